"""Cost of supervision construction per verified item: pipeline configurations side by side, one run.

Usage::

    flock /tmp/memsteer-lm.lock python benchmarks/generate_cost.py \\
        --user Elena_Morales --seed 1 --candidates 40 --chunk 4  # the paper's prompts vs lean-anchor
    python benchmarks/generate_cost.py --candidates 8 --configs lean   # one configuration only
    python benchmarks/generate_cost.py --configs v1,lean,lean-unsteered,v1-steered  # pipeline x sampler

For one RHELM persona (external sources on), seed and candidate count, runs ``memsteer generate``'s
pipeline (:func:`~memsteer_dspy.supervision.run.generate_supervision`, the MemSteer method, every
check on) once per configuration, each into a fresh folder under ``--out``, on the same LM (loaded
once, before any timing; the DSPy cache off, so nothing is answered from an earlier run). The
configurations take turns, ``--chunk`` candidates at a time, so other work on a shared machine
slows both alike:

- ``v1``   — the earlier pipeline: DSPy's JSONAdapter prompts, audit before blind read, the small
  bundle profile's 80/20 one-/two-record draw without answer-type targets;
- ``lean`` — compact prompts, the pre-filter of bundles with nothing concrete, blind read before
  the audit, tight output caps, and tasks steered toward the profile's mix;
- ``lean-unsteered`` — lean's pipeline on v1's task draw, and ``v1-steered`` — v1's pipeline on
  lean's steered draw: together they tell the pipeline's effect from the sampler's (the steered
  draw asks for two-record, number and list items, which a small LM keeps less often);
- ``lean-yield``, ``lean-yield2`` — lean with each kind also weighed by its yield on this run (to
  the power 1 or 2), and ``lean-anchor`` — lean-yield2 with the anchored planner, which picks its
  answer by number from the options the program reads off the bundle's sentences, sampled as
  :data:`~memsteer_dspy.bundles.ANCHORED_SAMPLING` says (two-record tasks only where a bridge or
  an update answers, the user's side of a conversation turn, concrete seeds:
  ``supervision.run.small_lm_generation_config``); with ``v1``, the default comparison;
- ``default`` — lean-anchor with the question writer's packaged examples
  (``supervision.writer_examples.default_writer_examples``): what ``memsteer demo`` and
  ``memsteer generate`` run on the embedded model;
- ``v1-fast`` — v1's pipeline on fast decoding, and ``lean-anchor-whole`` — lean-anchor on the
  earlier decoding: the decoding's effect on each pipeline.

``v1`` (and ``lean-anchor-whole``) run on the engine's decoding as the issue measured it (:data:`WHOLE_OBJECT_DECODING`: each
answer one grammar-bound JSON object, its keys decoded token by token); every other configuration
decodes fast (``LMSpec.fast_decoding``: a sampled token is checked alone against the grammar, and
an answer is written field by field, its keys fed as prompt).

Prints per role and in total: LM calls, prompt tokens, prompt tokens actually evaluated (llama.cpp
reuses the longest common prefix with the previous call; reported as ``cached_tokens``),
completion tokens and seconds; the kept fraction; tokens, evaluated tokens and seconds per accepted
item; the accepted items' answer types and evidence counts; then each configuration's ratios over
v1, measured in this run. Writes ``cost.json`` (everything printed) and each configuration's generate folder
(``train.jsonl``, ``val.jsonl``, ``rejected.jsonl``, ``summary.json``) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dspy  # noqa: E402

from memsteer_dspy.bundles import ANCHORED_SAMPLING, small_lm_bundle_config  # noqa: E402
from memsteer_dspy.lm import DEFAULT_LM  # noqa: E402
from memsteer_dspy.lm.config import LMSpec, build_lm  # noqa: E402
from memsteer_dspy.loaders import load_history  # noqa: E402
from memsteer_dspy.records import History, QAItem  # noqa: E402
from memsteer_dspy.supervision.program import GENERATION_ROLES  # noqa: E402
from memsteer_dspy.supervision.run import (  # noqa: E402
    GenerationConfig,
    accepted_distribution,
    format_kept,
    generate_supervision,
    kept_by_task,
    read_log,
)
from memsteer_dspy.supervision.writer_examples import default_writer_examples  # noqa: E402

# name -> (lean pipeline, steered task sampler, steered by yield). The two mixed ones separate the
# pipeline from the sampler: the steered sampler asks for harder items (two-record tasks, numbers,
# lists), which a small LM keeps less often whatever its prompts. "lean-yield" also weighs each
# kind by what it has yielded on this run (BundleConfig.steer_by_yield): measured with lean on the
# embedded model, entity and two-record tasks kept 1 of 42 while the lag alone kept asking for them.
CONFIGS: dict[str, tuple[bool, bool, float, bool]] = {
    # name: (lean, steered, yield power: 0 steers by the lag alone, anchored planner)
    "v1": (False, False, 0, False),
    "lean": (True, True, 0, False),
    "lean-unsteered": (True, False, 0, False),
    "v1-steered": (False, True, 0, False),
    "lean-yield": (True, True, 1.0, False),
    "lean-yield2": (True, True, 2.0, False),
    # the planner picks its answer from the program's options (GenerationConfig.anchored), and the
    # sampler steers toward the answer types a bundle has options for
    "lean-anchor": (True, True, 2.0, True),
    # ... with the question writer's packaged examples (WITH_EXAMPLES): demo's and generate's default
    "default": (True, True, 2.0, True),
    # v1's pipeline on fast decoding: what the decoding alone does to the earlier pipeline
    "v1-fast": (False, False, 0, False),
    # and lean-anchor on the earlier decoding: what the decoding does to the new pipeline
    "lean-anchor-whole": (True, True, 2.0, True),
}
# The configurations whose in-process LM decodes as the engine did when the issue measured today's
# cost (the grammar masks the whole vocabulary before every pick; each answer one JSON object, key
# by key); every other one decodes fast (LMSpec.fast_decoding).
WHOLE_OBJECT_DECODING = frozenset({"v1", "lean-anchor-whole"})
# The configurations whose question writer is shown the packaged examples (generate's default on a
# small in-process LM).
WITH_EXAMPLES = frozenset({"default"})


def generation_config(
    name: str, candidates: int, seed: int, history: History | None = None
) -> GenerationConfig:
    """The named configuration (:data:`CONFIGS`), every check on, stopping only when ``candidates``
    are done; one of :data:`WITH_EXAMPLES` needs the ``history`` generated for (its examples are
    refused when they are that history's)."""
    lean, steered, power, anchored = CONFIGS[name]
    bundle = small_lm_bundle_config(steered=steered)
    if power:
        bundle = bundle.model_copy(update={"steer_by_yield": True, "yield_power": power})
    if anchored:
        bundle = bundle.model_copy(update=ANCHORED_SAMPLING)
    examples = []
    if name in WITH_EXAMPLES:
        if history is None:
            raise ValueError(f"configuration {name!r} needs the history generated for")
        examples = default_writer_examples(history, seed)
    return GenerationConfig(
        n=candidates,
        max_candidates=candidates,
        seed=seed,
        lean=lean,
        anchored=anchored,
        bounded=True,
        bundle=bundle,
        writer_examples=examples,
    )


def role_costs(out: Path) -> dict[str, Any]:
    """Per role and in total, from the run's log: calls, prompt / evaluated / completion tokens,
    seconds; the kept fraction and the costs per accepted item."""
    log = read_log(out)
    roles: dict[str, dict[str, float]] = {}
    for r in log:
        for role, c in r.usage.items():
            t = roles.setdefault(
                role, dict.fromkeys(("calls", "prompt", "evaluated", "completion", "seconds"), 0)
            )
            t["calls"] += c.calls
            t["prompt"] += c.prompt_tokens
            t["evaluated"] += c.evaluated_tokens
            t["completion"] += c.completion_tokens
            t["seconds"] += c.seconds
    total = {
        k: sum(t[k] for t in roles.values())
        for k in ("calls", "prompt", "evaluated", "completion", "seconds")
    }
    tried = [r for r in log if r.status != "skipped"]
    accepted_items = [
        QAItem.model_validate(r.item) for r in tried if r.status == "accepted" and r.item
    ]
    accepted = len(accepted_items)
    state = json.loads((out / "run.json").read_text(encoding="utf-8"))
    wall = sum(s.get("wall_seconds", 0.0) for s in state.get("sessions", []))
    per = None
    if accepted:
        per = {
            "tokens": (total["prompt"] + total["completion"]) / accepted,
            "evaluated_tokens": (total["evaluated"] + total["completion"]) / accepted,
            "lm_seconds": total["seconds"] / accepted,
            "wall_seconds": wall / accepted,
            "calls": total["calls"] / accepted,
        }
    return {
        "roles": {r: roles[r] for r in GENERATION_ROLES if r in roles},
        "total": total,
        "candidates": len(tried),
        "accepted": accepted,
        "kept_fraction": round(accepted / len(tried), 4) if tried else 0.0,
        "rejected_by_reason": dict(
            Counter(r.reason or "?" for r in tried if r.status == "rejected")
        ),
        "wall_seconds": wall,
        "per_accepted": per,
        **accepted_distribution(accepted_items),
        "kept_by_task": kept_by_task(log),
    }


def print_costs(name: str, cost: dict[str, Any]) -> None:
    print(
        f"\n== {name}: accepted {cost['accepted']} of {cost['candidates']} candidates "
        f"(kept {100 * cost['kept_fraction']:.1f}%), wall {cost['wall_seconds']:.0f}s"
    )
    print(
        f"  {'role':<16}{'calls':>7}{'prompt':>10}{'evaluated':>11}{'completion':>12}{'seconds':>10}"
    )
    for role, t in [*cost["roles"].items(), ("total", cost["total"])]:
        print(
            f"  {role:<16}{t['calls']:>7.0f}{t['prompt']:>10.0f}{t['evaluated']:>11.0f}"
            f"{t['completion']:>12.0f}{t['seconds']:>10.1f}"
        )
    per = cost["per_accepted"]
    if per:
        print(
            f"  per accepted item: {per['tokens']:.0f} tokens ({per['evaluated_tokens']:.0f} evaluated), "
            f"{per['calls']:.1f} calls, {per['lm_seconds']:.1f} s of LM time, {per['wall_seconds']:.1f} s wall"
        )
    print(
        f"  accepted by answer type {cost['accepted_by_answer_type']}, by question form "
        f"{cost['accepted_by_question_word']}, by evidence records {cost['accepted_by_evidence_count']}"
    )
    print(f"  kept by task (accepted/tried): {format_kept(cost['kept_by_task'])}")
    print(f"  rejected by reason {cost['rejected_by_reason']}")


def ratios(new: dict[str, Any], old: dict[str, Any]) -> dict[str, float | None]:
    a, b = new["per_accepted"], old["per_accepted"]
    if not a or not b:
        return {}
    out = {f"{k}_per_accepted": round(a[k] / b[k], 3) if b[k] else None for k in a}
    out["kept_fraction"] = (
        round(new["kept_fraction"] / old["kept_fraction"], 3) if old["kept_fraction"] else None
    )
    return out


def run_configs(
    history: Any,
    lms: dict[str, dict[str, Any]],
    names: list[str],
    out: Path,
    *,
    candidates: int,
    seed: int,
    chunk: int,
    lm_description: dict[str, str] | None = None,
    progress: bool = True,
) -> tuple[dict[str, dict[str, Any]], bool]:
    """Run the named configurations into ``out/<name>``, taking turns ``chunk`` candidates at a time
    (each turn resumes its run), so a machine shared with other work slows all alike and the ratios
    stay fair. ``lms`` gives each configuration its LM per role (``{name: {role: lm}}``): in-process
    LMs of their own KV slots, so one configuration's turn does not evict the other's cached
    prefixes. Returns ``({name: role_costs}, stopped early)``; Ctrl-C stops with what each
    configuration finished."""
    done, stopped = 0, False
    try:
        while done < candidates:
            done = min(candidates, done + chunk)
            for name in names:
                config = generation_config(name, done, seed, history)
                generate_supervision(
                    history,
                    lms[name],
                    out / name,
                    config,
                    lm_description=lm_description,
                    progress=progress,
                )
    except KeyboardInterrupt:
        stopped = True
        print(
            f"\nstopped during the turn up to candidate {done}: the report covers what was finished"
        )
    results = {n: role_costs(out / n) for n in names if (out / n / "run.json").exists()}
    return results, stopped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--user", default="Elena_Morales", help="RHELM persona")
    ap.add_argument("--path", default=None, help="RHELM root (default ../shared/benchmarks/rhelm)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--candidates", type=int, default=40)
    ap.add_argument(
        "--configs", default="v1,lean-anchor", help=f"comma-separated, from {', '.join(CONFIGS)}"
    )
    ap.add_argument(
        "--chunk", type=int, default=8, help="candidates per turn of each configuration"
    )
    ap.add_argument("--lm", default=DEFAULT_LM, help="LM for every generation role")
    ap.add_argument(
        "--out", type=Path, default=None, help="output folder (default: a new temp folder)"
    )
    args = ap.parse_args(argv)
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in names if c not in CONFIGS]
    if unknown:
        ap.error(f"unknown configuration(s) {unknown}; choose from {', '.join(CONFIGS)}")
    out = args.out or Path(tempfile.mkdtemp(prefix="generate-cost-"))
    out.mkdir(parents=True, exist_ok=True)
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)

    history = load_history("rhelm", args.path, user=args.user).history
    # one LM per role and configuration, as `memsteer generate` builds them for one run: an
    # in-process model keeps a KV cache per slot. The fourteenth and fifteenth runs shared one LM, so
    # every role switch re-evaluated; the sixteenth shared each role's slot between configurations,
    # so every turn evicted the other configuration's prefixes.
    spec = LMSpec(model=args.lm, cache=False)
    specs = {
        n: spec.model_copy(update={"fast_decoding": n not in WHOLE_OBJECT_DECODING}) for n in names
    }
    lms_by_config = {
        name: {r: build_lm(specs[name], role=r, kv_slot=f"{name}/{r}") for r in GENERATION_ROLES}
        for name in names
    }
    lm = lms_by_config[names[0]][GENERATION_ROLES[0]]
    t0 = time.perf_counter()
    lm(
        messages=[{"role": "user", "content": "Reply with the word ok."}], max_tokens=16
    )  # load untimed
    print(
        f"{args.user}: {len(history)} records; seed {args.seed}, {args.candidates} candidates per "
        f"configuration; LM {args.lm} (loaded in {time.perf_counter() - t0:.1f}s, {os.cpu_count()} cores); "
        f"folders under {out}",
        flush=True,
    )
    for name in names:
        folder = out / name
        if folder.exists() and any(folder.iterdir()):
            sys.exit(f"{folder} is not empty: pass a new --out (a cost run never resumes)")
    # stopped early (Ctrl-C, or `timeout -s INT`): report what the configurations finished
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    described = dict.fromkeys(GENERATION_ROLES, args.lm)
    results, stopped = run_configs(
        history,
        lms_by_config,
        names,
        out,
        candidates=args.candidates,
        seed=args.seed,
        chunk=args.chunk,
        lm_description=described,
    )
    for name, cost in results.items():
        print_costs(name, cost)
    report: dict[str, Any] = {
        "user": args.user,
        "seed": args.seed,
        "candidates": args.candidates,
        "stopped_early": stopped,
        "lm": args.lm,
        "cores": os.cpu_count(),
        "configs": results,
    }
    if "v1" in results:
        report["ratios_over_v1"] = {
            n: ratios(results[n], results["v1"]) for n in results if n != "v1"
        }
        for n, r in report["ratios_over_v1"].items():
            print(f"\n== {n} / v1, measured in this run:")
            for k, v in r.items():
                print(f"  {k:<28} {v}")
    (out / "cost.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {out}/cost.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
