"""Evaluation: recall@k on known evidence, correctness (exact, then judge), QS, failures, resume."""

from __future__ import annotations

import json
from datetime import date

import pytest
from memory_fixtures import ScriptedLM, field_value, signature_of, small_history, small_qa

from memsteer_dspy.errors import ConfigError, InputError
from memsteer_dspy.evaluation import (
    delivered_recall,
    evaluate_design,
    question_score,
    read_qa_jsonl,
    recall_at_k,
)
from memsteer_dspy.memory import MemoryDesign, MemorySystem


def system(design: MemoryDesign | None = None, **kw) -> MemorySystem:
    return MemorySystem.from_design(design or MemoryDesign.base_bm25(), small_history(), **kw)


# --------------------------------------------------------------------------------------------
# metric functions
# --------------------------------------------------------------------------------------------


def test_recall_counts_distinct_records_in_unit_then_record_order():
    ranked = [["a", "b", "c"], ["b", "d"], ["e"]]
    assert recall_at_k(ranked, ["a"], 1) == 1.0
    assert recall_at_k(ranked, ["b"], 1) == 0.0  # a big unit does not put all its records at rank 1
    assert (
        recall_at_k(ranked, ["d"], 3) == 0.0 and recall_at_k(ranked, ["d"], 4) == 1.0
    )  # 'b' repeats, not recounted
    assert recall_at_k(ranked, ["a", "e", "zz"], 10) == pytest.approx(2 / 3)
    assert recall_at_k(ranked, [], 10) is None
    assert recall_at_k([], ["a"], 10) == 0.0


def test_delivered_recall_and_question_score():
    assert delivered_recall(["a", "b"], ["b", "c"]) == 0.5
    assert delivered_recall(["a"], []) is None
    assert question_score("90 dollars", "90", "number", correct=False) == 1.0
    assert question_score("91", "90", "number", correct=True) == 0.0  # numbers: exact only
    assert question_score("Anna, Bob", "Anna, Tom", "list", correct=False) == pytest.approx(1 / 3)
    assert question_score("Tom and Anna", "Anna, Tom", "list", correct=False) == 1.0
    assert question_score("crimson", "red", "text", correct=True) == 1.0


# --------------------------------------------------------------------------------------------
# retrieval-only evaluation
# --------------------------------------------------------------------------------------------


def test_recall_on_a_fixture_with_known_evidence():
    report = evaluate_design(system(), small_qa(), metrics="recall", protocol="as_of")
    by_id = {r.qa_id: r for r in report.items}
    assert by_id["q1"].recall_at_1 == 1.0  # 'bicycle bought market' -> s1:1
    assert by_id["q2"].recall_at_5 == 1.0  # s2:2 and the email
    assert by_id["q3"].recall_at_10 == 1.0
    for r in report.items:
        assert r.prediction is None and r.correct is None and r.trace is not None
        ranked = r.trace.ranked_records(10)
        expected = len(set(r.evidence_ids) & set(ranked)) / len(r.evidence_ids)
        assert r.recall_at_10 == pytest.approx(expected)
        assert r.delivered_recall == pytest.approx(
            len(set(r.evidence_ids) & set(r.trace.delivered_record_ids)) / len(r.evidence_ids)
        )
    s = report.summary
    assert s.n == 4 and s.accuracy is None and s.qs is None
    assert s.recall_at_10 == pytest.approx(sum(r.recall_at_10 for r in report.items) / 4)
    assert set(s.by_type) == {"fact", "multi"} and s.by_type["fact"].n == 2


def test_recall_protocol_as_of_hides_later_evidence():
    items = small_qa()
    items[2] = items[2].model_copy(
        update={"question_date": date(2024, 3, 1)}
    )  # asked before Tom paid
    as_of = evaluate_design(
        system(MemoryDesign.from_dict({"retrieve": {"time_filter": False}})),
        items,
        metrics="recall",
        protocol="as_of",
    )
    full = evaluate_design(
        system(MemoryDesign.from_dict({"retrieve": {"time_filter": False}})),
        items,
        metrics="recall",
        protocol="full",
    )
    assert as_of.items[2].recall_at_10 == 0.0 and full.items[2].recall_at_10 == 1.0
    assert as_of.summary.protocol == "as_of"


def test_recall_mode_needs_no_lm():
    s = system()
    assert s.answerer.lm is None
    report = evaluate_design(s, small_qa(), metrics="recall")
    assert report.summary.errors == 0


# --------------------------------------------------------------------------------------------
# full evaluation with scripted answerer and judge
# --------------------------------------------------------------------------------------------

ANSWERS = {"q1": "Red.", "q2": "in Lisbon, Portugal", "q3": "ninety", "q4": "Anna"}


def _answerer(system_prompt, user):
    q = field_value(user, "question")
    qid = next(i.id for i in small_qa() if i.question == q)
    return {"answer": ANSWERS[qid]}


def _judge_factory(verdicts):
    def judge(system_prompt, user):
        assert signature_of(system_prompt) == "judge"
        return {"correct": verdicts[field_value(user, "prediction")]}

    return judge


