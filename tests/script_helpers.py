"""Import a repository script (docs/, examples/, experiments/) as a module, for tests."""

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
