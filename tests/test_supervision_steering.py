"""The steering panel (``memsteer assess --steering``, ``generate``'s last step): a fixed panel of
memory designs scored LM-free on generated items and a reference set, and how well the two
rankings agree. The numbers are checked against hand-computed cases: ties leave the agreement
undefined, a reversed ranking gives tau -1, and the top-3 rule counts every design tied into it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from script_helpers import argv
from typer.testing import CliRunner

from memsteer_dspy.cli import app
from memsteer_dspy.demo_data import demo_path, load_demo
from memsteer_dspy.errors import InputError
from memsteer_dspy.memory.design import MemoryDesign
from memsteer_dspy.supervision.checks import copied_run, echoed_words, echoes
from memsteer_dspy.supervision.steering import (
    assess_steering,
    format_steering,
    lexical_by_evidence,
    load_panel,
    panel_split,
    rank_agreement,
    save_steering,
    steering_metrics,
)

NAMES = ["base-bm25", "a", "b", "c"]
# BM25-only designs: scored in milliseconds, no embedder to load
BM25_PANEL = {
    "base-bm25": {},
    "text-only-index": {"store": {"fields": ["text"]}},
    "no-stemming": {"retrieve": {"bm25": {"stemmer": "none", "stopwords": "none"}}},
    "budget-1000": {"context": {"budget_tokens": 1000}},
    "windows-3-stride-1": {"store": {"unit": "window", "window_size": 3, "window_stride": 1}},
}


def matrix(means: list[float], n: int = 6) -> np.ndarray:
    """n items whose per-design scores average to ``means`` exactly (all items equal)."""
    return np.tile(np.array(means, dtype=float), (n, 1))


def agree(generated: list[float], reference: list[float], metric: str = "recall_at_10"):
    """The agreement of two exact per-design means (every item equal)."""
    return rank_agreement(NAMES, matrix(generated), matrix(reference), metric=metric, resamples=50)


def test_the_same_order_agrees_and_the_reverse_disagrees():
    same = agree([0.2, 0.4, 0.6, 0.8], [0.1, 0.3, 0.5, 0.9])
    assert same.kendall_tau == pytest.approx(1.0) and same.spearman_rho == pytest.approx(1.0)
    assert same.generated_best == ["c"] and same.best_in_reference_top
    assert same.headroom_generated == pytest.approx(0.6)
    assert same.headroom_reference == pytest.approx(0.8)
    rev = agree([0.8, 0.6, 0.4, 0.2], [0.1, 0.3, 0.5, 0.9])
    assert rev.kendall_tau == pytest.approx(-1.0)
    assert rev.generated_best == ["base-bm25"] and not rev.best_in_reference_top
    assert rev.headroom_generated == 0.0


def test_a_panel_wide_tau_from_the_broken_designs_is_not_agreement_among_the_good_ones():
    """Both sets put the two broken designs last (panel-wide tau high), but the generated set
    ties the designs the reference puts at or above Base-BM25: nothing to choose among them."""
    names = ["base-bm25", "good", "better", "broken", "worse"]
    gen = matrix([1.0, 1.0, 1.0, 0.5, 0.2])
    ref = matrix([0.45, 0.50, 0.55, 0.30, 0.10])
    a = rank_agreement(names, gen, ref, metric="recall_at_10", resamples=20)
    assert a.kendall_tau > 0.6
    assert a.upper_designs == ["base-bm25", "good", "better"]
    assert a.kendall_tau_upper is None  # the generated set ties all three
    sep = rank_agreement(
        names, matrix([0.7, 0.8, 0.9, 0.5, 0.2]), ref, metric="recall_at_10", resamples=20
    )
    assert sep.kendall_tau_upper == pytest.approx(1.0)
    rev = rank_agreement(
        names, matrix([0.9, 0.8, 0.7, 0.5, 0.2]), ref, metric="recall_at_10", resamples=20
    )
    assert rev.kendall_tau > 0 and rev.kendall_tau_upper == pytest.approx(-1.0)


def test_a_set_that_ties_every_design_has_no_agreement_and_no_best():
    """Today's failure: every design finds every generated item's evidence."""
    tied = agree([1.0, 1.0, 1.0, 1.0], [0.6, 0.8, 0.7, 0.5], "delivered_recall")
    assert tied.kendall_tau is None and tied.spearman_rho is None and tied.kendall_ci95 is None
    assert tied.undefined_share == 1.0 and tied.separated == 1
    assert tied.generated_best == NAMES and not tied.best_in_reference_top  # a tie picks nothing
    assert tied.headroom_generated == 0.0 and tied.headroom_reference == pytest.approx(0.2)


def test_the_reference_top_counts_every_design_tied_into_it_and_the_interval_brackets_noise():
    rng = np.random.default_rng(0)
    g = np.clip(matrix([0.3, 0.5, 0.9, 0.7], 40) + rng.normal(0, 0.3, (40, 4)), 0, 1)
    r = matrix([0.4, 0.6, 0.6, 0.6])
    a = rank_agreement(NAMES, g, r, metric="recall_at_10", resamples=200)
    assert set(a.reference_top) == {"a", "b", "c"}  # three tied at the top
    assert a.best_in_reference_top
    r_noisy = np.clip(matrix([0.2, 0.5, 0.8, 0.6], 40) + rng.normal(0, 0.3, (40, 4)), 0, 1)
    b = rank_agreement(NAMES, g, r_noisy, metric="recall_at_10", resamples=200)
    low, high = b.kendall_ci95
    assert -1.0 <= low < high <= 1.0 and b.kendall_tau > 0 and b.undefined_share == 0.0


def test_the_package_panel_is_fixed_lm_free_and_patches_base_bm25():
    panel = load_panel()
    assert len(panel) >= 12 and "base-bm25" in panel
    assert panel["base-bm25"].key() == MemoryDesign.base_bm25().key()
    assert len({d.key() for d in panel.values()}) == len(panel)  # no design twice
    assert not any(d.lm_uses(answering=False) for d in panel.values())
    assert {d.retrieve.index for d in panel.values()} == {"bm25", "dense", "hybrid"}
    # on another base (the demo's smaller budget) every patch keeps what it does not change
    small = MemoryDesign.base_bm25()
    small = small.model_copy(
        update={"context": small.context.model_copy(update={"budget_tokens": 1000})}
    )
    on_small = load_panel(base=small)
    assert (
        on_small["dense"].context.budget_tokens == 1000
        and on_small["dense"].retrieve.index == "dense"
    )


def test_a_bad_panel_names_its_file_line_and_design(tmp_path):
    bad = tmp_path / "panel.json"
    bad.write_text('{\n  "base-bm25": {},\n  "x": {"retrieve": {"index": "bm25",}}\n}\n')
    with pytest.raises(InputError) as e:
        load_panel(bad)
    assert e.value.file == str(bad) and e.value.line == 3
    bad.write_text(json.dumps({"base-bm25": {}, "wrong": {"retrieve": {"index": "magic"}}}))
    with pytest.raises(InputError, match="wrong"):
        load_panel(bad)
    bad.write_text(json.dumps({"dense": {"retrieve": {"index": "dense"}}}))
    with pytest.raises(InputError, match="base-bm25"):
        load_panel(bad)


@pytest.fixture(scope="module")
def demo():
    return load_demo()


def _bm25_panel(tmp: Path) -> Path:
    path = tmp / "panel.json"
    path.write_text(json.dumps(BM25_PANEL))
    return path


def echo_items(items):
    """Each item asked in its evidence's own words (the first 25 words of its first record): what
    lexical retrieval finds by construction."""
    recs = {r.id: r for r in load_demo().history}
    out = []
    for q in items:
        text = " ".join(recs[q.evidence_ids[0]].text.split()[:25])
        out.append(q.model_copy(update={"question": text + "?", "id": q.id + "-echo"}))
    return out


def test_questions_in_their_evidence_words_are_lexically_easy(demo, tmp_path):
    panel = load_panel(_bm25_panel(tmp_path))
    ref = demo.qa_items
    rep = assess_steering(
        demo.history,
        echo_items(ref),
        ref,
        panel=panel,
        cache_dir=tmp_path / "idx",
        resamples=100,
        groups={"validation": [q.id + "-echo" for q in ref[:3]]},
    )
    assert rep.n_generated == rep.n_reference == 34
    assert rep.base_r10_generated > rep.base_r10_reference + 0.15  # the echo is easier
    assert rep.lexical_gap == pytest.approx(rep.base_r10_generated - rep.base_r10_reference)
    assert set(rep.separated_in) == {"validation"} and rep.separated_in["validation"] >= 1
    text = format_steering(rep)
    assert "Kendall tau" in text and "lexical easiness" in text and "validation items" in text
    # echoed questions are found by every design far more often than the hand-written ones
    gen, ref_split = rep.panel_split["generated"], rep.panel_split["reference"]
    assert gen["n"] == ref_split["n"] == 34
    assert gen["every_design"] > ref_split["every_design"]
    assert rep.headline()["separating_share"] == gen["separating"]
    assert "no design finds" in text and "at or above base-bm25" in text
    assert steering_metrics(rep)["steering.generated.every_design_share"] == gen["every_design"]
    metrics = steering_metrics(rep)
    assert metrics["panel.base-bm25.reference.recall_at_10"] == rep.base_r10_reference
    # the same items on both sides rank the panel the same way
    same = assess_steering(
        demo.history, ref, ref, panel=panel, cache_dir=tmp_path / "idx", resamples=100
    )
    assert same.agreement["delivered_recall"].kendall_tau == pytest.approx(1.0)
    assert same.lexical_gap == 0.0
    assert same.lexical_gap_same_mix == pytest.approx(0.0)
    assert "by evidence count" in format_steering(same)


def test_the_panel_split_counts_items_every_design_finds_none_finds_and_the_rest():
    m = np.array(
        [
            [1.0, 1.0, 1.0],  # every design
            [0.0, 0.0, 0.0],  # no design
            [0.0, np.nan, 0.0],  # no design (a missing score is no score)
            [1.0, 0.0, 1.0],  # separates
            [0.5, 0.5, 0.5],  # half the evidence under every design: ties, but neither end
        ]
    )
    assert panel_split(m) == {"every_design": 0.2, "no_design": 0.4, "separating": 0.2, "n": 5}
    assert panel_split(np.zeros((0, 3)))["n"] == 0


def _items(*counts: int):
    from memsteer_dspy.records import QAItem

    return [
        QAItem(id=f"q{i}", question="q?", answer="a", evidence_ids=[f"r{j}" for j in range(n)])
        for i, n in enumerate(counts)
    ]


def test_the_lexical_gap_at_the_generated_mix_separates_wording_from_evidence_count():
    """A reference whose one-record items score like the generated ones, and whose gap comes only
    from its many two-record items, has no gap at the generated items' mix."""
    gen = _items(1, 1, 1, 1)
    ref = _items(1, 1, 2, 2, 2, 2, 1)
    strata, same = lexical_by_evidence(gen, [1.0, 1.0, 0.0, 1.0], ref, [1, 1, 0, 0, 0.5, 0.5, 0])
    assert strata["1"] == {
        "generated": 0.75,
        "reference": 2 / 3,
        "n_generated": 4,
        "n_reference": 3,
    }
    assert strata["2+"]["generated"] is None and strata["2+"]["reference"] == 0.25
    assert same == pytest.approx(0.75 - 2 / 3)  # +0.08; over all reference items: 0.75 - 3 / 7
    # an item without resolved evidence (None) counts on neither side
    strata, _ = lexical_by_evidence(gen, [1.0, None, None, None], ref, [None] * 7)
    assert strata["1"]["n_generated"] == 1 and strata["1"]["reference"] is None
    # a generated stratum the reference lacks leaves the reweighted gap undefined
    _, same = lexical_by_evidence(_items(2), [1.0], _items(1), [0.5])
    assert same is None


