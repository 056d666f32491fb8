"""The optimizer's data types and protocols: a leaf module that imports no sibling, so nothing
can import in a circle through it (as GEPA's ``proposer/base.py``).

* the scores and costs a candidate carries: :class:`Score`, :class:`Cost`;
* what a proposer produces and reads: :class:`Proposal`, :class:`ProposalAttempt`,
  :class:`RevisionEntry`, and the design-change vocabulary (:func:`design_diff`,
  :func:`single_change`, :data:`COUPLED`);
* what an accept rule and a parent selector see: :class:`Candidate`, :class:`Decision`;
* what the run records: :class:`TrajectoryEntry` (one line of ``trajectory.jsonl``) and
  :class:`OptimizeResult`;
* the protocols the engine is written over: :class:`Evaluator`, :class:`Proposer`,
  :class:`AcceptRule`, :class:`ParentSelector`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from memsteer_dspy.evaluation import EvaluationReport, MetricSummary
from memsteer_dspy.memory.design import MemoryDesign
from memsteer_dspy.records import QAItem
from memsteer_dspy.stats import PairedComparison
from memsteer_dspy.tokens import truncate_to_tokens

Objective = Literal["accuracy", "recall", "recall-then-accuracy"]
Status = Literal["baseline", "accepted", "rejected", "invalid", "duplicate", "failed"]
USAGE_KEYS = ("calls", "prompt_tokens", "completion_tokens", "total_tokens")
RATIONALE_TOKENS = 70


# --------------------------------------------------------------------------------------------
# scores and costs
# --------------------------------------------------------------------------------------------


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
            n=summary.n,
            accuracy=summary.accuracy,
            qs=summary.qs,
            recall_at_10=summary.recall_at_10,
            delivered_recall=summary.delivered_recall,
            errors=summary.errors,
            metrics=metrics,
        )

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


class Cost(BaseModel):
    """LM calls and tokens (per role and in total) and wall time."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    seconds: float = 0.0
    cost_usd: float | None = Field(
        None, description="Dollars by LiteLLM's bundled price map; None while no call was priced."
    )
    by_role: dict[str, dict[str, Any]] = Field(default_factory=dict)

    def plus(self, other: Cost) -> Cost:
        roles = {r: dict(v) for r, v in self.by_role.items()}
        for r, v in other.by_role.items():
            mine = roles.setdefault(r, dict.fromkeys(USAGE_KEYS, 0))
            for k in USAGE_KEYS:
                mine[k] = mine.get(k, 0) + v.get(k, 0)
            if v.get("cost_usd") is not None:
                mine["cost_usd"] = (mine.get("cost_usd") or 0.0) + v["cost_usd"]
        return Cost(
            calls=self.calls + other.calls,
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
            seconds=round(self.seconds + other.seconds, 3),
            cost_usd=_add_usd(self.cost_usd, other.cost_usd),
            by_role=roles,
        )

    def short(self) -> str:
        usd = f", ${self.cost_usd:.4f}" if self.cost_usd is not None else ""
        return f"{self.calls} LM calls, {self.total_tokens:,} tokens{usd}, {self.seconds:.0f}s"


def _add_usd(a: float | None, b: float | None) -> float | None:
    """Dollar sums where an unpriced part (None) is not a price of zero: None only if both are."""
    return None if a is None and b is None else (a or 0.0) + (b or 0.0)


def usage_delta(
    before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]]
) -> Cost:
    """The LM usage between two snapshots (role -> calls, tokens, dollars) as a :class:`Cost`."""
    roles: dict[str, dict[str, int]] = {}
    for role, now in after.items():
        was = before.get(role, {})
        d: dict[str, Any] = {
            k: int(now.get(k, 0) or 0) - int(was.get(k, 0) or 0) for k in USAGE_KEYS
        }
        if now.get("cost_usd") is not None:
            d["cost_usd"] = float(now["cost_usd"]) - float(was.get("cost_usd") or 0.0)
        if any(d.values()):
            roles[role] = d
    usd = [r["cost_usd"] for r in roles.values() if r.get("cost_usd") is not None]
    return Cost(
        **{k: sum(r[k] for r in roles.values()) for k in USAGE_KEYS},
        cost_usd=sum(usd) if usd else None,
        by_role=roles,
    )


