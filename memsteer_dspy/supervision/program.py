"""The MemSteer supervision program and its baselines, as ``dspy.Module``s (paper Section 3.2).

:class:`MemSteerGenerator` turns one material bundle and task into one candidate QA–evidence item:

1. ``plan`` (planner LM) — :class:`~memsteer_dspy.signatures.plan.PlanAnswer` → an
   :class:`~memsteer_dspy.signatures.plan.AnswerPlan`;
2. programmatic plan checks with reason codes and deterministic citation repair
   (:func:`~memsteer_dspy.supervision.checks.check_plan`);
3. ``write_question`` (question writer LM) — :class:`~memsteer_dspy.signatures.question.WriteQuestion`,
   then :func:`~memsteer_dspy.supervision.checks.check_question` (``lean``: the question is first put
   in the user's voice, :func:`user_voice`, and must ask for its answer's kind, ``wrong_kind``);
4. ``audit`` (auditor LM) — :class:`~memsteer_dspy.signatures.audit.AuditQA`; every required verdict
   must be "supported" (``lean``: when every fact is its cited sentence's own words,
   :func:`~memsteer_dspy.supervision.checks.quoted_fact_support` settles the per-fact judgments and
   the LM answers :class:`~memsteer_dspy.signatures.audit.AuditQuotedFacts`, the rest of the audit);
5. ``blind_read`` (blind reader LM) — :class:`~memsteer_dspy.signatures.blind_read.BlindRead` over
   the bundle's records in shuffled order; accepted only if answerable, the answer matches the
   reference after type normalization, and the citations cover every evidence record.

Each sub-predictor runs on its role's LM (``lms`` maps role → ``dspy.BaseLM``). An LM call that
raises or returns something unparseable is retried (``max_retries``, re-sampled) and then rejects
the candidate with reason ``lm_error``; nothing is raised for one candidate's failure.

``generator(bundle=..., task=...)`` runs one candidate; :meth:`run_batch` runs many stage by stage
(every plan, then every question, …), which lets an in-process LM reuse the cached prompt prefix
(instructions and demonstrations) from one call to the next — on the embedded model that saves
most of the prompt processing. Each candidate's pipeline is written once, as a Python generator
that yields its LM requests; :meth:`forward` and :meth:`run_batch` only differ in how they drive it.

Accepted candidates become few-shot demonstrations (:meth:`add_demo`) on the planner, question
writer and blind reader, so a small LM sees what a good, short, span-grounded item looks like.

Baselines behind the same interface (the paper's Tables 4–5): :class:`JointGenerator` (plan and
question in one call) and :class:`DirectGenerator` (question, answer and evidence in one call; also
the ``naive`` method with random bundles). ``checks=False`` skips the plan checks, audit and blind
read (the ``--no-checks`` ablation).
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import dspy
from pydantic import BaseModel, Field

from memsteer_dspy.bundles import (
    MAX_ANSWER_OPTIONS,
    UNDATED_EVENT_KINDS,
    AnswerOption,
    Bundle,
    BundleView,
    Task,
    answer_options,
    bridge_event,
    event_span,
    plain_text,
    stating_spans,
    task_options,
    update_options,
    update_values,
    whole_word,
)
from memsteer_dspy.normalize import answers_match
from memsteer_dspy.records import Span
from memsteer_dspy.signatures.audit import AuditQA, AuditQuotedFacts
from memsteer_dspy.signatures.baselines import PlanAndWriteQuestion, WriteQAPair
from memsteer_dspy.signatures.blind_read import BlindRead
from memsteer_dspy.signatures.plan import AnswerPlan, EvidenceUse, Fact, PlanAnswer, PlanFromOptions
from memsteer_dspy.signatures.question import WriteQuestion
from memsteer_dspy.supervision.adapter import CompactJSONAdapter
from memsteer_dspy.supervision.checks import (
    _DATE_IN_TEXT,
    _RELATIVE_TIME,
    PlanIssue,
    Repair,
    answer_spans,
    check_plan,
    check_question,
    detail_terms,
    echoes,
    names_self,
    outside_quotes,
    prefilter_bundle,
    quoted_fact_support,
    records_missed,
    spans_by_id,
    swaps_roles,
    user_display_name,
)
from memsteer_dspy.supervision.limits import bounded_signature
from memsteer_dspy.tokens import count_tokens

__all__ = [
    "GENERATION_ROLES",
    "OWN_WORDS_VERSION",
    "AuditResult",
    "BlindResult",
    "DirectGenerator",
    "JointGenerator",
    "MemSteerGenerator",
    "Outcome",
    "Pipeline",
    "RoleCost",
    "make_generator",
]

GENERATION_ROLES = ("planner", "question_writer", "auditor", "blind_reader")
# Output-token caps per call: enough for the fields, short enough that a small LM cannot ramble.
MAX_TOKENS = {"plan": 400, "question": 100, "audit": 600, "blind": 160, "joint": 500, "direct": 300}
# lean: what the bounded roles were measured to need in one-line JSON (plan ~120 tokens, audit ~250)
LEAN_MAX_TOKENS = {**MAX_TOKENS, "plan": 300, "question": 80, "audit": 400, "blind": 100}
# What each version changed, and why: experiments/results/supervision-versions.md
LEAN_VERSION = 17
LEAN_QUESTION_REWRITES = 1
"""Lean re-samples a rejected question this many times (the earlier pipeline: 2). Measured on the
embedded writer over three runs (runs/demo-2, runs/demo-4, the thirteenth cost run's lean-anchor;
69 candidates): the second re-sample never saved a candidate (25 of 25 were rejected at the
question stage again, mostly the same question back), while the first re-sample let 3 through to
acceptance; the third writer call cost about 60 s of a 16-minute demo."""
# What each version changed, and why: experiments/results/supervision-versions.md
PROMPT_VERSION = 3
# What each version changed, and why: experiments/results/supervision-versions.md
ANCHORED_VERSION = 19
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


class _Generator(dspy.Module):
    """What every generation method shares: per-role LMs, bounded retries, usage booking, demos,
    the pipeline driver, and the verification stages (question check, audit, blind read)."""

    method: str = "memsteer"

    def __init__(
        self,
        lms: Mapping[str, dspy.BaseLM] | None = None,
        *,
        checks: bool = True,
        max_retries: int = 2,
        max_demos: int = 2,
        adapter: dspy.Adapter | None = None,
        max_answer_words: int = 10,
        bounded: bool = False,
        cold_start: bool = True,
        question_rewrites: int | None = None,
        plan_retries: int = 1,
        user_name: str | None = None,
        lean: bool = False,
        anchored: bool = False,
        own_words: bool = False,
        bridges: bool = False,
        updates: bool = False,
    ):
        super().__init__()
        self.updates = updates
        self.lean = lean
        self.anchored = anchored
        self.own_words = own_words
        self.bridges = bridges
        self.max_tokens = LEAN_MAX_TOKENS if lean else MAX_TOKENS
        self.user_name = user_name
        if question_rewrites is None:
            question_rewrites = LEAN_QUESTION_REWRITES if lean else 2
        self.question_rewrites = question_rewrites
        self.plan_retries = plan_retries
        self.bounded = bounded
        self.cold_start = cold_start
        self.checks = checks
        self.max_retries = max_retries
        self.max_demos = max_demos
        self.adapter = adapter or (CompactJSONAdapter() if lean else dspy.JSONAdapter())
        self.max_answer_words = max_answer_words
        self.audit = dspy.Predict(AuditQA)
        self.blind_read = dspy.Predict(BlindRead)
        self._demo_lock = threading.Lock()
        self._demo_count = 0
        self.role_of: dict[str, str] = {"audit": "auditor", "blind_read": "blind_reader"}
        if lean:  # the audit of a plan whose facts are quoted sentences (see _verify)
            self.audit_quoted = dspy.Predict(AuditQuotedFacts)
            self.role_of["audit_quoted"] = "auditor"
        self._pending_lms = dict(lms or {})

    def _ready(self) -> None:
        """Subclasses call this after adding their predictors: LMs, output limits, first demos."""
        if self.bounded:
            for name in self.role_of:
                predictor = getattr(self, name)
                predictor.signature = bounded_signature(predictor.signature)
        if self._pending_lms:
            self.set_role_lms(self._pending_lms)
        if self.cold_start:
            bundle, task, outcome = cold_start_example()
            view = bundle.view()
            examples = self._demo_examples(view, outcome.plan, outcome, task, bundle)
            for name, example in examples.items():
                getattr(self, name).demos = [example]

    # -- LMs ---------------------------------------------------------------------------------
    def set_role_lms(self, lms: Mapping[str, dspy.BaseLM]) -> None:
        """Put each sub-predictor on its role's LM (a role without an LM uses ``dspy.settings.lm``)."""
        for name, role in self.role_of.items():
            if role in lms:
                getattr(self, name).lm = lms[role]

    def _invoke(self, request: _Request) -> dspy.Prediction:
        """One predictor call with bounded, re-sampled retries; raises :class:`_LMFailure` when
        every attempt fails. Calls, tokens and seconds are booked under the predictor's role."""
        predictor = getattr(self, request.predictor)
        lm = predictor.lm or dspy.settings.lm
        cost = request.usage.setdefault(self.role_of[request.predictor], RoleCost())
        last: BaseException | None = None
        for attempt in range(self.max_retries + 1):
            config: dict[str, Any] = {"max_tokens": self.max_tokens.get(request.stage, 600)}
            if attempt or request.resample:
                config.update(rollout_id=attempt + 10 * request.resample, temperature=0.7)
            before = len(getattr(lm, "history", None) or [])
            start = time.perf_counter()
            out = None
            with dspy.track_usage() as tracker, dspy.context(adapter=self.adapter):
                try:
                    out = predictor(**request.inputs, config=config)
                except Exception as exc:  # an LM or parse failure of this call only
                    last = exc
            cost.calls += 1
            cost.seconds = round(cost.seconds + time.perf_counter() - start, 3)
            prompt, completion, cached = _usage_tokens(tracker)
            if prompt == 0 and completion == 0 and lm is not None:
                prompt, completion = _estimate_tokens(lm, before)
                cost.estimated = cost.estimated or bool(prompt or completion)
            cost.prompt_tokens += prompt
            cost.cached_tokens += min(cached, prompt)
            cost.completion_tokens += completion
            if out is not None:
                return out
            cost.failed_calls += 1
        raise _LMFailure(request.stage, f"{type(last).__name__}: {str(last)[:300]}")

    # -- driving pipelines -------------------------------------------------------------------
    def _pipeline(self, bundle: Bundle, task: Task, shuffle_seed: int) -> Pipeline:
        raise NotImplementedError

    def forward(self, bundle: Bundle, task: Task, shuffle_seed: int = 0) -> dspy.Prediction:
        """Run one candidate; returns ``dspy.Prediction(outcome=Outcome)``."""
        return dspy.Prediction(outcome=self._drive([self._pipeline(bundle, task, shuffle_seed)])[0])

    def run_batch(
        self,
        items: Sequence[tuple[Bundle, Task, int]],
        on_call: Callable[[str, int, int], None] | None = None,
        on_done: Callable[[int, Outcome], None] | None = None,
    ) -> list[Outcome]:
        """Run many candidates stage by stage: all pending plan calls, then question calls, …

        Same outcomes as calling the module on each item, in an order that lets an in-process LM
        reuse its cached prompt prefix (the stage's instructions and demonstrations).
        ``on_call(stage, done, total)`` is told after each LM call (for progress display), and
        ``on_done(item index, outcome)`` as soon as an item is finished (so it can be saved).
        """
        return self._drive([self._pipeline(b, t, s) for b, t, s in items], on_call, on_done)

    def _drive(
        self,
        pipelines: list[Pipeline],
        on_call: Callable[[str, int, int], None] | None = None,
        on_done: Callable[[int, Outcome], None] | None = None,
    ) -> list[Outcome]:
        results: list[Outcome | None] = [None] * len(pipelines)
        pending: dict[int, _Request] = {}

        def advance(i: int, send: Any = None, error: BaseException | None = None) -> None:
            try:
                request = (
                    pipelines[i].throw(error) if error is not None else pipelines[i].send(send)
                )
            except StopIteration as stop:
                results[i] = stop.value
                pending.pop(i, None)
                if on_done is not None:
                    on_done(i, stop.value)
            else:
                pending[i] = request

        for i in range(len(pipelines)):
            advance(i)
        while pending:
            stage = min((r.stage for r in pending.values()), key=STAGE_ORDER.index)
            batch = sorted(k for k, r in pending.items() if r.stage == stage)
            for done, i in enumerate(batch, 1):
                try:
                    out = self._invoke(pending[i])
                except _LMFailure as exc:
                    advance(i, error=exc)
                else:
                    advance(i, send=out)
                if on_call is not None:
                    on_call(stage, done, len(batch))
        return [r for r in results if r is not None]

    # -- demos -------------------------------------------------------------------------------
    def add_demo(self, bundle: Bundle, task: Task, outcome: Outcome) -> bool:
        """Add an accepted candidate as a few-shot demonstration (up to ``max_demos``).

        The demo shows only the evidence records, each cut after the last span it cites, so it
        teaches the output format and answer length without costing a small LM a whole bundle.
        """
        if self.max_demos <= 0 or outcome.status != "accepted" or outcome.plan is None:
            return False
        plan = outcome.plan
        if len(plan.evidence_ids) > 2 or not plan.facts:
            return False
        with self._demo_lock:
            if self._demo_count >= self.max_demos:
                return False
            demo = _demo_bundle(bundle, plan)
            view = demo.view()
            for name, example in self._demo_examples(view, plan, outcome, task, demo).items():
                predictor = getattr(self, name)
                predictor.demos = [*predictor.demos, example]
            self._demo_count += 1
        return True

    def _demo_examples(
        self,
        view: BundleView,
        plan: AnswerPlan,
        outcome: Outcome,
        task: Task,
        bundle: Bundle | None = None,
    ) -> dict[str, dspy.Example]:
        cited = [view.span_label(f.span_id) for f in plan.facts]
        blind = dspy.Example(
            question=outcome.question,
            answer_type=plan.answer_type,
            records=view.text,
            cited_ids=cited,
            answer=plan.answer,
            answerable=True,
        ).with_inputs("question", "answer_type", "records")
        return {"blind_read": blind}

    # -- shared stages -----------------------------------------------------------------------
    def _checked_plan(
        self,
        plan: AnswerPlan,
        task: Task,
        bundle: Bundle,
        view: BundleView,
        *,
        require_facts: bool = True,
    ) -> tuple[AnswerPlan, list[PlanIssue], list[Repair]]:
        texts = spans_by_id(bundle.spans())
        resolved, issues, repairs = check_plan(
            plan,
            task,
            view,
            texts,
            max_answer_words=self.max_answer_words,
            repair=self.checks and require_facts,
            user_name=self.user_name,
            drop_unknown=self.lean,
            stated=self.lean,
            task_kind=self.lean,
        )
        if not require_facts:  # the direct baseline has no facts to check
            skip = ("no_facts", "evidence_without_fact", "answer_not_in_spans")
            issues = [i for i in issues if i.code.value not in skip]
        return resolved, issues, repairs

    def _planned(
        self,
        predictor: str,
        stage: str,
        inputs: dict[str, Any],
        to_plan: Callable[[dspy.Prediction], AnswerPlan],
        task: Task,
        bundle: Bundle,
        view: BundleView,
        usage: dict[str, RoleCost],
        *,
        require_facts: bool = True,
    ) -> Generator[
        _Request, dspy.Prediction, tuple[dspy.Prediction, AnswerPlan, list[PlanIssue], list[Repair]]
    ]:
        """The planning call and its checks; a plan that fails them is re-sampled (another rollout
        at temperature 0.7) up to ``plan_retries`` times, each re-sample recorded as a repair.

        Measured on the embedded model, a quarter of the plans failed a check (an answer that is in
        no cited sentence, a record without a fact) on bundles where another sample is fine. The
        first call's LM failure raises :class:`_LMFailure`; a re-sample's failure keeps the last
        plan and its issues."""
        out = yield _Request(predictor, stage, inputs, usage)
        plan, issues, repairs = self._checked_plan(
            to_plan(out), task, bundle, view, require_facts=require_facts
        )
        for attempt in range(1, self.plan_retries + 1 if self.checks else 1):
            if not issues:
                break
            try:
                again = yield _Request(predictor, stage, inputs, usage, resample=attempt)
            except _LMFailure:
                break
            failed = f"plan_check:{issues[0].code.value}"
            out = again
            plan, issues, repairs = self._checked_plan(
                to_plan(out), task, bundle, view, require_facts=require_facts
            )
            repairs.insert(
                0,
                Repair(
                    stage="plan",
                    field="plan",
                    before=failed,
                    after=f"re-sample {attempt}",
                    reason=f"the plan failed {failed}; planned again",
                ),
            )
        return out, plan, issues, repairs

    def _question_problem(
        self,
        question: str,
        plan: AnswerPlan,
        view: BundleView,
        bundle: Bundle,
        also_demos: Iterable[str] = (),
        *,
        own_words: bool = True,
    ) -> str | None:
        """:func:`~memsteer_dspy.supervision.checks.check_question` against the current demos (and
        ``also_demos``), with the bundle's records (``view``, the one the planner read) and the
        user's name as what the question may name; lean also holds its topic words to the plan's
        evidence records. With the generator's ``own_words`` (and ``own_words`` here), a question
        that copies its evidence records' wording is ``echoes`` (:func:`_echo`)."""
        demos = {str(d.question) for p in self.predictors() for d in p.demos if d.get("question")}
        demos.update(also_demos)
        user = user_display_name(self.user_name)
        known = f"{view.text}\n{user}"
        evidence = None
        if self.lean and plan.evidence_ids:
            evidence = f"{bundle.subset(plan.evidence_ids).view().text}\n{user}"
        added = 0  # a bridge's "on the day <event>" is the program's, not the writer's length
        if ", on the day " in question and self._bridge_span(plan, bundle) is not None:
            added = 3 + len(question.split(", on the day ", 1)[1].split())
        problem = check_question(
            question,
            plan.answer,
            str(plan.answer_type),
            demos,
            known,
            kind_check=self.lean,
            evidence_text=evidence,
            own_words=self.own_words,
            extra_words=added,
        )
        if problem is None and self.lean and names_self(question, self.user_name):
            return "names_self"  # "When did I talk to Elena Morales?", asked by Elena Morales
        if problem is None and self.lean and str(plan.answer_type) == "entity":
            span = bundle.span(plan.answer_span_id) if plan.answer_span_id else None
            if span is not None and swaps_roles(question, plan.answer, span.text):
                return "role_swap"  # "Who tried to dictate …?" -> whom the user dictated to
        if problem is None and self.anchored:
            if not _FRONTED.match(question):  # "… altered my day as the what?"
                return "not_fronted"
            if _NO_VERB.match(question):  # "When Unable to Update on School Garden Plans?"
                return "no_verb"
            if str(plan.answer_type) == "entity" and _names_part_of(question, plan.answer):
                return "leaks_answer"  # "Who is Sofia's mother?" -> Sofia Morales
            if str(plan.answer_type) == "number" and _writes_number(question, plan.answer):
                return "leaks_answer"  # "How long … that 25-minute chat …?" -> 25
            if _misses_subject(question, plan, bundle):
                return "vague"  # "When did I send the email to Sofia Morales?": which one?
            if len(plan.evidence_ids) > 1 and self._update_span(plan, bundle) is None:
                # (an update's two records share its topic: the question asks by it, not by each)
                texts = [bundle.subset([rid]).view().text for rid in plan.evidence_ids]
                if records_missed(question, plan.answer, texts):
                    return "misses_record"
        if problem is None and own_words and self._echo(question, plan, bundle):
            return "echoes"
        return problem

    def _echo(self, question: str, plan: AnswerPlan, bundle: Bundle) -> list[str] | None:
        """With ``own_words``: what of its evidence records' wording the question copies
        (:func:`~memsteer_dspy.supervision.checks.echoes`), else None."""
        if not (self.own_words and self.checks and plan.evidence_ids):
            return None
        ids = plan.evidence_ids
        if self._bridge_span(plan, bundle) is not None:
            # the program's "on the day <event>" names the other record by its own words (as
            # RHELM's questions do): the writer's part is held to the answer's record
            question, ids = question.split(", on the day ")[0], ids[:1]
        text = "\n".join(s.text for s in bundle.subset(ids).spans())
        # a question about two records names something of each (records_missed): the allowance
        # is per evidence record
        return echoes(question, text, plan.answer, records=len(ids))

    def _anchored_ask(
        self, plan: AnswerPlan, view: BundleView, bundle: Bundle
    ) -> tuple[AnswerPlan, Repair | None]:
        """The anchored plan with an ask the question writer can follow: the planner's own, unless
        it would fail as a question (vague, a demonstration's ask, off its evidence records, the
        answer in it, …: :meth:`_question_problem`); then its answer sentence's ask
        (:func:`sentence_ask`) replaces it, recorded as a repair."""
        ask = first_person(plan.ask, keep_quoted=True).strip().rstrip(".")
        demo_asks = {str(d.ask) for p in self.predictors() for d in p.demos if d.get("ask")}
        as_question = ask if ask.endswith("?") else f"{ask}?"
        problem = (  # the ask may use its sentence's words: the writer says them in the user's own
            self._question_problem(as_question, plan, view, bundle, demo_asks, own_words=False)
            if ask
            else "empty"
        )
        span = bundle.span(plan.answer_span_id) if plan.answer_span_id else None
        if span is None:
            return plan, None
        second = _second_answer_span(plan, bundle)
        if second is None and (earlier := self._update_span(plan, bundle)) is not None:
            # ask for the current value by the earlier sentence's ask: the later one says "moved"
            kind = str(plan.answer_type)
            old = next(iter(update_values(earlier.text, kind)), "")
            new = f"{sentence_ask(earlier.text, old, kind)}, now that it has changed"
            repair = Repair(
                stage="plan",
                field="ask",
                before=plan.ask,
                after=new,
                reason="a knowledge update: the earlier sentence's ask, now",
            )
            return plan.model_copy(update={"ask": new}), repair
        bridge = self._bridge_span(plan, bundle) if second is None else None
        if bridge is not None:
            problem = problem or "bridge"  # the planner asked by the answer's own record alone
        if problem is None:
            new, why = plan.ask, ""
        else:
            kind = str(plan.answer_type)
            new = header_ask(bundle, span, plan.answer) or sentence_ask(
                span.text, plan.answer, kind
            )
            if second is not None:  # a two-record option: ask by both sentences
                new = f"{new}, and also {sentence_ask(second.text, plan.answer, kind)}"
            why = f"the planner's ask would fail as a question ({problem}): its sentence's instead"
        if bridge is not None:  # the program adds the other record's day to the question
            return plan.model_copy(update={"ask": new}), Repair(
                stage="plan",
                field="ask",
                before=plan.ask,
                after=new,
                reason="a bridge: its sentence's ask; the program adds the other record's day",
            )
        record = bundle.record(span.id.rpartition("#")[0])
        if (
            second is None
            and str(plan.answer_type) != "date"
            and record is not None
            and (when := spoken_date(record.date))
            and not _DATE_WORDS.search(new)
        ):  # the record's day makes the question about one event of the whole history
            new = f"{new.rstrip(' ?.')}, on {when}"
            why = (f"{why}; " if why else "") + "the record's date anchors it to one event"
        if not why:
            return plan, None
        repair = Repair(stage="plan", field="ask", before=plan.ask, after=new, reason=why)
        return plan.model_copy(update={"ask": new}), repair

    def _update_span(self, plan: AnswerPlan, bundle: Bundle) -> Span | None:
        """With ``updates``: the earlier sentence whose value the plan's answer updates (an
        :func:`~memsteer_dspy.bundles.update_options` option of the plan's two records, the same
        rule the options were made by), else None."""
        if not (self.updates and plan.answer_span_id and len(plan.evidence_ids) >= 2):
            return None
        records = [r for rid in plan.evidence_ids if (r := bundle.record(rid)) is not None]
        cited = {f.span_id for f in plan.facts}
        for option in update_options(records, self.user_name, str(plan.answer_type), limit=None):
            if option.span_id == plan.answer_span_id and option.earlier in cited:
                return bundle.span(option.earlier)
        return None

    def _bridge_span(self, plan: AnswerPlan, bundle: Bundle) -> Span | None:
        """With ``bridges``: the event sentence (:func:`~memsteer_dspy.bundles.event_span`) of
        another evidence record of the answer record's day that does not write the answer — the
        plan's bridge, which asks for the answer by that record's event — else None."""
        if not (self.bridges and plan.answer_span_id and len(plan.evidence_ids) >= 2):
            return None
        own = bundle.record(plan.answer_span_id.rpartition("#")[0])
        if own is None or not own.date:
            return None
        word = whole_word(plan.answer) if plan.answer.strip() else None
        for fact in plan.facts:
            record = bundle.record(fact.span_id.rpartition("#")[0])
            if (
                record is None
                or record.id == own.id
                or record.id not in plan.evidence_ids
                or record.date != own.date
                or record.kind in UNDATED_EVENT_KINDS
            ):
                continue
            event = event_span(stating_spans(record))
            if (
                event is not None
                and event.id == fact.span_id
                and (word is None or not word.search(plain_text(event.text)))
            ):
                return event
        return None

    def _verify(
        self,
        bundle: Bundle,
        view: BundleView,
        plan: AnswerPlan,
        question: str,
        usage: dict[str, RoleCost],
        shuffle_seed: int,
        repairs: list[Repair],
        *,
        question_check: bool = True,
        problem: str | None = None,
    ) -> Pipeline:
        """Question check → audit → blind read; the candidate's final outcome. With
        ``question_check=False`` the question is not checked here: ``problem`` is what the caller's
        own check found (None: fine, or not checked at all)."""
        base = {"plan": plan, "question": question, "repairs": repairs}
        if not self.checks:
            return Outcome(status="accepted", usage=usage, **base)
        if question_check:
            problem = self._question_problem(question, plan, view, bundle)
        if problem:
            return _rejected("question", f"question:{problem}", question, usage, **base)
        # lean: the blind read (short answer, the check that rejects corrupted items) before the
        # audit (long verdicts), so only candidates the blind reader confirms pay for an audit
        stages = ("blind", "audit") if self.lean else ("audit", "blind")
        # lean: facts that are their cited sentences' own words are supported by construction (the
        # planner cites sentences, the program fills each fact in from its sentence); a small
        # auditor asked to confirm them anyway spends most of its output on those verdicts
        quoted = self.lean and quoted_fact_support(plan, spans_by_id(bundle.spans()))
        audit = blind = None
        for stage in stages:
            if stage == "audit":
                predictor = "audit_quoted" if quoted else "audit"
                try:
                    inputs = _audit_inputs(view, bundle, plan, question)
                    out = yield _Request(predictor, "audit", inputs, usage)
                except _LMFailure as exc:
                    return _rejected(exc.stage, "lm_error", exc.detail, usage, blind=blind, **base)
                audit = _audit_result(out, view, plan, quoted=quoted)
                if audit.failures:
                    return _rejected(
                        "audit",
                        f"audit:{audit.failures[0]}",
                        ", ".join(audit.failures),
                        usage,
                        audit=audit,
                        blind=blind,
                        **base,
                    )
                continue
            order = _shuffled(bundle.record_ids, shuffle_seed)
            blind_view = bundle.view(order)
            try:
                out = yield _Request(
                    "blind_read",
                    "blind",
                    {
                        "question": question,
                        "answer_type": plan.answer_type,
                        "records": blind_view.text,
                    },
                    usage,
                )
            except _LMFailure as exc:
                return _rejected(exc.stage, "lm_error", exc.detail, usage, audit=audit, **base)
            day = self._bridge_span(plan, bundle) if self.anchored else None
            day = day or (self._update_span(plan, bundle) if self.anchored else None)
            blind = _blind_result(out, blind_view, bundle, plan, order, repairs, day)
            problem = _blind_problem(blind, plan)
            if problem is not None:
                return _rejected("blind", *problem, usage, audit=audit, blind=blind, **base)
        kind = None
        if self.anchored and self._update_span(plan, bundle) is not None:
            kind = "knowledge-update"
        elif self.anchored and self._bridge_span(plan, bundle) is not None:
            kind = "multi-hop"
        return Outcome(
            status="accepted", audit=audit, blind=blind, usage=usage, question_type=kind, **base
        )


