"""The settings of one MemSteer-Opt run (:class:`OptimizeConfig`), the items that select, and the
same-run key a resume must match."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from memsteer_dspy.errors import ConfigError
from memsteer_dspy.memory.answer import ANSWER_PROGRAM_VERSION
from memsteer_dspy.optimize.feedback import FeedbackMode
from memsteer_dspy.optimize.splits import ids_digest
from memsteer_dspy.optimize.types import Objective
from memsteer_dspy.records import History, QAItem
from memsteer_dspy.runfolder import lm_identity, qa_content_hash, run_key
from memsteer_dspy.untrusted import WITHHOLD_VERSION

SEARCHES = ("hill", "population", "random", "tpe")
ACCEPT_RULES = ("strict", "paired")
PARENT_STRATEGIES = ("softmax", "pareto")
GUARD_METRICS = ("recall_at_1", "recall_at_5", "recall_at_10", "delivered_recall", "accuracy")
Search = Literal["hill", "population", "random", "tpe"]
# OptimizeConfig fields left out of the same-run key: how far the run goes and how parallel it
# is change no finished iteration's result (a resume with more --iterations continues); `resolved`
# only describes how the other options got their values (those values are in the key).
KEY_EXCLUDED = ("iterations", "threads", "stop_at_max", "resolved")
# Options added after runs were written: left out of the key at the value those runs behaved as
# (no limit; no tabu list), so those runs stay resumable.
KEY_LATER_NONE = ("max_eval_lm_calls", "max_embed_units")
KEY_LATER_FALSE = ("tabu",)


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
        0.02,
        ge=0,
        le=1,
        description="A design that calls an LM at retrieval time must beat the best LM-free design "
        "found so far by this much (primary metric) to be accepted.",
    )
    guard: list[str] = Field(
        default_factory=list,
        description="Non-inferiority guards: metrics (recall_at_1/5/10, delivered_recall, accuracy) a "
        "candidate must not be significantly below the current design on, paired over the validation "
        "items (one-sided, same accept_test and accept_alpha), on top of the accept rule.",
    )
    guard_margin: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="Guards as a non-inferiority test: pass only when the paired bootstrap shows the "
        "candidate above current - guard_margin (p < accept_alpha). None: reject only a significant loss.",
    )
    val_from: Literal["val", "train+val"] = Field(
        "val",
        description="Items that select (accept rule, guards, parent choice, the best design): 'val', or "
        "'train+val' (objective 'recall' only: retrieval-only scoring is cheap, so the training items "
        "also select; feedback still comes from the training items alone).",
    )
    proposals: int = Field(
        1,
        ge=1,
        le=8,
        description="K proposals per iteration from the LM proposer (search hill or population), each "
        "screened by retrieval-only recall on validation; the best goes on to be scored and judged.",
    )
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
    resolved: str | None = Field(
        None,
        description="How the options left unset were resolved (memsteer_dspy.optimize.defaults), "
        "in words; descriptive: the resolved values themselves are in the same-run key.",
    )


def val_items(train: list[QAItem], val: list[QAItem], config: Any) -> list[QAItem]:
    """The items that select (accept rule, guards, parent choice, best design) under
    ``config.val_from``: the validation items, or (objective ``recall`` only) train + validation.
    Feedback always comes from the training items alone."""
    if config.val_from == "val":
        return val
    if config.val_from != "train+val":
        raise ConfigError(f"--val-from must be 'val' or 'train+val', not {config.val_from!r}")
    if config.objective != "recall":
        raise ConfigError(
            "--val-from train+val needs --objective recall (retrieval-only scoring; selecting on "
            "training items under an accuracy objective would pay an answering call per item)"
        )
    seen = {q.id for q in val}
    return [*val, *(q for q in train if q.id not in seen)]


def optimize_run_key(
    config: OptimizeConfig,
    history: History,
    init_design_key: str,
    *,
    train: list[QAItem],
    val: list[QAItem],
    test: list[QAItem],
    lms: dict[str, Any],
) -> dict[str, Any]:
    """The same-run key of an optimization (:func:`memsteer_dspy.runfolder.run_key`): the history
    fingerprint, the protocol, the initial design's key, the LM identities of ``lms`` (role -> LM
    or None), every option but :data:`KEY_EXCLUDED`, and the content hashes of the train,
    validation and test items (an edited answer or evidence id counts, not just the ids)."""
    options = {k: v for k, v in config.model_dump(mode="json").items() if k not in KEY_EXCLUDED}
    for later in KEY_LATER_NONE:
        if options.get(later) is None:
            options.pop(later, None)
    for later in KEY_LATER_FALSE:
        if options.get(later) is False:
            options.pop(later)
    key = run_key(
        "optimize",
        history=history,
        protocol=config.protocol,
        design_key=init_design_key,
        lms={r: lm_identity(lm) for r, lm in lms.items()},
        options=options,
    )
    if lms.get("answerer") is not None:  # answers enter the scores: the program's version too
        key["answer_program"] = ANSWER_PROGRAM_VERSION
    key["withhold_version"] = WITHHOLD_VERSION  # what the proposer's feedback (and answerer) read
    key["qa_hash"] = {
        "train": qa_content_hash(train),
        "val": qa_content_hash(val),
        "test": qa_content_hash(test),
    }
    return key


def run_settings(
    config: OptimizeConfig,
    history: History,
    init_design_key: str,
    *,
    train: list[QAItem],
    val: list[QAItem],
    test: list[QAItem],
    test_source: str,
) -> dict[str, Any]:
    """The settings written beside the key in ``run.json`` (descriptive: the report and the
    summaries read them)."""
    c = config
    return {
        "history_fingerprint": history.fingerprint,
        "user": history.user_id,
        "objective": c.objective,
        "feedback": c.feedback,
        "seed": c.seed,
        "train_ids": ids_digest(train),
        "val_ids": ids_digest(val),
        "init_design_key": init_design_key,
        "protocol": c.protocol,
        "n_train": len(train),
        "n_val": len(val),
        "search": c.search,
        "parents": c.parents,
        "accept": c.accept,
        "guard": c.guard,
        "guard_margin": c.guard_margin,
        "val_from": c.val_from,
        "n_test": len(test),
        "test_ids": ids_digest(test) if test else None,
        "test_source": test_source,
        "resolved": c.resolved,
    }
