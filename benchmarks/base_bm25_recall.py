"""Base-BM25 evidence recall on all ten RHELM personas (retrieval only; no LM).

The paper's starting design (record units, text + metadata indexed, raw question, BM25, ranked
order in the fixed context budget), evaluated with the RHELM protocol — each question sees only
records dated strictly before its ``question_date`` — over the official QA items of every persona.
Reports R@1/5/10 and delivered recall overall and by question type, pooled over all items, plus
per persona. This is the baseline every optimized design is compared against.

Usage:
    python benchmarks/base_bm25_recall.py [--rhelm PATH] [--no-external] [--design FILE.json] [--out FILE.json]

Prints a table and, with ``--out``, writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from memsteer_dspy.evaluation import ItemResult, evaluate_design, summarize_items
from memsteer_dspy.loaders.rhelm import list_personas, load_rhelm
from memsteer_dspy.memory import MemoryDesign, MemorySystem


def pct(v: float | None) -> str:
    return "   -  " if v is None else f"{100 * v:6.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--rhelm",
        type=Path,
        default=Path(__file__).resolve().parents[2] / "shared/benchmarks/rhelm",
    )
    ap.add_argument("--no-external", action="store_true", help="conversations only")
    ap.add_argument("--design", type=Path, help="a design JSON instead of Base-BM25")
    ap.add_argument("--cache-dir", type=Path, help="reuse built indexes from here")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    design = MemoryDesign.load(args.design) if args.design else MemoryDesign.base_bm25()
    t0 = time.perf_counter()
    pooled: list[ItemResult] = []
    per_persona = {}
    unresolved = 0
    for persona in list_personas(args.rhelm):
        loaded = load_rhelm(args.rhelm, persona, external=not args.no_external)
        unresolved += len({u.qa_id for u in loaded.unresolved})
        system = MemorySystem.from_design(design, loaded.history, cache_dir=args.cache_dir)
        report = evaluate_design(system, loaded.qa_items, metrics="recall", protocol="as_of")
        pooled.extend(report.items)
        per_persona[persona] = report.summary
    seconds = time.perf_counter() - t0

    overall = summarize_items(pooled, "recall")
    by_type: dict[str, list[ItemResult]] = {}
    for r in pooled:
        by_type.setdefault(r.question_type or "unknown", []).append(r)
    types = {t: summarize_items(rs, "recall") for t, rs in sorted(by_type.items())}

    label = "conversations only" if args.no_external else "with external sources"
    print(
        f"{design.name} on RHELM ({label}), {overall.n} official items, {len(per_persona)} personas, "
        f"{seconds:.1f}s; items with unresolved evidence ids: {unresolved}"
    )
    head = f"{'':<30} {'n':>5} {'R@1':>6} {'R@5':>6} {'R@10':>6} {'deliv':>6} {'empty':>6}"
    print(head)
    rows = [("overall", overall)] + list(types.items()) + [("", None)] + list(per_persona.items())
    for name, s in rows:
        if s is None:
            print()
            continue
        print(
            f"{name:<30} {s.n:>5} {pct(s.recall_at_1)} {pct(s.recall_at_5)} {pct(s.recall_at_10)} "
            f"{pct(s.delivered_recall)} {s.empty_contexts:>6}"
        )
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "design": design.model_dump(mode="json"),
                    "external": not args.no_external,
                    "seconds": round(seconds, 1),
                    "overall": overall.model_dump(),
                    "by_type": {t: s.model_dump() for t, s in types.items()},
                    "by_persona": {
                        p: s.model_dump(exclude={"by_type"}) for p, s in per_persona.items()
                    },
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