def _audit_inputs(
    view: BundleView, bundle: Bundle, plan: AnswerPlan, question: str
) -> dict[str, Any]:
    evidence = [
        f"{view.label_of(e.record_id) or e.record_id}: {e.contribution or 'part of the answer'}"
        for e in plan.evidence
    ]
    return {
        "records": view.text,
        "question": question,
        "answer": plan.answer,
        "answer_type": str(plan.answer_type),
        "ask": plan.ask or question,
        "facts": _fact_lines(view, bundle, plan),
        "evidence": evidence,
    }


def _blind_problem(blind: BlindResult, plan: AnswerPlan) -> tuple[str, str] | None:
    """Why the blind read rejects the candidate (reason, detail), or None when it confirms it."""
    if not blind.answerable:
        return "blind:unanswerable", "the blind reader found the question unanswerable"
    if not blind.matched:
        return "blind:mismatch", f"blind answer {blind.answer!r} vs reference {plan.answer!r}"
    if blind.missing_evidence:
        return "blind:citation", f"evidence not cited: {blind.missing_evidence}"
    return None


_REWRITE_HINTS = {
    "vague": "name the people, places, things or events it is about, and no relative day such as 'today'",
    "mentions_records": "ask about the user's own life, never about 'the user', 'the conversation' or the records",
    "leaks_answer": "do not put the answer in the question",
    "copies_demo": "ask about these records, not about the example",
    "unknown_name": "name only people, places and things the records name",
    "unknown_detail": "write no number, time or detail the facts do not state",
    "names_self": "you are the one asking: say 'I', 'me' or 'my', never your own name",
    "role_swap": "the answer is not the one who did it, you did: ask 'Who did I … to/with?'",
    "too_long": "ask in a short question (at most 20 words) by the event's key words, not its whole sentence",
    "wrong_kind": "ask for the answer's kind: 'When …?' for a date, 'How many …?' for a number, "
    "'Who …?' or 'What …?' for a name or thing, and one of them ('Who is …?'), not several ('Who are …?')",
    "compound": "ask one thing only, in one question",
    "off_evidence": "ask about what the facts say: name their people, places and things",
    "misses_record": "ask by what every fact says about the answer, one detail of each",
    "not_fronted": "start with the question word (Who, What, When, Where, How many) and end with '?'",
    "no_verb": "after the question word put a verb: 'When did I …?', 'When was the email … sent?'",
    "empty": "write one complete question ending with '?'",
    "not_a_question": "write one complete question ending with '?'",
    "echoes": "ask it as I would months later, in my own everyday words: keep the names, but do not "
    "copy the record's wording",
}


