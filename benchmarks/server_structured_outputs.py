"""Per-role parse failures against a real OpenAI-compatible server, with and without the schema.

Starts llama-cpp-python's server on the embedded model (``memsteer_dspy.lm.serve``; needs the
``local`` and ``server`` extras), then runs, once per ``structured_output`` mode, a small
``memsteer generate`` (planner, question writer, auditor, blind reader) and ``memsteer evaluate``
with answers (answerer, judge) on the bundled demo history, every role on the server as
``openai/qwen-server``. A DSPy callback counts, per role, how many LM outputs the JSONAdapter
parsed and how many it could not. Modes:

* ``auto`` — what memsteer-dspy does: the signature's JSON schema goes to the server in the form it
  takes (llama-cpp-python: ``{"type": "json_object", "schema": ...}``), which constrains decoding;
* ``none`` — what DSPy does on its own for an ``openai/<alias>`` it has no catalog entry for: no
  ``response_format``; the format is only described in the prompt;
* ``json_object`` (with ``--modes auto,none,json_object``) — JSON mode without the schema.

The LM cache is off, so every call reaches the server. Run it alone on the machine (it uses the
CPU for minutes)::

    python benchmarks/server_structured_outputs.py [--candidates 3] [--items 3] [--modes auto,none]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import dspy
from dspy.utils.callback import BaseCallback
from typer.testing import CliRunner

from memsteer_dspy.cli import app
from memsteer_dspy.lm.model_files import ensure_embedded_model
from memsteer_dspy.lm.serve import running_llama_server, server_missing

DEMO = Path(__file__).resolve().parent.parent / "memsteer_dspy" / "data" / "demo"


class ParseCounter(BaseCallback):
    """Counts adapter parses per role: the role is that of the LM called last on the same thread."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.parsed: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.lock = threading.Lock()

    def on_lm_start(self, call_id, instance, inputs):
        self.local.role = getattr(instance, "role", "?")

    def on_adapter_parse_end(self, call_id, outputs, exception=None):
        role = getattr(self.local, "role", "?")
        with self.lock:
            (self.failed if exception is not None else self.parsed)[role] += 1


def run(args: list[str]) -> dict:
    result = CliRunner().invoke(app, [*args, "--json"])
    if result.exit_code != 0:
        sys.exit(f"memsteer {' '.join(args)} failed:\n{result.output}")
    return json.loads(result.stdout[result.stdout.index("{") :])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--candidates", type=int, default=3, help="generate: candidates per mode")
    parser.add_argument("--items", type=int, default=3, help="evaluate: QA items per mode")
    parser.add_argument(
        "--modes", default="auto,none", help="structured_output modes, comma-separated"
    )
    opts = parser.parse_args()
    why = server_missing()
    if why:
        sys.exit(why)
    os.environ.setdefault("OPENAI_API_KEY", "unused")
    modes = [m.strip() for m in opts.modes.split(",") if m.strip()]
    counts: dict[str, ParseCounter] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        with running_llama_server(ensure_embedded_model("qwen2.5-coder-1.5b"), tmp) as server:
            for mode in modes:
                config = tmp / f"{mode}.toml"
                config.write_text(
                    server.toml(structured_output=mode).replace("num_retries = 1", "cache = false")
                )
                counter = counts[mode] = ParseCounter()
                dspy.configure(callbacks=[counter])
                start = time.perf_counter()
                demo = ["--format", "jsonl", "--path", str(DEMO)]
                n, config_args = str(opts.candidates), ["--config", str(config)]
                gen = ["generate", *demo, "--n", n, "--max-candidates", n]
                run([*gen, "--out", str(tmp / f"gen-{mode}"), "--profile", "small", *config_args])
                ev = ["evaluate", *demo, "--limit", str(opts.items), "--no-cache"]
                run([*ev, "--out", str(tmp / f"eval-{mode}"), *config_args])
                dspy.configure(callbacks=[])
                print(f"mode {mode}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
    roles = sorted({r for c in counts.values() for r in (*c.parsed, *c.failed)})
    print(
        f"parse failures per role ({opts.candidates} generate candidates, {opts.items} evaluate items, "
        "llama-cpp-python server, embedded 1.5B model)"
    )
    print(f"{'role':16s}" + "".join(f"{m:>22s}" for m in modes))
    for role in roles:
        cells = []
        for mode in modes:
            failed, total = (
                counts[mode].failed[role],
                counts[mode].failed[role] + counts[mode].parsed[role],
            )
            cells.append(f"{failed}/{total} ({failed / total:.0%})" if total else "-")
        print(f"{role:16s}" + "".join(f"{c:>22s}" for c in cells))


if __name__ == "__main__":
    main()
