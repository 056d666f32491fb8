"""Fast decoding against the earlier decoding of the embedded LM, on the supervision roles' own calls.

Usage::

    python benchmarks/decoding_speed.py                              # the demo history, 6 candidates
    python benchmarks/decoding_speed.py --user Elena_Morales --candidates 8   # a RHELM persona

Records every LM call of a short lean-anchor generation run (``memsteer generate``'s pipeline on the
embedded model, the DSPy cache off), then replays each recorded call greedily (temperature 0) under
both decodings of :class:`~memsteer_dspy.lm.local.LlamaCppEngine`, taking turns call by call (the
order flips every call), each decoding with its own KV slot per role:

- ``whole`` — the engine before 2026-12-06 (``fast_decoding=False``): the grammar masks the whole
  vocabulary before every pick, and an answer is one JSON object decoded key by key;
- ``fast`` — the default: the grammar checks the picked token only, and an answer is written field
  by field, its keys fed as prompt.

Per role and in total prints the calls, the seconds under each decoding and their ratio (fast /
whole, measured in this run), the output tokens, the decode steps llama.cpp ran one token at a
time, and how many answers are the same text both ways and the same JSON (greedy picks are the
same; a fed key may be tokenized otherwise than the model would write it, which can change a later
pick). The CPU's model and flags are printed with the numbers. Writes nothing but a temporary
generation folder (deleted).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import dspy  # noqa: E402
from generate_cost import generation_config  # noqa: E402

from memsteer_dspy.lm import DEFAULT_LM, buildflags  # noqa: E402
from memsteer_dspy.lm.config import LMSpec, build_lm  # noqa: E402
from memsteer_dspy.supervision.program import GENERATION_ROLES  # noqa: E402
from memsteer_dspy.supervision.run import generate_supervision  # noqa: E402

DECODINGS = ("whole", "fast")


def record_calls(history: Any, candidates: int, seed: int, lm: str) -> list[tuple[str, dict]]:
    """Every LM call (role, messages, kwargs) of a short lean-anchor run on ``history``."""
    spec = LMSpec(model=lm, cache=False)
    lms = {r: build_lm(spec, role=r, kv_slot=f"record/{r}") for r in GENERATION_ROLES}
    out = Path(tempfile.mkdtemp(prefix="decoding-speed-"))
    try:
        generate_supervision(
            history, lms, out, generation_config("lean-anchor", candidates, seed), progress=True
        )
    finally:
        shutil.rmtree(out, ignore_errors=True)
    calls = []
    for role, role_lm in lms.items():
        for h in role_lm.history:
            calls.append(
                (
                    role,
                    {
                        "messages": h["messages"],
                        "kwargs": dict(h["kwargs"]),
                        "timestamp": str(h.get("timestamp") or ""),
                    },
                )
            )
    calls.sort(key=lambda c: c[1]["timestamp"])  # the run's order
    return calls


def replay(calls: list[tuple[str, dict]], lm: str) -> dict[str, dict[str, dict[str, float]]]:
    """Each call greedily under both decodings, by turns; per role and decoding: calls, seconds,
    completion tokens, decode steps; and per role how many answers agree."""
    lms = {
        d: {
            r: build_lm(
                LMSpec(model=lm, cache=False, temperature=0.0, fast_decoding=d == "fast"),
                role=r,
                kv_slot=f"{d}/{r}",
            )
            for r in GENERATION_ROLES
        }
        for d in DECODINGS
    }
    table: dict[str, dict[str, Any]] = defaultdict(
        lambda: {
            **{d: {"seconds": 0.0, "completion": 0, "steps": 0} for d in DECODINGS},
            "calls": 0,
            "same_text": 0,
            "same_json": 0,
        }
    )
    for i, (role, call) in enumerate(calls):
        kwargs = {k: v for k, v in call["kwargs"].items() if k not in ("rollout_id", "temperature")}
        texts = {}
        for d in DECODINGS if i % 2 == 0 else DECODINGS[::-1]:
            role_lm = lms[d][role]
            start = time.perf_counter()
            try:
                role_lm(messages=call["messages"], temperature=0.0, **kwargs)
            except Exception as exc:  # noqa: BLE001 - one failed call is reported, never the run
                print(f"  call {i} ({role}, {d}) failed: {exc}", file=sys.stderr)
                texts[d] = None
                continue
            row = table[role][d]
            row["seconds"] += time.perf_counter() - start
            h = role_lm.history[-1]
            row["completion"] += (h.get("usage") or {}).get("completion_tokens", 0)
            row["steps"] += role_lm.engine.last_timings.generated_tokens
            texts[d] = h["outputs"][0] if h.get("outputs") else None
        table[role]["calls"] += 1
        a, b = texts.get("whole"), texts.get("fast")
        if a is not None and b is not None:
            table[role]["same_text"] += int(a == b)
            try:
                table[role]["same_json"] += int(json.loads(a) == json.loads(b))
            except (TypeError, ValueError):
                pass
        if (i + 1) % 10 == 0:
            print(f"  replayed {i + 1}/{len(calls)} calls", flush=True)
    return dict(table)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--user", default=None, help="a RHELM persona (default: the demo history)")
    ap.add_argument("--path", default=None, help="RHELM root (default ../shared/benchmarks/rhelm)")
    ap.add_argument("--candidates", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lm", default=DEFAULT_LM, help="an in-process LM (local/… or llamacpp/…)")
    args = ap.parse_args(argv)
    if not LMSpec(model=args.lm).in_process:
        ap.error(
            f"--lm {args.lm!r} is not in-process: only llama.cpp in this process decodes either way"
        )
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
    if args.user:
        from memsteer_dspy.loaders import load_history

        history = load_history("rhelm", args.path, user=args.user).history
    else:
        from memsteer_dspy.demo_data import load_demo

        history = load_demo().history
    print(
        f"{history.user_id}: {len(history)} records; {args.candidates} lean-anchor candidates, "
        f"seed {args.seed}; LM {args.lm}; CPU {buildflags.cpu_model_name()}, {os.cpu_count()} cores, {' '.join(buildflags.reported_features())}",
        flush=True,
    )
    calls = record_calls(history, args.candidates, args.seed, args.lm)
    print(f"recorded {len(calls)} calls; replaying each greedily under both decodings", flush=True)
    table = replay(calls, args.lm)
    roles = [r for r in GENERATION_ROLES if r in table]
    total = {
        "calls": sum(table[r]["calls"] for r in roles),
        "same_text": sum(table[r]["same_text"] for r in roles),
        "same_json": sum(table[r]["same_json"] for r in roles),
        **{
            d: {k: sum(table[r][d][k] for r in roles) for k in ("seconds", "completion", "steps")}
            for d in DECODINGS
        },
    }
    print(
        f"\n  {'role':<16}{'calls':>6}{'whole s':>9}{'fast s':>8}{'fast/whole':>11}"
        f"{'tokens':>8}{'steps whole':>12}{'steps fast':>11}{'same text':>10}{'same JSON':>10}"
    )
    for role, t in [*((r, table[r]) for r in roles), ("total", total)]:
        w, f = t["whole"], t["fast"]
        ratio = f["seconds"] / w["seconds"] if w["seconds"] else float("nan")
        print(
            f"  {role:<16}{t['calls']:>6.0f}{w['seconds']:>9.1f}{f['seconds']:>8.1f}{ratio:>11.2f}"
            f"{w['completion']:>8.0f}{w['steps']:>12.0f}{f['steps']:>11.0f}"
            f"{t['same_text']:>10.0f}{t['same_json']:>10.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