def rewrite_hint(question: str, problem: str | None, details: Sequence[str] = ()) -> str:
    """What a re-sampled question writer is told (its ``avoid`` input): the rejected question,
    what to fix, and for a vague one the facts' concrete details it can name. Measured on the
    embedded writer: told nothing, it returned the same question at temperature 0.7; told "be
    specific" without the words to be specific with, a vague one again; told inside ``ask``, it
    copied the hint into the question — hence a field of its own."""
    hint = _REWRITE_HINTS.get(problem or "", "write a different question")
    if problem == "vague" and details:
        hint += f"; it could mention {', '.join(details)}"
    if problem == "echoes" and details:
        hint += f"; say these differently or leave them out: {', '.join(repr(d) for d in details)}"
    if problem == "not_fronted" and (word := _INNER_QUESTION_WORD.search(question)):
        # the writer copied an ask with its question word in the answer's place ("Demolition
        # slips by how many, …"): name the word to move, as the general hint did not
        first = word.group(0)
        hint = (
            f"move '{first.lower()}' to the front: start with '{first.capitalize()}', "
            "then ask the rest, and end with '?'"
        )
    return f"{question!r} was rejected ({problem}): {hint}."


_INNER_QUESTION_WORD = re.compile(
    r"\b(?:how (?:many|much|long|often|far)|who|whom|whose|what|when|where|which)\b", re.I
)


