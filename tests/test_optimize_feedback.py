"""Feedback modes (random30, +gold, +diagnosis, stratified caps) and the objectives' accept rule."""

from __future__ import annotations

import pytest
from memory_fixtures import small_history
from optimize_fixtures import result

from memsteer_dspy.optimize.diagnosis import Diagnosis, FailureStage
from memsteer_dspy.optimize.feedback import build_feedback
from memsteer_dspy.optimize.objectives import Score, accept, passes_screen
from memsteer_dspy.records import QAItem


def population(n_storage=3, n_retrieval=25, n_answering=12, n_correct=5):
    """Items, results and diagnoses with a known number of failures per stage."""
    items, results, diagnoses = [], [], {}
    stages = [FailureStage.STORAGE] * n_storage + [FailureStage.RETRIEVAL] * n_retrieval
    stages += [FailureStage.ANSWERING] * n_answering + [None] * n_correct
    for i, stage in enumerate(stages):
        qid = f"q{i:03d}"
        items.append(
            QAItem(
                id=qid,
                question=f"question {i}?",
                answer=f"answer {i}",
                evidence_ids=["s1:1", "s2:2"],
                question_date="2024-03-01",
            )
        )
        results.append(
            result(
                qid,
                delivered=["s1:1"],
                context="[s1:1]\nI bought a red bicycle",
                correct=stage is None,
                ranked=["s1:1", "s3:1", "s2:2"],
            )
        )
        if stage is not None:
            diagnoses[qid] = Diagnosis(qa_id=qid, stage=stage, missing_ids=["s2:2"])
    return items, results, diagnoses


def test_stratified_takes_at_most_ten_cases_per_stage():
    items, results, diagnoses = population()
    fb = build_feedback(
        items, results, diagnoses, small_history(), mode="stratified", seed=1, iteration=3
    )
    stages = [c.stage for c in fb.cases]
    assert stages.count(FailureStage.STORAGE) == 3
    assert stages.count(FailureStage.RETRIEVAL) == 10
    assert stages.count(FailureStage.ANSWERING) == 10
    assert fb.n_failures == 40 and fb.stage_counts == {
        "storage": 3,
        "retrieval": 25,
        "answering": 12,
    }
    assert all(c.missing_ids == ["s2:2"] and c.evidence_ids == ["s1:1", "s2:2"] for c in fb.cases)
    # with a smaller cap the cap holds for every stage
    fb2 = build_feedback(items, results, diagnoses, small_history(), mode="stratified", per_stage=2)
    assert len(fb2.cases) == 6


def test_random30_samples_thirty_failures_without_gold_or_diagnosis():
    items, results, diagnoses = population()
    fb = build_feedback(items, results, diagnoses, small_history(), mode="random30", seed=0)
    assert len(fb.cases) == 30 and len({c.qa_id for c in fb.cases}) == 30
    correct = {r.qa_id for r in results if r.correct}
    assert not correct & {c.qa_id for c in fb.cases}
    c = fb.cases[0]
    assert (
        c.prediction == "wrong"
        and c.ranked_ids == ["s1:1", "s3:1", "s2:2"]
        and c.delivered_ids == ["s1:1"]
    )
    assert c.context_excerpt.startswith("[s1:1]")
    assert (
        c.evidence_ids is None
        and c.gold_excerpts is None
        and c.stage is None
        and fb.stage_counts is None
    )
    text = fb.render()
    assert "required evidence" not in text and "diagnosis:" not in text


def test_gold_mode_adds_evidence_and_excerpts_but_no_attribution():
    items, results, diagnoses = population()
    fb = build_feedback(items, results, diagnoses, small_history(), mode="random30+gold")
    c = fb.cases[0]
    assert c.evidence_ids == ["s1:1", "s2:2"]
    assert c.gold_excerpts["s1:1"].startswith("I bought a red bicycle")
    assert c.stage is None and c.missing_ids is None
    assert "diagnosis:" not in fb.render()


def test_diagnosis_mode_adds_attribution_with_random_sampling():
    items, results, diagnoses = population()
    fb = build_feedback(
        items, results, diagnoses, small_history(), mode="random30+diagnosis", seed=4
    )
    assert len(fb.cases) == 30
    assert all(c.stage is not None and c.missing_ids == ["s2:2"] for c in fb.cases)
    # random sampling does not cap stages: retrieval (25 of 40 failures) dominates
    assert sum(c.stage is FailureStage.RETRIEVAL for c in fb.cases) > 10
    assert "diagnosis: " in fb.render()


def test_sampling_is_seeded_by_seed_and_iteration():
    items, results, diagnoses = population()
    h = small_history()

    def ids(**kw):
        return [
            c.qa_id
            for c in build_feedback(items, results, diagnoses, h, mode="random30", **kw).cases
        ]

    assert ids(seed=1, iteration=2) == ids(seed=1, iteration=2)
    assert ids(seed=1, iteration=2) != ids(seed=1, iteration=3)


def test_render_keeps_within_budget_and_says_what_was_left_out():
    items, results, diagnoses = population()
    fb = build_feedback(items, results, diagnoses, small_history(), mode="stratified")
    from memsteer_dspy.tokens import count_tokens

    full = fb.render()
    short = fb.render(max_tokens=600)
    assert count_tokens(short) <= 600 < count_tokens(full)
    assert "Showing" in short and "did not fit" in short
    # round-robin over stages: a short budget still shows every stage
    assert all(f"{s.value} failure" in short for s in FailureStage)


def test_no_failures_renders_a_plain_note():
    items, results, _ = population(0, 0, 0, 3)
    fb = build_feedback(items, results, {}, small_history())
    assert fb.cases == [] and "answered every training question" in fb.render()


# --------------------------------------------------------------------------------------------
# objectives
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cand", "cur", "expected"),
    [(0.41, 0.40, True), (0.40, 0.40, False), (0.39, 0.40, False)],
)
def test_accuracy_accepts_only_strict_improvements(cand, cur, expected):
    assert accept("accuracy", Score(accuracy=cand), Score(accuracy=cur)) is expected


def test_recall_breaks_ties_by_r_at_10_and_rejects_full_ties():
    cur = Score(delivered_recall=0.5, recall_at_10=0.4, metrics="recall")
    assert accept("recall", Score(delivered_recall=0.6, recall_at_10=0.1), cur)
    assert accept("recall", Score(delivered_recall=0.5, recall_at_10=0.45), cur)
    assert not accept("recall", Score(delivered_recall=0.5, recall_at_10=0.4), cur)
    assert not accept("recall", Score(delivered_recall=0.49, recall_at_10=0.9), cur)


def test_recall_then_accuracy_screens_by_recall_and_confirms_by_accuracy():
    cur = Score(accuracy=0.3, delivered_recall=0.5, recall_at_10=0.5)
    worse_recall = Score(delivered_recall=0.4, recall_at_10=0.4, metrics="recall")
    assert not passes_screen("recall-then-accuracy", worse_recall, cur)
    assert passes_screen("recall-then-accuracy", Score(delivered_recall=0.5, recall_at_10=0.5), cur)
    assert not accept("recall-then-accuracy", Score(accuracy=0.3, delivered_recall=0.6), cur)
    assert accept(
        "recall-then-accuracy", Score(accuracy=0.35, delivered_recall=0.5, recall_at_10=0.5), cur
    )
    assert not accept("recall-then-accuracy", Score(accuracy=0.9, delivered_recall=0.4), cur)
