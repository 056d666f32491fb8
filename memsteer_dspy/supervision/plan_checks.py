"""Programmatic checks of MemSteer's supervision pipeline (paper Section 3.2).

"Answer plans that fail programmatic checks of structural consistency and provenance coverage are
rejected before question generation." :func:`check_plan` resolves the planner's labels to span and
record ids and returns the plan's failures, each with a reason code (:class:`PlanCheckCode`):

=========================  =====================================================================
code                       the plan fails when
=========================  =====================================================================
``no_facts``               it cites no supporting fact
``unknown_span``           a cited span is not a span of the bundle
``unknown_record``         an evidence record is not a record of the bundle
``evidence_count``         its number of evidence records differs from the task's
``evidence_without_fact``  an evidence record contributes no fact
``fact_outside_evidence``  a fact's record is not an evidence record
``bad_answer_type``        the answer type is not one of text/entity/number/date/list/boolean
``empty_answer``           the answer is empty
``answer_unparseable``     the answer does not parse as its type (``memsteer_dspy.normalize``)
``answer_too_long``        a text/entity answer is longer than ``max_answer_words`` words
``answer_not_in_spans``    a text/entity answer (or a list item) is not in the cited spans
``answer_is_user``         an entity answer is the user's own name (the user asking their own
                           assistant "Who woke up feeling unrested?" → themselves)
``answer_not_stated``      (``stated``, lean) the cited spans hold the answer without stating a
                           fact about it: a text/entity/list answer found only in a source or
                           link line (a URL line: "[Montessori Gardens: …](https://…)"), or a date
                           answer cited from a heading, a label or a separator ("---") that
                           writes no date ("- **Key Topics:**": the date is the record's own, and
                           nothing happened on it),
                           or a number answer that no cited span writes (digits or words) and
                           that is not the count of the plan's facts or evidence records (the
                           small planner counted "3 suggestions" in a sentence that gave one)
``wrong_kind``             (``task_kind``, lean) the plan's answer type is not the one the task
                           asks for (a list task answered by one name), or a list answer has
                           fewer than two items
=========================  =====================================================================

Before ``answer_not_in_spans`` fails a plan, :func:`repair_answer_citation` tries a deterministic
citation repair: when the answer occurs in exactly one span of the bundle, and that span is in an
evidence record (or the task needs a single record), the plan's answer span — and the fact that
cited a neighbouring span of the same record — are pointed at it, and the repair is recorded.

The question checks are in :mod:`~memsteer_dspy.supervision.question_checks`; both are imported
from :mod:`~memsteer_dspy.supervision.checks`.
"""

from __future__ import annotations

import re
from enum import StrEnum

from pydantic import BaseModel

from memsteer_dspy.bundles import BundleView, Task
from memsteer_dspy.normalize import (
    AnswerParseError,
    list_items,
    normalize_text,
    numbers_in,
    parse_answer,
)
from memsteer_dspy.records import AnswerType, states_nothing
from memsteer_dspy.signatures.plan import AnswerPlan, EvidenceUse, Fact

EXTRACTIVE_TYPES = (AnswerType.TEXT, AnswerType.ENTITY)


class PlanCheckCode(StrEnum):
    NO_FACTS = "no_facts"
    UNKNOWN_SPAN = "unknown_span"
    UNKNOWN_RECORD = "unknown_record"
    EVIDENCE_COUNT = "evidence_count"
    EVIDENCE_WITHOUT_FACT = "evidence_without_fact"
    FACT_OUTSIDE_EVIDENCE = "fact_outside_evidence"
    BAD_ANSWER_TYPE = "bad_answer_type"
    EMPTY_ANSWER = "empty_answer"
    ANSWER_UNPARSEABLE = "answer_unparseable"
    ANSWER_TOO_LONG = "answer_too_long"
    ANSWER_NOT_IN_SPANS = "answer_not_in_spans"
    ANSWER_IS_USER = "answer_is_user"
    ANSWER_NOT_STATED = "answer_not_stated"
    WRONG_KIND = "wrong_kind"


class PlanIssue(BaseModel):
    """One failed plan check: its code and what exactly failed."""

    code: PlanCheckCode
    detail: str


class Repair(BaseModel):
    """A deterministic citation repair: which stage, what was cited, what now is, and why."""

    stage: str
    field: str
    before: str | None
    after: str
    reason: str


