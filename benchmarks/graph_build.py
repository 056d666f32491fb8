"""Record-graph build time: one RHELM persona, and a synthetic 100,000-record history.

Usage::

    python benchmarks/graph_build.py                       # Elena_Morales (external on) + 100k
    python benchmarks/graph_build.py --persona Jonas_Richter --synthetic 20000
    python benchmarks/graph_build.py --no-rhelm --synthetic 100000

Prints, for each history, the records, edges by type, seconds per build phase and in total, and
the peak resident memory of the process; writes nothing. The synthetic history has threads of
8 turns with Zipf-distributed vocabulary (5,000 words), names, numbers and dates, and document
sections with headings that other records mention, so every edge kind occurs.
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from memsteer_dspy.graph import GraphParams, RecordGraph  # noqa: E402
from memsteer_dspy.records import History, Record  # noqa: E402


def synthetic_history(n: int, seed: int = 0) -> History:
    """``n`` records: conversation threads of 8 turns and documents of 6 sections."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(5000)]
    weights = [1.0 / (i + 1) for i in range(len(vocab))]
    names = [f"Person{i}" for i in range(300)]
    titles = [f"Project Atlas{i} Plan" for i in range(n // 60 + 1)]
    start = datetime(2024, 1, 1)
    records: list[Record] = []
    thread = 0
    while len(records) < n:
        thread += 1
        is_doc = thread % 5 == 0
        size = 6 if is_doc else 8
        title = titles[thread % len(titles)]
        for pos in range(size):
            if len(records) >= n:
                break
            words = rng.choices(vocab, weights=weights, k=rng.randint(30, 90))
            words.insert(rng.randrange(len(words)), rng.choice(names))
            words.insert(rng.randrange(len(words)), str(rng.randint(2, 500)))
            if rng.random() < 0.05:
                words.append(f"see {titles[rng.randrange(len(titles))]} part {rng.randrange(6)}")
            text = " ".join(words) + "."
            ts = start + timedelta(minutes=len(records) * 7)
            records.append(
                Record(
                    id=f"t{thread}:{pos}",
                    kind="document_section" if is_doc else "conversation_turn",
                    text=text,
                    timestamp=ts,
                    thread_id=f"t{thread}",
                    position=pos,
                    metadata={"heading": f"{title} part {pos}"} if is_doc else {},
                )
            )
    return History("synthetic", records)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def report(label: str, history: History, params: GraphParams) -> None:
    t0 = time.perf_counter()
    graph = RecordGraph.build(history, params)
    total = time.perf_counter() - t0
    phases = ", ".join(f"{k} {v:.2f}s" for k, v in graph.stats.seconds.items())
    print(f"{label}: {len(history)} records, edges {graph.edge_counts()}")
    print(f"  build {total:.2f}s ({phases}); peak RSS {peak_rss_mb():.0f} MB")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--persona", default="Elena_Morales")
    ap.add_argument(
        "--rhelm",
        type=Path,
        default=Path(__file__).resolve().parents[2] / "shared/benchmarks/rhelm",
    )
    ap.add_argument("--no-rhelm", action="store_true")
    ap.add_argument("--synthetic", type=int, default=100_000)
    args = ap.parse_args()
    params = GraphParams()
    if not args.no_rhelm:
        from memsteer_dspy.loaders.rhelm import load_rhelm

        t0 = time.perf_counter()
        loaded = load_rhelm(args.rhelm, args.persona, external=True)
        print(f"loaded {args.persona} in {time.perf_counter() - t0:.2f}s")
        report(f"RHELM {args.persona} (external on)", loaded.history, params)
    if args.synthetic:
        t0 = time.perf_counter()
        history = synthetic_history(args.synthetic)
        print(f"generated synthetic history in {time.perf_counter() - t0:.2f}s")
        report(f"synthetic {args.synthetic}", history, params)


if __name__ == "__main__":
    main()