_USER_AFTER_PREP = re.compile(
    r"\b(with|to|for|from|at|by|of|about|on|told|asked|helped)\s+the\s+user\b", re.I
)


# The question word a sentence ask (sentence_ask) puts in the answer's place, by answer type (an
# entity's is chosen by _entity_word). One word: "who or what" reads as two questions (compound).
_ASK_FOR = {
    "number": "how many",
    "list": "which ones",
    "date": "when",
    "text": "what",
    "boolean": "whether",
}
SENTENCE_ASK_WORDS = 40
"""A sentence ask quotes at most this many words of its sentence, around the answer's place."""
# Where a sentence splits into clauses: a sentence ask keeps the clause that holds the answer.
# where a sentence's clauses meet: a conjunction, a semicolon, a dash, a colon, or a comma before
# a new subject ("My friend Marcus Lee is running it too, he's much faster though": the whole
# sentence as the ask gave "Who is running it too, he's much faster though, …?", kept by demo-14
# and demo-15)
_CLAUSE_BREAK = re.compile(
    r",\s+(?:but|and|so|because|while|although|though|which)\s+|;\s+|\s*[—–]\s*|:\s+"
    r"|,\s+(?=(?:he|she|they|it|we|I|you)(?:['’](?:s|re|m|ll|d|ve))?\s)"
)
_PERSON = re.compile(r"(?:(?:Dr|Ms|Mr|Mrs)\.\s+)?[A-Z][a-z]+(?:\s+[A-Z][a-z]+){0,2}")


_MONTH_NAMES = (
    "January February March April May June July August September October November December".split()
)
_DATE_WORDS = re.compile(
    rf"\b(?:{'|'.join(_MONTH_NAMES)})\b|\b\d{{4}}-\d{{2}}-\d{{2}}\b|\b(?:19|20)\d\d\b", re.I
)


def spoken_date(iso: str | None) -> str | None:
    """``2024-05-18`` as "May 18, 2024" (None for a missing or unreadable date)."""
    m = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})", iso or "")
    if m is None or not 1 <= int(m.group(2)) <= 12:
        return None
    return f"{_MONTH_NAMES[int(m.group(2)) - 1]} {int(m.group(3))}, {m.group(1)}"


_HEADER_LINE = re.compile(r"^\s*(Sender|From|Recipient|To)\s*:", re.I)
_SUBJECT = re.compile(r"^\s*Subject\s*:\s*(.+)$", re.I)


def header_ask(bundle: Bundle, span: Span, answer: str) -> str | None:
    """The ask for a name cited from an email's sender or recipient line: who sent, or received,
    the email with that record's subject (``who sent the email "Quick Health Update"``); None for
    any other sentence. The sentence ask of such a line is its address: the embedded writer turned
    ``who <sofia.morales@email.com>`` into "Who is Sofia Morales?"."""
    line = _HEADER_LINE.match(span.text)
    record = bundle.record(span.id.rpartition("#")[0])
    if line is None or record is None:
        return None
    subject = next(
        (m.group(1).strip() for s in record.spans if (m := _SUBJECT.match(s.text))), None
    )
    if not subject:
        return None
    if line.group(1).lower() in ("sender", "from"):
        return f'who sent the email "{subject}"'
    return f'who the email "{subject}" was sent to'