def _contains(haystack: str, needle: str) -> bool:
    """Whether normalized ``needle`` occurs in normalized ``haystack`` on word boundaries."""
    n, h = normalize_text(needle), normalize_text(haystack)
    return bool(n) and f" {n} " in f" {h} "


def answer_spans(view: BundleView, span_texts: dict[str, str], answer: str) -> list[str]:
    """Ids of the bundle's spans whose text contains ``answer`` (normalized, word-bounded)."""
    return [sid for sid, text in span_texts.items() if _contains(text, answer)]


def user_display_name(user_id: str | None) -> str:
    """The name a user id spells (``Elena_Morales`` → ``Elena Morales``; "" for none)."""
    return (user_id or "").replace("_", " ").strip()


def is_user_name(answer: str, user_name: str | None) -> bool:
    """Whether ``answer`` is the user's name ("Elena Morales" or "Elena" for user Elena_Morales)."""
    if not user_name:
        return False
    name = normalize_text(user_display_name(user_name)).split()
    said = normalize_text(answer).split()
    return bool(said) and len(name) >= 2 and (said == name or said == name[:1])


def _unknown_fact(label: str) -> PlanIssue:
    """The failure of a fact whose label names no span (one wording: the repair that drops such a
    fact withdraws exactly this issue)."""
    return PlanIssue(code=PlanCheckCode.UNKNOWN_SPAN, detail=f"fact cites {label!r}")


def resolve_plan(
    plan: AnswerPlan, view: BundleView, span_texts: dict[str, str] | None = None
) -> tuple[AnswerPlan, list[PlanIssue]]:
    """The plan with labels resolved to span and record ids, and the references that resolve to
    nothing (``unknown_span`` / ``unknown_record``; those keep their raw text). A fact without a
    statement gets its span's text."""
    issues: list[PlanIssue] = []
    facts = []
    for f in plan.facts:
        sid = view.resolve_span(f.span_id)
        if sid is None:
            issues.append(_unknown_fact(f.span_id))
        statement = f.statement or ((span_texts or {}).get(sid, "") if sid else "")
        if sid is not None and any(x.span_id == sid for x in facts):
            continue  # one span cited twice counts once
        facts.append(Fact(span_id=sid or f.span_id, statement=statement))
    evidence: list[EvidenceUse] = []
    seen: set[str] = set()
    for e in plan.evidence:
        rid = view.resolve_record(e.record_id)
        if rid is None:
            issues.append(
                PlanIssue(code=PlanCheckCode.UNKNOWN_RECORD, detail=f"evidence {e.record_id!r}")
            )
            rid = e.record_id
        if rid in seen:
            continue  # one record listed twice counts once
        seen.add(rid)
        evidence.append(EvidenceUse(record_id=rid, contribution=e.contribution))
    answer_span = None
    if plan.answer_span_id:
        answer_span = view.resolve_span(plan.answer_span_id)
        if answer_span is None:
            issues.append(
                PlanIssue(
                    code=PlanCheckCode.UNKNOWN_SPAN, detail=f"answer span {plan.answer_span_id!r}"
                )
            )
            answer_span = plan.answer_span_id
    resolved = plan.model_copy(
        update={"facts": facts, "evidence": evidence, "answer_span_id": answer_span}
    )
    return resolved, issues


def _record_of(span_id: str) -> str:
    return span_id.rpartition("#")[0]