def test_assess_steering_refuses_empty_sets(demo):
    with pytest.raises(InputError, match="no generated items"):
        assess_steering(demo.history, [], demo.qa_items)
    with pytest.raises(InputError, match="no reference items"):
        assess_steering(demo.history, demo.qa_items, [])


def _supervision_folder(folder: Path, items) -> Path:
    folder.mkdir(parents=True)
    lines = [q.model_dump_json() for q in items]
    (folder / "train.jsonl").write_text("\n".join(lines[:20]) + "\n")
    (folder / "val.jsonl").write_text("\n".join(lines[20:]) + "\n")
    (folder / "summary.json").write_text(json.dumps({"accepted": len(items)}))
    return folder


def test_assess_steering_command_reports_and_leaves_the_supervision_folder_as_it_was(
    demo, tmp_path
):
    sup = _supervision_folder(tmp_path / "gen", echo_items(demo.qa_items))
    args = [
        *argv("assess --format jsonl --path {} --supervision {}", demo_path(), sup),
        *argv("--steering --panel {} --json", _bm25_panel(tmp_path)),
    ]
    before = {p.name: p.read_bytes() for p in sup.iterdir()}
    res = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "steering.json")])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout[res.stdout.index("{") :])["steering"][str(sup)]
    assert report["n_generated"] == 34 and [r["name"] for r in report["panel"]] == list(BM25_PANEL)
    assert report["separated_in"]["validation"] >= 1
    saved = json.loads((tmp_path / "steering.json").read_text())["steering"][str(sup)]
    assert saved["n_reference"] == 34
    assert {p.name: p.read_bytes() for p in sup.iterdir()} == before  # an input is only read
    # a reference file instead of the format's own QA; a missing folder is a located error
    ref = tmp_path / "ref.jsonl"
    ref.write_text("\n".join(q.model_dump_json() for q in demo.qa_items[:10]) + "\n")
    res = CliRunner().invoke(app, [*args[:-1], "--reference", str(ref)])
    assert res.exit_code == 0, res.output
    assert "10 reference items" in res.output and "Kendall tau" in res.output
    res = CliRunner().invoke(app, [*args[:6], str(tmp_path / "none"), *args[7:]])
    assert res.exit_code == 2 and "train.jsonl" in res.output