# A question that starts with its question word (after a preposition: "On what day …", "With whom
# …") or an auxiliary ("Did …"). The embedded writer returned sentence asks as they were: "October
# 14, 2024 brought unexpected health challenges that … altered my day as the what?"
_FRONTED = re.compile(
    r"^\W*(?:(?:on|in|at|with|to|for|from|by|since|during|of|about|after|before)\s+)?"
    r"(?:who|whom|whose|what|when|where|which|why|how|is|are|was|were|did|do|does|has|have|had"
    r"|can|could|will|would|should)\b",
    re.I,
)
# "When", "Where" or "Why" followed by no verb: a title or subject copied after the question word
# ("When Unable to Update on School Garden Plans?"). "When's …" and "Where'd …" are verbs, and a
# question with an auxiliary further on ("When I was in Eugene, what did I wear?") has its verb.
_AUXILIARY = (
    r"(?:is|are|was|were|am|did|do|does|has|have|had|can|could|will|would|should|shall|may|might"
    r"|must)"
)
_NO_VERB = re.compile(
    r"^\W*(?:(?:on|in|at|with|to|for|from|by|since|during|of|about|after|before)\s+)?"
    rf"(?:when|where|why)\s+(?!.*\b{_AUXILIARY}\b)",
    re.I,
)


def _names_part_of(question: str, answer: str) -> bool:
    """Whether the question writes a capitalised word of a name answer ("Who is Sofia's mother?"
    for "Sofia Morales"): it gives the answer away, or asks about the answer's own relation."""
    words = [w for w in re.findall(r"[A-Z][A-Za-z-]{2,}", answer)]
    return any(re.search(rf"(?<![\w-]){re.escape(w)}(?![\w-])", question) for w in words)


# Subject words that say nothing about which email it is ("Thank You for Your Help").
_COURTESY = frozenset({"thank", "thanks", "your", "this", "that", "with", "from", "about"})


def _subject_stems(text: str) -> set[str]:
    return {w.lower()[:5] for w in re.findall(r"[A-Za-z]{4,}", text)} - {w[:5] for w in _COURTESY}


def _misses_subject(question: str, plan: AnswerPlan, bundle: Bundle) -> bool:
    """Whether a date question cited from an email's subject line names fewer than half of the
    subject's words (compared by their first five letters): "When did I send the email to Sofia
    Morales?" for "Subject: Thank You for Your Help This Morning" asks about one of many emails,
    and its own date is then no check that the reader found the right one."""
    if str(plan.answer_type) != "date" or not plan.answer_span_id:
        return False
    span = bundle.span(plan.answer_span_id)
    subject = _SUBJECT.match(span.text) if span is not None else None
    if subject is None or not (words := _subject_stems(subject.group(1))):
        return False
    return 2 * len(words & _subject_stems(question)) < len(words)


def _writes_number(question: str, answer: str) -> bool:
    """Whether the question writes a number answer's number outside a date ("How long did it take
    me during that 25-minute chat?" for 25; the "on July 9, 2024" a one-record ask carries does not
    count)."""
    m = re.match(r"\s*(\d+(?:[.,]\d+)?)", answer)
    if m is None:
        return False
    rest = _DATE_IN_TEXT.sub(" ", question)
    return re.search(rf"(?<![\d.,]){re.escape(m.group(1))}(?![\d]|[.,]\d)", rest) is not None


def _second_answer_span(plan: AnswerPlan, bundle: Bundle) -> Span | None:
    """The fact sentence of another evidence record that writes the plan's answer too (the second
    sentence of a two-record option), or None."""
    if not plan.answer_span_id or len(plan.evidence_ids) < 2:
        return None
    own = plan.answer_span_id.rpartition("#")[0]
    word = whole_word(plan.answer)
    for fact in plan.facts:
        span = bundle.span(fact.span_id)
        rid = fact.span_id.rpartition("#")[0]
        if (
            span is not None
            and rid != own
            and rid in plan.evidence_ids
            and word.search(plain_text(span.text))
        ):
            return span
    return None


def _entity_word(answer: str, before: str) -> str:
    """An entity's question word from the words before it: "where" after "at" / "in" / "near",
    "what" after an article or possessive ("my MacBook Air") or for anything but a name of one to
    three capitalised words, else "who"."""
    last = before.split()[-1].lower() if before.split() else ""
    if last in ("at", "in", "near"):
        return "where"
    determiner = last in ("a", "an", "the", "my", "our", "your", "his", "her", "their")
    return "what" if determiner or not _PERSON.fullmatch(answer) else "who"