# --------------------------------------------------------------------------------------------
# design changes
# --------------------------------------------------------------------------------------------


# Fields that only make sense together: a switch and the settings that act under it, and the
# top-k / pool pair (pool >= top_k). A sub-change moves each such group as one.
COUPLED: tuple[tuple[str, ...], ...] = (
    (
        "store.unit",
        "store.window_size",
        "store.window_stride",
        "store.section_max_tokens",
        "store.facts_batch",
        "store.max_facts_per_record",
    ),
    ("retrieve.top_k", "retrieve.pool"),
    ("retrieve.query", "retrieve.keep_original_query", "retrieve.n_queries"),
    ("retrieve.rerank", "retrieve.reranker_model", "retrieve.rerank_top"),
    (
        "retrieve.index",
        "retrieve.bm25_weight",
        "retrieve.dense_weight",
        "retrieve.dense.embedder",
        "retrieve.dense.backend",
        "retrieve.dense.query_instruction",
        "retrieve.dense.max_chars",
    ),
)


def flat_fields(obj: Any, prefix: str = "") -> dict[str, Any]:
    """A nested dict as dotted paths -> leaf values (``{"retrieve.top_k": 20, ...}``)."""
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(flat_fields(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: obj}


def design_diff(before: MemoryDesign, after: MemoryDesign) -> list[str]:
    """What changed, one ``path: old -> new`` per field (the name is not part of a design)."""
    a, b = flat_fields(before.model_dump(mode="json")), flat_fields(after.model_dump(mode="json"))
    out = []
    for k in sorted(set(a) | set(b)):
        if k == "name" or a.get(k) == b.get(k):
            continue
        out.append(f"{k}: {json.dumps(a.get(k))} -> {json.dumps(b.get(k))}")
    return out


def single_change(changes: list[str]) -> tuple[str, Any] | None:
    """The one change a ``design_diff`` list makes, as (field, new value), when it changes one
    field or one coupled group (a switch with its settings: the switch names it, e.g.
    ``("store.unit", "window")`` for a window of any size); None for several changes or a line
    that does not parse."""
    new: dict[str, Any] = {}
    for line in changes:
        field, sep, rest = line.partition(": ")
        _, arrow, value = rest.rpartition(" -> ")
        if not sep or not arrow:
            return None
        try:
            new[field.strip()] = json.loads(value)
        except json.JSONDecodeError:
            return None
    groups = {next((g for g in COUPLED if f in g), (f,)) for f in new}
    if len(groups) != 1:
        return None
    (group,) = groups
    label = next(f for f in group if f in new)
    return label, new[label]


# --------------------------------------------------------------------------------------------
# proposals
# --------------------------------------------------------------------------------------------


class RevisionEntry(BaseModel):
    """One earlier proposal as the proposer sees it in the revision history."""

    iteration: int
    status: str = Field(description="baseline, accepted, rejected, invalid, duplicate or failed.")
    changes: list[str] = Field(default_factory=list)
    score: str = ""
    rationale: str = ""
    note: str = ""
    tried_alone: list[str] | None = Field(
        None,
        description="Fields whose single-field sub-change was screened (a rejected multi-field "
        "proposal); None: not screened, so every changed field counts as tried.",
    )
    rejected_alone: list[tuple[str, Any]] = Field(
        default_factory=list,
        description="(field, value) changes this entry rejected on their own: a rejected "
        "single-change proposal, or a rejected single-field sub-change screen (the tabu list).",
    )

    def render(self) -> str:
        head = f"- iteration {self.iteration}: {self.status.upper()}"
        if self.score:
            head += f" ({self.score})"
        lines = [head]
        if self.changes:
            lines.append("  changes: " + "; ".join(self.changes))
        if self.rationale:
            lines.append(
                "  rationale: "
                + truncate_to_tokens(self.rationale, RATIONALE_TOKENS).replace("\n", " ")
            )
        if self.note:
            lines.append("  note: " + self.note)
        return "\n".join(lines)


class ProposalAttempt(BaseModel):
    """One call of the proposer LM within an iteration."""

    kind: Literal["ok", "invalid", "duplicate", "error"]
    error: str | None = None
    duplicate_of: str | None = Field(
        None, description="The earlier candidate it equals (e.g. 'iteration 3, rejected')."
    )
    design_key: str | None = None
    rollout_id: int | None = None
    temperature: float | None = None
    seconds: float = 0.0
    raw: str | None = Field(None, description="The reply, when it could not be parsed as a design.")
    notes: list[str] = Field(default_factory=list)


class Proposal(BaseModel):
    """What the proposer produced in one iteration."""

    status: Literal["ok", "invalid", "duplicate", "failed"]
    design: MemoryDesign | None = None
    rationale: str = ""
    attempts: list[ProposalAttempt] = Field(default_factory=list)
    error: str | None = None
    search_params: dict[str, Any] | None = Field(
        None, description="random/tpe: the sampled parameters and their distributions."
    )


# --------------------------------------------------------------------------------------------
# candidates, decisions, the trajectory
# --------------------------------------------------------------------------------------------


@dataclass
class Candidate:
    """A scored design as accept rules and parent selectors see it."""

    iteration: int
    design: MemoryDesign
    score: Score
    item_ids: list[str] = field(default_factory=list)
    item_scores: list[float | None] = field(default_factory=list)
    retrieval_lm_calls: float = 0.0
    item_metrics: dict[str, list[float | None]] = field(default_factory=dict)

    @property
    def uses_lm(self) -> bool:
        return self.retrieval_lm_calls > 0


@dataclass
class Decision:
    accepted: bool
    reason: str = ""
    stats: dict[str, Any] = field(default_factory=dict)


class TrajectoryEntry(BaseModel):
    """One finished iteration (0: the initial design d0)."""

    iteration: int
    status: Status
    accepted: bool
    design: dict[str, Any] | None = None
    design_key: str | None = None
    parent_key: str | None = Field(None, description="Key of the design this one revised.")
    changes: list[str] = Field(default_factory=list)
    rationale: str = ""
    score: Score | None = Field(None, description="Validation score under the objective's metrics.")
    screen_score: Score | None = Field(None, description="recall-then-accuracy: the recall screen.")
    best_key: str = ""
    best_score: Score | None = None
    selected_by: str | None = None
    reason: str | None = Field(
        None, description="Why it was rejected, invalid, a duplicate or failed."
    )
    attempts: list[ProposalAttempt] = Field(default_factory=list)
    train_failures: dict[str, int] | None = Field(
        None, description="Failures per stage after a train refresh."
    )
    cost: Cost = Field(default_factory=Cost)
    cost_total: Cost = Field(default_factory=Cost)
    run_id: str | None = None
    finished_at: str = ""
    parent_iteration: int | None = Field(
        None, description="The iteration whose design this one revised."
    )
    accept_stats: dict[str, Any] | None = Field(
        None, description="The accept rule's statistic (paired: p, gain, wins, losses)."
    )
    retrieval_lm_calls: int | None = Field(
        None, description="LM calls per question at retrieval time."
    )
    search_params: dict[str, Any] | None = Field(
        None, description="random/tpe: the sampled parameters."
    )
    sub_screens: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Single-field sub-changes of a rejected proposal, each scored.",
    )
    tried_alone: list[str] | None = Field(
        None, description="Fields whose sub-change was screened on its own."
    )

    def revision(self) -> RevisionEntry:
        """How the proposer sees this entry in the revision history."""
        score = (
            self.score.short()
            if self.score
            else (self.screen_score.short() if self.screen_score else "")
        )
        note = self.reason or ""
        if self.status == "baseline":
            note = "the initial design"
        tabu = [self.changes] if self.status == "rejected" else []
        tabu += [
            sc.get("changes") or [] for sc in self.sub_screens if sc.get("status") == "rejected"
        ]
        alone = [c for c in map(single_change, tabu) if c is not None]
        return RevisionEntry(
            iteration=self.iteration,
            status=self.status,
            changes=self.changes,
            score=score,
            rationale=self.rationale,
            note=note,
            tried_alone=self.tried_alone,
            rejected_alone=alone,
        )


