"""The MemSteer-Opt loop (paper, Section 3.3): evidence-guided memory-design optimization.

    score d0 on the fixed validation set; diagnose its training failures
    for t = 1..T:
        parent    ← the current best (search 'hill') or a pool member (search 'population':
                    softmax over validation score, or the per-item Pareto front)
        feedback  ← sample failure cases of the parent (mode: stratified by default)
        d'        ← proposer(parent, design schema, revision history, feedback)  (or an Optuna
                    sample: search 'random' / 'tpe', no feedback)
        A(d')     ← build d' (reusing stores and indexes) and score it on the validation set
        accept d' iff the accept rule says it beats the current best ('strict': A(d') > A(d_t),
                    ties rejected; 'paired': a significant paired gain on the validation items),
                    and an LM-using retrieval beats the best LM-free design by the LM margin
        (--stop-at-max: stop early when the current best already scores the objective's maximum
        on validation: no rule can accept anything then, and every proposal is LM time for nothing)
    score d0 and the best design on the held-out test items; paired bootstrap verdict

The loop is written over the protocols of :mod:`memsteer_dspy.optimize.search` (evaluator,
proposer, accept rule, parent selector). The answerer, its prompt and the context budget stay fixed
across candidates. Every proposal is kept (``iterations/NNN/``), accepted or not, with its design,
rationale, the feedback it was given, and per-item validation results.

Output folder (everything needed to resume; a rerun continues from the last finished iteration):

* ``trajectory.jsonl`` — append-only, one :class:`TrajectoryEntry` per finished iteration (0 is d0);
* ``best_design.json`` — the current best design (rewritten after every iteration);
* ``summary.md`` — settings, the held-out comparison, a table of iterations and the accepted path;
* ``summary.json`` — the result, machine-readable (``test``: n, source, initial, best, diff, ci95,
  verdict; every candidate's scores, retrieval LM calls per question and cost);
* ``run.json`` — the run-folder layer's file (:mod:`memsteer_dspy.runfolder`): the same-run ``key``
  (:meth:`MemSteerOpt.run_key`) a resume must match, the ``sessions`` with each one's LM usage by
  role, and beside them the settings, the test split and the MLflow parent run id;
* ``test/initial``, ``test/best-<design key>`` — per-item held-out results of the two designs;
* ``iterations/NNN/`` — ``proposal.json``, ``design.json``, ``rationale.md``, ``feedback.md``,
  ``feedback.json``, ``val/items.jsonl`` (and ``val-recall/`` under recall-then-accuracy,
  ``sub-K/`` for screened single-field sub-changes, ``screen-K/`` for ``--proposals K``) and, for
  d0 and accepted designs, ``train/items.jsonl`` and ``diagnosis.jsonl``.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from memsteer_dspy.errors import ConfigError, InputError
from memsteer_dspy.memory.design import MemoryDesign, store_build_calls
from memsteer_dspy.memory.store import unit_count
from memsteer_dspy.optimize.diagnosis import Diagnosis, diagnose_failures, stage_counts
from memsteer_dspy.optimize.feedback import FEEDBACK_MODES, Feedback, FeedbackMode, build_feedback
from memsteer_dspy.optimize.objectives import (
    OBJECTIVES,
    Objective,
    Score,
    accept,
    at_ceiling,
    metrics_for,
    passes_screen,
    selected_by,
    unscored_fields,
)
from memsteer_dspy.optimize.proposer import (
    DesignProposer,
    Proposal,
    ProposalAttempt,
    RevisionEntry,
    design_diff,
    single_change,
)
from memsteer_dspy.optimize.search import (
    AcceptRule,
    Candidate,
    Decision,
    Evaluator,
    HistoryEvaluator,
    LMProposer,
    NonInferiorityGuard,
    OptunaProposer,
    PairedAccept,
    Proposer,
    Search,
    StrictAccept,
    check_extras,
    item_metric,
    item_primary,
    lm_margin_decision,
    parent_selector,
    retrieval_lm_calls,
    single_field_variants,
    val_items,
)
from memsteer_dspy.optimize.splits import ids_digest
from memsteer_dspy.records import History, QAItem
from memsteer_dspy.runfolder import (
    JsonlLog,
    RunFolder,
    lm_identity,
    qa_content_hash,
    run_key,
    write_atomic,
    write_json,
)
from memsteer_dspy.stats import PairedComparison, compare_item_results, points, points_ci
from memsteer_dspy.tracking import Tracker, flatten

Status = Literal["baseline", "accepted", "rejected", "invalid", "duplicate", "failed"]
# OptimizeConfig fields left out of the same-run key: how far the run goes and how parallel it
# is change no finished iteration's result (a resume with more --iterations continues).
KEY_EXCLUDED = ("iterations", "threads", "stop_at_max")
USAGE_KEYS = ("calls", "prompt_tokens", "completion_tokens", "total_tokens")


class OptimizeConfig(BaseModel):
    """Settings of one MemSteer-Opt run."""

    iterations: int = Field(20, ge=0, description="T: proposals after the initial design.")
    objective: Objective = "accuracy"
    feedback: FeedbackMode = "stratified"
    seed: int = 0
    n_random: int = Field(30, ge=1, description="Cases of the random30* modes.")
    per_stage: int = Field(10, ge=1, description="Cases per failure stage under 'stratified'.")
    feedback_tokens: int = Field(3000, ge=200, description="Token budget of the rendered feedback.")
    history_tokens: int = Field(
        900, ge=100, description="Token budget of the rendered revision history."
    )
    protocol: Literal["as_of", "full"] = "full"
    threads: int = Field(1, ge=1, description="QA items evaluated concurrently.")
    max_resamples: int = Field(3, ge=0, description="Re-samples of a duplicate proposal.")
    resample_temperature: float = Field(0.7, gt=0, le=2)
    max_build_calls: int | None = Field(
        None,
        ge=0,
        description="Most LM calls a candidate's store may take to build (fact extraction: one call "
        "per facts_batch records); a design over it is sent back to the proposer. None: no limit.",
    )
    max_eval_lm_calls: int | None = Field(
        None,
        ge=0,
        description="Most retrieval-time LM calls one scoring of a candidate may take (query "
        "rewrite / decomposition / HyDE / multi-query / LM rerank: one call per question each); a "
        "design over it is sent back to the proposer. None: no limit.",
    )
    max_embed_units: int | None = Field(
        None,
        ge=0,
        description="Most memory units a candidate's dense or hybrid index may embed (one vector per "
        "unit); a design over it is sent back to the proposer. None: no limit.",
    )
    proposer_output: Literal["design", "changes"] = Field(
        "design",
        description="'design': the whole revised design; 'changes': only the fields to change (small LMs).",
    )
    search: Search = Field(
        "hill",
        description="'hill': the paper's single path (revise the current best); 'population': every "
        "scored design stays in a pool and each iteration revises a parent chosen by `parents`; "
        "'random' / 'tpe': proposer-free baselines (Optuna) at the same evaluation budget.",
    )
    parents: Literal["softmax", "pareto"] = Field(
        "softmax",
        description="search='population': 'softmax' over validation score (M*) or 'pareto', the "
        "per-item Pareto front (GEPA).",
    )
    softmax_temperature: float = Field(0.05, gt=0, description="parents='softmax': temperature.")
    accept: Literal["strict", "paired"] = Field(
        "strict",
        description="'strict': strictly better on validation (the paper's); 'paired': a significant "
        "paired improvement on the validation items (p < accept_alpha, gain > accept_margin).",
    )
    accept_alpha: float = Field(0.1, gt=0, lt=1, description="accept='paired': significance level.")
    accept_margin: float = Field(0.0, ge=0, le=1, description="accept='paired': minimum mean gain.")
    accept_test: Literal["bootstrap", "sign"] = Field(
        "bootstrap", description="accept='paired': one-sided paired bootstrap or exact sign test."
    )
    lm_retrieval_margin: float = Field(
        0.02, ge=0, le=1,
        description="A design that calls an LM at retrieval time must beat the best LM-free design "
        "found so far by this much (primary metric) to be accepted.",
    )  # fmt: skip
    guard: list[str] = Field(
        default_factory=list,
        description="Non-inferiority guards: metrics (recall_at_1/5/10, delivered_recall, accuracy) a "
        "candidate must not be significantly below the current design on, paired over the validation "
        "items (one-sided, same accept_test and accept_alpha), on top of the accept rule.",
    )
    guard_margin: float | None = Field(
        None, gt=0, lt=1,
        description="Guards as a non-inferiority test: pass only when the paired bootstrap shows the "
        "candidate above current - guard_margin (p < accept_alpha). None: reject only a significant loss.",
    )  # fmt: skip
    val_from: Literal["val", "train+val"] = Field(
        "val",
        description="Items that select (accept rule, guards, parent choice, the best design): 'val', or "
        "'train+val' (objective 'recall' only: retrieval-only scoring is cheap, so the training items "
        "also select; feedback still comes from the training items alone).",
    )
    proposals: int = Field(
        1, ge=1, le=8,
        description="K proposals per iteration from the LM proposer (search hill or population), each "
        "screened by retrieval-only recall on validation; the best goes on to be scored and judged.",
    )  # fmt: skip
    stop_at_max: bool = Field(
        False,
        description="Stop before an iteration when the best design already scores the objective's "
        "maximum on validation (no accept rule can take anything then). Off: the paper's T "
        "iterations always run. Not part of the same-run key: it only truncates the trajectory.",
    )
    tabu: bool = Field(
        True,
        description="LM proposer: a change rejected on its own anywhere in the run (a one-field "
        "proposal, or a screened sub-change) is not proposed again: a proposal that only repeats it "
        "is re-sampled like a duplicate, and a 'changes' proposer is not offered the value at all.",
    )
    screen_subchanges: bool = Field(
        True,
        description="objective='recall' (cheap scoring), LM proposer: a rejected or failed proposal "
        "that changes several fields has each single-field sub-change scored before its fields are "
        "given up (the random/TPE baselines never screen: they keep their evaluation budget).",
    )


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
            calls=self.calls + other.calls, prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens, seconds=round(self.seconds + other.seconds, 3),
            cost_usd=_add_usd(self.cost_usd, other.cost_usd), by_role=roles,
        )  # fmt: skip

    def short(self) -> str:
        usd = f", ${self.cost_usd:.4f}" if self.cost_usd is not None else ""
        return f"{self.calls} LM calls, {self.total_tokens:,} tokens{usd}, {self.seconds:.0f}s"


def _add_usd(a: float | None, b: float | None) -> float | None:
    """Dollar sums where an unpriced part (None) is not a price of zero: None only if both are."""
    return None if a is None and b is None else (a or 0.0) + (b or 0.0)


def progress_line(event: Mapping[str, Any]) -> str:
    """One line for an ``on_event`` event of :class:`MemSteerOpt` (the CLI's and the experiment
    scripts' progress display): iteration, status, the candidate's and the best design's primary
    metric (and R@10 under the recall objective), the cost so far, parent and changes or reason."""

    def pct(v: float | None) -> str:
        return "  -  " if v is None else f"{100 * v:5.1f}"

    cand, best, recall = event["candidate"], event["best"], event["objective"] == "recall"
    primary = "delivered_recall" if recall else "accuracy"
    c = getattr(cand, primary, None) if cand is not None else None
    b = getattr(best, primary, None) if best is not None else None
    name = "recall" if recall else "acc"
    line = f"iter {event['iteration']:>3}/{event['total']}  {event['status']:<9} candidate {name} {pct(c)}"
    if recall:
        line += f" R@10 {pct(getattr(cand, 'recall_at_10', None) if cand is not None else None)}"
    line += f"  best {pct(b)}"
    if recall:
        line += f" R@10 {pct(getattr(best, 'recall_at_10', None) if best is not None else None)}"
    line += f"  cost {event['cost_total'].short()}"
    if event.get("parent") is not None and event["iteration"]:
        line += f"  parent {event['parent']}"
    if event.get("lm_per_question"):
        line += f"  LM/q {event['lm_per_question']}"
    if event["status"] in ("invalid", "failed", "duplicate") and event.get("reason"):
        line += f"  ({event['reason'][:100]})"
    elif event.get("changes"):
        line += "  [" + "; ".join(event["changes"])[:120] + "]"
    return line


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
        return RevisionEntry(iteration=self.iteration, status=self.status, changes=self.changes, score=score,
                             rationale=self.rationale, note=note, tried_alone=self.tried_alone,
                             rejected_alone=alone)  # fmt: skip


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
            "out": self.out_dir, "iterations": len(self.entries) - 1, "accepted_path": self.accepted_path,
            "best_iteration": self.best_iteration, "best_design_key": self.best_design.key(),
            "initial": self.baseline_score.model_dump(), "best": self.best_score.model_dump(),
            "cost": total.model_dump(), "tracking_uri": self.tracking_uri, "mlflow_parent_run_id": self.parent_run_id,
            "test": self.test.model_dump(mode="json") if self.test is not None else None,
            "stopped": self.stopped,
            "candidates": [
                {"iteration": e.iteration, "status": e.status, "design_key": e.design_key,
                 "parent_iteration": e.parent_iteration, "score": (e.score or e.screen_score).model_dump()
                 if (e.score or e.screen_score) else None, "retrieval_lm_calls": e.retrieval_lm_calls,
                 "accept_stats": e.accept_stats, "lm_calls": e.cost.calls, "tokens": e.cost.total_tokens,
                 "seconds": e.cost.seconds}
                for e in self.entries
            ],
        }  # fmt: skip


@dataclass
class _TrainState:
    """The current design's training results and diagnoses (the source of feedback)."""

    iteration: int
    results: list[Any]
    diagnoses: dict[str, Diagnosis]
    errors: dict[str, str] = field(default_factory=dict)


def ceiling_reason(best: TrajectoryEntry, t: int) -> str:
    """Why the loop stops before iteration ``t`` when the best design is at the objective's maximum."""
    who = (
        "the initial design" if best.iteration == 0 else f"the design of iteration {best.iteration}"
    )
    return (f"{who} already scores the maximum on validation ({best.score.short() if best.score else '-'}), "
            f"so no candidate can be strictly better there; iterations {t}..: not run "
            "(a larger or harder validation set is needed to separate designs)")  # fmt: skip


def best_of(entries: list[TrajectoryEntry]) -> TrajectoryEntry:
    """The current best design's entry: the last accepted one (the baseline counts as accepted)."""
    return next(e for e in reversed(entries) if e.accepted)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _usage_delta(
    before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]]
) -> Cost:
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


