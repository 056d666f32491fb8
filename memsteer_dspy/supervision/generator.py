"""The generator base (:class:`_Generator`): the pipeline every method's candidate runs through
(plan checks, question, audit, blind read), its LM calls with retries and usage, batching
(:meth:`_Generator.run_batch`) and few-shot demonstrations.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import Any

import dspy

from memsteer_dspy.bundles import (
    UNDATED_EVENT_KINDS,
    Bundle,
    BundleView,
    Task,
    event_span,
    plain_text,
    stating_spans,
    update_options,
    update_values,
    whole_word,
)
from memsteer_dspy.records import Span
from memsteer_dspy.signatures.audit import AuditQA, AuditQuotedFacts
from memsteer_dspy.signatures.blind_read import BlindRead
from memsteer_dspy.signatures.plan import AnswerPlan
from memsteer_dspy.supervision.adapter import CompactJSONAdapter
from memsteer_dspy.supervision.asks import (
    _DATE_WORDS,
    _second_answer_span,
    first_person,
    header_ask,
    sentence_ask,
    spoken_date,
)
from memsteer_dspy.supervision.checks import (
    PlanIssue,
    Repair,
    check_plan,
    quoted_fact_support,
    spans_by_id,
    user_display_name,
)
from memsteer_dspy.supervision.limits import bounded_signature
from memsteer_dspy.supervision.outcome import (
    LEAN_MAX_TOKENS,
    LEAN_QUESTION_REWRITES,
    MAX_TOKENS,
    STAGE_ORDER,
    Outcome,
    Pipeline,
    RoleCost,
    _estimate_tokens,
    _LMFailure,
    _rejected,
    _Request,
    _shuffled,
    _usage_tokens,
)
from memsteer_dspy.supervision.question_rules import (
    QuestionRules,
    question_echo,
    question_verdict,
)
from memsteer_dspy.supervision.replies import (
    _audit_inputs,
    _audit_result,
    _blind_problem,
    _blind_result,
    _demo_bundle,
    cold_start_example,
)
from memsteer_dspy.supervision.writer_examples import WriterExample


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
        bridge_events: str = "subject",
        updates: bool = False,
        pairs: bool = True,
        writer_examples: Sequence[WriterExample] = (),
    ):
        super().__init__()
        self.writer_examples = tuple(writer_examples)
        self.updates = updates
        self.pairs = pairs
        self.lean = lean
        self.anchored = anchored
        self.own_words = own_words
        self.bridges = bridges
        self.bridge_events = bridge_events
        self.max_tokens = LEAN_MAX_TOKENS if lean else MAX_TOKENS
        self.user_name = user_name
        if question_rewrites is None:
            question_rewrites = LEAN_QUESTION_REWRITES if lean else 2
        self.question_rewrites = question_rewrites
        self.plan_retries = plan_retries
        self.bounded = bounded
        self.cold_start = cold_start
        self.checks = checks
        self.question_rules = QuestionRules.of(
            lean=lean, anchored=anchored, own_words=own_words, user_name=user_name
        )
        self.max_retries = max_retries
        self.max_demos = max_demos
        self.adapter = adapter or (CompactJSONAdapter() if lean else dspy.JSONAdapter())
        self.max_answer_words = max_answer_words
        self.audit = dspy.Predict(AuditQA)
        self.blind_read = dspy.Predict(BlindRead)
        self._demo_lock = threading.Lock()
        self._demo_count = 0
        self.role_of: dict[str, str] = {"audit": "auditor", "blind_read": "blind_reader"}
        # lean: the blind read (short answer, the check that rejects corrupted items) before the
        # audit (long verdicts), so only candidates the blind reader confirms pay for an audit
        self.verify_order = ("blind", "audit") if lean else ("audit", "blind")
        # lean: facts that are their cited sentences' own words are supported by construction (the
        # planner cites sentences, the program fills each fact in from its sentence); a small
        # auditor asked to confirm them anyway spends most of its output on those verdicts
        self.quoted_audit = lean
        if self.quoted_audit:  # the audit of a plan whose facts are quoted sentences (see _verify)
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
        if self.writer_examples:  # before the cold-start demo: the nearest one is the format's
            writer = getattr(self, "write_question", None)
            if writer is None:
                raise ValueError(f"method {self.method!r} has no question writer to show examples")
            writer.demos = [*(e.example() for e in self.writer_examples), *writer.demos]

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
        """The generator's verdict on a question (:func:`question_verdict` by its
        :attr:`question_rules`): against the current demos (and ``also_demos``), with the bundle's
        records (``view``, the one the planner read) and the user's name as what the question may
        name; lean also holds its topic words to the plan's evidence records. With the generator's
        ``own_words`` (and ``own_words`` here), a question that copies its evidence records'
        wording is ``echoes`` (:func:`question_echo`, as :meth:`_echo`). The rules and their order
        are the verdict's; this gathers what it reads: the demos, the bundle's and the evidence
        records' text, the plan's bridge or update sentence."""
        rules = self.question_rules
        demos = {str(d.question) for p in self.predictors() for d in p.demos if d.get("question")}
        demos.update(also_demos)
        examples = {e.question for e in self.writer_examples}  # hand-written: copying test only
        demos -= examples
        user = user_display_name(self.user_name)
        evidence = None
        if rules.on_evidence and plan.evidence_ids:
            evidence = f"{bundle.subset(plan.evidence_ids).view().text}\n{user}"
        return question_verdict(
            question,
            plan,
            bundle,
            rules,
            demos=demos,
            known_text=f"{view.text}\n{user}",
            evidence_text=evidence,
            bridge=self._bridge_span(plan, bundle),
            update=self._update_span(plan, bundle) if rules.anchored else None,
            echo=own_words and self.checks,
            examples=examples,
        )

    def _echo(self, question: str, plan: AnswerPlan, bundle: Bundle) -> list[str] | None:
        """With ``own_words``: what of its evidence records' wording the question copies
        (:func:`question_echo`), else None."""
        if not (self.own_words and self.checks):
            return None
        return question_echo(question, plan, bundle, self._bridge_span(plan, bundle))

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
        # the stages in verify_order; with quoted_audit, a plan whose facts are all its sentences'
        # own words is audited by audit_quoted, the per-fact verdicts settled (see __init__)
        quoted = self.quoted_audit and quoted_fact_support(plan, spans_by_id(bundle.spans()))
        # a bridge's day record or an update's earlier record: checked by the program, not the reader
        update = self._update_span(plan, bundle) if self.anchored else None
        bridge = self._bridge_span(plan, bundle) if self.anchored and update is None else None
        checked = update or bridge
        settled = {}
        if checked is not None:  # the auditor's verdict on that record is the program's
            what = (
                "the earlier value, updated later"
                if update
                else "the answer's day, its event named"
            )
            settled[checked.record_id] = f"the program checked it: {what}"
        audit = blind = None
        for stage in self.verify_order:
            if stage == "audit":
                predictor = "audit_quoted" if quoted else "audit"
                try:
                    inputs = _audit_inputs(view, bundle, plan, question)
                    out = yield _Request(predictor, "audit", inputs, usage)
                except _LMFailure as exc:
                    return _rejected(exc.stage, "lm_error", exc.detail, usage, blind=blind, **base)
                audit = _audit_result(out, view, plan, quoted=quoted, settled=settled)
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
            blind = _blind_result(out, blind_view, bundle, plan, order, repairs, checked)
            problem = _blind_problem(blind, plan)
            if problem is not None:
                return _rejected("blind", *problem, usage, audit=audit, blind=blind, **base)
        kind = "knowledge-update" if update else "multi-hop" if bridge else None
        return Outcome(
            status="accepted", audit=audit, blind=blind, usage=usage, question_type=kind, **base
        )
