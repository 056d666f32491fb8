"""Span splitting speed: characters per second of ``split_spans`` on one line of 10k → 1M
characters with no newline (the shape that hung ``ingest``), against the same text with a newline
every 10 sentences, and against the previous (quadratic) sentence cutter where it finishes in time;
then ingest of a large JSONL history: seconds and peak memory as a multiple of the file size.

Usage:
    python benchmarks/span_split_speed.py [--max-chars 1000000] [--records 20000] [--out FILE.json]

Prints a table (chars/s per size, and the ratio of the largest to the smallest size: about 1.0 for
a linear splitter, growing with the size for a quadratic one) and, with ``--out``, the numbers as JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import tempfile
import time
import tracemalloc
from pathlib import Path

from memsteer_dspy import records
from memsteer_dspy.records import split_spans

WORDS = (
    'Dr. Liu met J. Smith at 5 p.m. e.g. we went home version 3.5 costs $12.50 "quoted." (aside)'
    " Yes! Why? U.S. ok. Then The A"
).split()


def prose(n_chars: int, seed: int = 0, newline_every: int | None = None) -> str:
    rng = random.Random(seed)
    out, size, sentences = [], 0, 0
    while size < n_chars:
        w = rng.choice(WORDS)
        if rng.random() < 0.15:
            w += "."
            sentences += 1
            if newline_every and sentences % newline_every == 0:
                w += "\n"
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n_chars]


def _old_cuts(line: str) -> list[int]:
    """The sentence cutter before the linear rewrite (re-scans the prefix at every boundary)."""
    cuts = []
    for m in records._BOUNDARY.finditer(line):
        head = line[: m.start()].rstrip("\"')]")
        word = records._LAST_WORD.search(head)
        if word and (word.group(1).lower() in records._ABBREVIATIONS or len(word.group(1)) == 1):
            continue
        cuts.append(m.end())
    return cuts


def timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-chars", type=int, default=1_000_000)
    ap.add_argument(
        "--old-limit", type=int, default=100_000, help="largest size timed with the old cutter"
    )
    ap.add_argument(
        "--records", type=int, default=20_000, help="records in the ingest benchmark (0: skip)"
    )
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    sizes = [
        s for s in (10_000, 30_000, 100_000, 300_000, 1_000_000, 3_000_000) if s <= args.max_chars
    ]
    rows = []
    print(f"{'chars':>10} {'one line c/s':>14} {'newlines c/s':>14} {'old cutter c/s':>15}")
    for n in sizes:
        line = prose(n, seed=n)
        broken = prose(n, seed=n, newline_every=10)
        t_line = timed(split_spans, "r", line)
        t_broken = timed(split_spans, "r", broken)
        t_old = timed(_old_cuts, line) if n <= args.old_limit else None
        t_new_cuts = timed(records._sentence_cuts, line) if t_old is not None else None
        row = {
            "chars": n,
            "one_line_cps": n / t_line,
            "newlines_cps": n / t_broken,
            "old_cutter_cps": n / t_old if t_old else None,
            "cutter_speedup": t_old / t_new_cuts if t_old and t_new_cuts else None,
        }
        rows.append(row)
        old = f"{row['old_cutter_cps']:>15,.0f}" if row["old_cutter_cps"] else f"{'(skipped)':>15}"
        print(f"{n:>10,} {row['one_line_cps']:>14,.0f} {row['newlines_cps']:>14,.0f} {old}")
    ratio = rows[-1]["one_line_cps"] / rows[0]["one_line_cps"]
    print(f"chars/s at {rows[-1]['chars']:,} / at {rows[0]['chars']:,}: {ratio:.2f} (1.0 = linear)")
    timed_old = [r for r in rows if r["cutter_speedup"]]
    if timed_old:
        r = timed_old[-1]
        print(
            f"sentence cutter at {r['chars']:,} chars: {r['cutter_speedup']:.0f}x faster than the old one"
        )
    result = {"split": rows, "linearity_ratio": ratio}

    if args.records:
        from memsteer_dspy.loaders import load_history

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "history.jsonl"
            with open(path, "w", encoding="utf-8") as fh:
                for i in range(args.records):
                    fh.write(
                        json.dumps({"id": f"r{i}", "kind": "note", "text": prose(500, seed=i)})
                        + "\n"
                    )
            size = path.stat().st_size
            gc.collect()
            tracemalloc.start()
            t0 = time.perf_counter()
            report = load_history("jsonl", path).report()
            seconds = time.perf_counter() - t0
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        print(
            f"ingest {args.records:,} records ({size / 1e6:.1f} MB, {report['spans']:,} spans): {seconds:.1f}s "
            f"(under tracemalloc), peak traced memory {peak / 1e6:.0f} MB = {peak / size:.1f}x the file"
        )
        result["ingest"] = {
            "records": args.records,
            "bytes": size,
            "seconds_traced": seconds,
            "peak_bytes": peak,
            "peak_over_file": peak / size,
        }
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