def test_steering_needs_supervision_and_a_reference(tmp_path, demo):
    res = CliRunner().invoke(
        app, ["assess", "--format", "jsonl", "--path", str(demo_path()), "--steering"]
    )
    assert res.exit_code == 2 and "--supervision" in res.output
    history = tmp_path / "h.jsonl"  # records only: no QA to measure against
    history.write_text((demo_path() / "records.jsonl").read_text())
    sup = _supervision_folder(tmp_path / "gen", demo.qa_items)
    res = CliRunner().invoke(
        app,
        argv("assess --format jsonl --path {} --supervision {} --steering", history, sup),
    )
    assert res.exit_code == 2 and "--reference" in res.output


def test_save_steering_without_a_summary_writes_only_the_report(demo, tmp_path):
    panel = load_panel(_bm25_panel(tmp_path))
    rep = assess_steering(demo.history, demo.qa_items[:8], demo.qa_items, panel=panel, resamples=20)
    folder = tmp_path / "f"
    folder.mkdir()
    assert save_steering(folder, rep).name == "steering.json"
    assert sorted(p.name for p in folder.iterdir()) == ["steering.json"]


# -- own words ----------------------------------------------------------------------------


SENTENCE = (
    "I woke up early, feeling excited about taking Oliver for our usual nature walk in Forest Park."
)