def repair_answer_citation(
    plan: AnswerPlan, task: Task, span_texts: dict[str, str]
) -> tuple[AnswerPlan, Repair | None]:
    """Point the plan's answer citation at the one span that contains the answer.

    The span is the only one of the cited answer span's record that contains the answer (the
    planner cited a neighbouring sentence), or else the only one of the evidence records, or else
    the only one of the whole bundle. It must be in
    an evidence record, or the task needs one record (which then becomes the evidence). Returns the
    plan unchanged and ``None`` when no such span exists.
    """
    hits = [sid for sid, text in span_texts.items() if _contains(text, plan.answer)]
    cited_record = (
        _record_of(plan.answer_span_id)
        if plan.answer_span_id and "#" in plan.answer_span_id
        else None
    )
    in_record = [sid for sid in hits if _record_of(sid) == cited_record]
    in_evidence = [sid for sid in hits if _record_of(sid) in plan.evidence_ids]
    if len(in_record) == 1:
        target, why = in_record[0], "the answer occurs in exactly one span of the cited record"
    elif len(in_evidence) == 1:
        target, why = (
            in_evidence[0],
            "the answer occurs in exactly one span of the evidence records",
        )
    elif len(hits) == 1:
        target, why = hits[0], "the answer occurs in exactly one span of the bundle"
    else:
        return plan, None
    record = _record_of(target)
    evidence = list(plan.evidence)
    if record not in plan.evidence_ids:
        if task.evidence_count != 1 or len(evidence) > 1:
            return plan, None
        contribution = evidence[0].contribution if evidence else "states the answer"
        evidence = [EvidenceUse(record_id=record, contribution=contribution)]
    before = plan.answer_span_id
    facts = list(plan.facts)
    # the fact that cited another span of the same record (or, for one record, of the old record)
    same = [i for i, f in enumerate(facts) if _record_of(f.span_id) == record]
    if task.evidence_count == 1 and not same:
        same = list(range(len(facts)))[:1]
    if same and all(facts[i].span_id != target for i in same):
        i = same[0]
        facts[i] = Fact(span_id=target, statement=span_texts[target])
    elif not same:
        facts.append(Fact(span_id=target, statement=span_texts[target]))
    if task.evidence_count == 1:
        facts = [f for f in facts if _record_of(f.span_id) == record] or [
            Fact(span_id=target, statement=span_texts[target])
        ]
    deduped: list[Fact] = []
    for f in facts:
        if all(f.span_id != g.span_id for g in deduped):
            deduped.append(f)
    facts = deduped
    repaired = plan.model_copy(
        update={"answer_span_id": target, "facts": facts, "evidence": evidence}
    )
    repair = Repair(stage="plan", field="answer_span_id", before=before, after=target, reason=why)
    return repaired, repair


def drop_stray_facts(
    plan: AnswerPlan, span_texts: dict[str, str], *, unknown: bool = False
) -> tuple[AnswerPlan, Repair | None]:
    """Drop the facts a planner cited outside its evidence records (with ``unknown``, also those
    citing a label that names no span: the embedded planner wrote "R2.1.4" beside a good "R2.4").

    Applies only when the answer span is in an evidence record and every evidence record keeps at
    least one fact, so the plan still covers its evidence; the dropped span ids are recorded.
    Returns the plan unchanged and ``None`` otherwise.
    """
    evidence = set(plan.evidence_ids)
    stray = [
        f.span_id
        for f in plan.facts
        if (f.span_id in span_texts and _record_of(f.span_id) not in evidence)
        or (unknown and f.span_id not in span_texts)
    ]
    answer = plan.answer_span_id
    if not stray or not answer or answer not in span_texts or _record_of(answer) not in evidence:
        return plan, None
    kept = [f for f in plan.facts if f.span_id not in stray]
    if {_record_of(f.span_id) for f in kept if f.span_id in span_texts} != evidence:
        return plan, None
    repair = Repair(
        stage="plan",
        field="facts",
        before=", ".join(stray),
        after="",
        reason="facts cited outside the evidence records were dropped",
    )
    return plan.model_copy(update={"facts": kept}), repair


_TITLE = r"(?:(?:Mr|Mrs|Ms|Dr|Prof)\.?\s+)"


def expand_name(plan: AnswerPlan, span_texts: dict[str, str]) -> tuple[AnswerPlan, Repair | None]:
    """Complete a partial name in an entity answer from its answer span: "Amelia" → "Amelia Torres"
    when the span writes "Amelia Torres", "Patel" → "Mrs. Patel".

    A blind reader that finds the full name in the records answers with it, and a mismatch then
    rejects a good item (measured: 'Amelia Torres' vs reference 'Amelia'). Only a name the span
    writes once, in full, right around the answer; the repair is recorded."""
    answer = plan.answer.strip()
    text = span_texts.get(plan.answer_span_id or "")
    if str(plan.answer_type) != "entity" or not text or not answer[:1].isupper():
        return plan, None
    pattern = re.compile(
        rf"(?<![\w.])({_TITLE}?){re.escape(answer)}((?:\s+[A-Z][\w'’-]*)*)(?![\w'’-])"
    )
    found = {(m.group(1) + answer + m.group(2)).strip() for m in pattern.finditer(text)}
    if len(found) != 1 or (full := found.pop()) == answer or len(full.split()) > 4:
        return plan, None
    repair = Repair(
        stage="plan",
        field="answer",
        before=answer,
        after=full,
        reason="the answer span writes the full name",
    )
    return plan.model_copy(update={"answer": full}), repair


