"""Split-half control for the steering panel: how well do the official items agree with themselves?

``memsteer assess --steering`` compares a generated set's ranking of the design panel with the
official items'. This script gives the yardstick: the same measurement with official items in
place of the generated ones — a random ``--size`` of one half (default: the whole half) against
the other half, over ``--draws`` seeded splits. A generated set's τ reads against these numbers at
its own size. LM-free (retrieval only; RHELM and the index cache found as ``systems.py`` finds them).

Usage::

    python experiments/steering_control.py --user Elena_Morales                 # halves
    python experiments/steering_control.py --user Elena_Morales --size 12       # 12 items vs a half
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import resolve_rhelm_args  # noqa: E402

from memsteer_dspy.loaders.rhelm import load_rhelm  # noqa: E402
from memsteer_dspy.supervision.steering import assess_steering  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--user", required=True)
    parser.add_argument("--rhelm-root", type=Path, default=None)
    parser.add_argument("--cache-dir", type=Path, default=None, help="index cache")
    parser.add_argument("--size", type=int, default=None, help="items drawn from the first half")
    parser.add_argument("--draws", type=int, default=5)
    args = parser.parse_args()
    loaded = load_rhelm(resolve_rhelm_args(parser, args), args.user)
    evidenced = [q for q in loaded.qa_items if q.evidence_ids]
    rows = []
    for seed in range(args.draws):
        items = list(evidenced)
        random.Random(seed).shuffle(items)
        half = len(items) // 2
        a, b = items[: args.size or half], items[half:]
        rep = assess_steering(
            loaded.history, a, b, cache_dir=args.cache_dir, reference_source="official half"
        )
        d = rep.agreement["delivered_recall"]
        rows.append(
            {
                "seed": seed,
                "n": [len(a), len(b)],
                "tau": d.kendall_tau,
                "tau_upper": d.kendall_tau_upper,
                "upper": len(d.upper_designs),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    for key in ("tau", "tau_upper"):
        vals = [r[key] for r in rows if r[key] is not None]
        if vals:
            print(
                f"{key}: mean {statistics.mean(vals):+.2f}, range {min(vals):+.2f} .. {max(vals):+.2f}"
            )


if __name__ == "__main__":
    main()