def test_a_question_copied_from_its_sentence_echoes_and_one_in_own_words_does_not():
    copied = (
        "When did I wake up early, feeling excited about taking Oliver for our usual nature walk?"
    )
    assert echoes(copied, SENTENCE) == [
        "up early feeling excited about taking oliver for our usual nature walk"
    ]
    assert echoes("When did I take Oliver to Forest Park?", SENTENCE) is None
    # names, numbers and the answer are not echo; four distinctive words are
    assert echoed_words("When did Oliver and I walk in Forest Park?", SENTENCE) == ["walk"]
    assert echoes("When was I excited about our usual nature walk?", SENTENCE) == [
        "excited",
        "usual",
        "nature",
        "walk",
    ]
    # a quoted email subject is words a user would not recall verbatim
    subject = "Subject: Thank You for a Wonderful Birthday Brunch!"
    assert echoes("When was the email 'Thank You for a Wonderful Birthday Brunch!' sent?", subject)
    assert echoes("When did I thank Sofia for the birthday brunch?", subject) is None
    assert copied_run("Who is watching Biscuit?", "Lena is watching Biscuit while we travel") == [
        "is",
        "watching",
        "biscuit",
    ]


def test_no_hand_written_demo_question_echoes_its_evidence(demo):
    """The thresholds' calibration: a user's own questions pass."""
    recs = {r.id: r for r in demo.history}
    copied = [
        q.question
        for q in demo.qa_items
        if echoes(q.question, "\n".join(recs[e].text for e in q.evidence_ids), q.answer)
    ]
    assert copied == []


