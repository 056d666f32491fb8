"""What one candidate comes to: its :class:`Outcome` (status, plan, question, the audit's
:class:`AuditResult` and the blind read's :class:`BlindResult`) with each role's
:class:`RoleCost`; the roles, output-token caps and prompt versions; and the requests a
candidate's pipeline yields to its driver (:data:`Pipeline`).
"""

from __future__ import annotations

import random
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Literal

import dspy
from pydantic import BaseModel, Field

from memsteer_dspy.signatures.plan import AnswerPlan
from memsteer_dspy.supervision.checks import (
    PlanIssue,
    Repair,
)
from memsteer_dspy.tokens import count_tokens

GENERATION_ROLES = ("planner", "question_writer", "auditor", "blind_reader")
# Output-token caps per call: enough for the fields, short enough that a small LM cannot ramble.
MAX_TOKENS = {"plan": 400, "question": 100, "audit": 600, "blind": 160, "joint": 500, "direct": 300}
# lean: what the bounded roles were measured to need in one-line JSON (plan ~120 tokens, audit ~250)
LEAN_MAX_TOKENS = {**MAX_TOKENS, "plan": 300, "question": 80, "audit": 400, "blind": 100}
# What each version changed, and why: experiments/results/supervision-versions.md
LEAN_VERSION = 21
LEAN_QUESTION_REWRITES = 1
"""Lean re-samples a rejected question this many times (the earlier pipeline: 2). Measured on the
embedded writer over three runs (runs/demo-2, runs/demo-4, the thirteenth cost run's lean-anchor;
69 candidates): the second re-sample never saved a candidate (25 of 25 were rejected at the
question stage again, mostly the same question back), while the first re-sample let 3 through to
acceptance; the third writer call cost about 60 s of a 16-minute demo."""
# What each version changed, and why: experiments/results/supervision-versions.md
PROMPT_VERSION = 3
# What each version changed, and why: experiments/results/supervision-versions.md
ANCHORED_VERSION = 22
# What each version changed, and why: experiments/results/supervision-versions.md
OWN_WORDS_VERSION = 2
# The order in which run_batch serves pending requests.
STAGE_ORDER = ("plan", "joint", "direct", "question", "audit", "blind")


class RoleCost(BaseModel):
    """LM calls, tokens and seconds one role spent on one candidate."""

    calls: int = 0
    failed_calls: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = Field(
        default=0, description="Prompt tokens the backend reused from its prompt (KV) cache."
    )
    completion_tokens: int = 0
    estimated: bool = False
    seconds: float = 0.0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def evaluated_tokens(self) -> int:
        """Prompt tokens the backend actually processed (all of them when it reports no cache)."""
        return self.prompt_tokens - self.cached_tokens


class AuditResult(BaseModel):
    """The auditor's verdicts (span and record ids resolved) and which required ones failed."""

    fact_checks: list[dict[str, Any]] = Field(default_factory=list)
    record_checks: list[dict[str, Any]] = Field(default_factory=list)
    answer_support: str = "unclear"
    answer_rationale: str = ""
    consistency: str = "unclear"
    consistency_rationale: str = ""
    failures: list[str] = Field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


class BlindResult(BaseModel):
    """The blind reader's answer and citations, and how they compare with the reference."""

    answerable: bool
    answer: str
    cited_ids: list[str] = Field(default_factory=list, description="As the reader wrote them.")
    cited_record_ids: list[str] = Field(default_factory=list)
    record_order: list[str] = Field(default_factory=list, description="The shuffled order it read.")
    matched: bool = False
    missing_evidence: list[str] = Field(default_factory=list)


class Outcome(BaseModel):
    """What the program made of one bundle and task: accepted, or rejected at a stage with a reason.

    ``reason`` is ``plan_check:<code>``, ``question:<code>``, ``audit:<check>``,
    ``blind:<mismatch|unanswerable|citation>`` or ``lm_error`` (then ``stage`` is the stage
    whose LM call failed).
    """

    status: Literal["accepted", "rejected"]
    stage: str | None = None
    reason: str | None = None
    detail: str | None = None
    plan: AnswerPlan | None = None
    plan_issues: list[PlanIssue] = Field(default_factory=list)
    question: str | None = None
    audit: AuditResult | None = None
    blind: BlindResult | None = None
    repairs: list[Repair] = Field(default_factory=list)
    usage: dict[str, RoleCost] = Field(default_factory=dict)
    question_type: str | None = Field(
        default=None,
        description="The item's question type where the program knows it better than the task "
        "that asked for it: 'multi-hop' for a bridge (the answer asked by another record's day).",
    )


class _LMFailure(Exception):
    """Every attempt of one LM call failed."""

    def __init__(self, stage: str, detail: str):
        super().__init__(detail)
        self.stage, self.detail = stage, detail


@dataclass
class _Request:
    """One LM call a candidate's pipeline is waiting for."""

    predictor: str
    stage: str
    inputs: dict[str, Any]
    usage: dict[str, RoleCost]
    resample: int = 0  # > 0: a deliberate re-sample (another rollout at temperature 0.7)


Pipeline = Generator[_Request, dspy.Prediction, Outcome]


def _usage_tokens(tracker: Any) -> tuple[int, int, int]:
    """Prompt, completion and cached prompt tokens of the calls ``tracker`` saw."""
    prompt = completion = cached = 0
    for entries in tracker.usage_data.values():
        for e in entries:
            prompt += int(e.get("prompt_tokens") or 0)
            completion += int(e.get("completion_tokens") or 0)
            cached += int((e.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return prompt, completion, cached


def _estimate_tokens(lm: Any, before: int) -> tuple[int, int]:
    """Prompt/completion tokens of the LM's history entries since ``before`` (for LMs that report
    no usage, such as test doubles)."""
    prompt = completion = 0
    for entry in list(getattr(lm, "history", []))[before:]:
        for m in entry.get("messages") or []:
            content = m.get("content") if isinstance(m, dict) else None
            prompt += count_tokens(content if isinstance(content, str) else str(content or ""))
        for o in entry.get("outputs") or []:
            completion += count_tokens(o if isinstance(o, str) else str(o))
    return prompt, completion


def _shuffled(ids: list[str], seed: int) -> list[str]:
    order = list(ids)
    random.Random(f"blind:{seed}").shuffle(order)
    return order


def _rejected(stage: str, reason: str, detail: str | None, usage, **parts: Any) -> Outcome:
    return Outcome(
        status="rejected", stage=stage, reason=reason, detail=detail, usage=usage, **parts
    )