def sentence_ask(sentence: str, answer: str, answer_type: str) -> str:
    """What the question should ask, read off the answer's own sentence: the clause that holds the
    answer, with its question word in the answer's place (``I tried to message who for
    feedback``; a number keeps its unit: ``we lost how many hours of class``), or, where the
    sentence does not write the answer (a date answered by its record's date), the sentence as the
    event asked about (``when: "I cleared that small pile of books"``).

    The anchored planner knows its answer but writes a poor ask: on the embedded model it copied
    the cold-start demonstration's "who is coming with me to the pottery class" into bundles with
    no pottery class, and wrote "who is involved in the garden activities" (vague); the question
    writer then wrote "Who is Lila?". Its first forms were copied too: ``who or what is the ___
    in: "…"`` gave "Who or what is the recipient in the given text?", and the whole sentence with
    "who or what" in place gave "Who or what did I try to message for feedback, but my hands were
    shaking so much …?" (compound, twice over)."""
    text = plain_text(sentence).strip()
    if answer_type == "date" and (subject := _SUBJECT.match(sentence)):
        # an email dated by its subject line: the bare subject after "when" came back as "When
        # Unable to Update on School Garden Plans?" (the twenty-second cost run)
        return f'when was the email "{subject.group(1).strip()}" sent'
    needle = answer.strip()
    match = re.search(rf"(?<!\w){re.escape(needle)}(?!\w)", text, re.I) if needle else None
    if match is None:  # "when I cleared that small pile of books" (v6 quoted it after "when:",
        # and the writer copied the frame: "When: 'Active communication among staff …'?")
        words = text.split()[:SENTENCE_ASK_WORDS]
        return f"{_ASK_FOR.get(answer_type, 'what')} {' '.join(words)}".rstrip(" ,.;:!")
    if answer_type == "entity":
        wh = _entity_word(match.group(0), text[: match.start()])
    elif answer_type == "number" and (unit := re.fullmatch(r"[\d.,]+\s+([A-Za-z-]+)", needle)):
        wh = f"how many {unit.group(1)}"
    else:
        wh = _ASK_FOR.get(answer_type, "what")
    marked = f"{text[: match.start()]}\x00{text[match.end() :]}"
    clauses = _CLAUSE_BREAK.split(marked)
    at = next(i for i, c in enumerate(clauses) if "\x00" in c)
    clause = clauses[at]
    if len(clause.split()) < 4:  # too short to name anything: with the clause before, or whole
        clause = f"{clauses[at - 1]}, {clause}" if at else marked
    words = clause.split()
    if len(words) > SENTENCE_ASK_WORDS:  # the words around the answer's place
        i = next((n for n, w in enumerate(words) if "\x00" in w), 0)
        start = max(0, min(i - SENTENCE_ASK_WORDS // 2, len(words) - SENTENCE_ASK_WORDS))
        words = words[start : start + SENTENCE_ASK_WORDS]
    return " ".join(words).replace("\x00", wh).rstrip(" ,.")


def first_person(ask: str, *, keep_quoted: bool = False) -> str:
    """The plan's ``ask`` in the user's voice for the question writer: "the user's" → "my",
    "with the user" → "with me", "the user" → "I". A writer given "what the user's health profile
    is" wrote "What is the health profile of the user?" three times out of three. With
    ``keep_quoted`` (anchored) quoted text keeps its words (:func:`outside_quotes`)."""

    def voice(text: str) -> str:
        text = re.sub(r"\bthe\s+user['’]s\b", "my", text, flags=re.I)
        text = _USER_AFTER_PREP.sub(lambda m: f"{m.group(1)} me", text)
        return re.sub(r"\bthe\s+user\b", "I", text, flags=re.I)

    return outside_quotes(ask, voice) if keep_quoted else voice(ask)


_YOU_SUBJECT = re.compile(
    r"\byou\b(?=\s+(?:am|was|have|had|will|would|can|could|should|might|must|"
    r"do|did|got|went|met|made|said|told|saw|took|gave|sent|bought|ate|wrote|felt|left|came|"
    r"kept|found|heard|thought|knew|began|spent|paid|read|\w+ed|"
    r"want|need|like|love|hope|plan|think|feel|know|see|say|use|get|wish|prefer|mean|keep|try|"
    r"remember|mention|have|go|work|live|enjoy|call|ask|tell|bring|take|make|buy|visit|meet)\b)",
    re.I,
)
# "help you plan", "made you feel", "let you know": "you" is the object of these before a bare verb
_CAUSATIVE = frozenset(
    "help helps helped let lets make makes made have has had watch watched saw hear heard "
    "bid get got".split()
)


def _object_you(text: str, at: int) -> bool:
    before = re.findall(r"[A-Za-z']+", text[:at])
    return bool(before) and before[-1].lower() in _CAUSATIVE


_AUX_YOU = re.compile(
    r"\b(did|do|does|have|had|will|would|can|could|should|shall|might|must|are|were)\s+you\b", re.I
)
_FIRST_PERSON_AUX = {"are": "am", "were": "was"}


def user_voice(question: str) -> str:
    """A question in the user's own voice: "you" → "I" / "me", "your" → "my". The user asks their
    assistant, so "you" would be the assistant; measured on the embedded writer, which copies the
    assistant's turns ("Who stretched out beside you?", "When did you notice the space feel
    lighter?"), a third of the questions came back in the second person."""

    def aux(m: re.Match[str]) -> str:
        verb = m.group(1)
        return f"{_FIRST_PERSON_AUX.get(verb.lower(), verb)} I"

    def voice(q: str) -> str:
        q = _AUX_YOU.sub(aux, q)
        q = re.sub(r"\byourself\b", "myself", q, flags=re.I)
        q = re.sub(r"\byours\b", "mine", q, flags=re.I)
        q = re.sub(r"\byour\b", "my", q, flags=re.I)
        q = re.sub(r"\byou\s+are\b", "I am", q, flags=re.I)
        q = re.sub(r"\byou\s+were\b", "I was", q, flags=re.I)
        q = _YOU_SUBJECT.sub(lambda m: m.group(0) if _object_you(q, m.start()) else "I", q)
        return re.sub(r"\byou\b", "me", q, flags=re.I)

    q = outside_quotes(question, voice)  # a quoted subject is a name: "Thank You for …"
    return q[:1].upper() + q[1:] if q else q


def _drop_relative_day(question: str, *, keep_quoted: bool = False) -> str:
    """A date question without its relative day ("When did I have lunch today with Lila?" →
    "When did I have lunch with Lila?"): the answer is the day, so "today" only hides it. With
    ``keep_quoted`` (lean) a quoted subject keeps its words ("… Plans Today' sent?")."""
    drop = partial(_RELATIVE_TIME.sub, "")
    out = outside_quotes(question, drop) if keep_quoted else drop(question)
    return re.sub(r"\s+([?,.])", r"\1", re.sub(r"\s{2,}", " ", out)).strip()


def _fact_lines(view: BundleView | None, bundle: Bundle, plan: AnswerPlan) -> list[str]:
    """The plan's facts as ``'<span label>: <statement>'`` (just the statement without a ``view``).

    For a date answer each fact also gives its record's date: a "when" answer is often the date of
    the record that tells the event (shown in the record's header, not in the sentence), and an
    auditor that is not told so judges the sentence alone and finds no date in it."""
    lines = []
    for f in plan.facts:
        parts = [view.span_label(f.span_id)] if view is not None else []
        record = bundle.record(f.span_id.rpartition("#")[0])
        if str(plan.answer_type) == "date" and record is not None and record.date:
            parts.append(f"(in a record dated {record.date})")
        lines.append(f"{' '.join(parts)}: {f.statement}" if parts else f.statement)
    return lines


def _audit_result(
    out: dspy.Prediction, view: BundleView, plan: AnswerPlan, *, quoted: bool = False
) -> AuditResult:
    """The audit's verdicts matched to the plan's facts and evidence records; a fact or record
    without a "supported" verdict (or with none at all) fails its check. With ``quoted`` the facts
    passed :func:`~memsteer_dspy.supervision.checks.quoted_fact_support` and each gets that verdict."""
    result = AuditResult(
        answer_support=out.answer_support,
        answer_rationale=out.answer_rationale,
        consistency=out.consistency,
        consistency_rationale=out.consistency_rationale,
    )
    fact_verdicts: dict[str, str] = {}
    if quoted:
        why = "the fact is the cited sentence's own words (lexical check)"
        for f in plan.facts:
            check = {"span_id": f.span_id, "verdict": "supported", "rationale": why}
            result.fact_checks.append(check)
            fact_verdicts[f.span_id] = "supported"
    for i, fc in enumerate([] if quoted else out.fact_checks or []):
        sid = view.resolve_span(fc.span_id)
        if sid is None and i < len(plan.facts):
            sid = plan.facts[i].span_id  # matched by position when the label is garbled
        result.fact_checks.append(
            {"span_id": sid or fc.span_id, "verdict": fc.verdict, "rationale": fc.rationale}
        )
        if sid is not None:
            fact_verdicts.setdefault(sid, fc.verdict)
    record_verdicts: dict[str, str] = {}
    for i, rc in enumerate(out.record_checks or []):
        rid = view.resolve_record(rc.record_id)
        if rid is None and i < len(plan.evidence):
            rid = plan.evidence[i].record_id
        result.record_checks.append(
            {"record_id": rid or rc.record_id, "verdict": rc.verdict, "rationale": rc.rationale}
        )
        if rid is not None:
            record_verdicts.setdefault(rid, rc.verdict)
    failures = []
    if any(fact_verdicts.get(f.span_id) != "supported" for f in plan.facts):
        failures.append("fact_support")
    if any(record_verdicts.get(rid) != "supported" for rid in plan.evidence_ids):
        failures.append("record_contribution")
    if result.answer_support != "supported":
        failures.append("answer_support")
    if result.consistency != "supported":
        failures.append("consistency")
    result.failures = failures
    return result


def _blind_result(
    out: dspy.Prediction,
    view: BundleView,
    bundle: Bundle,
    plan: AnswerPlan,
    order: list[str],
    repairs: list[Repair],
    bridge: Span | None = None,
) -> BlindResult:
    """Compare the blind answer with the reference; cited ids resolved to records. When the answer
    matched but an evidence record is uncited, and the answer occurs in exactly one span of the
    bundle (in that record), the citation is repaired and the repair recorded. So is a plan's
    ``bridge`` record left uncited when the answer's record is cited: what a bridge's record
    contributes is its day, which the program checked (it is the answer record's), and the
    question names its event (:func:`~memsteer_dspy.supervision.checks.records_missed`); what an
    update's earlier record contributes is the value the answer replaces, which the program
    found (:func:`~memsteer_dspy.bundles.update_options`). A reader that finds the answer need
    not cite the record that only says which day, or what it was before."""
    cited_ids = [str(c) for c in (out.cited_ids or [])]
    cited: list[str] = []
    for c in cited_ids:
        rid = view.resolve_record(c)
        if rid is not None and rid not in cited:
            cited.append(rid)
    matched = bool(out.answerable) and answers_match(str(out.answer), plan.answer, plan.answer_type)
    missing = [rid for rid in plan.evidence_ids if rid not in cited]
    if matched and missing:
        hits = answer_spans(view, spans_by_id(bundle.spans()), plan.answer)
        if len(hits) == 1 and (rid := hits[0].rpartition("#")[0]) in missing:
            cited.append(rid)
            missing.remove(rid)
            repairs.append(
                Repair(
                    stage="blind",
                    field="cited_record_ids",
                    before=None,
                    after=rid,
                    reason="the matched answer occurs in exactly one span of the bundle",
                )
            )
    day = bridge.id.rpartition("#")[0] if bridge is not None else None
    if matched and missing == [day] and plan.evidence_ids and plan.evidence_ids[0] in cited:
        cited.append(day)
        missing.remove(day)
        repairs.append(
            Repair(
                stage="blind",
                field="cited_record_ids",
                before=None,
                after=day,
                reason="the bridge or earlier record was checked by the program",
            )
        )
    return BlindResult(
        answerable=bool(out.answerable),
        answer=str(out.answer),
        cited_ids=cited_ids,
        cited_record_ids=cited,
        record_order=order,
        matched=matched,
        missing_evidence=missing,
    )


def _demo_bundle(bundle: Bundle, plan: AnswerPlan) -> Bundle:
    """The evidence records of an accepted item, each cut after its last cited span (+1)."""
    cited: dict[str, int] = {}
    for sid in [plan.answer_span_id, *(f.span_id for f in plan.facts)]:
        if sid and "#" in sid:
            rid, _, n = sid.rpartition("#")
            if n.isdigit():
                cited[rid] = max(cited.get(rid, 0), int(n))
    records = []
    for r in bundle.records:
        if r.id in plan.evidence_ids:
            last = cited.get(r.id, len(r.spans))
            spans = [s for s in r.spans if s.index <= last + 1]
            cut = r.truncated or len(spans) < len(r.spans)
            records.append(r.model_copy(update={"spans": spans, "truncated": cut}))
    return bundle.model_copy(update={"records": records})


def _plan_from(out: dspy.Prediction) -> AnswerPlan:
    """The planner's fields as an :class:`AnswerPlan` (labels unresolved). The answer span counts
    as a fact; each fact's statement is filled in from its span when the plan is resolved."""
    labels = [str(x) for x in (getattr(out, "fact_span_ids", None) or [])]
    answer_span = str(out.answer_span_id) if getattr(out, "answer_span_id", None) else None
    if answer_span and answer_span not in labels:
        labels.append(answer_span)
    return AnswerPlan(
        ask=str(getattr(out, "ask", "") or ""),
        answer=str(out.answer or "").strip(),
        answer_type=out.answer_type,
        answer_span_id=answer_span,
        facts=[Fact(span_id=label, statement="") for label in dict.fromkeys(labels)],
        evidence=list(getattr(out, "evidence", None) or []),
        operations=[str(o) for o in (getattr(out, "operations", None) or [])],
    )


def options_text(view: BundleView, options: Sequence[AnswerOption]) -> str:
    """The anchored planner's numbered options, each with its sentences' labels in ``view`` (two
    for a two-record option)."""
    return "\n".join(
        f"{n}. {o.answer_type}: {o.answer} ({', '.join(view.span_label(s) for s in o.span_ids)})"
        for n, o in enumerate(options, 1)
    )


def _anchored_plan(
    out: dspy.Prediction, *, options: Sequence[AnswerOption], view: BundleView, task: Task
) -> AnswerPlan:
    """The anchored planner's fields as an :class:`AnswerPlan`: answer, type and answer span from
    the chosen option; the option's record first among the evidence records (the planner's own
    contribution for it kept), then the planner's others, ``task.evidence_count`` in all. A number
    that names no option gives an empty answer and an unknown answer span, so the plan checks
    reject it (and re-plan) like any other plan."""
    choice = getattr(out, "answer_option", None)
    try:
        option = options[int(choice) - 1] if int(choice) >= 1 else None
    except (TypeError, ValueError, IndexError):
        option = None
    labels = [str(x) for x in (getattr(out, "fact_span_ids", None) or [])]
    given = list(getattr(out, "evidence", None) or [])
    evidence, answer, answer_span = given, "", f"option {choice}"
    answer_type = task.answer_type or "entity"
    if option is not None:
        # the option's records first (both of a two-record option), each with the planner's own
        # contribution where it gave one; then the planner's others
        own_ids = list(dict.fromkeys(s.rpartition("#")[0] for s in option.span_ids))
        given_by = {view.resolve_record(e.record_id): e for e in given}
        own = [
            EvidenceUse(
                record_id=rid,
                contribution=given_by[rid].contribution if rid in given_by else "states the answer",
            )
            for rid in own_ids
        ]
        others = [e for e in given if view.resolve_record(e.record_id) not in (*own_ids, None)]
        evidence = [*own, *others][: max(task.evidence_count, len(own))]
        answer, answer_type, answer_span = option.answer, option.answer_type, option.span_id
        cited = {view.resolve_span(label) for label in labels}
        labels.extend(s for s in option.span_ids if s not in cited)
    return AnswerPlan(
        ask=str(getattr(out, "ask", "") or ""),
        answer=answer,
        answer_type=answer_type,
        answer_span_id=answer_span,
        facts=[Fact(span_id=label, statement="") for label in dict.fromkeys(labels)],
        evidence=evidence,
        operations=[str(o) for o in (getattr(out, "operations", None) or [])],
    )


def _anchored_demo_fields(
    bundle: Bundle,
    view: BundleView,
    fields: dict[str, Any],
    plan: AnswerPlan,
    user_name: str | None,
) -> dict[str, Any]:
    """A planner demonstration's fields for the anchored planner: the demo bundle's options (the
    plan's own answer among them) and the chosen number in place of the written answer."""
    options = answer_options(bundle.records, user_name, str(plan.answer_type))
    chosen = next(
        (n for n, o in enumerate(options, 1) if o.answer.lower() == plan.answer.lower()), None
    )
    if chosen is None:
        span_id = plan.answer_span_id or plan.facts[0].span_id
        own = AnswerOption(span_id, plan.answer, str(plan.answer_type))
        keep = options[: MAX_ANSWER_OPTIONS - 1]
        options, chosen = [*keep, own], len(keep) + 1
    fields = {
        k: v for k, v in fields.items() if k not in ("answer", "answer_type", "answer_span_id")
    }
    return {**fields, "options": options_text(view, options), "answer_option": chosen}


def _plan_rejection(plan: AnswerPlan, issues: list[PlanIssue], repairs, usage) -> Outcome:
    detail = "; ".join(f"{i.code.value}: {i.detail}" for i in issues)
    return _rejected(
        "plan_check",
        f"plan_check:{issues[0].code.value}",
        detail,
        usage,
        plan=plan,
        plan_issues=issues,
        repairs=repairs,
    )


def _task_inputs(view: BundleView, task: Task) -> dict[str, Any]:
    return {
        "records": view.text,
        "question_type": f"{task.question_type}: {task.description}",
        "evidence_count": task.evidence_count,
    }


class MemSteerGenerator(_Generator):
    """MemSteer: plan → plan checks → question → audit → blind read (two-stage generation)."""

    method = "memsteer"

    def __init__(self, lms: Mapping[str, dspy.BaseLM] | None = None, **kwargs: Any):
        super().__init__(lms, **kwargs)
        self.plan = dspy.Predict(PlanFromOptions if self.anchored else PlanAnswer)
        self.write_question = dspy.Predict(WriteQuestion)
        self.role_of.update({"plan": "planner", "write_question": "question_writer"})
        self._ready()

    def _pipeline(self, bundle: Bundle, task: Task, shuffle_seed: int) -> Pipeline:
        usage: dict[str, RoleCost] = {}
        if self.lean and self.checks and (why := prefilter_bundle(bundle, task)):
            return _rejected(
                "prefilter",
                f"prefilter:{why}",
                "fewer records with a name, number, date "
                f"or place than the task's {task.evidence_count} evidence records",
                usage,
            )
        view = bundle.view()
        inputs, to_plan = _task_inputs(view, task), _plan_from
        if self.anchored:
            options = task_options(
                bundle.records, task, self.user_name, bridges=self.bridges, updates=self.updates
            )
            if not options:
                why = "no sentence of the bundle holds a name, number, list or dated statement"
                return _rejected("prefilter", "prefilter:no_options", why, usage)
            inputs = {**inputs, "options": options_text(view, options)}
            to_plan = partial(_anchored_plan, options=options, view=view, task=task)
        try:
            _, plan, issues, repairs = yield from self._planned(
                "plan", "plan", inputs, to_plan, task, bundle, view, usage
            )
        except _LMFailure as exc:
            return _rejected(exc.stage, "lm_error", exc.detail, usage)
        if issues and self.checks:
            return _plan_rejection(plan, issues, repairs, usage)
        if self.anchored and self.checks:
            plan, ask_repair = self._anchored_ask(plan, view, bundle)
            repairs.extend([ask_repair] if ask_repair else [])
        evidence_view = bundle.subset(plan.evidence_ids).view() if plan.evidence_ids else view
        # a bridge: the writer asks by the answer's record alone, the program adds "on the day …"
        bridge = self._bridge_span(plan, bundle) if self.anchored and self.checks else None
        day = first_person(bridge_event(bridge.text), keep_quoted=True) if bridge else None
        writer_plan = plan
        if bridge is not None:
            evidence_view = bundle.subset(plan.evidence_ids[:1]).view()
            own = [f for f in plan.facts if f.span_id.rpartition("#")[0] == plan.evidence_ids[0]]
            writer_plan = plan.model_copy(update={"facts": own})
        inputs = {
            "records": evidence_view.text,
            "ask": first_person(plan.ask, keep_quoted=self.anchored),
            "facts": _fact_lines(None, bundle, writer_plan),
            "answer": plan.answer,
            "answer_type": str(plan.answer_type),
            "avoid": "none",
        }
        question, problem = "", None
        for attempt in range(self.question_rewrites + 1):
            if attempt:  # say what was wrong: at temperature 0.7 alone the same question came back
                details = (
                    self._echo(question, plan, bundle) or []
                    if problem == "echoes"
                    else detail_terms(
                        [f.statement for f in plan.facts], f"{question} {plan.answer}"
                    )
                )
                inputs = {**inputs, "avoid": rewrite_hint(question, problem, details)}
            try:
                q = yield _Request("write_question", "question", inputs, usage, resample=attempt)
            except _LMFailure as exc:
                return _rejected(
                    exc.stage, "lm_error", exc.detail, usage, plan=plan, repairs=repairs
                )
            previous, question = question, str(q.question or "").strip()
            if attempt:
                repairs.append(
                    Repair(
                        stage="question",
                        field="question",
                        before=previous,
                        after=question,
                        reason=f"re-sampled after question:{problem}",
                    )
                )
            if (
                self.anchored
                and self.checks
                and (one := re.sub(r"\?{2,}", "?", question)) != question
            ):
                why = "a doubled question mark was made one"  # "…cover??" failed as compound
                repairs.append(
                    Repair(
                        stage="question", field="question", before=question, after=one, reason=why
                    )
                )
                question = one
            if (
                self.anchored
                and self.checks
                and (mine := first_person(question, keep_quoted=True)) != question
            ):
                why = "'the user' was put in the user's voice"  # "Who did the user sketch …?"
                repairs.append(
                    Repair(
                        stage="question", field="question", before=question, after=mine, reason=why
                    )
                )
                question = mine
            if self.lean and self.checks and (voiced := user_voice(question)) != question:
                why = "the question was put in the user's voice"
                repairs.append(
                    Repair(
                        stage="question",
                        field="question",
                        before=question,
                        after=voiced,
                        reason=why,
                    )
                )
                question = voiced
            if (
                self.checks
                and str(plan.answer_type) == "date"
                and _RELATIVE_TIME.search(question)
                and (fixed := _drop_relative_day(question, keep_quoted=self.lean)) != question
            ):
                repairs.append(
                    Repair(
                        stage="question",
                        field="question",
                        before=question,
                        after=fixed,
                        reason="a date question's relative day was removed",
                    )
                )
                question = fixed
            if day and "on the day" not in question.lower():
                bridged = f"{question.rstrip(' ?.')}, on the day {day}?"
                why = "a bridge: the other record's event says which day"
                repairs.append(
                    Repair(
                        stage="question",
                        field="question",
                        before=question,
                        after=bridged,
                        reason=why,
                    )
                )
                question = bridged
            problem = self._question_problem(question, plan, view, bundle) if self.checks else None
            if problem is None:
                break
        # the loop above has checked the final question: _verify takes its verdict
        return (
            yield from self._verify(
                bundle,
                view,
                plan,
                question,
                usage,
                shuffle_seed,
                repairs,
                question_check=False,
                problem=problem,
            )
        )

    def _demo_examples(
        self,
        view: BundleView,
        plan: AnswerPlan,
        outcome: Outcome,
        task: Task,
        bundle: Bundle | None = None,
    ) -> dict[str, dspy.Example]:
        examples = super()._demo_examples(view, plan, outcome, task)
        fields = _plan_demo_fields(view, plan, task)
        if self.anchored and bundle is not None:
            fields = _anchored_demo_fields(bundle, view, fields, plan, self.user_name)
        examples["plan"] = dspy.Example(**fields).with_inputs(
            "records", "question_type", "evidence_count", *(["options"] if self.anchored else [])
        )
        # lean: the records as the writer reads them in a request, its plan's evidence records only
        # (the cold-start demo's other record was ~45 tokens of every lean writer call)
        lean_records = self.lean and bundle is not None and plan.evidence_ids
        writer_view = bundle.subset(plan.evidence_ids).view() if lean_records else view
        examples["write_question"] = dspy.Example(
            records=writer_view.text,
            ask=first_person(plan.ask, keep_quoted=self.anchored),
            facts=[f.statement for f in plan.facts],
            answer=plan.answer,
            answer_type=str(plan.answer_type),
            avoid="none",
            question=outcome.question,
        ).with_inputs("records", "ask", "facts", "answer", "answer_type", "avoid")
        return examples


class JointGenerator(_Generator):
    """Baseline ``joint``: plan and question in one planner call, then the same checks."""

    method = "joint"

    def __init__(self, lms: Mapping[str, dspy.BaseLM] | None = None, **kwargs: Any):
        super().__init__(lms, **kwargs)
        self.plan_and_write = dspy.Predict(PlanAndWriteQuestion)
        self.role_of.update({"plan_and_write": "planner"})
        self._ready()

    def _pipeline(self, bundle: Bundle, task: Task, shuffle_seed: int) -> Pipeline:
        usage: dict[str, RoleCost] = {}
        view = bundle.view()
        try:
            out, plan, issues, repairs = yield from self._planned(
                "plan_and_write",
                "joint",
                _task_inputs(view, task),
                _plan_from,
                task,
                bundle,
                view,
                usage,
            )
        except _LMFailure as exc:
            return _rejected(exc.stage, "lm_error", exc.detail, usage)
        if issues and self.checks:
            return _plan_rejection(plan, issues, repairs, usage)
        question = str(out.question or "").strip()
        return (yield from self._verify(bundle, view, plan, question, usage, shuffle_seed, repairs))

    def _demo_examples(
        self,
        view: BundleView,
        plan: AnswerPlan,
        outcome: Outcome,
        task: Task,
        bundle: Bundle | None = None,
    ) -> dict[str, dspy.Example]:
        examples = super()._demo_examples(view, plan, outcome, task)
        fields = _plan_demo_fields(view, plan, task)
        examples["plan_and_write"] = dspy.Example(**fields, question=outcome.question).with_inputs(
            "records", "question_type", "evidence_count"
        )
        return examples


class DirectGenerator(_Generator):
    """Baselines ``direct`` and ``naive``: question, answer and evidence records in one call, no plan."""

    method = "direct"

    def __init__(self, lms: Mapping[str, dspy.BaseLM] | None = None, **kwargs: Any):
        super().__init__(lms, **kwargs)
        self.write_qa = dspy.Predict(WriteQAPair)
        self.role_of.update({"write_qa": "planner"})
        self._ready()

    def _pipeline(self, bundle: Bundle, task: Task, shuffle_seed: int) -> Pipeline:
        usage: dict[str, RoleCost] = {}
        view = bundle.view()
        try:
            out, plan, issues, repairs = yield from self._planned(
                "write_qa",
                "direct",
                _task_inputs(view, task),
                _direct_plan,
                task,
                bundle,
                view,
                usage,
                require_facts=False,
            )
        except _LMFailure as exc:
            return _rejected(exc.stage, "lm_error", exc.detail, usage)
        if issues and self.checks:
            return _plan_rejection(plan, issues, repairs, usage)
        question = str(out.question or "").strip()
        return (yield from self._verify(bundle, view, plan, question, usage, shuffle_seed, repairs))

    def _demo_examples(
        self,
        view: BundleView,
        plan: AnswerPlan,
        outcome: Outcome,
        task: Task,
        bundle: Bundle | None = None,
    ) -> dict[str, dspy.Example]:
        examples = super()._demo_examples(view, plan, outcome, task)
        examples["write_qa"] = dspy.Example(
            records=view.text,
            question_type=f"{task.question_type}: {task.description}",
            evidence_count=len(plan.evidence_ids),
            question=outcome.question,
            answer=plan.answer,
            answer_type=plan.answer_type,
            evidence_record_ids=[view.label_of(r) or r for r in plan.evidence_ids],
        ).with_inputs("records", "question_type", "evidence_count")
        return examples


def _direct_plan(out: dspy.Prediction) -> AnswerPlan:
    """The direct baseline's answer and evidence records as a plan without facts."""
    evidence = [
        EvidenceUse(record_id=str(r), contribution="") for r in (out.evidence_record_ids or [])
    ]
    return AnswerPlan(
        ask="", answer=str(out.answer or "").strip(), answer_type=out.answer_type, evidence=evidence
    )


def _plan_demo_fields(view: BundleView, plan: AnswerPlan, task: Task) -> dict[str, Any]:
    """The planner's inputs and outputs for a demonstration, with the demo view's labels. Its
    ``fact_span_ids`` hold every fact's label, the answer sentence's too: the field asks for the
    fact sentences, and the bounded schema wants at least one (a one-fact demo once showed ``[]``,
    an output the grammar forbids)."""
    labels = [view.span_label(f.span_id) for f in plan.facts]
    answer_label = view.span_label(plan.answer_span_id) if plan.answer_span_id else labels[0]
    evidence = [
        EvidenceUse(
            record_id=view.label_of(e.record_id) or e.record_id, contribution=e.contribution
        )
        for e in plan.evidence
    ]
    return {
        "records": view.text,
        "question_type": f"{task.question_type}: {task.description}",
        "evidence_count": len(plan.evidence_ids),
        "fact_span_ids": labels,
        "answer_span_id": answer_label,
        "answer_type": plan.answer_type,
        "answer": plan.answer,
        "evidence": evidence,
        "operations": plan.operations,
        "ask": plan.ask,
    }


def cold_start_example() -> tuple[Bundle, Task, Outcome]:
    """A fictional accepted item (not from any user's history) that demonstrates the output format
    to every predictor until real accepted items replace it: a short answer copied from one
    labelled sentence, a standalone question in the user's voice, an extractive blind answer."""
    from datetime import datetime

    from memsteer_dspy.bundles import BundleConfig, bundle_from_records
    from memsteer_dspy.records import History, Record

    records = [
        Record(
            id="demo:1",
            kind="conversation_turn",
            timestamp=datetime(2023, 5, 2, 18, 0),
            author="Sam",
            text="User: I finally booked the pottery class at Clayworks Studio for Saturday. "
            "My sister Maya is coming along, and we want to try the wheel.",
        ),
        Record(
            id="demo:2",
            kind="email",
            timestamp=datetime(2023, 5, 3),
            author="Clayworks Studio",
            metadata={"subject": "Your booking"},
            text="Subject: Your booking\nThank you for booking two seats for the wheel-throwing class. "
            "Please arrive ten minutes early.",
        ),
    ]
    bundle = bundle_from_records(History("demo", records), ["demo:1", "demo:2"], BundleConfig())
    plan = AnswerPlan(
        ask="who is coming with me to the pottery class",
        answer="Maya",
        answer_type="entity",
        answer_span_id="demo:1#2",
        facts=[Fact(span_id="demo:1#2", statement=bundle.span("demo:1#2").text)],
        evidence=[EvidenceUse(record_id="demo:1", contribution="names who comes along")],
        operations=["lookup"],
    )
    outcome = Outcome(
        status="accepted",
        plan=plan,
        question="Who is coming with me to the pottery class at Clayworks Studio?",
    )
    return bundle, Task(question_type="fact", evidence_count=1), outcome


def make_generator(
    method: str, lms: Mapping[str, dspy.BaseLM] | None = None, **kwargs: Any
) -> MemSteerGenerator | JointGenerator | DirectGenerator:
    """The generator for ``method``: memsteer, joint, direct or naive (naive = direct on random bundles)."""
    if method == "memsteer":
        return MemSteerGenerator(lms, **kwargs)
    if method == "joint":
        return JointGenerator(lms, **kwargs)
    if method in ("direct", "naive"):
        gen = DirectGenerator(lms, **kwargs)
        gen.method = method
        return gen
    raise ValueError(f"unknown method {method!r}; choose memsteer, joint, direct or naive")