def _answer_support_issue(
    plan: AnswerPlan, kind: AnswerType, span_texts: dict[str, str]
) -> PlanIssue | None:
    cited = [
        sid for sid in [plan.answer_span_id, *(f.span_id for f in plan.facts)] if sid in span_texts
    ]
    text = "\n".join(span_texts[sid] for sid in dict.fromkeys(cited))
    if kind in EXTRACTIVE_TYPES and not _contains(text, plan.answer):
        return PlanIssue(
            code=PlanCheckCode.ANSWER_NOT_IN_SPANS,
            detail=f"{plan.answer!r} is not in the cited spans",
        )
    if kind is AnswerType.LIST:
        missing = [item for item in list_items(plan.answer) if not _contains(text, item)]
        if missing:
            return PlanIssue(
                code=PlanCheckCode.ANSWER_NOT_IN_SPANS,
                detail=f"list items not in the cited spans: {missing}",
            )
    return None


_URL = re.compile(r"\bhttps?://|\bwww\.", re.I)


def _unstated_issue(
    plan: AnswerPlan, kind: AnswerType, span_texts: dict[str, str]
) -> PlanIssue | None:
    """``answer_not_stated`` for a plan whose cited spans hold its answer without stating a fact
    about it (see the module docstring), or None."""
    cited = [
        sid
        for sid in dict.fromkeys([plan.answer_span_id, *(f.span_id for f in plan.facts)])
        if sid in span_texts
    ]
    if kind in (*EXTRACTIVE_TYPES, AnswerType.LIST):
        items = list_items(plan.answer) if kind is AnswerType.LIST else [plan.answer]
        holding = [sid for sid in cited if any(_contains(span_texts[sid], i) for i in items)]
        if holding and all(_URL.search(span_texts[sid]) for sid in holding):
            return PlanIssue(
                code=PlanCheckCode.ANSWER_NOT_STATED,
                detail=f"{plan.answer!r} is only in a source or link line",
            )
    if kind is AnswerType.DATE:
        span = span_texts.get(plan.answer_span_id or "")
        if span is not None and states_nothing(span) and not _DATE_IN_TEXT.search(span):
            return PlanIssue(
                code=PlanCheckCode.ANSWER_NOT_STATED,
                detail=f"the date is cited from a heading that writes none: {span[:60]!r}",
            )
    if kind is AnswerType.NUMBER:
        try:
            value = round(parse_answer(plan.answer, kind).value, 9)
        except AnswerParseError:
            return None  # answer_unparseable says so
        text = _DATE_OR_TIME.sub(" ", "\n".join(span_texts[sid] for sid in cited))
        counts = {float(len(plan.facts)), float(len(plan.evidence_ids))}
        if value not in numbers_in(text) and value not in counts:
            return PlanIssue(
                code=PlanCheckCode.ANSWER_NOT_STATED,
                detail=f"no cited span writes the number {plan.answer!r}, and it counts "
                "neither the facts nor the evidence records",
            )
    return None


# Dates and clock times are not quantities a number answer can be read from ("2024-02-03" writes
# no 3 anything).
_DATE_OR_TIME = re.compile(r"\b\d{4}-\d{1,2}-\d{1,2}\b|\b\d{1,2}[:/]\d{2}(?:[:/]\d{2,4})?\b")


def _kind_issue(plan: AnswerPlan, kind: AnswerType, task: Task) -> PlanIssue | None:
    """``wrong_kind`` for a plan that answers another kind than its task asks for, or a list of one."""
    if task.answer_type and kind.value != task.answer_type:
        return PlanIssue(
            code=PlanCheckCode.WRONG_KIND,
            detail=f"the task asks for a {task.answer_type} answer; the plan gives a {kind.value}",
        )
    if kind is AnswerType.LIST and len(list_items(plan.answer)) < 2:
        return PlanIssue(
            code=PlanCheckCode.WRONG_KIND, detail=f"a list answer of one item: {plan.answer!r}"
        )
    return None


