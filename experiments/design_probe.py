"""Score hand-picked design variants on the selecting items only (never the test split).

A developer's look at the design space before asking a search to explore it: each variant is
scored, retrieval only, on the RHELM official training + validation items of the chosen personas
(one design shared by all, as in ``search_compare.py --shared-only``), and compared with
Base-BM25 item by item (paired bootstrap). The held-out test split of ``search_compare.py`` is
never read here, so what this shows cannot leak into the held-out figures.

    python experiments/design_probe.py --variant hybrid='{"retrieve": {"index": "hybrid"}}'
    python experiments/design_probe.py --variants experiments/configs/probe_variants.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import PersonaPool, SharedEvaluator, _merge, add_rhelm_args, resolve_rhelm_args  # noqa: E402

from memsteer_dspy.loaders.rhelm import list_personas, load_rhelm  # noqa: E402
from memsteer_dspy.memory import MemoryDesign  # noqa: E402
from memsteer_dspy.optimize import split_official  # noqa: E402
from memsteer_dspy.stats import paired_comparison  # noqa: E402

METRICS = ("recall_at_10", "delivered_recall")


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    name, _, patch = text.partition("=")
    if not patch:
        raise SystemExit(f"--variant {text!r}: expected NAME='{{json patch of Base-BM25}}'")
    return name, json.loads(patch)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    ap.add_argument(
        "--variant", action="append", default=[], help="NAME='{json patch}' (repeatable)"
    )
    ap.add_argument("--variants", type=Path, help="a JSON object NAME -> patch of Base-BM25")
    ap.add_argument("--persona", action="append", help="persona (repeatable; default all ten)")
    ap.add_argument("--seed", type=int, default=0)
    add_rhelm_args(ap)
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args(argv)
    root = resolve_rhelm_args(ap, args)
    variants = dict(parse_variant(v) for v in args.variant)
    if args.variants:
        variants.update(json.loads(args.variants.read_text()))
    histories, selecting = {}, []
    for p in args.persona or list_personas(root):
        loaded = load_rhelm(root, p, external=True)
        histories[p] = loaded.history
        train, val = split_official(loaded.qa_items, seed=args.seed)
        selecting += train + val
    pool = PersonaPool(histories)
    items = pool.items(selecting)
    ev = SharedEvaluator(
        pool, lm=lambda role: None, protocol="as_of", cache_dir=args.cache_dir, answering=False
    )
    base = MemoryDesign.base_bm25()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        scores = {}
        for name, patch in {"base-bm25": {}, **variants}.items():
            design = MemoryDesign.from_dict(_merge(base.model_dump(mode="json"), patch))
            t0 = time.perf_counter()
            _, rep = ev.evaluate(design, items, "recall", Path(tmp) / name)
            scores[name] = {m: [getattr(r, m) for r in rep.items] for m in METRICS}
            cmp = paired_comparison(scores["base-bm25"], scores[name], "delivered_recall")
            row = {
                "variant": name,
                "patch": patch,
                "n": cmp.n,
                "seconds": round(time.perf_counter() - t0, 1),
                **{m: cmp.best[m] for m in METRICS},
                "diff": cmp.diff,
                "ci95": cmp.ci95,
            }
            rows.append(row)
            cells = "  ".join(
                f"{m} {100 * cmp.best[m]:.1f} ({100 * cmp.diff[m]:+.1f} [{100 * cmp.ci95[m][0]:+.1f}, "
                f"{100 * cmp.ci95[m][1]:+.1f}])"
                for m in METRICS
            )
            print(f"{name:28s} n={cmp.n}  {cells}  {row['seconds']}s", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
