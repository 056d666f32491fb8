"""Evidence-guided failure diagnosis (paper, Section 3.3 (i)).

For each incorrect training response, the evidence annotations say where the memory system failed:

* **answering** — every evidence record (and every cited span) is in the final answer context, yet
  the answer is wrong;
* otherwise, for each missing evidence record the memory lookup says whether the current memory can
  recover it (:func:`memsteer_dspy.memory.lookup_record`): **storage** if any missing record is
  unrecoverable, **retrieval** if all of them are recoverable.

A response counts as incorrect when the judge said so, when it failed with an error, or — under the
``recall`` objective, where nothing is answered — when some evidence did not reach the answerer.
"""

from __future__ import annotations

import re
from enum import StrEnum

from pydantic import BaseModel, Field

from memsteer_dspy.evaluation import ItemResult
from memsteer_dspy.memory.lookup import RecordLookup
from memsteer_dspy.memory.system import MemorySystem
from memsteer_dspy.records import QAItem, span_record_id


class FailureStage(StrEnum):
    """Where an incorrect response failed."""

    STORAGE = "storage"
    RETRIEVAL = "retrieval"
    ANSWERING = "answering"


class EvidenceCheck(BaseModel):
    """Is one evidence record (and its cited spans) in the final answer context?"""

    record_id: str
    in_history: bool = True
    delivered: bool = Field(
        description="The record's content reached the answerer (within the budget)."
    )
    cited_spans: list[str] = Field(
        default_factory=list, description="Span ids the annotation cites in this record."
    )
    missing_spans: list[str] = Field(
        default_factory=list, description="Cited spans whose text is not in the context."
    )
    span_check: str = Field(
        "text",
        description="'text': span text searched in the context; 'record': the memory "
        "rewrites content (facts), so the record's delivery stands for its spans.",
    )

    @property
    def present(self) -> bool:
        return self.in_history and self.delivered and not self.missing_spans

    def summary(self) -> str:
        if not self.in_history:
            return f"{self.record_id}: not in the history"
        if not self.delivered:
            return f"{self.record_id}: not delivered to the answerer"
        if self.missing_spans:
            return (
                f"{self.record_id}: delivered, but {len(self.missing_spans)} of {len(self.cited_spans)} "
                f"cited span(s) not in the context ({', '.join(self.missing_spans)})"
            )
        return f"{self.record_id}: in the context"


class Diagnosis(BaseModel):
    """The diagnosis of one incorrect training response."""

    qa_id: str
    stage: FailureStage
    missing_ids: list[str] = Field(
        default_factory=list, description="Evidence records not (fully) in the context."
    )
    checks: list[EvidenceCheck] = Field(default_factory=list)
    lookups: list[RecordLookup] = Field(
        default_factory=list, description="Memory lookups of the missing records."
    )
    note: str | None = None

    def row(self) -> dict:
        """One row of the diagnosis table."""
        return {
            "qa_id": self.qa_id,
            "stage": self.stage.value,
            "missing_ids": self.missing_ids,
            "evidence": [c.record_id for c in self.checks],
            "checks": [c.summary() for c in self.checks],
            "lookups": [lk.summary() for lk in self.lookups],
            "note": self.note,
        }


def is_failure(result: ItemResult) -> bool:
    """Whether a training response is a failure the optimizer should learn from (see module doc)."""
    if result.error is not None:
        return True
    if result.correct is not None:
        return not result.correct
    return result.delivered_recall is not None and result.delivered_recall < 1.0


_WS = re.compile(r"\s+")


def _norm(text: str) -> str:
    return _WS.sub(" ", text).strip().lower()


def evidence_checks(system: MemorySystem, item: QAItem, result: ItemResult) -> list[EvidenceCheck]:
    """Check each evidence record of ``item`` (and records of its cited spans) against the answer
    context of ``result``'s trace."""
    history = system.user_history
    trace = result.trace
    delivered = set(trace.delivered_record_ids) if trace is not None else set()
    context = _norm(trace.context) if trace is not None else ""
    rewrites = system.design.store.unit == "facts"
    spans: dict[str, list[str]] = {}
    for sid in item.span_ids:
        try:
            spans.setdefault(span_record_id(sid), []).append(sid)
        except ValueError:
            continue
    record_ids = list(dict.fromkeys([*item.evidence_ids, *spans]))
    checks = []
    for rid in record_ids:
        in_history = rid in history
        cited = spans.get(rid, [])
        missing: list[str] = []
        if in_history and rid in delivered and not rewrites:
            for sid in cited:
                try:
                    text = history.span(sid).text
                except KeyError:
                    missing.append(sid)
                    continue
                if _norm(text) not in context:
                    missing.append(sid)
        checks.append(
            EvidenceCheck(
                record_id=rid,
                in_history=in_history,
                delivered=rid in delivered,
                cited_spans=cited,
                missing_spans=missing,
                span_check="record" if rewrites else "text",
            )
        )
    return checks


def diagnose(
    system: MemorySystem, item: QAItem, result: ItemResult, *, protocol: str = "full"
) -> Diagnosis:
    """Diagnose one incorrect response (see the module docstring). ``protocol`` is the evaluation
    protocol the result was produced under (``as_of`` cuts the memory at the question date)."""
    checks = evidence_checks(system, item, result)
    missing = [c.record_id for c in checks if not c.present]
    note = None
    if result.error is not None:
        note = f"the response failed ({result.error_stage}): {result.error}"
    if not checks:
        return Diagnosis(
            qa_id=item.id,
            stage=FailureStage.ANSWERING,
            checks=[],
            note=note
            or "no evidence annotation: nothing could be missing, so the answer step is blamed",
        )
    if not missing:
        return Diagnosis(qa_id=item.id, stage=FailureStage.ANSWERING, checks=checks, note=note)
    as_of = item.question_date if protocol == "as_of" else None
    lookups = [
        system.lookup(rid, question=item.question, question_date=item.question_date, as_of=as_of)
        for rid in missing
    ]
    stage = (
        FailureStage.STORAGE
        if any(not lk.retrievable for lk in lookups)
        else FailureStage.RETRIEVAL
    )
    return Diagnosis(
        qa_id=item.id, stage=stage, missing_ids=missing, checks=checks, lookups=lookups, note=note
    )


def diagnose_failures(
    system: MemorySystem,
    items: list[QAItem],
    results: list[ItemResult],
    *,
    protocol: str = "full",
    errors: dict[str, str] | None = None,
) -> dict[str, Diagnosis]:
    """Diagnose every failure among ``results`` (matched to ``items`` by id). An item whose
    diagnosis raises is left out, with the reason put in ``errors`` (qa id → reason); it never
    stops the rest."""
    by_id = {q.id: q for q in items}
    out: dict[str, Diagnosis] = {}
    for r in results:
        if not is_failure(r) or r.qa_id not in by_id:
            continue
        try:
            out[r.qa_id] = diagnose(system, by_id[r.qa_id], r, protocol=protocol)
        except Exception as exc:  # one bad item never stops the diagnosis of the rest
            if errors is not None:
                errors[r.qa_id] = f"{type(exc).__name__}: {exc}"
    return out


def stage_counts(diagnoses: dict[str, Diagnosis]) -> dict[str, int]:
    """Failures per stage (every stage present, in storage/retrieval/answering order)."""
    counts = {s.value: 0 for s in FailureStage}
    for d in diagnoses.values():
        counts[d.stage.value] += 1
    return counts
