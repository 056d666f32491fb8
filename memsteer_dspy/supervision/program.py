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

This module holds the generators and :func:`make_generator`; their parts, one way (each reads
only those before it): :mod:`~memsteer_dspy.supervision.outcome` (results and requests),
:mod:`~memsteer_dspy.supervision.asks` (a question's words),
:mod:`~memsteer_dspy.supervision.replies` (each role's inputs and outputs),
:mod:`~memsteer_dspy.supervision.question_rules` (a question's repairs and its verdict, fixed
at construction) and :mod:`~memsteer_dspy.supervision.generator` (the pipeline every generator runs).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import dspy

from memsteer_dspy.bundles import (
    Bundle,
    BundleView,
    Task,
    bridge_event,
    task_options,
)
from memsteer_dspy.signatures.baselines import PlanAndWriteQuestion, WriteQAPair
from memsteer_dspy.signatures.plan import AnswerPlan, PlanAnswer, PlanFromOptions
from memsteer_dspy.signatures.question import WriteQuestion
from memsteer_dspy.supervision.asks import (
    _NO_VERB as _NO_VERB,
)
from memsteer_dspy.supervision.asks import (
    SENTENCE_ASK_WORDS,
    first_person,
    header_ask,
    rewrite_hint,
    sentence_ask,
    spoken_date,
    user_voice,
)
from memsteer_dspy.supervision.asks import (
    _drop_relative_day as _drop_relative_day,
)
from memsteer_dspy.supervision.asks import (
    _misses_subject as _misses_subject,
)
from memsteer_dspy.supervision.asks import (
    _names_part_of as _names_part_of,
)
from memsteer_dspy.supervision.asks import (
    _subject_stems as _subject_stems,
)
from memsteer_dspy.supervision.asks import (
    _writes_number as _writes_number,
)
from memsteer_dspy.supervision.checks import (
    Repair,
    detail_terms,
    prefilter_bundle,
)
from memsteer_dspy.supervision.generator import _Generator
from memsteer_dspy.supervision.outcome import (
    ANCHORED_VERSION,
    GENERATION_ROLES,
    LEAN_MAX_TOKENS,
    LEAN_QUESTION_REWRITES,
    LEAN_VERSION,
    MAX_TOKENS,
    OWN_WORDS_VERSION,
    PROMPT_VERSION,
    STAGE_ORDER,
    AuditResult,
    BlindResult,
    Outcome,
    Pipeline,
    RoleCost,
    _LMFailure,
    _rejected,
    _Request,
)
from memsteer_dspy.supervision.outcome import (
    _usage_tokens as _usage_tokens,
)
from memsteer_dspy.supervision.plan_checks import user_display_name
from memsteer_dspy.supervision.question_rules import (
    BRIDGE_DAY,
    own_name_in_voice,
    question_repairs,
    repaired,
)
from memsteer_dspy.supervision.replies import (
    _anchored_demo_fields,
    _anchored_plan,
    _direct_plan,
    _fact_lines,
    _plan_demo_fields,
    _plan_from,
    _plan_rejection,
    _task_inputs,
    cold_start_example,
    options_text,
)

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
    # importable from here before the split as well
    "ANCHORED_VERSION",
    "LEAN_MAX_TOKENS",
    "LEAN_QUESTION_REWRITES",
    "LEAN_VERSION",
    "MAX_TOKENS",
    "PROMPT_VERSION",
    "SENTENCE_ASK_WORDS",
    "STAGE_ORDER",
    "cold_start_example",
    "first_person",
    "header_ask",
    "options_text",
    "rewrite_hint",
    "sentence_ask",
    "spoken_date",
    "user_voice",
]


class MemSteerGenerator(_Generator):
    """MemSteer: plan → plan checks → question → audit → blind read (two-stage generation)."""

    method = "memsteer"

    def __init__(self, lms: Mapping[str, dspy.BaseLM] | None = None, **kwargs: Any):
        super().__init__(lms, **kwargs)
        self.plan = dspy.Predict(PlanFromOptions if self.anchored else PlanAnswer)
        self.write_question = dspy.Predict(WriteQuestion)
        # lean: a bundle with too little concrete detail for its task costs no LM call
        self.prefilter = self.lean and self.checks
        # what the program fixes in each written question before its verdict, in this order
        self.question_repairs = question_repairs(
            lean=self.lean,
            anchored=self.anchored,
            checks=self.checks,
            user=user_display_name(self.user_name),
        )
        self.role_of.update({"plan": "planner", "write_question": "question_writer"})
        self._ready()

    def _pipeline(self, bundle: Bundle, task: Task, shuffle_seed: int) -> Pipeline:
        usage: dict[str, RoleCost] = {}
        if self.prefilter and (why := prefilter_bundle(bundle, task)):
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
                bundle.records,
                task,
                self.user_name,
                bridges=self.bridges,
                bridge_events=self.bridge_events,
                updates=self.updates,
                pairs=self.pairs,
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
        day = None
        if bridge is not None:  # in the asker's voice: "the user" and the user's own name
            day = first_person(bridge_event(bridge.text), keep_quoted=True)
            day = own_name_in_voice(day, user_display_name(self.user_name))
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
            question, made = repaired(question, plan, self.question_repairs)
            repairs.extend(made)
            if day and "on the day" not in question.lower():
                bridged = f"{question.rstrip(' ?.')}{BRIDGE_DAY}{day}?"
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