def lm_usage(lm: Any) -> dict[str, int]:
    """Calls and tokens an LM has used so far: its role meter if it has one, else its history."""
    meter, role = getattr(lm, "meter", None), getattr(lm, "role", None)
    if meter is not None and role is not None:
        u = meter.by_role().get(role, {})
        return {k: int(u.get(k, 0)) for k in USAGE_KEYS}
    history = list(getattr(lm, "history", []) or [])
    out = dict.fromkeys(USAGE_KEYS, 0)
    out["calls"] = len(history)
    for h in history:
        usage = h.get("usage") or {}
        for k in USAGE_KEYS[1:]:
            v = usage.get(k)
            out[k] += int(v) if isinstance(v, (int, float)) else 0
    return out


class MemSteerOpt:
    """One MemSteer-Opt run over one user's history (see the module docstring).

    Args:
        history: the user's history H.
        train, val: QA–evidence supervision (generated, or official QA split).
        out_dir: the run's folder (created; an existing one is resumed).
        config: :class:`OptimizeConfig`.
        lms: role → LM (``answerer``, ``judge``, ``proposer``), or a function role → LM called
            only when a role is needed (the ``recall`` objective answers nothing).
        init_design: d0 (default Base-BM25); ``--init-design`` for transfer and continuation.
        proposer: a ready :class:`DesignProposer` (default: one on ``lms('proposer')``).
        tracker: MLflow :class:`~memsteer_dspy.tracking.Tracker` (default: none).
        cache_dir: where stores and indexes are kept and reused across candidates.
        usage: function returning role → {calls, prompt_tokens, completion_tokens, total_tokens}
            (the CLI passes ``lm_config.usage_by_role``); default: from the LMs used.
        on_event: called with a dict after d0 and after each iteration (progress display).
        run_params: extra parameters to record on the MLflow parent run (supervision, LMs, ...).
        test: held-out QA items the run never uses for feedback or selection; at the end (and on
            resume) the initial and the best design are scored on them and compared (paired
            bootstrap interval and verdict: :attr:`OptimizeResult.test`, ``summary.json``, MLflow).
        test_source: where the test items came from (recorded in ``run.json`` and the summary).
        evaluator: an :class:`~memsteer_dspy.optimize.search.Evaluator` (default: a
            :class:`~memsteer_dspy.optimize.search.HistoryEvaluator` over ``history``).
        search_proposer: a :class:`~memsteer_dspy.optimize.search.Proposer` (default: from
            ``config.search``: the LM proposer, or Optuna's random / TPE sampler).
        restart: empty ``out_dir`` and start over. Without it an existing folder resumes, and only
            if its same-run key (:meth:`run_key`) equals this run's: otherwise
            :class:`~memsteer_dspy.runfolder.RunMismatchError` names the differing fields.
    """

    def __init__(
        self, history: History, train: list[QAItem], val: list[QAItem], out_dir: str | Path, *,
        config: OptimizeConfig | None = None, lms: Mapping[str, Any] | Callable[[str], Any] | None = None,
        init_design: MemoryDesign | None = None, proposer: DesignProposer | None = None,
        tracker: Tracker | None = None, cache_dir: str | Path | None = None,
        usage: Callable[[], Mapping[str, Mapping[str, Any]]] | None = None,
        on_event: Callable[[dict[str, Any]], None] | None = None, run_params: Mapping[str, Any] | None = None,
        test: list[QAItem] | None = None, test_source: str = "", evaluator: Evaluator | None = None,
        search_proposer: Proposer | None = None, restart: bool = False,
    ):  # fmt: skip
        self.config = config or OptimizeConfig()
        if self.config.objective not in OBJECTIVES:
            raise ConfigError(
                f"unknown objective {self.config.objective!r}; choose one of {', '.join(OBJECTIVES)}"
            )
        if self.config.feedback not in FEEDBACK_MODES:
            raise ConfigError(
                f"unknown feedback mode {self.config.feedback!r}; choose one of {', '.join(FEEDBACK_MODES)}"
            )
        if not train or not val:
            raise InputError(
                f"MemSteer-Opt needs training and validation QA items (got {len(train)} train, {len(val)} val)",
                hint="generate supervision (memsteer generate) or use --supervision official",
            )  # fmt: skip
        self.history = history
        self.train = train
        self.val = val_items(train, val, self.config)
        self.out = Path(out_dir)
        self.d0 = init_design or MemoryDesign.base_bm25()
        self.fixed_budget = self.d0.context.budget_tokens
        self._lm_source = lms
        self._lms_used: dict[str, Any] = {}
        self._proposer = proposer
        self.tracker = tracker or Tracker.disabled()
        self.cache_dir = cache_dir
        self._usage = usage
        self.on_event = on_event
        self.run_params = dict(run_params or {})
        self.parent_run_id: str | None = None
        self.test = list(test or [])
        self.test_source = test_source
        overlap = {q.id for q in self.test} & {q.id for q in [*train, *val]}
        if overlap:
            raise InputError(
                f"{len(overlap)} test item(s) are also train or validation items (e.g. {sorted(overlap)[0]!r})",
                field="--test", hint="held-out items must be ones the optimizer never sees",
            )  # fmt: skip
        self.evaluator: Evaluator = evaluator or HistoryEvaluator(
            history, lm=self.lm, protocol=self.config.protocol, threads=self.config.threads,
            cache_dir=cache_dir, answering=self.config.objective != "recall",
        )  # fmt: skip
        c = self.config
        self.rule: AcceptRule = (
            PairedAccept(c.objective, alpha=c.accept_alpha, margin=c.accept_margin, test=c.accept_test, seed=c.seed)
            if c.accept == "paired" else StrictAccept(c.objective)
        )  # fmt: skip
        self.guards = (
            NonInferiorityGuard(
                c.guard,
                alpha=c.accept_alpha,
                test=c.accept_test,
                seed=c.seed,
                margin=c.guard_margin,
            )  # fmt: skip
            if c.guard
            else None
        )
        self.selector = parent_selector(c.search, c.parents, c.objective, c.softmax_temperature)
        if search_proposer is None:
            if c.search in ("random", "tpe"):
                search_proposer = OptunaProposer(c.search, self.d0, c.objective, seed=c.seed)
            else:
                search_proposer = LMProposer(lambda: self.proposer)
        self.search_proposer = search_proposer
        if c.proposals > 1 and not self.search_proposer.uses_feedback:
            raise ConfigError(
                "--proposals K applies to the LM proposer (--search hill or population)"
            )
        self._candidates: dict[int, Candidate] = {}
        self._states: dict[int, _TrainState] = {}
        self.restart = restart
        self.folder: RunFolder | None = None
        self._usage_start: dict[str, dict[str, int]] = {}

    # -- resources ----------------------------------------------------------------------------
    def lm(self, role: str) -> Any:
        src = self._lm_source
        if src is None:
            raise ConfigError(
                f"MemSteer-Opt needs an LM for the {role} role: pass lms={{'{role}': <dspy LM>}}"
            )
        lm = src(role) if callable(src) and not isinstance(src, Mapping) else src.get(role)
        if lm is None:
            raise ConfigError(
                f"MemSteer-Opt needs an LM for the {role} role: pass lms={{'{role}': <dspy LM>}}"
            )
        self._lms_used[role] = lm
        return lm

    def usage_snapshot(self) -> dict[str, dict[str, int]]:
        if self._usage is not None:
            return {r: dict(v) for r, v in self._usage().items()}
        return {role: lm_usage(lm) for role, lm in self._lms_used.items()}

    @property
    def proposer(self) -> DesignProposer:
        if self._proposer is None:
            self._proposer = DesignProposer(
                self.lm("proposer"), fixed_budget=self.fixed_budget, max_resamples=self.config.max_resamples,
                resample_temperature=self.config.resample_temperature, history_tokens=self.config.history_tokens,
                output=self.config.proposer_output, check=self._check_buildable, tabu=self.config.tabu,
                unscored=unscored_fields(self.config.objective),
            )  # fmt: skip
        elif self._proposer.fixed_budget is None:
            self._proposer.fixed_budget = self.fixed_budget
        return self._proposer

    def _check_buildable(self, design: MemoryDesign) -> None:
        """Raise :class:`InputError` naming the field when this machine cannot build ``design``: a
        model folder that is not there, or a store over the ``max_build_calls`` budget."""
        from memsteer_dspy.memory.embedders import check_local_models

        check_local_models(design)
        check_extras(design)
        per_question = retrieval_lm_calls(design)
        eval_limit = self.config.max_eval_lm_calls
        if eval_limit is not None and per_question * len(self.val) > eval_limit:
            field = "retrieve.rerank" if design.retrieve.rerank == "llm" else "retrieve.query"
            raise InputError(
                f"{field} {getattr(design.retrieve, field.split('.')[1])!r} costs {per_question} LM "
                f"call(s) per question at retrieval time, {per_question * len(self.val)} to score "
                f"{len(self.val)} items; this run allows {eval_limit}",
                field=field,
                hint="choose an LM-free retrieval: query 'raw' and rerank 'none' or 'cross_encoder'",
            )
        embed_limit = self.config.max_embed_units
        if embed_limit is not None and design.retrieve.index in ("dense", "hybrid"):
            units = unit_count(self.history, design.store)
            if units is not None and units > embed_limit:
                raise InputError(
                    f"a {design.retrieve.index} index over this store embeds {units:,} units "
                    f"({design.retrieve.dense.embedder}); this run allows {embed_limit:,}",
                    field="store.section_max_tokens"
                    if design.store.unit == "section"
                    else "retrieve.index",
                    hint="keep fewer, larger units (a larger store.section_max_tokens, record or thread units) or a bm25 index",
                )
        limit = self.config.max_build_calls
        needed = store_build_calls(design, len(self.history))
        if limit is not None and needed > limit:
            raise InputError(
                f"store.unit {design.store.unit!r} needs about {needed} LM calls to build over "
                f"{len(self.history)} records; this run allows {limit}",
                field="store.unit",
                hint="choose a unit that needs no LM to build: record, window, thread or section",
            )

    def system(self, design: MemoryDesign):
        """The memory system of ``design`` (store and index reused from the cache when they exist)."""
        system = getattr(self.evaluator, "system", None)
        if system is None:
            raise ConfigError("this run's evaluator builds no single memory system")
        return system(design)

    def evaluate(self, design: MemoryDesign, items: list[QAItem], metrics: str, folder: Path):
        """Score ``design`` on ``items``; per-item results go to ``folder/items.jsonl`` (resumable)."""
        return self.evaluator.evaluate(design, items, metrics, folder)

    # -- files --------------------------------------------------------------------------------
    def _iter_dir(self, t: int) -> Path:
        return self.out / "iterations" / f"{t:03d}"

    def _settings(self) -> dict[str, Any]:
        c = self.config
        return {
            "history_fingerprint": self.history.fingerprint, "user": self.history.user_id, "objective": c.objective,
            "feedback": c.feedback, "seed": c.seed, "train_ids": ids_digest(self.train), "val_ids": ids_digest(self.val),
            "init_design_key": self.d0.key(), "protocol": c.protocol, "n_train": len(self.train), "n_val": len(self.val),
            "search": c.search, "parents": c.parents, "accept": c.accept, "guard": c.guard, "guard_margin": c.guard_margin, "val_from": c.val_from,
            "n_test": len(self.test),
            "test_ids": ids_digest(self.test) if self.test else None, "test_source": self.test_source,
        }  # fmt: skip

    def run_key(self) -> dict[str, Any]:
        """The same-run key of this optimization (:func:`memsteer_dspy.runfolder.run_key`): every
        setting that changes its trajectory or its held-out figures. A resume must match it field
        by field, or :class:`~memsteer_dspy.runfolder.RunMismatchError` names the fields that differ.

        It holds the history fingerprint, the protocol, the initial design's key, the content
        hashes of the train, validation and test items (``qa_hash.train`` / ``.val`` / ``.test``:
        an edited answer or evidence id counts, not just the ids), the LM identities (model and
        sampling settings) of the proposer (LM search only), the answerer and, unless the objective
        is ``recall``, the judge, and every :class:`OptimizeConfig` option but ``iterations`` and
        ``threads`` (objective, feedback, seed, search, accept rule and its parameters, ...)."""
        c = self.config
        lms: dict[str, Any] = {"answerer": self._lm_or_none("answerer")}
        if c.objective != "recall":
            lms["judge"] = self._lm_or_none("judge")
        if self.search_proposer.uses_feedback:
            lms["proposer"] = (
                getattr(self._proposer, "lm", None) if self._proposer is not None else self._lm_or_none("proposer")
            )  # fmt: skip
        options = {k: v for k, v in c.model_dump(mode="json").items() if k not in KEY_EXCLUDED}
        for later in (
            "max_eval_lm_calls",
            "max_embed_units",
        ):  # added later: runs without them stay resumable
            if options.get(later) is None:
                options.pop(later, None)
        if options.get("tabu") is False:  # added later: runs from before it had none
            options.pop("tabu")
        key = run_key(
            "optimize", history=self.history, protocol=c.protocol, design_key=self.d0.key(),
            lms={r: lm_identity(lm) for r, lm in lms.items()}, options=options,
        )  # fmt: skip
        key["qa_hash"] = {"train": qa_content_hash(self.train), "val": qa_content_hash(self.val),
                          "test": qa_content_hash(self.test)}  # fmt: skip
        return key

    def _lm_or_none(self, role: str) -> Any:
        """The role's LM for the same-run key, without marking the role as used; None when this run
        has none for it (a role the run never needs, e.g. the answerer of a recall-only run)."""
        src = self._lm_source
        if src is None:
            return None
        if isinstance(src, Mapping):
            return src.get(role)
        try:
            return src(role)
        except Exception:  # noqa: BLE001 - a role that cannot be built is one this run must not need
            return None

    def _open_folder(self) -> RunFolder:
        """Open the run folder through the run-folder layer: resume only the same run (see
        :meth:`run_key`), ``restart`` empties it first. The settings beside the key in ``run.json``
        are descriptive (the report and summaries read them)."""
        folder = RunFolder.open(self.out, self.run_key(), restart=self.restart,
                                legacy_files=("trajectory.jsonl",), extra=self._settings())  # fmt: skip
        folder.state["iterations"] = self.config.iterations
        folder.state["config"] = self.config.model_dump(mode="json")
        return folder

    def _save_usage(self) -> None:
        """This session's LM usage by role (since :meth:`run` started) into the folder's ledger."""
        if self.folder is not None:
            self.folder.add_usage(_usage_delta(self._usage_start, self.usage_snapshot()).by_role)
            self.folder.save()

    def read_trajectory(self) -> list[TrajectoryEntry]:
        """Finished iterations on disk (the run-folder layer's log: a line torn by an interrupted
        write is cut off, so appending continues cleanly; damage anywhere else is an InputError
        naming the line)."""
        log = JsonlLog(self.out / "trajectory.jsonl")
        entries: list[TrajectoryEntry] = []
        for n, obj in enumerate(log.read(), start=1):
            try:
                e = TrajectoryEntry.model_validate(obj)
            except ValueError as exc:
                raise InputError(f"not a trajectory entry ({exc})", file=log.path, line=n,
                                 hint="rerun with --restart to start this run over") from None  # fmt: skip
            if e.iteration != len(entries):
                raise InputError(
                    f"iteration {e.iteration} follows iteration {len(entries) - 1}: the trajectory has a gap",
                    file=log.path, line=n, hint="rerun with --restart to start this run over",
                )  # fmt: skip
            entries.append(e)
        return entries

    def _append(self, entry: TrajectoryEntry) -> None:
        JsonlLog(self.out / "trajectory.jsonl").append(entry.model_dump_json())
        self._save_usage()

    # -- training results and feedback --------------------------------------------------------
    def _train_state(self, design: MemoryDesign, t: int) -> _TrainState:
        """Run (or resume) ``design`` on the training set and diagnose its failures."""
        folder = self._iter_dir(t)
        metrics = "recall" if self.config.objective == "recall" else "all"
        system, report = self.evaluate(design, self.train, metrics, folder / "train")
        errors: dict[str, str] = {}
        diagnoses = diagnose_failures(
            system, self.train, report.items, protocol=self.config.protocol, errors=errors
        )
        write_atomic(
            folder / "diagnosis.jsonl",
            "".join(d.model_dump_json() + "\n" for d in diagnoses.values()),
        )
        return _TrainState(iteration=t, results=report.items, diagnoses=diagnoses, errors=errors)

    def _feedback(self, state: _TrainState, t: int) -> Feedback:
        c = self.config
        return build_feedback(self.train, state.results, state.diagnoses, self.history, mode=c.feedback, seed=c.seed,
                              iteration=t, n_random=c.n_random, per_stage=c.per_stage)  # fmt: skip

    # -- one candidate ------------------------------------------------------------------------
    def _score(
        self, design: MemoryDesign, folder: Path, current: Score | None
    ) -> tuple[Score | None, Score | None, str | None]:
        """(final score, recall screen score, reason) of a candidate on the validation set."""
        objective = self.config.objective
        screen = None
        if objective == "recall-then-accuracy" and current is not None:
            _, rep = self.evaluate(design, self.val, "recall", folder / "val-recall")
            screen = Score.from_summary(rep.summary, "recall")
            if not passes_screen(objective, screen, current):
                return None, screen, (f"screened out by recall ({screen.short()} vs the current "
                                      f"{current.short()}); not answered")  # fmt: skip
        metrics = metrics_for(objective)
        _, rep = self.evaluate(design, self.val, metrics, folder / "val")
        self._last_items = rep.items
        return Score.from_summary(rep.summary, metrics), screen, None

    def _candidate_of(
        self, iteration: int, design: MemoryDesign, score: Score, items: list[Any]
    ) -> Candidate:
        by_id = {r.qa_id: r for r in items}
        ids = [q.id for q in self.val]
        return Candidate(
            iteration=iteration, design=design, score=score, item_ids=ids,
            item_scores=[item_primary(self.config.objective, by_id[i]) if i in by_id else None for i in ids],
            retrieval_lm_calls=retrieval_lm_calls(design),
            item_metrics={m: [item_metric(m, by_id[i]) if i in by_id else None for i in ids]
                          for m in self.config.guard},
        )  # fmt: skip

    def candidate(self, entry: TrajectoryEntry) -> Candidate:
        """A scored entry as accept rules and parent selectors see it (per-item validation scores
        read back from its ``val/items.jsonl``)."""
        if entry.iteration not in self._candidates:
            from memsteer_dspy.evaluation import ItemResult

            path = self._iter_dir(entry.iteration) / "val" / "items.jsonl"
            items = [ItemResult.model_validate(obj) for obj in JsonlLog(path).read(repair=False)]
            self._candidates[entry.iteration] = self._candidate_of(
                entry.iteration, MemoryDesign.from_dict(entry.design), entry.score, items
            )
        return self._candidates[entry.iteration]

    def pool(self, entries: list[TrajectoryEntry]) -> list[Candidate]:
        """Every scored design so far (the population search's pool)."""
        return [self.candidate(e) for e in entries
                if e.score is not None and e.design is not None and e.status in ("baseline", "accepted", "rejected")]  # fmt: skip

    def _best_lm_free(self, entries: list[TrajectoryEntry]) -> Candidate | None:
        free = [c for c in self.pool(entries) if not c.uses_lm]
        if not free:
            return None
        return max(
            free,
            key=lambda c: (c.score.primary(self.config.objective) or 0.0, c.score.recall_key()),
        )

    def _decide(
        self, cand: Candidate, incumbent: Candidate, entries: list[TrajectoryEntry]
    ) -> Decision:
        decision = self.rule.decide(cand, incumbent)
        if decision.accepted and self.guards is not None:
            guarded = self.guards.check(cand, incumbent)
            decision.stats = {**decision.stats, **guarded.stats}
            if not guarded.accepted:
                guarded.stats = decision.stats
                return guarded
        if decision.accepted and self.config.lm_retrieval_margin is not None:
            veto = lm_margin_decision(cand, self._best_lm_free(entries), self.config.objective,
                                      self.config.lm_retrieval_margin)  # fmt: skip
            if veto is not None:
                veto.stats = {**decision.stats, **veto.stats}
                return veto
        return decision

    def _propose(
        self, t: int, current: MemoryDesign, entries: list[TrajectoryEntry], feedback_text: str
    ) -> Proposal:
        path = self._iter_dir(t) / "proposal.json"
        if path.exists():  # proposed before an interruption: reuse, never ask (and pay) twice
            try:
                saved = Proposal.model_validate_json(path.read_text(encoding="utf-8"))
            except ValueError:
                saved = None
            if saved is not None and saved.design is not None:
                try:  # the run's limits may have changed since (e.g. --max-build-calls)
                    self._check_buildable(saved.design)
                except InputError:
                    saved = None
            if saved is not None and saved.status != "failed":  # an LM failure is asked again
                return saved
        seen = {
            e.design_key: f"iteration {e.iteration} ({e.status})" for e in entries if e.design_key
        }
        history = [e.revision() for e in entries]
        try:
            proposal = self.search_proposer.propose(
                current, history, feedback_text, seen=seen, iteration=t
            )
        except Exception as exc:  # the proposer never stops the loop
            proposal = Proposal(status="failed", error=f"{type(exc).__name__}: {exc}")
        write_atomic(path, proposal.model_dump_json(indent=2) + "\n")
        return proposal

    def _best_of_k(
        self, t: int, parent: MemoryDesign, entries: list[TrajectoryEntry], feedback_text: str, first: Proposal
    ) -> Proposal:  # fmt: skip
        """``--proposals K``: K-1 more proposals (each told the earlier ones, so they differ), all
        screened by retrieval-only recall on validation; returns the best, with every attempt."""
        folder = self._iter_dir(t)
        found = [first]
        extra_seen = {first.design.key(): f"proposal 1 of iteration {t}"}
        attempts = list(first.attempts)
        for k in range(2, self.config.proposals + 1):
            path = folder / f"proposal-{k}.json"
            prop = None
            if path.exists():
                try:
                    prop = Proposal.model_validate_json(path.read_text(encoding="utf-8"))
                except ValueError:
                    prop = None
            if prop is None:
                seen = {
                    e.design_key: f"iteration {e.iteration} ({e.status})"
                    for e in entries
                    if e.design_key
                }
                try:
                    prop = self.search_proposer.propose(parent, [e.revision() for e in entries], feedback_text,
                                                        seen={**seen, **extra_seen}, iteration=t * 100 + k)  # fmt: skip
                except Exception as exc:  # noqa: BLE001 - one failed call loses one proposal
                    prop = Proposal(status="failed", error=f"{type(exc).__name__}: {exc}")
                write_atomic(path, prop.model_dump_json(indent=2) + "\n")
            attempts += prop.attempts
            if prop.status == "ok" and prop.design is not None:
                extra_seen[prop.design.key()] = f"proposal {k} of iteration {t}"
                found.append(prop)
        if len(found) == 1:
            return first.model_copy(update={"attempts": attempts})
        screened = []
        for k, prop in enumerate(found, start=1):
            try:
                _, rep = self.evaluate(prop.design, self.val, "recall", folder / f"screen-{k}")
                screened.append((Score.from_summary(rep.summary, "recall").recall_key(), -k, prop))
            except Exception:  # noqa: BLE001 - an unbuildable proposal is screened out
                continue
        if not screened:
            return first.model_copy(update={"attempts": attempts})
        key, neg_k, best = max(screened, key=lambda x: (x[0], x[1]))
        note = (f"best of {len(found)} proposals by retrieval-only recall on validation (proposal {-neg_k}: "
                f"delivered recall {key[0]:.3f}, R@10 {key[1]:.3f})")  # fmt: skip
        return best.model_copy(
            update={"attempts": attempts, "rationale": f"{best.rationale}\n\n({note})"}
        )

    def _screen_subchanges(
        self, t: int, parent: MemoryDesign, proposed: MemoryDesign, incumbent: Candidate,
        entries: list[TrajectoryEntry], entry: TrajectoryEntry,
    ) -> tuple[MemoryDesign, Candidate] | None:  # fmt: skip
        """Score each single-field sub-change of a rejected multi-field proposal (cheap scoring
        only); returns the best accepted one, if any. Every screen is written to the entry."""
        variants = single_field_variants(parent, proposed)
        if not variants:
            return None
        seen = {e.design_key for e in entries if e.design_key}
        chosen: tuple[MemoryDesign, Candidate] | None = None
        tried: list[str] = []
        for i, (fld, design) in enumerate(variants, start=1):
            design = design.model_copy(update={"name": f"opt-{t:03d}-{i}"})
            changes = design_diff(parent, design)
            screen: dict[str, Any] = {"field": fld, "design_key": design.key(), "changes": changes}
            tried.extend(c.split(":", 1)[0].strip() for c in changes)
            if design.key() in seen:
                screen.update(status="duplicate")
                entry.sub_screens.append(screen)
                continue
            try:
                self._check_buildable(design)
                score, _, _ = self._score(design, self._iter_dir(t) / f"sub-{i}", incumbent.score)
            except Exception as exc:  # noqa: BLE001 - one sub-change failing stops nothing
                screen.update(status="failed", reason=f"{type(exc).__name__}: {exc}")
                entry.sub_screens.append(screen)
                continue
            cand = self._candidate_of(t, design, score, self._last_items)
            decision = self._decide(cand, incumbent, entries)
            screen.update(status="accepted" if decision.accepted else "rejected", score=score.model_dump(),
                          reason=decision.reason, stats=decision.stats)  # fmt: skip
            entry.sub_screens.append(screen)
            if decision.accepted and (
                chosen is None or accept(self.config.objective, score, chosen[1].score)
            ):
                chosen = (design, cand)
        entry.tried_alone = tried
        return chosen

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> OptimizeResult:
        """Run (or resume) the optimization; returns the best design and the trajectory."""
        self._usage_start = self.usage_snapshot()
        self.folder = self._open_folder()
        run = self.folder.state
        entries = self.read_trajectory()
        self.parent_run_id = self.tracker.start_run(
            f"optimize-{self.history.user_id}", resume_run_id=run.get("parent_run_id"),
            tags={"memsteer.kind": "optimize", "memsteer.user": self.history.user_id},
        )  # fmt: skip
        if self.parent_run_id:
            run["parent_run_id"] = self.parent_run_id
            run["tracking_uri"] = self.tracker.uri
        self.folder.save()
        self.tracker.log_params(self.parent_run_id, {
            **{k: run[k] for k in ("history_fingerprint", "user", "objective", "feedback", "seed", "protocol",
                                   "n_train", "n_val", "iterations", "init_design_key", "search", "accept",
                                   "n_test")},
            "init_design": self.d0.name, **self.run_params,
        })  # fmt: skip
        status = "FAILED"
        try:
            result = self._loop(entries)
            status = "FINISHED"
            return result
        except KeyboardInterrupt:
            status = "KILLED"
            raise
        finally:
            try:
                self._save_usage()
                self._finish(status)
            finally:
                self.folder.close()

    def _state_for(self, entry: TrajectoryEntry) -> _TrainState:
        if entry.iteration not in self._states:
            while len(self._states) >= 4:
                self._states.pop(next(iter(self._states)))
            self._states[entry.iteration] = self._train_state(
                MemoryDesign.from_dict(entry.design), entry.iteration
            )
        return self._states[entry.iteration]

    def _loop(self, entries: list[TrajectoryEntry]) -> OptimizeResult:
        if not entries:
            entries.append(self._baseline())
        for e in entries:  # a resumed Optuna search rebuilds its study from the trajectory
            self.search_proposer.observe(e)
        stopped = None
        for t in range(len(entries), self.config.iterations + 1):
            best_entry = best_of(entries)
            if self.config.stop_at_max and at_ceiling(self.config.objective, best_entry.score):
                stopped = ceiling_reason(best_entry, t)
                self.tracker.log_params(self.parent_run_id, {"stopped": stopped})
                break
            parent_entry = best_entry
            if self.selector.name != "hill":
                rng = random.Random(f"parent:{self.config.seed}:{t}")
                chosen = self.selector.select(self.pool(entries), self.candidate(best_entry), rng)
                parent_entry = entries[chosen.iteration]
            state = self._state_for(parent_entry) if self.search_proposer.uses_feedback else None
            entry = self._iteration(t, parent_entry, best_entry, state, entries)
            entries.append(entry)
            self.search_proposer.observe(entry)
            self._write_outputs(entries)
        self._write_outputs(entries)
        best = best_of(entries)
        result = OptimizeResult(
            best_design=MemoryDesign.from_dict(best.design), best_score=best.score, baseline_score=entries[0].score,
            entries=entries, out_dir=str(self.out), parent_run_id=self.parent_run_id,
            tracking_uri=self.tracker.uri if self.tracker.active else None, best_iteration=best.iteration,
            stopped=stopped,
        )  # fmt: skip
        result.test = self._held_out(entries)
        self._write_outputs(entries, result)
        return result

    def _held_out(self, entries: list[TrajectoryEntry]) -> PairedComparison | None:
        """Score the initial and the best design on the test items and compare them (resumable:
        ``test/initial`` and ``test/best-<design key>`` keep per-item results)."""
        if not self.test:
            return None
        objective = self.config.objective
        metrics = metrics_for(objective)
        best = best_of(entries)
        initial, chosen = (
            MemoryDesign.from_dict(entries[0].design),
            MemoryDesign.from_dict(best.design),
        )
        _, r0 = self.evaluate(initial, self.test, metrics, self.out / "test" / "initial")
        # one folder per chosen design: a run resumed with more iterations can choose another
        # design, whose held-out scoring must not meet the earlier best's per-item results
        same = chosen.key() == initial.key()
        folder = self.out / "test" / ("initial" if same else f"best-{chosen.key()}")
        _, r1 = self.evaluate(chosen, self.test, metrics, folder)
        primary = "delivered_recall" if objective == "recall" else "accuracy"
        comp = compare_item_results(r0.items, r1.items, answered=metrics == "all", primary=primary,
                                    source=self.test_source, seed=self.config.seed)  # fmt: skip
        names = list(comp.initial)
        rid = self.parent_run_id
        metrics_out: dict[str, float | None] = {"test_n": float(comp.n), "test_p_bootstrap": comp.p_bootstrap,
                                                "test_p_sign": comp.p_sign}  # fmt: skip
        for m in names:
            ci = comp.ci95.get(m)
            metrics_out.update({f"test_initial_{m}": comp.initial.get(m), f"test_best_{m}": comp.best.get(m),
                                f"test_diff_{m}": comp.diff.get(m), f"test_ci_low_{m}": ci[0] if ci else None,
                                f"test_ci_high_{m}": ci[1] if ci else None})  # fmt: skip
        self.tracker.log_metrics(rid, metrics_out)
        self.tracker.set_tags(rid, {"test_verdict": comp.verdict, "test_primary": primary,
                                    "test_source": self.test_source})  # fmt: skip
        return comp

    def _baseline(self) -> TrajectoryEntry:
        t0, before = time.perf_counter(), self.usage_snapshot()
        folder = self._iter_dir(0)
        d0 = self.d0
        folder.mkdir(parents=True, exist_ok=True)
        d0.save(folder / "design.json")
        run_id = self._start_candidate_run(0)
        score, _, _ = self._score(d0, folder, None)
        state = None
        if self.search_proposer.uses_feedback:
            state = self._train_state(d0, 0)
            self._states[0] = state
        cost = _usage_delta(before, self.usage_snapshot())
        cost.seconds = round(time.perf_counter() - t0, 3)
        entry = TrajectoryEntry(
            iteration=0, status="baseline", accepted=True, design=d0.model_dump(mode="json"), design_key=d0.key(),
            score=score, best_key=d0.key(), best_score=score, selected_by="initial design",
            train_failures=stage_counts(state.diagnoses) if state else None, cost=cost, cost_total=cost,
            run_id=run_id, finished_at=_now(), retrieval_lm_calls=retrieval_lm_calls(d0),
        )  # fmt: skip
        self._track_candidate(entry, None, state)
        self._append(entry)
        self._event(entry)
        return entry

    def _iteration(
        self, t: int, parent_entry: TrajectoryEntry, best_entry: TrajectoryEntry, state: _TrainState | None,
        entries: list[TrajectoryEntry],
    ) -> TrajectoryEntry:  # fmt: skip
        t0, before = time.perf_counter(), self.usage_snapshot()
        folder = self._iter_dir(t)
        folder.mkdir(parents=True, exist_ok=True)
        run_id = self._start_candidate_run(t)
        parent = MemoryDesign.from_dict(parent_entry.design)
        feedback, feedback_text = None, ""
        if state is not None:
            feedback = self._feedback(state, t)
            feedback_text = feedback.render(self.config.feedback_tokens)
            write_atomic(folder / "feedback.json", feedback.model_dump_json(indent=2) + "\n")
            write_atomic(folder / "feedback.md", feedback_text + "\n")
        proposal = self._propose(t, parent, entries, feedback_text)
        if self.config.proposals > 1 and proposal.status == "ok":
            proposal = self._best_of_k(t, parent, entries, feedback_text, proposal)
        incumbent_score = best_entry.score
        entry = TrajectoryEntry(
            iteration=t, status="failed", accepted=False, parent_key=parent.key(), attempts=proposal.attempts,
            rationale=proposal.rationale, best_key=best_entry.design_key or "", best_score=incumbent_score,
            parent_iteration=parent_entry.iteration, search_params=proposal.search_params,
        )  # fmt: skip
        new_state = None
        accepted_design: MemoryDesign | None = None
        if proposal.status != "ok" or proposal.design is None:
            entry.status = "failed" if proposal.status == "failed" else proposal.status
            entry.reason = proposal.error or f"the proposal was {proposal.status}"
            if proposal.design is not None:
                entry.design = proposal.design.model_dump(mode="json")
                entry.changes = design_diff(parent, proposal.design)
        else:
            design = proposal.design.model_copy(update={"name": f"opt-{t:03d}"})
            entry.design, entry.design_key = design.model_dump(mode="json"), design.key()
            entry.changes = design_diff(parent, design)
            entry.retrieval_lm_calls = retrieval_lm_calls(design)
            design.save(folder / "design.json")
            write_atomic(folder / "rationale.md", f"# Iteration {t}\n\n{proposal.rationale.strip()}\n\n## Changes\n\n"
                          + "".join(f"- {c}\n" for c in entry.changes))  # fmt: skip
            try:
                score, screen, reason = self._score(design, folder, incumbent_score)
            except (
                Exception
            ) as exc:  # a candidate that cannot be built or scored never stops the loop
                score, screen = None, None
                reason = f"could not build or score the design: {type(exc).__name__}: {exc}"
            entry.score, entry.screen_score = score, screen
            incumbent = self.candidate(best_entry)
            if score is None:
                screened = screen is not None and reason and reason.startswith("screened")
                entry.status = "rejected" if screened else "failed"
                entry.reason = reason
            else:
                cand = self._candidate_of(t, design, score, self._last_items)
                self._candidates[t] = cand
                decision = self._decide(cand, incumbent, entries)
                entry.accept_stats = decision.stats or None
                if decision.accepted:
                    entry.status, entry.accepted = "accepted", True
                    accepted_design = design
                else:
                    entry.status = "rejected"
                    entry.reason = decision.reason
            if (
                not entry.accepted
                and self.config.screen_subchanges
                and self.config.objective == "recall"
                and self.search_proposer.uses_feedback  # the baselines keep their budget
            ):
                found = self._screen_subchanges(t, parent, design, incumbent, entries, entry)
                if (
                    found is not None
                ):  # a sub-change on its own is better: it is this iteration's design
                    sub, cand = found
                    entry.screen_score = entry.score
                    entry.score, entry.design, entry.design_key = (
                        cand.score,
                        sub.model_dump(mode="json"),
                        sub.key(),
                    )
                    entry.reason = (f"the proposal as a whole was {entry.status} ({entry.reason}); its sub-change "
                                    f"{'; '.join(design_diff(parent, sub))} was accepted on its own")  # fmt: skip
                    entry.changes = design_diff(parent, sub)
                    entry.retrieval_lm_calls = cand.retrieval_lm_calls
                    entry.status, entry.accepted = "accepted", True
                    self._candidates[t] = cand
                    accepted_design = sub
                    sub.save(folder / "design.json")
                    sub_dir = (
                        folder
                        / f"sub-{next(i for i, s in enumerate(entry.sub_screens, 1) if s['design_key'] == sub.key())}"
                    )
                    for name in ("val",):  # the pool reads the entry's per-item results from val/
                        src = sub_dir / name / "items.jsonl"
                        if src.exists():
                            write_atomic(
                                folder / name / "items.jsonl", src.read_text(encoding="utf-8")
                            )
        if accepted_design is not None:
            entry.selected_by = selected_by(self.config.objective) + (
                f" ({self.rule.name} rule)" if self.rule.name != "strict" else ""
            )
            entry.best_key, entry.best_score = accepted_design.key(), entry.score
            if self.search_proposer.uses_feedback:
                new_state = self._train_state(accepted_design, t)
                self._states[t] = new_state
                entry.train_failures = stage_counts(new_state.diagnoses)
        cost = _usage_delta(before, self.usage_snapshot())
        cost.seconds = round(time.perf_counter() - t0, 3)
        entry.cost = cost
        entry.cost_total = entries[-1].cost_total.plus(cost)
        entry.run_id = run_id
        entry.finished_at = _now()
        self._track_candidate(entry, feedback, new_state, diagnosis_for_feedback=state)
        self._append(entry)
        self._event(entry)
        return entry

    # -- outputs ------------------------------------------------------------------------------
    def _event(self, entry: TrajectoryEntry) -> None:
        self.tracker.log_metrics(self.parent_run_id, {
            "best_score": entry.best_score.primary(self.config.objective) if entry.best_score else None,
            "best_accuracy": entry.best_score.accuracy if entry.best_score else None,
            "best_delivered_recall": entry.best_score.delivered_recall if entry.best_score else None,
            "best_recall_at_10": entry.best_score.recall_at_10 if entry.best_score else None,
            "candidate_accuracy": entry.score.accuracy if entry.score else None,
            "candidate_delivered_recall": (entry.score or entry.screen_score).delivered_recall if (entry.score or entry.screen_score) else None,
            "candidate_recall_at_10": (entry.score or entry.screen_score).recall_at_10 if (entry.score or entry.screen_score) else None,
            "accepted": float(entry.accepted), "cost_lm_calls": entry.cost_total.calls,
            "cost_tokens": entry.cost_total.total_tokens, "cost_seconds": entry.cost_total.seconds,
            "cost_usd": entry.cost_total.cost_usd,
        }, step=entry.iteration)  # fmt: skip
        if self.on_event is not None:
            self.on_event({
                "iteration": entry.iteration, "total": self.config.iterations, "status": entry.status,
                "candidate": entry.score or entry.screen_score, "best": entry.best_score,
                "objective": self.config.objective, "cost_total": entry.cost_total, "reason": entry.reason,
                "changes": entry.changes, "parent": entry.parent_iteration,
                "lm_per_question": entry.retrieval_lm_calls,
            })  # fmt: skip

    def _start_candidate_run(self, t: int) -> str | None:
        if not self.tracker.active or not self.parent_run_id:
            return None
        marker = self._iter_dir(t) / "mlflow_run_id"
        previous = marker.read_text().strip() if marker.exists() else None
        run_id = self.tracker.start_run(f"iter-{t:03d}", parent_run_id=self.parent_run_id, resume_run_id=previous,
                                        tags={"memsteer.iteration": t})  # fmt: skip
        if run_id:
            write_atomic(marker, run_id + "\n")
        return run_id

    def _track_candidate(
        self, entry: TrajectoryEntry, feedback: Feedback | None, new_state: _TrainState | None,
        diagnosis_for_feedback: _TrainState | None = None,
    ) -> None:  # fmt: skip
        rid = entry.run_id
        if not rid or not self.tracker.active:
            return
        folder = self._iter_dir(entry.iteration)
        tr = self.tracker
        params: dict[str, Any] = {"iteration": entry.iteration, "status": entry.status, "parent_key": entry.parent_key,
                                  "design_key": entry.design_key}  # fmt: skip
        if entry.design is not None:
            params.update(
                {
                    f"design.{k}": v
                    for k, v in flatten(
                        {k: v for k, v in entry.design.items() if k != "name"}
                    ).items()
                }
            )
        tr.log_params(rid, params)
        s = entry.score or entry.screen_score
        tr.log_metrics(rid, {
            "val_accuracy": s.accuracy if s else None, "val_qs": s.qs if s else None,
            "val_recall_at_10": s.recall_at_10 if s else None, "val_delivered_recall": s.delivered_recall if s else None,
            "lm_calls": entry.cost.calls, "lm_tokens": entry.cost.total_tokens,
            "lm_prompt_tokens": entry.cost.prompt_tokens, "lm_completion_tokens": entry.cost.completion_tokens,
            "wall_seconds": entry.cost.seconds, "lm_cost_usd": entry.cost.cost_usd,
            "retrieval_lm_calls_per_question": entry.retrieval_lm_calls,
            "accept_p": (entry.accept_stats or {}).get("p"), "accept_gain": (entry.accept_stats or {}).get("gain"),
            **({f"train_{k}_failures": v for k, v in entry.train_failures.items()} if entry.train_failures else {}),
        }, step=entry.iteration)  # fmt: skip
        tr.set_tags(rid, {"accepted": "true" if entry.accepted else "false", "status": entry.status,
                          "selected_by": entry.selected_by or "", "reason": entry.reason or ""})  # fmt: skip
        if (folder / ".tracked").exists():  # artifacts already logged before an interruption
            tr.end_run(rid)
            return
        if entry.design is not None:
            tr.log_dict(rid, entry.design, "design.json")
        tr.log_text(rid, f"# Iteration {entry.iteration} ({entry.status})\n\n{entry.rationale or '(initial design)'}\n\n"
                    + "## Changes\n\n" + ("".join(f"- {c}\n" for c in entry.changes) or "(none)\n")
                    + (f"\n## Outcome\n\n{entry.reason}\n" if entry.reason else ""), "rationale.md")  # fmt: skip
        for sub in ("val", "val-recall"):
            items = folder / sub / "items.jsonl"
            if items.exists():
                tr.log_table(rid, _item_rows(items), f"{sub}_items.json")
        if diagnosis_for_feedback is not None:
            tr.log_table(
                rid, [d.row() for d in diagnosis_for_feedback.diagnoses.values()], "diagnosis.json"
            )
        if new_state is not None:
            tr.log_table(
                rid, [d.row() for d in new_state.diagnoses.values()], "train_diagnosis.json"
            )
        if feedback is not None:
            tr.log_artifact(rid, folder / "feedback.md")
            tr.log_artifact(rid, folder / "feedback.json")
        if entry.attempts:
            tr.log_dict(
                rid, [a.model_dump(mode="json") for a in entry.attempts], "proposal_attempts.json"
            )
        if tr.active:
            write_atomic(folder / ".tracked", _now() + "\n")
        tr.end_run(rid)

    def _write_outputs(
        self, entries: list[TrajectoryEntry], result: OptimizeResult | None = None
    ) -> None:
        best = best_of(entries)
        design = MemoryDesign.from_dict(best.design)
        design.save(self.out / "best_design.json")
        test = result.test if result is not None else None
        stopped = result.stopped if result is not None else None
        write_atomic(
            self.out / "summary.md",
            render_summary(
                entries, self.config, self.history, self._settings(), test=test, stopped=stopped
            ),  # fmt: skip
        )
        if result is not None:
            data = {"user": self.history.user_id, "objective": self.config.objective, "search": self.config.search,
                    "parents": self.config.parents if self.config.search == "population" else None,
                    "accept": self.config.accept, "feedback": self.config.feedback, "n_train": len(self.train),
                    "n_val": len(self.val), **result.summary()}  # fmt: skip
            write_json(self.out / "summary.json", data)

    def _finish(self, status: str) -> None:
        rid = self.parent_run_id
        if not rid:
            return
        for name in (
            "best_design.json",
            "trajectory.jsonl",
            "summary.md",
            "summary.json",
            "run.json",
        ):
            if (self.out / name).exists():
                self.tracker.log_artifact(rid, self.out / name)
        self.tracker.end_run(rid, status=status)


