"""Paired statistics for comparing two memory designs on the same QA items.

Every function takes two equally long per-item score vectors, ``a`` (the reference design, e.g. the
initial one) and ``b`` (the challenger, e.g. the best one found), aligned item by item. A ``None``
in either vector (an item a metric does not apply to, such as recall on an item without evidence)
drops that *pair*; the rest are compared pairwise.

* :func:`paired_bootstrap_ci` — percentile interval of the mean paired difference ``b - a``
  (seeded; 1,000 resamples by default);
* :func:`paired_bootstrap_p` — one-sided bootstrap p-value of "``b`` is no better than ``a``":
  the share of resampled mean differences that are ``<= 0``, as ``(1 + count) / (1 + resamples)``;
  all-zero differences (ties) give p = 1;
* :func:`sign_test_p` — exact one-sided sign test (binomial, p = 1/2) on the items where the two
  differ; ties are left out; no differing item gives p = 1;
* :func:`paired_comparison` — the held-out verdict MemSteer-Opt writes to ``summary.json``: means,
  differences and 95% intervals per metric, and ``better`` / ``worse`` / ``inconclusive`` from the
  primary metric's interval (``better`` iff its lower end is above 0, ``worse`` iff its upper end is
  below 0).

Used by ``memsteer optimize`` (the held-out test split and ``--accept paired``) and
``memsteer evaluate --compare``; other tools (the demo's report, ``memsteer batch``) import
:func:`paired_comparison` to report the same thing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

Verdict = Literal["better", "worse", "inconclusive"]
RESAMPLES = 1000
SEED = 0
LEVEL = 0.95


def paired_differences(a: Sequence[float | None], b: Sequence[float | None]) -> np.ndarray:
    """``b - a`` over the pairs where both are measured (a length mismatch is an error)."""
    if len(a) != len(b):
        raise ValueError(f"paired scores need equally long vectors (got {len(a)} and {len(b)})")
    return np.array(
        [y - x for x, y in zip(a, b, strict=True) if x is not None and y is not None], dtype=float
    )


def _resampled_means(d: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(d), size=(resamples, len(d)))
    return d[idx].mean(axis=1)


def paired_bootstrap_ci(
    a: Sequence[float | None],
    b: Sequence[float | None],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    level: float = LEVEL,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean of ``b - a`` (None without any pair)."""
    d = paired_differences(a, b)
    if len(d) == 0:
        return None
    means = _resampled_means(d, resamples, seed)
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


