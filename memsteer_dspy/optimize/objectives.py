"""What MemSteer-Opt maximizes on the fixed validation set, and the accept rule.

* ``accuracy`` (default) — the paper's binary validation accuracy A(d); a candidate d' replaces
  the current design d_t only if A(d') > A(d_t) (ties are rejected).
* ``recall`` — delivered recall on validation (the gold evidence that reaches the answerer within
  the fixed context budget), R@10 breaking ties; no answering LM, so a fast screen.
* ``recall-then-accuracy`` — a candidate whose recall is worse than the current design's is
  screened out without answering; the others are answered and judged, and accepted only if their
  accuracy is strictly higher (the paper's rule, behind a cheap screen).
"""

from __future__ import annotations

from typing import get_args

from memsteer_dspy.memory.design import AnswerSpec
from memsteer_dspy.optimize.types import Objective, Score

__all__ = [
    "OBJECTIVES",
    "Objective",
    "Score",
    "accept",
    "at_ceiling",
    "metrics_for",
    "passes_screen",
    "recall_better",
    "recall_not_worse",
    "selected_by",
    "unscored_fields",
]

OBJECTIVES: tuple[str, ...] = get_args(Objective)
_EPS = 1e-9


def unscored_fields(objective: Objective) -> frozenset[str]:
    """The design fields ``objective`` cannot see: under ``recall`` (retrieval only, no answering
    LM) the answer settings change nothing that is scored, so a proposal of them is an identical
    candidate."""
    if objective != "recall":
        return frozenset()
    return frozenset(f"answer.{name}" for name in AnswerSpec.model_fields)


def metrics_for(objective: Objective) -> str:
    """The evaluation metrics the objective needs for its final decision ('recall' or 'all')."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    return "recall" if objective == "recall" else "all"


def _gt(a: float | None, b: float | None) -> bool:
    return a is not None and (b is None or a > b + _EPS)


def recall_better(candidate: Score, current: Score) -> bool:
    """Strictly better delivered recall, or equal delivered recall and strictly better R@10."""
    (cd, cr), (bd, br) = candidate.recall_key(), current.recall_key()
    if cd > bd + _EPS:
        return True
    return abs(cd - bd) <= _EPS and cr > br + _EPS


def recall_not_worse(candidate: Score, current: Score) -> bool:
    return not recall_better(current, candidate)


def at_ceiling(objective: Objective, score: Score | None) -> bool:
    """Whether ``score`` is the most the objective can give, so that no candidate can be accepted.

    Every accept rule asks for a strict gain on validation (``paired``: a positive mean gain), so
    a design that scores the maximum there (delivered recall and R@10 both 1.0 under ``recall``;
    accuracy 1.0 otherwise) cannot be beaten on those items, whatever is proposed.
    """
    if score is None:
        return False
    if objective == "recall":
        dr, r10 = score.delivered_recall, score.recall_at_10
        return dr is not None and dr >= 1.0 - _EPS and (r10 is None or r10 >= 1.0 - _EPS)
    return score.accuracy is not None and score.accuracy >= 1.0 - _EPS


def passes_screen(objective: Objective, candidate: Score, current: Score) -> bool:
    """``recall-then-accuracy``: whether the candidate goes on to be answered and judged."""
    return objective != "recall-then-accuracy" or recall_not_worse(candidate, current)


def accept(objective: Objective, candidate: Score, current: Score) -> bool:
    """The accept rule: is ``candidate`` strictly better than ``current``? Ties are rejected."""
    if objective == "recall":
        return recall_better(candidate, current)
    if objective == "recall-then-accuracy" and not recall_not_worse(candidate, current):
        return False
    return _gt(candidate.accuracy, current.accuracy)


def selected_by(objective: Objective) -> str:
    """What decided an accepted design, as reported in the trajectory and summary."""
    return {
        "accuracy": "accuracy",
        "recall": "delivered recall (R@10 tie-break)",
        "recall-then-accuracy": "recall screen + accuracy",
    }[objective]
