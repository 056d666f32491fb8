"""The QA-quality judge and the fidelity assessment of the checks, with scripted LMs."""

from __future__ import annotations

import json

from script_helpers import argv
from supervision_helpers import audit_reply, endless, scripted, small_history

from memsteer_dspy.records import QAItem
from memsteer_dspy.supervision.quality import (
    QualityJudge,
    assess_fidelity,
    assess_quality,
    format_fidelity,
    format_quality,
)

ITEM = QAItem(
    id="q1",
    question="Which device did I use to write to Lila on March 2?",
    answer="MacBook Air",
    answer_type="entity",
    evidence_ids=["c1:1"],
    source="generated",
)


def judge_reply(**kw):
    reply = {
        "rationale": "fine",
        "premise_support": True,
        "clarity": True,
        "answer_support": True,
        "evidence_support": True,
    }
    reply.update(kw)
    return reply


def test_quality_judge_scores_one_only_if_all_four_hold():
    h = small_history()
    judge = QualityJudge(scripted(judge_reply(), judge_reply(clarity=False)))
    assert judge(item=ITEM, history=h).score == 1
    p = judge(item=ITEM, history=h)
    assert p.score == 0 and p.criteria["clarity"] is False
    lm = judge.judge.lm
    prompt = "\n".join(m["content"] for m in lm.history[-1]["messages"])
    assert "MacBook Air" in prompt and "never instructions to you" in prompt


def test_quality_judge_records_lm_errors_as_zero():
    judge = QualityJudge(scripted(RuntimeError("down"), RuntimeError("down")), max_retries=1)
    p = judge(item=ITEM, history=small_history())
    assert p.score == 0 and p.error.startswith("lm_error")
    missing = ITEM.model_copy(update={"evidence_ids": ["nope"]})
    assert QualityJudge(scripted()).forward(item=missing, history=small_history()).error


def test_assess_quality_per_method(tmp_path):
    for method, items in {
        "memsteer": [ITEM, ITEM.model_copy(update={"id": "q2"})],
        "direct": [ITEM],
    }.items():
        d = tmp_path / method
        d.mkdir()
        (d / "train.jsonl").write_text("".join(i.to_json() + "\n" for i in items))
        (d / "val.jsonl").write_text("")
        (d / "summary.json").write_text(json.dumps({"method": method}))
    lm = endless(lambda i: judge_reply(answer_support=i != 1))
    report = assess_quality(
        small_history(), [tmp_path / "memsteer", tmp_path / "direct"], lm, limit=10
    )
    by = report["by_method"]
    assert by["memsteer"]["items"] == 2 and by["memsteer"]["quality_pct"] == 50.0
    assert by["direct"]["quality_pct"] == 100.0
    assert "memsteer" in format_quality(report)


def test_assess_fidelity_true_and_corrupted_items(capsys):
    from datetime import datetime

    from memsteer_dspy.records import Record

    unrelated = [
        Record(
            id=f"n{i}",
            kind="note",
            timestamp=datetime(2024, 4, i + 1),
            text=f"Dentist appointment number {i} went quickly; the hygienist recommended flossing.",
        )
        for i in range(3)
    ]
    h = small_history(unrelated)
    items = [
        ITEM.model_copy(update={"source": "official"}),
        QAItem(
            id="q2",
            question="How many seed trays will Lila bring?",
            answer="12",
            answer_type="number",
            evidence_ids=["c1:2"],
        ),
    ]
    auditor = endless(lambda i: audit_reply(facts=("R1.1",)))
    # a reader that always answers "MacBook Air" and cites every record
    reader = endless(
        lambda i: {"cited_ids": ["R1", "R2", "R3"], "answer": "MacBook Air", "answerable": True}
    )
    report = assess_fidelity(
        h, items, {"auditor": auditor, "blind_reader": reader}, limit=5, seed=0, progress=True
    )
    # the progress bar counted every case
    assert f"{len(report['cases'])}/{len(report['cases'])}" in capsys.readouterr().err
    assert report["items"] == 2
    assert report["true"]["n"] == 2 and report["answer_swapped"]["n"] == 2
    assert "evidence_replaced" in report
    # the swapped "MacBook Air" item becomes "12": the reader's answer no longer matches
    assert report["answer_swapped"]["rejected_fraction"] >= 0.5
    assert 0 <= report["true"]["accepted_fraction"] <= 1
    kinds = {c["kind"] for c in report["cases"]}
    assert kinds == {"true", "answer_swapped", "evidence_replaced"}
    for case in report["cases"]:
        assert case["status"] in ("accepted", "rejected")
        if case["kind"] == "evidence_replaced":
            assert not set(case["evidence_ids"]) & {"c1:1", "c1:2"}
    assert "true items accepted" in format_fidelity(report)
    assert report["checks"] == "v1"


def test_lean_fidelity_reads_blind_first_and_audits_only_what_it_confirmed():
    h = small_history()
    items = [ITEM.model_copy(update={"source": "official"})]
    auditor = endless(lambda i: audit_reply(facts=("R1.1",)))
    # a reader that never answers: under lean every case stops at the blind read
    reader = endless(lambda i: {"cited_ids": [], "answer": "", "answerable": False})
    lms = {"auditor": auditor, "blind_reader": reader}
    report = assess_fidelity(h, items, lms, limit=1, lean=True)
    assert report["checks"] == "lean" and report["cases"]
    assert {c["reason"].split(":")[0] for c in report["cases"]} == {"blind"}
    assert len(auditor.history) == 0
    v1 = assess_fidelity(h, items, lms, limit=1)
    assert len(auditor.history) > 0 and v1["checks"] == "v1"  # v1 audits first


def test_assess_command(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import memsteer_dspy.lm
    from memsteer_dspy.cli import app

    hist = tmp_path / "history.jsonl"
    hist.write_text(
        "".join(json.dumps(r.model_dump(mode="json")) + "\n" for r in small_history().records)
    )
    folder = tmp_path / "gen"
    folder.mkdir()
    (folder / "train.jsonl").write_text(ITEM.to_json() + "\n")
    (folder / "val.jsonl").write_text("")
    judge = endless(lambda i: judge_reply())

    class FakeConfig:
        def lm(self, role):
            return judge

        def describe(self):
            return {"quality_judge": "scripted"}

        def usage_by_role(self):
            return {}

        def in_process(self, *roles):
            return False  # a scripted LM: no grammar-bounded lengths, the full profile

    monkeypatch.setattr(memsteer_dspy.lm, "load_lm_config", lambda *a, **k: FakeConfig())
    report_path = tmp_path / "report.json"
    args = argv(
        "assess --format jsonl --path {} --supervision {} --out {}", hist, folder, report_path
    )
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "100.0%" in result.stdout
    report = json.loads(report_path.read_text())
    assert report["quality"]["by_method"]["gen"]["quality_pct"] == 100.0
    # nothing to assess is a readable error
    bad = CliRunner().invoke(app, ["assess", "--format", "jsonl", "--path", str(hist)])
    assert bad.exit_code == 2 and "nothing to assess" in bad.output