class OptimizeResult(BaseModel):
    best_design: MemoryDesign
    best_score: Score
    baseline_score: Score
    entries: list[TrajectoryEntry]
    out_dir: str
    parent_run_id: str | None = None
    tracking_uri: str | None = None
    test: PairedComparison | None = Field(
        None,
        description="Initial vs best design on the held-out test items (None without a test split).",
    )
    best_iteration: int = 0
    stopped: str | None = Field(
        None, description="Why the loop ended before its last iteration (None: it ran them all)."
    )

    @property
    def accepted_path(self) -> list[int]:
        return [e.iteration for e in self.entries if e.accepted]

    def summary(self) -> dict[str, Any]:
        """``summary.json``: the result in machine-readable form (``test`` as in the issue)."""
        total = self.entries[-1].cost_total if self.entries else Cost()
        return {
            "out": self.out_dir,
            "iterations": len(self.entries) - 1,
            "accepted_path": self.accepted_path,
            "best_iteration": self.best_iteration,
            "best_design_key": self.best_design.key(),
            "initial": self.baseline_score.model_dump(),
            "best": self.best_score.model_dump(),
            "cost": total.model_dump(),
            "tracking_uri": self.tracking_uri,
            "mlflow_parent_run_id": self.parent_run_id,
            "test": self.test.model_dump(mode="json") if self.test is not None else None,
            "stopped": self.stopped,
            "candidates": [
                {
                    "iteration": e.iteration,
                    "status": e.status,
                    "design_key": e.design_key,
                    "parent_iteration": e.parent_iteration,
                    "score": (e.score or e.screen_score).model_dump()
                    if (e.score or e.screen_score)
                    else None,
                    "retrieval_lm_calls": e.retrieval_lm_calls,
                    "accept_stats": e.accept_stats,
                    "lm_calls": e.cost.calls,
                    "tokens": e.cost.total_tokens,
                    "seconds": e.cost.seconds,
                }
                for e in self.entries
            ],
        }


