"""``tune-prompts``: the supervision as dspy.Examples, the correctness metric with evidence feedback,
the MemoryQA program, and a small GEPA run with scripted LMs."""

from __future__ import annotations

import json

import dspy
from memory_fixtures import small_history, small_qa
from optimize_fixtures import ProposerLM
from test_optimize_loop import NARROW, answerer_and_judge

from memsteer_dspy.memory import MemoryDesign, MemorySystem
from memsteer_dspy.optimize.tune import CorrectnessMetric, MemoryQA, to_examples, tune_prompts


def test_examples_carry_inputs_and_labels():
    ex = to_examples(small_qa())[1]
    assert set(ex.inputs().keys()) == {"question", "question_date"}
    assert (
        ex.answer == "Lisbon"
        and ex.evidence_ids == ["s2:2", "mail:1"]
        and ex.question_date == "2024-03-01"
    )


def test_program_matches_the_memory_system_and_metric_explains_evidence():
    lm = answerer_and_judge()
    system = MemorySystem.from_design(NARROW, small_history(), lms={"answerer": lm})
    program = MemoryQA(system)
    assert [n for n, _ in program.named_predictors()] == [
        "answerer.read"
    ]  # raw queries: no rewriter
    gold = to_examples(small_qa())[3]  # "Anna, Tom": two records, one delivered at most
    pred = program(**gold.inputs())
    same = system(gold.question, question_date=gold.question_date)
    assert (
        pred.trace.delivered_record_ids == same.trace.delivered_record_ids
        and pred.answer == same.answer
    )
    metric = CorrectnessMetric(lm, feedback=True)
    out = metric(gold, pred, None, "answerer", None)
    assert (
        out.score == 0.0
        and "of 2 gold evidence records reached the answerer; missing" in out.feedback
    )
    ok = metric(gold, dspy.Prediction(answer="Tom, Anna", trace=same.trace), None, None, None)
    assert ok.score == 1.0 and ok.feedback.startswith("Correct")
    assert CorrectnessMetric(lm)(gold, dspy.Prediction(answer="anna, tom")) == 1.0
    broken = CorrectnessMetric(lm, feedback=True)(gold, object(), None, None, None)
    assert broken.score == 0.0


def test_a_design_with_query_rewriting_exposes_the_rewriter():
    lm = answerer_and_judge()
    d = MemoryDesign.from_dict({"retrieve": {"query": "rewrite"}})
    program = MemoryQA(MemorySystem.from_design(d, small_history(), lms={"answerer": lm}))
    assert sorted(n for n, _ in program.named_predictors()) == ["answerer.read", "rewriter"]


def test_gepa_run_writes_tuned_instructions(tmp_path):
    lm = answerer_and_judge()
    reflection = ProposerLM(
        ["```\nAnswer with the exact fact from the context; never guess.\n```"] * 50
    )
    res = tune_prompts(
        small_history(),
        small_qa(),
        small_qa(),
        NARROW,
        out_dir=tmp_path / "tune",
        optimizer="gepa",
        answerer_lm=lm,
        judge_lm=lm,
        reflection_lm=reflection,
        auto=None,
        max_metric_calls=16,
    )
    assert 0.0 <= res.val_before <= 1.0 and 0.0 <= res.val_after <= 1.0
    assert res.n_train == 4 and set(res.instructions) == {"answerer.read"}
    saved = json.loads((tmp_path / "tune" / "instructions.json").read_text())
    assert saved == res.instructions
    assert (tmp_path / "tune" / "tuned_program.json").exists() and (
        tmp_path / "tune" / "result.json"
    ).exists()
    assert reflection.calls, "GEPA never asked the reflection LM"
