"""BM25 speed: memsteer's bm25s index against rank_bm25 on the same corpus and queries, in one run.

Two corpora:

* one RHELM persona with external sources (Base-BM25 record units: text + metadata), queried with
  the persona's official questions;
* a synthetic 100,000-record history (seeded Zipfian vocabulary, 20–60 words a record), queried
  with seeded 6-word queries.

For each: index build time (tokenization included, the same tokenizer for both engines), queries
per second for top-10 retrieval (bm25s also with a per-query date mask, as the RHELM protocol
uses), peak traced memory while building (tracemalloc: Python and numpy allocations), and the
speed ratio bm25s / rank_bm25. rank_bm25 is timed on a subset of the queries when it is slow;
queries per second are per-query averages either way.

Usage:
    python benchmarks/bm25_speed.py [--rhelm PATH] [--persona NAME] [--records 100000] [--out FILE.json]

Prints a table and, with ``--out``, writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import resource
import time
import tracemalloc
from pathlib import Path

import numpy as np

from memsteer_dspy.memory import MemoryDesign
from memsteer_dspy.memory.index import BM25Index, top_k
from memsteer_dspy.memory.store import build_units


def synthetic_corpus(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    syll = [
        "ka",
        "lo",
        "mi",
        "ne",
        "ru",
        "ta",
        "shi",
        "vo",
        "pe",
        "da",
        "gri",
        "on",
        "el",
        "ban",
        "tor",
    ]
    vocab = sorted(
        {"".join(rng.choice(syll) for _ in range(rng.randint(2, 4))) for _ in range(60_000)}
    )
    rng.shuffle(vocab)
    weights = 1.0 / np.arange(1, len(vocab) + 1) ** 1.07  # Zipf-like
    cum = np.cumsum(weights / weights.sum())
    nrng = np.random.default_rng(seed)
    lengths = nrng.integers(20, 61, size=n)
    words = np.searchsorted(cum, nrng.random(int(lengths.sum())))
    docs, pos = [], 0
    for length in lengths:
        docs.append(" ".join(vocab[w] for w in words[pos : pos + length]))
        pos += length
    qwords = np.searchsorted(cum, nrng.random(6 * 200) ** 0.5)  # queries lean to rarer words
    queries = [" ".join(vocab[w] for w in qwords[i : i + 6]) for i in range(0, len(qwords), 6)]
    return docs, queries


def rhelm_corpus(root: Path, persona: str) -> tuple[list[str], list[str], list[int], np.ndarray]:
    from memsteer_dspy.loaders.rhelm import load_rhelm

    loaded = load_rhelm(root, persona, external=True)
    units = build_units(loaded.history, MemoryDesign.base_bm25().store)
    first_day = np.array([u.first_day for u in units], dtype=np.int64)
    cutoffs = [q.question_date.toordinal() for q in loaded.qa_items]
    return [u.index_text for u in units], [q.question for q in loaded.qa_items], cutoffs, first_day


def traced(fn):
    """(result, seconds, peak traced MB): timed in one untraced run, memory in a second, traced one
    (tracemalloc slows allocation-heavy code several times over)."""
    gc.collect()
    t0 = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - t0
    gc.collect()
    tracemalloc.start()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    gc.collect()
    return out, seconds, peak / 2**20


def bench(
    name: str, docs: list[str], queries: list[str], *, rank_bm25_queries: int, masks=None
) -> dict:
    from rank_bm25 import BM25Okapi

    params = MemoryDesign.base_bm25().retrieve.bm25
    ours, build_s, build_mb = traced(lambda: BM25Index(params).build(docs))
    tok = ours.tokenize

    t0 = time.perf_counter()
    for q in queries:
        ours.search(q, 10)
    ours_qps = len(queries) / (time.perf_counter() - t0)
    masked_qps = None
    if masks is not None:
        t0 = time.perf_counter()
        for q, m in zip(queries, masks, strict=True):
            ours.search(q, 10, m)
        masked_qps = len(queries) / (time.perf_counter() - t0)

    def build_rank():
        return BM25Okapi([tok(d) for d in docs])

    theirs, rank_build_s, rank_build_mb = traced(build_rank)
    sub = queries[:rank_bm25_queries]
    t0 = time.perf_counter()
    overlap = []
    for q in sub:
        scores = theirs.get_scores(tok(q))
        theirs_top, _ = top_k(np.asarray(scores), 10, None, min_score=0.0)
        ours_top, _ = ours.search(q, 10)
        overlap.append(len(set(theirs_top) & set(ours_top)) / max(1, len(ours_top)))
    rank_qps = len(sub) / (time.perf_counter() - t0)
    # the loop above also ran our search once per query; take that share out of rank_bm25's time
    rank_qps = 1.0 / max(1e-9, 1.0 / rank_qps - 1.0 / ours_qps)
    return {
        "corpus": name,
        "docs": len(docs),
        "queries": len(queries),
        "rank_bm25_queries": len(sub),
        "bm25s_build_s": round(build_s, 3),
        "bm25s_build_peak_mb": round(build_mb, 1),
        "bm25s_qps": round(ours_qps, 1),
        "bm25s_masked_qps": round(masked_qps, 1) if masked_qps else None,
        "rank_bm25_build_s": round(rank_build_s, 3),
        "rank_bm25_build_peak_mb": round(rank_build_mb, 1),
        "rank_bm25_qps": round(rank_qps, 2),
        "query_speed_ratio": round(ours_qps / rank_qps, 1),
        "build_speed_ratio": round(rank_build_s / build_s, 2),
        "top10_overlap": round(float(np.mean(overlap)), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--rhelm",
        type=Path,
        default=Path(__file__).resolve().parents[2] / "shared/benchmarks/rhelm",
    )
    ap.add_argument("--persona", default="Elena_Morales")
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument(
        "--rank-bm25-queries",
        type=int,
        default=20,
        help="queries timed for rank_bm25 on the synthetic corpus",
    )
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    rows = []
    if (args.rhelm / "data").is_dir():
        docs, queries, cutoffs, first_day = rhelm_corpus(args.rhelm, args.persona)
        masks = [first_day < c for c in cutoffs]
        rows.append(
            bench(
                f"RHELM {args.persona} (+external)",
                docs,
                queries,
                rank_bm25_queries=len(queries),
                masks=masks,
            )
        )
    else:
        print(f"RHELM not found at {args.rhelm}; skipping the persona corpus")
    docs, queries = synthetic_corpus(args.records)
    rows.append(
        bench(
            f"synthetic {args.records:,}", docs, queries, rank_bm25_queries=args.rank_bm25_queries
        )
    )

    keys = [k for k in rows[0] if k != "corpus"]
    width = max(len(k) for k in keys)
    print(f"{'':<{width}}  " + "  ".join(f"{r['corpus']:>28}" for r in rows))
    for k in keys:
        print(f"{k:<{width}}  " + "  ".join(f"{str(r[k]):>28}" for r in rows))
    print(f"process peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