def _item_rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    for r in JsonlLog(path).read(repair=False):
        trace = r.get("trace") or {}
        rows.append({
            "qa_id": r.get("qa_id"), "question": r.get("question"), "question_type": r.get("question_type"),
            "reference": r.get("reference"), "prediction": r.get("prediction"), "correct": r.get("correct"),
            "qs": r.get("qs"), "recall_at_10": r.get("recall_at_10"), "delivered_recall": r.get("delivered_recall"),
            "evidence_ids": r.get("evidence_ids"), "delivered_ids": trace.get("delivered_record_ids"),
            "error": r.get("error"),
        })  # fmt: skip
    return rows


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]<>()#+!|~])")


def md_text(text: str) -> str:
    """``text`` as literal Markdown inline text: its markup characters escaped, newlines folded
    (a user id such as ``<img src=x>`` or ``*x*`` shows as written, and stays in its heading)."""
    return _MD_SPECIAL.sub(r"\\\1", " ".join(str(text).split()))


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}"


def render_test(test: PairedComparison) -> list[str]:
    """The held-out section of ``summary.md``."""
    lines = ["## Held-out test", "",
             f"{test.n} items ({test.source or 'test split'}), never used for feedback or selection. "
             f"Verdict on {test.primary}: **{test.verdict}** (paired bootstrap 95% interval, {test.resamples} "
             f"resamples, seed {test.seed}; one-sided p = {test.p_bootstrap:.3f}, sign test p = {test.p_sign:.3f}).",
             "", "| metric | initial | best | diff | 95% CI |", "|---|---:|---:|---:|---|"]  # fmt: skip
    for m in test.initial:
        lines.append(f"| {m} | {_pct(test.initial[m])} | {_pct(test.best.get(m))} | {points(test.diff.get(m))} | "
                     f"{points_ci(test.ci95.get(m))} |")  # fmt: skip
    return lines + [""]


