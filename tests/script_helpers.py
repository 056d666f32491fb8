"""Helpers for tests that run the repository's scripts and commands: import a script (docs/,
examples/, experiments/) as a module, and spell a command line as an argument list."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_script(relpath: str):
    """The script at ``ROOT/relpath`` imported as a fresh module (its ``main`` is not run)."""
    path = ROOT / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rhelm_args(rhelm_root, tmp_path) -> list[str]:
    """The RHELM scripts' data flags (``experiments/_common.add_rhelm_args``): the benchmark root
    and a per-test index cache."""
    return ["--rhelm-root", str(rhelm_root), "--cache-dir", str(tmp_path / "cache")]


def argv(line: str, *values: object) -> list[str]:
    """The command line ``line`` as an argument list: its words, each word ``{}`` replaced by the
    next of ``values`` as a string (so a path or a phrase with spaces stays one argument).

    ``argv("evaluate --path {} --metrics recall --out {}", folder, out)`` is
    ``["evaluate", "--path", str(folder), "--metrics", "recall", "--out", str(out)]``, kept on one
    line by the formatter, where the literal list takes one line per element."""
    words = line.split()
    if words.count("{}") != len(values):
        raise ValueError(f"{words.count('{}')} '{{}}' in {line!r} for {len(values)} values")
    rest = iter(values)
    return [str(next(rest)) if word == "{}" else word for word in words]
