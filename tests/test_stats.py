"""Paired statistics: hand-computed small cases and verdicts on constructed score vectors."""

from __future__ import annotations

import random

import pytest

from memsteer_dspy.stats import (
    paired_bootstrap_ci,
    paired_bootstrap_p,
    paired_comparison,
    paired_differences,
    sign_test_p,
    verdict_of,
)


def test_sign_test_hand_computed():
    # 5 wins, 0 losses: (1/2)^5
    assert sign_test_p([0] * 5, [1] * 5) == pytest.approx(1 / 32)
    # 4 wins, 1 loss: (C(5,4) + C(5,5)) / 32 = 6/32
    assert sign_test_p([0, 0, 0, 0, 1], [1, 1, 1, 1, 0]) == pytest.approx(6 / 32)
    # ties are left out: 2 wins, 0 losses, 3 ties -> 1/4
    assert sign_test_p([0, 0, 1, 1, 0.5], [1, 1, 1, 1, 0.5]) == pytest.approx(1 / 4)
    # 1 win, 2 losses: P(X >= 1 | n=3) = 7/8
    assert sign_test_p([0, 1, 1], [1, 0, 0]) == pytest.approx(7 / 8)
    assert sign_test_p([1, 1], [1, 1]) == 1.0


def test_pairs_with_a_missing_score_are_dropped():
    d = paired_differences([0.5, None, 1.0, 0.0], [1.0, 1.0, None, 0.0])
    assert d.tolist() == [0.5, 0.0]
    with pytest.raises(ValueError, match="equally long"):
        paired_differences([1.0], [1.0, 2.0])


def test_bootstrap_interval_of_a_constant_difference_is_that_constant():
    assert paired_bootstrap_ci([0.2, 0.4, 0.1], [0.5, 0.7, 0.4]) == pytest.approx((0.3, 0.3))
    assert paired_bootstrap_ci([None], [1.0]) is None


def test_bootstrap_two_item_case_matches_its_distribution():
    # d = [1, 0]: a resample's mean is 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4, so the
    # 2.5% and 97.5% quantiles are 0 and 1, and P(mean <= 0) is about 1/4.
    low, high = paired_bootstrap_ci([0, 0], [1, 0], resamples=4000, seed=3)
    assert (low, high) == (0.0, 1.0)
    p = paired_bootstrap_p([0, 0], [1, 0], resamples=4000, seed=3)
    assert 0.22 < p < 0.28


def test_bootstrap_is_seeded():
    rng = random.Random(1)
    a = [rng.random() for _ in range(30)]
    b = [x + rng.gauss(0, 0.2) for x in a]
    assert paired_bootstrap_ci(a, b, seed=7) == paired_bootstrap_ci(a, b, seed=7)
    assert paired_bootstrap_p(a, b, seed=7) == paired_bootstrap_p(a, b, seed=7)


def test_ties_give_p_one():
    assert paired_bootstrap_p([0.3, 0.6], [0.3, 0.6]) == 1.0


def _vectors(shift: float, noise: float, n: int = 60, seed: int = 0):
    rng = random.Random(seed)
    a = [rng.choice([0.0, 0.5, 1.0]) for _ in range(n)]
    b = [min(1.0, max(0.0, x + shift + rng.gauss(0, noise))) for x in a]
    return a, b


def test_verdict_clear_win():
    a, b = _vectors(0.3, 0.05)
    c = paired_comparison(
        {"delivered_recall": a, "recall_at_10": a},
        {"delivered_recall": b, "recall_at_10": b},
        "delivered_recall",
        source="constructed",
    )
    assert c.verdict == "better" and c.n == 60 and c.source == "constructed"
    assert c.ci95["delivered_recall"][0] > 0 and c.diff["delivered_recall"] > 0.1
    assert c.p_bootstrap < 0.01 and c.p_sign < 0.01
    assert (
        set(c.initial)
        == set(c.best)
        == set(c.diff)
        == set(c.ci95)
        == {"delivered_recall", "recall_at_10"}
    )


def test_verdict_clear_loss():
    a, b = _vectors(-0.3, 0.05)
    c = paired_comparison({"delivered_recall": a}, {"delivered_recall": b}, "delivered_recall")
    assert c.verdict == "worse" and c.ci95["delivered_recall"][1] < 0
    assert c.p_bootstrap > 0.99 and c.p_sign > 0.99


def test_verdict_noise_is_inconclusive():
    rng = random.Random(1)
    a = [rng.choice([0.0, 1.0]) for _ in range(40)]
    b = [x if rng.random() < 0.7 else 1 - x for x in a]  # symmetric flips: no true difference
    flips_up = sum(y > x for x, y in zip(a, b, strict=True))
    flips_down = sum(y < x for x, y in zip(a, b, strict=True))
    assert abs(flips_up - flips_down) <= 3  # the constructed vector really is noise
    c = paired_comparison({"accuracy": a}, {"accuracy": b}, "accuracy")
    low, high = c.ci95["accuracy"]
    assert low < 0 < high and c.verdict == "inconclusive" and c.p_bootstrap > 0.1


def test_verdict_follows_the_primary_metric_and_needs_it():
    a, b = _vectors(0.3, 0.05)
    c = paired_comparison({"x": a, "y": b}, {"x": b, "y": a}, "y")
    assert c.verdict == "worse" and c.diff["x"] > 0
    with pytest.raises(ValueError, match="primary metric"):
        paired_comparison({"x": a}, {"x": b}, "accuracy")
    assert verdict_of(None) == "inconclusive"


def test_a_metric_missing_on_every_pair_is_reported_as_none():
    c = paired_comparison(
        {"accuracy": [None, None], "recall_at_10": [0, 1]},
        {"accuracy": [None, None], "recall_at_10": [0, 1]},
        "recall_at_10",
    )
    assert (
        c.initial["accuracy"] is None and c.ci95["accuracy"] is None and c.n_pairs["accuracy"] == 0
    )
    assert c.ci95["recall_at_10"] == [0.0, 0.0] and c.verdict == "inconclusive"
