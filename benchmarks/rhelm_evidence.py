"""How well the RHELM loader maps the official evidence ids to records, and how fast it loads.

Loads every persona of the RHELM benchmark (with external sources, and optionally without) and
prints, per persona: records by kind, QA items, the share of QA items whose evidence all resolved
to record ids, how the evidence strings resolved (method counts), the unresolved ones, and the
load time; then the overall figure. Writes nothing.

    python benchmarks/rhelm_evidence.py [--root PATH] [--no-external] [--json]

The target is >= 98% of the 1,305 official items fully resolved with external sources.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

from memsteer_dspy.loaders.rhelm import (
    EXTERNAL_NOT_LOADED,
    default_rhelm_root,
    list_personas,
    load_rhelm,
)

TARGET = 0.98


def measure(root: Path, persona: str, external: bool) -> dict:
    start = time.perf_counter()
    loaded = load_rhelm(root, persona, external=external)
    seconds = time.perf_counter() - start
    broken = [u for u in loaded.unresolved if u.reason != EXTERNAL_NOT_LOADED]
    bad_items = {u.qa_id for u in broken}
    methods = Counter(
        r["method"] for q in loaded.qa_items for r in q.metadata["evidence_resolution"]
    )
    return {
        "persona": persona,
        "records_by_kind": loaded.history.stats()["records_by_kind"],
        "qa_items": len(loaded.qa_items),
        "resolved_items": sum(q.id not in bad_items for q in loaded.qa_items),
        "external_evidence_not_loaded": len(loaded.unresolved) - len(broken),
        "items_needing_external": len({u.qa_id for u in loaded.unresolved} - bad_items),
        "methods": dict(methods.most_common()),
        "unresolved": [{"qa_id": u.qa_id, "raw": u.raw, "reason": u.reason} for u in broken],
        "load_seconds": round(seconds, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=None, help="RHELM folder (default: auto)")
    parser.add_argument("--no-external", action="store_true", help="conversations only")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    root = args.root or default_rhelm_root()
    if root is None:
        print("RHELM data not found: pass --root or set MEMSTEER_RHELM_ROOT", file=sys.stderr)
        return 2
    external = not args.no_external
    rows = [measure(root, p, external) for p in list_personas(root)]
    items = sum(r["qa_items"] for r in rows)
    resolved = sum(r["resolved_items"] for r in rows)
    summary = {
        "root": str(root),
        "external": external,
        "personas": len(rows),
        "qa_items": items,
        "resolved_items": resolved,
        "resolved_fraction": resolved / items if items else None,
        "items_needing_external": sum(r["items_needing_external"] for r in rows),
        "target": TARGET,
        "load_seconds_total": round(sum(r["load_seconds"] for r in rows), 2),
        "load_seconds_max": max(r["load_seconds"] for r in rows),
        "methods": dict(sum((Counter(r["methods"]) for r in rows), Counter()).most_common()),
    }
    if args.json:
        print(json.dumps({"summary": summary, "personas": rows}, indent=2, ensure_ascii=False))
        return 0
    for r in rows:
        pct = 100 * r["resolved_items"] / r["qa_items"] if r["qa_items"] else float("nan")
        kinds = ", ".join(f"{k} {v}" for k, v in r["records_by_kind"].items())
        print(
            f"{r['persona']}: {kinds}; QA {r['qa_items']}, all evidence resolved {pct:.1f}%"
            f" ({r['resolved_items']}/{r['qa_items']}); load {r['load_seconds']:.2f}s"
        )
        if r["external_evidence_not_loaded"]:
            print(
                f"    evidence in emails/attachments (not loaded): {r['external_evidence_not_loaded']}"
                f" strings, {r['items_needing_external']} items"
            )
        for u in r["unresolved"]:
            print(f"    unresolved {u['qa_id']}: {u['raw']!r} — {u['reason']}")
    s = summary
    print(
        f"\noverall ({'with' if external else 'without'} external sources): "
        f"{s['resolved_items']}/{s['qa_items']} items fully resolved = "
        f"{100 * s['resolved_fraction']:.2f}% (target {100 * TARGET:.0f}%); "
        f"load {s['load_seconds_total']:.2f}s total, {s['load_seconds_max']:.2f}s max per persona"
    )
    if not external:
        print(f"items with evidence in emails/attachments: {s['items_needing_external']}")
    print("resolution methods: " + ", ".join(f"{k} {v}" for k, v in s["methods"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
