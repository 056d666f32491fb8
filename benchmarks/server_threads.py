"""Wall time of ``--threads 1`` vs ``--threads 4`` against a slow OpenAI-compatible server.

After one unmeasured warm-up run of each command, the server is :class:`memsteer_dspy.lm.fake_server.FakeOpenAIServer`: every completion waits
``--delay`` seconds (what a remote API or a GPU server with free batch slots costs per request)
and answers the request's JSON schema, so the time measured is the commands' own request
scheduling, not a model's speed (a CPU llama.cpp server answers one request at a time, so
threads gain nothing there). Both runs use the same commands in one process:

* ``memsteer evaluate`` on the bundled demo history (answerer + judge per item), and
* ``memsteer generate`` (candidates in parallel),

and the script checks that both thread counts book the same LM calls and tokens per role and
that each run folder holds every item exactly once. It prints the per-run wall times and the
ratio t(1) / t(4)::

    python benchmarks/server_threads.py [--delay 0.3] [--items 8] [--candidates 4]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from typer.testing import CliRunner

from memsteer_dspy.cli import app
from memsteer_dspy.lm.fake_server import FakeOpenAIServer

DEMO = Path(__file__).resolve().parent.parent / "memsteer_dspy" / "data" / "demo"


def run(args: list[str]) -> tuple[dict, float]:
    start = time.perf_counter()
    result = CliRunner().invoke(app, [*args, "--json"])
    seconds = time.perf_counter() - start
    if result.exit_code != 0:
        sys.exit(f"memsteer {' '.join(args)} failed:\n{result.output}")
    return json.loads(result.stdout[result.stdout.index("{") :]), seconds


def books(usage: dict) -> dict:
    return {r: (u["calls"], u["prompt_tokens"], u["completion_tokens"]) for r, u in usage.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--delay", type=float, default=0.3, help="seconds per completion")
    parser.add_argument("--items", type=int, default=8, help="evaluate: QA items")
    parser.add_argument("--candidates", type=int, default=4, help="generate: candidates")
    opts = parser.parse_args()
    os.environ.setdefault("OPENAI_API_KEY", "unused")
    with (
        tempfile.TemporaryDirectory() as tmp,
        FakeOpenAIServer(alias="slow", delay=opts.delay) as server,
    ):
        tmp = Path(tmp)
        config = tmp / "server.toml"
        config.write_text(
            f'[lm]\ndefault = "openai/slow"\n[lm.options."openai/slow"]\napi_base = "{server.api_base}"\n'
            "num_retries = 0\ncache = false\n"
        )
        rows = []
        for command in ("evaluate", "generate"):
            seen: dict[int, tuple[float, dict, int]] = {}
            for threads in (0, 1, 4):  # 0: a warm-up run (imports, first index build), not measured
                out = tmp / f"{command}-{threads}"
                before = len(server.requests)
                n = str(opts.candidates)
                args = {
                    "evaluate": ["--limit", str(opts.items), "--no-cache"],
                    "generate": ["--n", n, "--max-candidates", n],
                }[command]
                args = [command, "--format", "jsonl", "--path", str(DEMO), *args, "--out", str(out)]
                report, seconds = run(
                    [*args, "--config", str(config), "--threads", str(max(threads, 1))]
                )
                if threads == 0:
                    continue
                usage = report.get("lm_usage") or report.get("lm_usage_by_role") or {}
                seen[threads] = (seconds, books(usage), len(server.requests) - before)
                if command == "evaluate":
                    lines = (out / "items.jsonl").read_text().splitlines()
                    assert (
                        len(lines) == len({json.loads(x)["qa_id"] for x in lines}) == opts.items
                    ), lines
                else:
                    n = sum(
                        len((out / f).read_text().splitlines())
                        for f in ("train.jsonl", "val.jsonl", "rejected.jsonl")
                        if (out / f).exists()
                    )
                    assert n == report["candidates"] == opts.candidates, (n, report["candidates"])
            (t1, b1, r1), (t4, b4, r4) = seen[1], seen[4]
            same = b1 == b4 and r1 == r4 and sum(c for c, _, _ in b4.values()) == r4
            rows.append((command, r1, t1, t4, t1 / t4, same))
        print(
            f"fake server: {opts.delay:.2f} s per completion, {server.max_in_flight} requests at most at once"
        )
        print(
            f"{'command':10s} {'requests':>8s} {'t(1) s':>8s} {'t(4) s':>8s} {'t1/t4':>6s}  books equal"
        )
        for command, requests, t1, t4, ratio, same in rows:
            print(
                f"{command:10s} {requests:8d} {t1:8.2f} {t4:8.2f} {ratio:6.2f}  {'yes' if same else 'NO'}"
            )


if __name__ == "__main__":
    main()
