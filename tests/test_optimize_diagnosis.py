"""Evidence-guided diagnosis: answering / retrieval / storage failures on hand-built cases."""

from __future__ import annotations

import pytest
from memory_fixtures import small_history
from optimize_fixtures import result

from memsteer_dspy.evaluation import evaluate_item
from memsteer_dspy.memory import MemoryDesign, MemorySystem
from memsteer_dspy.optimize.diagnosis import (
    FailureStage,
    diagnose,
    diagnose_failures,
    is_failure,
    stage_counts,
)
from memsteer_dspy.records import QAItem


@pytest.fixture(scope="module")
def system() -> MemorySystem:
    return MemorySystem.from_design(MemoryDesign.base_bm25(), small_history())


def item(
    evidence: list[str], spans: list[str] | None = None, date: str = "2024-03-01", qa_id: str = "x"
) -> QAItem:
    return QAItem(
        id=qa_id,
        question="What colour was the bicycle I bought?",
        answer="red",
        evidence_ids=evidence,
        span_ids=spans or [],
        question_date=date,
    )


def test_all_evidence_in_context_is_an_answering_failure(system):
    text = system.user_history["s1:1"].text
    d = diagnose(system, item(["s1:1"]), result("x", delivered=["s1:1"], context=f"[s1:1]\n{text}"))
    assert d.stage is FailureStage.ANSWERING
    assert d.missing_ids == [] and d.lookups == []
    assert [c.present for c in d.checks] == [True]


def test_a_missing_record_that_memory_can_recover_is_a_retrieval_failure(system):
    d = diagnose(system, item(["s1:1", "s2:2"]), result("x", delivered=["s1:1"], context="..."))
    assert d.stage is FailureStage.RETRIEVAL
    assert d.missing_ids == ["s2:2"]
    (lk,) = d.lookups
    assert lk.record_id == "s2:2" and lk.stored and lk.retrievable and lk.self_rank == 1
    assert {c.record_id: c.delivered for c in d.checks} == {"s1:1": True, "s2:2": False}


def test_an_unrecoverable_missing_record_is_a_storage_failure(system):
    # s3:1 is dated 2024-03-20: under the as_of protocol a question of 2024-03-01 cannot see it
    d = diagnose(system, item(["s1:1", "s3:1"]), result("x", delivered=["s1:1"]), protocol="as_of")
    assert d.stage is FailureStage.STORAGE
    assert d.missing_ids == ["s3:1"]
    assert not d.lookups[0].visible and not d.lookups[0].retrievable


def test_any_unrecoverable_record_makes_it_storage_even_if_others_are_recoverable(system):
    d = diagnose(system, item(["s2:2", "no-such-record"]), result("x", delivered=[]))
    assert d.stage is FailureStage.STORAGE
    assert d.missing_ids == ["s2:2", "no-such-record"]
    by_id = {lk.record_id: lk for lk in d.lookups}
    assert by_id["s2:2"].retrievable and not by_id["no-such-record"].in_history


def test_a_cited_span_cut_from_the_context_makes_the_record_missing(system):
    rec = system.user_history["doc.md:Budget"]
    spans = [s.id for s in rec.spans]
    first_lines = "\n".join(s.text for s in rec.spans[:2])  # the context was cut after two spans
    it = item(["doc.md:Budget"], spans=[spans[0], spans[-1]])
    d = diagnose(system, it, result("x", delivered=["doc.md:Budget"], context=first_lines))
    assert d.stage is FailureStage.RETRIEVAL
    (check,) = d.checks
    assert check.delivered and check.missing_spans == [spans[-1]] and not check.present
    # with the whole record in the context, the same item is an answering failure
    d2 = diagnose(system, it, result("x", delivered=["doc.md:Budget"], context=rec.text))
    assert d2.stage is FailureStage.ANSWERING


def test_diagnosis_of_real_traces_from_the_memory_system(system):
    q = item(["s1:1"], qa_id="q1")
    r = evaluate_item(system, q, metrics="recall")
    assert r.delivered_recall == 1.0
    r.correct = False  # as if the answerer got it wrong
    assert diagnose(system, q, r).stage is FailureStage.ANSWERING
    narrow = MemorySystem.from_design(
        MemoryDesign.from_dict({"retrieve": {"top_k": 1, "pool": 1}}), small_history()
    )
    q2 = QAItem(
        id="q2",
        question="Where is Anna's marine biology conference?",
        answer="Lisbon",
        evidence_ids=["s2:2", "mail:1"],
        question_date="2024-03-01",
    )
    r2 = evaluate_item(narrow, q2, metrics="recall")
    assert r2.delivered_recall == 0.5 and is_failure(r2)
    d = diagnose(narrow, q2, r2)
    assert d.stage is FailureStage.RETRIEVAL and len(d.missing_ids) == 1


def test_is_failure_covers_judged_recall_only_and_errored_results():
    assert is_failure(result("a", delivered=[], correct=False))
    assert not is_failure(result("a", delivered=[], correct=True))
    assert is_failure(result("a", delivered=[], correct=None, delivered_recall=0.5))
    assert not is_failure(result("a", delivered=[], correct=None, delivered_recall=1.0))
    assert is_failure(result("a", delivered=[], correct=None, delivered_recall=1.0, error="boom"))


def test_diagnose_failures_skips_correct_items_and_records_errors(system, monkeypatch):
    items = [item(["s1:1"], qa_id="ok"), item(["s2:2"], qa_id="bad"), item(["s1:1"], qa_id="boom")]
    results = [
        result("ok", delivered=["s1:1"], correct=True),
        result("bad", delivered=[]),
        result("boom", delivered=[]),
    ]
    real = system.lookup

    def lookup(rid, **kw):
        if kw.get("question") and rid == "s1:1":
            raise RuntimeError("index unavailable")
        return real(rid, **kw)

    monkeypatch.setattr(system, "lookup", lookup)
    errors: dict[str, str] = {}
    out = diagnose_failures(system, items, results, errors=errors)
    assert set(out) == {"bad"} and out["bad"].stage is FailureStage.RETRIEVAL
    assert "index unavailable" in errors["boom"]
    assert stage_counts(out) == {"storage": 0, "retrieval": 1, "answering": 0}