def check_plan(
    plan: AnswerPlan,
    task: Task,
    view: BundleView,
    span_texts: dict[str, str],
    *,
    max_answer_words: int = 10,
    repair: bool = True,
    user_name: str | None = None,
    drop_unknown: bool = False,
    stated: bool = False,
    task_kind: bool = False,
) -> tuple[AnswerPlan, list[PlanIssue], list[Repair]]:
    """Resolve and check a plan: ``(resolved plan, failures, repairs)``; no failures = pass.

    ``span_texts`` maps every span id of the bundle to its text. See the module docstring for
    the checks and the citation repair; ``drop_unknown`` lets the repair drop a fact whose label
    names no span when the rest of the plan still covers its evidence (:func:`drop_stray_facts`);
    ``stated`` adds ``answer_not_stated`` and ``task_kind`` adds ``wrong_kind``.
    """
    resolved, issues = resolve_plan(plan, view, span_texts)
    repairs: list[Repair] = []
    try:
        kind = AnswerType(str(resolved.answer_type))
    except ValueError:
        issues.append(
            PlanIssue(code=PlanCheckCode.BAD_ANSWER_TYPE, detail=str(resolved.answer_type))
        )
        return resolved, issues, repairs
    if not resolved.answer.strip():
        issues.append(PlanIssue(code=PlanCheckCode.EMPTY_ANSWER, detail="the answer is empty"))
        return resolved, issues, repairs
    try:
        parse_answer(resolved.answer, kind)
    except AnswerParseError as exc:
        issues.append(PlanIssue(code=PlanCheckCode.ANSWER_UNPARSEABLE, detail=str(exc)))
    if kind is AnswerType.ENTITY and is_user_name(resolved.answer, user_name):
        issues.append(
            PlanIssue(code=PlanCheckCode.ANSWER_IS_USER, detail=f"{resolved.answer!r} is the user")
        )
    if task_kind and (wrong := _kind_issue(resolved, kind, task)) is not None:
        issues.append(wrong)
    if kind in EXTRACTIVE_TYPES and len(resolved.answer.split()) > max_answer_words:
        issues.append(
            PlanIssue(
                code=PlanCheckCode.ANSWER_TOO_LONG,
                detail=f"{len(resolved.answer.split())} words (at most {max_answer_words})",
            )
        )

    support = _answer_support_issue(resolved, kind, span_texts)
    if support is not None and repair and kind in EXTRACTIVE_TYPES:
        fixed, rep = repair_answer_citation(resolved, task, span_texts)
        if rep is not None and _answer_support_issue(fixed, kind, span_texts) is None:
            resolved, support = fixed, None
            repairs.append(rep)
            # a repair resolves the unknown answer span it replaced
            issues = [
                i
                for i in issues
                if not (i.code is PlanCheckCode.UNKNOWN_SPAN and i.detail.startswith("answer span"))
            ]
    if support is not None:
        issues.append(support)
    elif stated and (unstated := _unstated_issue(resolved, kind, span_texts)) is not None:
        issues.append(unstated)
    elif repair:
        resolved, named = expand_name(resolved, span_texts)
        if named is not None:
            repairs.append(named)

    if repair:
        cited = {f.span_id for f in resolved.facts}
        resolved, stray = drop_stray_facts(resolved, span_texts, unknown=drop_unknown)
        if stray is not None:
            repairs.append(stray)
            dropped = [_unknown_fact(sid) for sid in cited - {f.span_id for f in resolved.facts}]
            issues = [i for i in issues if i not in dropped]
    if not resolved.facts:
        issues.append(PlanIssue(code=PlanCheckCode.NO_FACTS, detail="the plan cites no fact"))
    evidence_ids = resolved.evidence_ids
    if len(evidence_ids) != task.evidence_count:
        issues.append(
            PlanIssue(
                code=PlanCheckCode.EVIDENCE_COUNT,
                detail=f"{len(evidence_ids)} evidence records, the task asks for {task.evidence_count}",
            )
        )
    fact_records = {_record_of(f.span_id) for f in resolved.facts if f.span_id in span_texts}
    for rid in evidence_ids:
        if rid in view.record_labels.values() and rid not in fact_records:
            issues.append(
                PlanIssue(
                    code=PlanCheckCode.EVIDENCE_WITHOUT_FACT, detail=f"record {rid} has no fact"
                )
            )
    for f in resolved.facts:
        if f.span_id in span_texts and _record_of(f.span_id) not in evidence_ids:
            issues.append(
                PlanIssue(
                    code=PlanCheckCode.FACT_OUTSIDE_EVIDENCE,
                    detail=f"fact {f.span_id} is not from an evidence record",
                )
            )
    return resolved, issues, repairs


_MONTH = r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.?"
_DATE_IN_TEXT = re.compile(
    rf"\b\d{{4}}-\d{{1,2}}-\d{{1,2}}\b|\b\d{{1,2}}/\d{{1,2}}/\d{{2,4}}\b"
    rf"|\b{_MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,?\s+\d{{4}})?\b"
    rf"|\b\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH}(?:,?\s+\d{{4}})?\b",
    re.I,
)
