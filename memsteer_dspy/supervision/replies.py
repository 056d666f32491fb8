"""Each role's inputs and what the program makes of its outputs: the audit's and blind reader's
inputs and results, the plan read off a planner's output (:func:`_plan_from`; the anchored
planner's options, :func:`options_text` and :func:`_anchored_plan`), rejections, the fields
of a demonstration and the cold-start example (:func:`cold_start_example`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import dspy

from memsteer_dspy.bundles import (
    MAX_ANSWER_OPTIONS,
    AnswerOption,
    Bundle,
    BundleView,
    Task,
    answer_options,
)
from memsteer_dspy.normalize import answers_match
from memsteer_dspy.records import Span
from memsteer_dspy.signatures.plan import AnswerPlan, EvidenceUse, Fact
from memsteer_dspy.supervision.checks import (
    PlanIssue,
    Repair,
    answer_spans,
    spans_by_id,
)
from memsteer_dspy.supervision.outcome import AuditResult, BlindResult, Outcome, _rejected


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
    out: dspy.Prediction,
    view: BundleView,
    plan: AnswerPlan,
    *,
    quoted: bool = False,
    settled: Mapping[str, str] | None = None,
) -> AuditResult:
    """The audit's verdicts matched to the plan's facts and evidence records; a fact or record
    without a "supported" verdict (or with none at all) fails its check. With ``quoted`` the facts
    passed :func:`~memsteer_dspy.supervision.checks.quoted_fact_support` and each gets that verdict.
    ``settled`` maps an evidence record whose part the program checked (a bridge's day record, an
    update's earlier record) to why: it gets that verdict whatever the auditor said of it. Measured
    in v20-jonas: the embedded auditor judged only the answer's record of a bridge and said nothing
    of the day's, and the one bridge its blind reader answered right was lost to
    ``audit:record_contribution``."""
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
    for rid, why in (settled or {}).items():
        record_verdicts[rid] = "supported"
        result.record_checks.append({"record_id": rid, "verdict": "supported", "rationale": why})
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
    day = bridge.record_id if bridge is not None else None
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