def _own_words_candidate(*questions: str):
    """The MacBook Air candidate of the anchored pipeline with the own-words check on, its writer
    answering ``questions`` in turn; the DummyLM records every writer request."""
    from supervision_helpers import (
        audit_reply,
        blind_reply,
        option_reply,  # the anchored tests' MacBook Air plan
        question_reply,
        role_lms,
        small_bundle,
    )
    from test_supervision_anchored import FACT

    from memsteer_dspy.bundles import answer_options
    from memsteer_dspy.supervision.program import MemSteerGenerator

    bundle = small_bundle()
    options = answer_options(bundle.records, "Elena", "entity")
    n = next(i for i, o in enumerate(options, 1) if o.answer == "MacBook Air")
    lms = role_lms(
        [option_reply(n)], [question_reply(q) for q in questions], [audit_reply()], [blind_reply()]
    )
    gen = MemSteerGenerator(
        lms, max_retries=0, lean=True, anchored=True, own_words=True, user_name="Elena"
    )
    return gen(bundle=bundle, task=FACT, shuffle_seed=0).outcome, lms["question_writer"]


COPIED = "Which device did I use this morning to send a quick note to Lila from, on March 2?"


def test_a_question_in_its_record_s_words_is_rewritten_with_the_copied_words_named():
    own = "Which laptop did I message Lila from on March 2?"
    out, writer = _own_words_candidate(COPIED, own)
    assert out.status == "accepted", out.detail
    assert out.question == own
    assert any("question:echoes" in r.reason for r in out.repairs if r.field == "question")
    hint = writer.history[-1]["messages"][-1]["content"]
    assert "was rejected (echoes)" in hint and "'quick note to lila from'" in hint


def test_a_question_that_still_copies_after_its_rewrite_is_rejected_as_echoes():
    out, _ = _own_words_candidate(COPIED, COPIED.replace("device", "computer"))
    assert out.status == "rejected" and out.reason == "question:echoes"
    assert out.stage == "question"


def test_own_words_is_in_a_run_s_key_and_off_with_the_checks():
    from memsteer_dspy.supervision.run import GenerationConfig

    assert GenerationConfig().identity()["own_words_version"] >= 1
    assert "own_words_version" not in GenerationConfig(own_words=False).identity()
    assert "own_words_version" not in GenerationConfig(checks=False).identity()


def test_generate_ends_with_the_steering_panel_when_there_is_a_reference(tmp_path, monkeypatch):
    from test_supervision_run import scripted_generate_cli

    hist = scripted_generate_cli(tmp_path, monkeypatch, in_process=False)
    out = tmp_path / "out"
    args = [
        *argv("generate --format jsonl --path {} --out {} --n 3", hist, out),
        *argv("--max-candidates 4 --profile full --panel {}", _bm25_panel(tmp_path)),
    ]
    first = CliRunner().invoke(app, args)  # no reference: no steering
    assert first.exit_code == 0, first.output
    assert not (out / "steering.json").exists()
    # the run's own items as the reference (resumed: nothing generated again)
    ref = tmp_path / "reference.jsonl"
    ref.write_bytes((out / "train.jsonl").read_bytes())
    res = CliRunner().invoke(app, [*args, "--reference", str(ref)])
    assert res.exit_code == 0, res.output
    report = json.loads((out / "steering.json").read_text())
    assert [r["name"] for r in report["panel"]] == list(BM25_PANEL)
    assert (
        json.loads((out / "summary.json").read_text())["steering"]["metric"] == "delivered_recall"
    )
    assert "lexical easiness" in res.output and "steering.json" in res.output
    import sqlite3  # one MLflow run holds the panel's metrics

    with sqlite3.connect(out / "mlflow.db") as db:
        names = {n for (n,) in db.execute("select key from latest_metrics")}
    assert (
        "steering.delivered_recall.kendall_tau" in names or "steering.base_r10_generated" in names
    )


def test_the_accepted_mix_is_reported_beside_the_reference_s(demo):
    from memsteer_dspy.supervision.steering import question_mix

    items = demo.qa_items
    mix = question_mix(items)
    assert sum(mix["question_type"].values()) == pytest.approx(1.0, abs=1e-3)  # rounded shares
    multi = sum(len(set(q.evidence_ids)) >= 2 for q in items) / len(items)
    assert mix["evidence"]["2+"] == pytest.approx(multi, abs=1e-4) and 0 < multi < 1