def render_summary(
    entries: list[TrajectoryEntry],
    config: OptimizeConfig,
    history: History,
    settings: dict[str, Any],
    test: PairedComparison | None = None,
    stopped: str | None = None,
) -> str:
    """``summary.md``: settings, baseline vs best, the held-out comparison, a table of iterations
    and the accepted path."""
    base, best = entries[0], best_of(entries)
    total = entries[-1].cost_total
    lines = [
        f"# MemSteer-Opt: {md_text(history.user_id)}",
        "",
        f"- history fingerprint `{history.fingerprint}`, {len(history)} records",
        f"- supervision: {settings.get('n_train')} train / {settings.get('n_val')} val items",
        f"- objective `{config.objective}`, feedback `{config.feedback}`, seed {config.seed}, "
        f"protocol `{config.protocol}`, iterations {len(entries) - 1} of {config.iterations}",
        f"- search `{config.search}`"
        + (f" (parents: {config.parents})" if config.search == "population" else "")
        + f", accept `{config.accept}`"
        + (
            f" (alpha {config.accept_alpha}, margin {config.accept_margin}, {config.accept_test})"
            if config.accept == "paired"
            else ""
        )
        + f", LM-retrieval margin {config.lm_retrieval_margin}",
        f"- initial design `{base.design_key}`; best design `{best.design_key}` (iteration {best.iteration})",
        f"- validation: initial {base.score.short() if base.score else '-'}; best {best.score.short() if best.score else '-'}",
        f"- cost: {total.short()}",
        *([f"- stopped early: {stopped}"] if stopped else []),
        "",
        *(render_test(test) if test is not None else []),
        "## Iterations",
        "",
        "LM/q: LM calls per question at retrieval time (query rewrite, HyDE, LM rerank, ...).",
        "",
        "| iter | parent | status | val acc | QS | deliv. recall | R@10 | LM/q | changes | selected by | LM calls | tokens | s |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---|---|---:|---:|---:|",
    ]
    for e in entries:
        s = e.score or e.screen_score
        changes = (
            "; ".join(e.changes) if e.changes else ("(initial)" if e.status == "baseline" else "–")
        )
        if e.reason and not e.accepted:
            changes += f" — {e.reason}"
        changes = " ".join(changes.split()).replace("|", "\\|")
        if len(changes) > 300:
            changes = changes[:297] + "..."
        lines.append(
            f"| {e.iteration} | {'' if e.parent_iteration is None else e.parent_iteration} | {e.status} | "
            f"{_pct(s.accuracy if s else None)} | {_pct(s.qs if s else None)} | "
            f"{_pct(s.delivered_recall if s else None)} | {_pct(s.recall_at_10 if s else None)} | "
            f"{'' if e.retrieval_lm_calls is None else e.retrieval_lm_calls} | {changes} | "
            f"{e.selected_by or ''} | {e.cost.calls} | {e.cost.total_tokens:,} | {e.cost.seconds:.0f} |"
        )
    path = [e for e in entries if e.accepted]
    lines += ["", "## Accepted path", ""]
    for e in path:
        what = "; ".join(e.changes) if e.changes else "initial design"
        lines.append(f"- iteration {e.iteration} `{e.design_key}`: {e.score.short() if e.score else '-'} — {what}"
                     + (f" (selected by {e.selected_by})" if e.iteration else ""))  # fmt: skip
    return "\n".join(lines) + "\n"
