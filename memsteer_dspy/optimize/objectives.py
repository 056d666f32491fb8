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

from typing import TYPE_CHECKING, Literal, get_args

from pydantic import BaseModel

if TYPE_CHECKING:
    from memsteer_dspy.evaluation import MetricSummary

Objective = Literal["accuracy", "recall", "recall-then-accuracy"]
OBJECTIVES: tuple[str, ...] = get_args(Objective)
_EPS = 1e-9


def unscored_fields(objective: Objective) -> frozenset[str]:
    """The design fields ``objective`` cannot see: under ``recall`` (retrieval only, no answering
    LM) the answer settings change nothing that is scored, so a proposal of them is an identical
    candidate."""
    if objective != "recall":
        return frozenset()
    from memsteer_dspy.memory.design import AnswerSpec

    return frozenset(f"answer.{name}" for name in AnswerSpec.model_fields)


class Score(BaseModel):
    """A design's validation scores (None where not measured)."""

    n: int = 0
    accuracy: float | None = None
    qs: float | None = None
    recall_at_10: float | None = None
    delivered_recall: float | None = None
    errors: int = 0
    metrics: str = "all"

    @classmethod
    def from_summary(cls, summary: MetricSummary, metrics: str) -> Score:
        return cls(
            n=summary.n, accuracy=summary.accuracy, qs=summary.qs, recall_at_10=summary.recall_at_10,
            delivered_recall=summary.delivered_recall, errors=summary.errors, metrics=metrics,
        )  # fmt: skip

    def recall_key(self) -> tuple[float, float]:
        return (self.delivered_recall or 0.0, self.recall_at_10 or 0.0)

    def primary(self, objective: Objective) -> float | None:
        """The number the objective maximizes (delivered recall, or accuracy)."""
        return self.delivered_recall if objective == "recall" else self.accuracy

    def short(self) -> str:
        bits = []
        if self.accuracy is not None:
            bits.append(f"acc {self.accuracy:.3f}")
        if self.qs is not None:
            bits.append(f"QS {self.qs:.3f}")
        if self.delivered_recall is not None:
            bits.append(f"delivered recall {self.delivered_recall:.3f}")
        if self.recall_at_10 is not None:
            bits.append(f"R@10 {self.recall_at_10:.3f}")
        return ", ".join(bits) or "not scored"


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
    return {"accuracy": "accuracy", "recall": "delivered recall (R@10 tie-break)",
            "recall-then-accuracy": "recall screen + accuracy"}[objective]  # fmt: skip