def paired_bootstrap_p(
    a: Sequence[float | None],
    b: Sequence[float | None],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> float:
    """One-sided p-value that ``b`` is not better than ``a`` on average (1.0 without any pair)."""
    d = paired_differences(a, b)
    if len(d) == 0 or not np.any(d):
        return 1.0
    means = _resampled_means(d, resamples, seed)
    return float((1 + np.count_nonzero(means <= 0)) / (1 + resamples))


def sign_test_p(a: Sequence[float | None], b: Sequence[float | None]) -> float:
    """Exact one-sided sign test: P(at least ``wins`` of ``wins + losses`` fair coin flips), where
    ``wins`` counts items with ``b > a`` and ``losses`` items with ``b < a``; ties are left out."""
    d = paired_differences(a, b)
    wins, losses = int(np.count_nonzero(d > 0)), int(np.count_nonzero(d < 0))
    n = wins + losses
    if n == 0:
        return 1.0
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n


def verdict_of(ci: tuple[float, float] | None) -> Verdict:
    """``better`` when the interval lies above 0, ``worse`` when below, else ``inconclusive``."""
    if ci is None:
        return "inconclusive"
    if ci[0] > 0:
        return "better"
    if ci[1] < 0:
        return "worse"
    return "inconclusive"


class PairedComparison(BaseModel):
    """Two designs on the same items: the ``test`` object of an optimize run's ``summary.json``."""

    n: int = Field(description="Items compared.")
    source: str = Field("", description="Where the items came from (e.g. 'official held-out').")
    primary: str = Field(description="The metric the verdict follows.")
    initial: dict[str, float | None] = Field(description="Metric -> mean of the reference design.")
    best: dict[str, float | None] = Field(description="Metric -> mean of the challenger.")
    diff: dict[str, float | None] = Field(
        description="Metric -> mean paired difference (best - initial)."
    )
    ci95: dict[str, list[float] | None] = Field(
        description="Metric -> [low, high] bootstrap interval of diff."
    )
    n_pairs: dict[str, int] = Field(default_factory=dict, description="Metric -> pairs measured.")
    p_bootstrap: float = Field(
        1.0, description="Primary metric: one-sided bootstrap p (best not better)."
    )
    p_sign: float = Field(1.0, description="Primary metric: exact one-sided sign-test p.")
    verdict: Verdict = "inconclusive"
    resamples: int = RESAMPLES
    seed: int = SEED
    level: float = LEVEL


def points(d: float | None, empty: str = "–") -> str:
    """A difference of fractions in signed points (``+4.2``)."""
    return empty if d is None else f"{100 * d:+.1f}"


def points_ci(ci: Sequence[float] | None, empty: str = "–") -> str:
    """An interval of fractions in signed points (``[+1.0, +7.5]``)."""
    return empty if not ci else f"[{points(ci[0])}, {points(ci[1])}]"


def _mean(v: Sequence[float | None]) -> float | None:
    vals = [x for x in v if x is not None]
    return sum(vals) / len(vals) if vals else None


def paired_comparison(
    initial_scores: Mapping[str, Sequence[float | None]],
    best_scores: Mapping[str, Sequence[float | None]],
    primary_metric: str,
    *,
    source: str = "",
    resamples: int = RESAMPLES,
    seed: int = SEED,
    level: float = LEVEL,
) -> PairedComparison:
    """Compare two designs metric by metric on the same items (vectors aligned item by item).

    ``initial_scores`` and ``best_scores`` map a metric name (``recall_at_10``,
    ``delivered_recall``, ``accuracy``, ...) to per-item scores; the verdict follows
    ``primary_metric``'s interval. Means are over each design's measured items; differences and
    intervals over the pairs measured under both.
    """
    if primary_metric not in initial_scores or primary_metric not in best_scores:
        raise ValueError(f"primary metric {primary_metric!r} is not among the scores given")
    metrics = [m for m in initial_scores if m in best_scores]
    n = max((len(initial_scores[m]) for m in metrics), default=0)
    out = PairedComparison(
        n=n,
        source=source,
        primary=primary_metric,
        initial={},
        best={},
        diff={},
        ci95={},
        resamples=resamples,
        seed=seed,
        level=level,
    )
    for m in metrics:
        a, b = initial_scores[m], best_scores[m]
        d = paired_differences(a, b)
        ci = paired_bootstrap_ci(a, b, resamples=resamples, seed=seed, level=level)
        out.initial[m], out.best[m] = _mean(a), _mean(b)
        out.diff[m] = float(d.mean()) if len(d) else None
        out.ci95[m] = list(ci) if ci is not None else None
        out.n_pairs[m] = len(d)
    a, b = initial_scores[primary_metric], best_scores[primary_metric]
    out.p_bootstrap = paired_bootstrap_p(a, b, resamples=resamples, seed=seed)
    out.p_sign = sign_test_p(a, b)
    ci = out.ci95[primary_metric]
    out.verdict = verdict_of(tuple(ci) if ci is not None else None)
    return out


RECALL_METRICS = ("recall_at_10", "delivered_recall")


def compare_item_results(
    initial_items: Sequence[object],
    best_items: Sequence[object],
    *,
    answered: bool,
    primary: str | None = None,
    source: str = "",
    seed: int = SEED,
    resamples: int = RESAMPLES,
) -> PairedComparison:
    """:func:`paired_comparison` of two designs' per-item evaluation results (objects with
    ``qa_id``, ``recall_at_10``, ``delivered_recall`` and, when ``answered``, ``correct``), paired
    by ``qa_id`` in the order of ``initial_items``. ``primary`` defaults to ``accuracy`` when
    answers were scored, else ``delivered_recall``."""
    names = [*RECALL_METRICS, *(["accuracy"] if answered else [])]
    primary = primary or ("accuracy" if answered else "delivered_recall")
    by_id = {getattr(r, "qa_id"): r for r in best_items}  # noqa: B009
    ids = [getattr(r, "qa_id") for r in initial_items]  # noqa: B009

    def value(r: object | None, m: str) -> float | None:
        if r is None:
            return None
        return float(bool(getattr(r, "correct"))) if m == "accuracy" else getattr(r, m)  # noqa: B009

    a = {m: [value(r, m) for r in initial_items] for m in names}
    b = {m: [value(by_id.get(i), m) for i in ids] for m in names}
    return paired_comparison(a, b, primary, source=source, seed=seed, resamples=resamples)