def test_correctness_exact_first_then_judge_and_qs():
    answer_lm = ScriptedLM(_answerer)
    judge_lm = ScriptedLM(_judge_factory({"in Lisbon, Portugal": True, "Anna": False}))
    report = evaluate_design(
        system(lms={"answerer": answer_lm}), small_qa(), judge_lm=judge_lm, protocol="as_of"
    )
    r = {i.qa_id: i for i in report.items}
    assert (
        r["q1"].exact and r["q1"].judge_correct is None and r["q1"].correct
    )  # 'Red.' == 'red' normalized
    assert r["q2"].exact is False and r["q2"].judge_correct is True and r["q2"].correct
    assert r["q3"].exact and r["q3"].qs == 1.0  # 'ninety' == 90 as a number
    assert r["q4"].correct is False and r["q4"].qs == pytest.approx(0.5)  # list partial credit
    assert len(judge_lm.calls) == 2  # only the non-exact predictions are judged
    s = report.summary
    assert s.accuracy == 0.75 and s.qs == pytest.approx((1 + 1 + 1 + 0.5) / 4)
    assert s.by_type["multi"].accuracy == 0.5
    assert r["q1"].trace.answer == "Red." and r["q1"].prediction == "Red."


def test_one_failed_item_scores_zero_with_its_error():
    def flaky(system_prompt, user):
        if "Tom pay" in field_value(user, "question"):
            raise RuntimeError("rate limited")
        return _answerer(system_prompt, user)

    judge_lm = ScriptedLM(lambda s, u: {"correct": True})
    report = evaluate_design(
        system(lms={"answerer": ScriptedLM(flaky)}), small_qa(), judge_lm=judge_lm
    )
    bad = next(i for i in report.items if i.qa_id == "q3")
    assert (
        bad.correct is False
        and bad.qs == 0.0
        and bad.error_stage == "answer"
        and "rate limited" in bad.error
    )
    assert bad.recall_at_10 == 0.0  # no trace: scored 0
    assert report.summary.errors == 1 and report.summary.n == 4
    assert sum(i.correct for i in report.items) == 3


def test_all_metrics_need_answerer_and_judge():
    with pytest.raises(ConfigError, match="judge"):
        evaluate_design(system(lms={"answerer": ScriptedLM(_answerer)}), small_qa())
    with pytest.raises(ConfigError, match="answerer"):
        evaluate_design(system(), small_qa(), judge_lm=ScriptedLM(lambda s, u: {"correct": True}))


def test_threads_give_the_same_results():
    judge_lm = ScriptedLM(lambda s, u: {"correct": False})
    one = evaluate_design(
        system(lms={"answerer": ScriptedLM(_answerer)}), small_qa(), judge_lm=judge_lm
    )
    two = evaluate_design(
        system(lms={"answerer": ScriptedLM(_answerer)}), small_qa(), judge_lm=judge_lm, threads=3
    )
    assert [i.qa_id for i in two.items] == [q.id for q in small_qa()]
    assert [(i.correct, i.qs, i.recall_at_10) for i in one.items] == [
        (i.correct, i.qs, i.recall_at_10) for i in two.items
    ]


# --------------------------------------------------------------------------------------------
# output folder, resume, QA files
# --------------------------------------------------------------------------------------------


def test_out_dir_holds_items_with_traces_and_a_rerun_resumes(tmp_path):
    answer_lm = ScriptedLM(_answerer)
    judge_lm = ScriptedLM(lambda s, u: {"correct": True})
    s = system(lms={"answerer": answer_lm})
    first = evaluate_design(s, small_qa()[:2], judge_lm=judge_lm, out_dir=tmp_path)
    lines = (tmp_path / "items.jsonl").read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["trace"]["ranked_unit_ids"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["n"] == 2 and summary["accuracy"] == first.summary.accuracy
    assert MemoryDesign.load(tmp_path / "design.json") == s.design
    calls = len(answer_lm.calls)
    second = evaluate_design(s, small_qa(), judge_lm=judge_lm, out_dir=tmp_path)
    assert len(answer_lm.calls) == calls + 2  # only q3, q4 answered again
    assert second.summary.n == 4 and len((tmp_path / "items.jsonl").read_text().splitlines()) == 4


def test_read_qa_jsonl(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(q.model_dump_json() + "\n" for q in small_qa()))
    assert read_qa_jsonl(path) == small_qa()
    path.write_text(
        small_qa()[0].model_dump_json() + "\n" + '{"id": "x", "question": "", "answer": "a"}\n'
    )
    with pytest.raises(InputError) as info:
        read_qa_jsonl(path)
    assert info.value.line == 2 and info.value.field == "question" and info.value.record == "x"


@pytest.mark.integration
def test_full_evaluation_with_the_embedded_model():
    """One item answered and judged by the real embedded LM (slow on CPU: about a minute)."""
    from memsteer_dspy.errors import MissingExtraError
    from memsteer_dspy.lm import load_lm_config

    try:
        config = load_lm_config(None)
        answerer, judge = config.lm("answerer"), config.lm("judge")
    except MissingExtraError as exc:
        pytest.skip(f"embedded model not installed: {exc}")
    design = MemoryDesign.from_dict({"context": {"budget_tokens": 300}})
    report = evaluate_design(
        system(design, lms={"answerer": answerer}), small_qa()[:1], judge_lm=judge
    )
    item = report.items[0]
    assert item.error is None, item.error
    assert item.prediction and item.correct is not None and item.recall_at_1 == 1.0
    assert config.usage_by_role()["answerer"]["calls"] >= 1