# --------------------------------------------------------------------------------------------
# protocols
# --------------------------------------------------------------------------------------------


@runtime_checkable
class Evaluator(Protocol):
    """Builds ``design`` and scores it on ``items`` (``metrics``: 'recall' or 'all'); per-item
    results go to ``folder/items.jsonl``, and a rerun with the same design resumes from them.
    Returns the system (whatever failure diagnosis needs: ``user_history``, ``design``,
    ``lookup(record_id, ...)``) and an :class:`~memsteer_dspy.evaluation.EvaluationReport`."""

    def evaluate(
        self, design: MemoryDesign, items: list[QAItem], metrics: str, folder: Path
    ) -> tuple[Any, EvaluationReport]: ...


class Proposer(Protocol):
    """Where candidate designs come from. ``uses_feedback``: whether it reads the diagnosis and
    failure cases (the loop builds them only then)."""

    uses_feedback: bool

    def propose(
        self,
        parent: MemoryDesign,
        history: list[RevisionEntry],
        feedback: str,
        *,
        seen: dict[str, str],
        iteration: int,
    ) -> Proposal: ...

    def observe(self, entry: TrajectoryEntry) -> None: ...


class AcceptRule(Protocol):
    name: str

    def decide(self, candidate: Candidate, incumbent: Candidate) -> Decision: ...


class ParentSelector(Protocol):
    name: str

    def select(
        self, pool: Sequence[Candidate], best: Candidate, rng: random.Random
    ) -> Candidate: ...
