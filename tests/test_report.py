"""``memsteer report``: the numbers, figures and page made from a scripted optimize run's folder, the
held-out verdict when ``summary.json`` has one, the report logged to the MLflow parent run, and bad
run folders named in the error."""

from __future__ import annotations

import base64
import json
import re
import shutil

import pytest
from tracked_run import scripted_optimize_run
from typer.testing import CliRunner

from memsteer_dspy.cli import app
from memsteer_dspy.errors import InputError
from memsteer_dspy.report import load_run, write_report

pytest.importorskip("matplotlib", reason="memsteer report needs the 'report' extra (matplotlib)")

TEST = {  # the shape of the held-out verdict MemSteer-Opt writes to summary.json
    "n": 35,
    "source": "official held-out",
    "primary": "accuracy",
    "initial": {"accuracy": 0.40, "recall_at_10": 0.43},
    "best": {"accuracy": 0.57, "recall_at_10": 0.41},
    "diff": {"accuracy": 0.17, "recall_at_10": -0.02},
    "ci95": {"accuracy": [0.03, 0.31], "recall_at_10": [-0.09, 0.05]},
    "verdict": "better",
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "opt"
    res = scripted_optimize_run(out)
    assert res.accepted_path == [0, 2, 4], [e.status for e in res.entries]
    return out


def _copy(run_dir, tmp_path):
    dst = tmp_path / "opt"
    shutil.copytree(
        run_dir, dst, ignore=shutil.ignore_patterns("mlflow.db", "mlartifacts", "report")
    )
    return dst


def _png_colours(path) -> set[tuple[int, int, int]]:
    import matplotlib.image as mpimg

    img = mpimg.imread(path)
    rgb = (img[..., :3] * 255).round().astype(int).reshape(-1, 3)
    return {tuple(int(c) for c in px) for px in rgb}


def test_report_numbers_page_and_figures(run_dir, tmp_path):
    rep = write_report(run_dir, tmp_path / "rep")
    data = json.loads((tmp_path / "rep/report.json").read_text())
    rows = data["iterations"]
    assert [r["status"] for r in rows] == [
        "baseline",
        "rejected",
        "accepted",
        "invalid",
        "accepted",
    ]
    assert data["metric"] == "accuracy"
    # the accepted path climbs; the tie stays at the baseline's score; the invalid one has none
    assert rows[0]["score"] < rows[2]["score"] < rows[4]["score"] == 1.0
    assert rows[1]["score"] == rows[0]["score"] and rows[3]["score"] is None
    assert [r["best"] for r in rows] == [rows[0]["score"]] * 2 + [rows[2]["score"]] * 2 + [1.0]
    assert sorted(rows[2]["changes"]) == ["retrieve.pool: 1 -> 2", "retrieve.top_k: 1 -> 2"]
    # diagnoses: d0 and each accepted design, failures shrinking as more is delivered
    assert [d["iteration"] for d in data["diagnosis"]] == [0, 2, 4]
    totals = [sum(d[s] for s in ("storage", "retrieval", "answering")) for d in data["diagnosis"]]
    assert totals[0] > totals[-1] and totals[-1] == 0
    # cost: 5 proposer requests (the invalid proposal was sent back once), answers and judgments
    assert data["cost_by_role"]["proposer"]["calls"] == 5
    assert data["cost_by_role"]["proposer"]["total_tokens"] == 75
    assert data["cost_by_role"]["answerer"]["calls"] > 0

    assert set(rep.figures) == {"score", "diagnosis", "cost"}  # no held-out verdict in this run
    page = rep.html.read_text()
    assert "No held-out verdict" in page and "retrieve.top_k: 1 -&gt; 2" in page
    assert "deliver four units" in page and "(initial design)" in page
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 3  # self-contained: every figure inside the page
    assert all(base64.b64decode(i).startswith(b"\x89PNG") for i in images)
    # the accepted path is drawn (its green), and the tie/rejected grey and the invalid red marks
    colours = _png_colours(rep.figures["score"])
    for colour in ((0x2C, 0xA0, 0x2C), (0x7F, 0x7F, 0x7F), (0xD6, 0x27, 0x28)):
        assert any(sum(abs(a - b) for a, b in zip(c, colour, strict=True)) < 12 for c in colours), (
            colour
        )


def test_heldout_verdict_from_summary_json(run_dir, tmp_path):
    dst = _copy(run_dir, tmp_path)
    (dst / "summary.json").write_text(json.dumps({"test": TEST}))
    rep = write_report(dst)
    assert rep.folder == dst / "report" and "heldout" in rep.figures
    page = rep.html.read_text()
    assert "<span class='better'>better</span>" in page and "official held-out" in page
    assert "[+0.030, +0.310]" in page and "[-0.090, +0.050]" in page
    assert "No held-out verdict" not in page
    # the interval that excludes 0 is drawn green, the one across 0 grey
    colours = _png_colours(rep.figures["heldout"])
    assert any(
        sum(abs(a - b) for a, b in zip(c, (0x2C, 0xA0, 0x2C), strict=True)) < 12 for c in colours
    )
    # a later run without the verdict removes the stale figure
    (dst / "summary.json").write_text(json.dumps({"other": 1}))
    rep2 = write_report(dst)
    assert "heldout" not in rep2.figures and not (dst / "report/heldout.png").exists()


def test_report_is_logged_to_the_mlflow_parent_run(run_dir, tmp_path):
    from mlflow import MlflowClient

    r = CliRunner().invoke(app, ["report", str(run_dir), "--out", str(tmp_path / "rep")])
    assert r.exit_code == 0, r.output
    assert "added to MLflow parent run" in r.output
    assert "runs?workflowType=machine_learning&viewStateShareKey=memsteer" in r.output
    run = load_run(run_dir).run
    client = MlflowClient(tracking_uri=run["tracking_uri"])
    arts = {a.path for a in client.list_artifacts(run["parent_run_id"], "report")}
    assert {
        "report/report.html",
        "report/score.png",
        "report/diagnosis.png",
        "report/cost.png",
        "report/report.json",
    } <= arts


def test_cli_json_and_bad_run_folders(run_dir, tmp_path):
    r = CliRunner().invoke(
        app, ["report", str(run_dir), "--out", str(tmp_path / "r"), "--no-tracking", "--json"]
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["mlflow_parent_run_id"] is None and out["html"].endswith("report.html")
    assert [x["iteration"] for x in out["iterations"]] == [0, 1, 2, 3, 4]

    r = CliRunner().invoke(app, ["report", str(tmp_path / "nowhere")])
    assert r.exit_code == 2 and "nowhere" in r.output and "no such folder" in r.output
    empty = tmp_path / "empty"
    empty.mkdir()
    r = CliRunner().invoke(app, ["report", str(empty)])
    assert r.exit_code == 2 and "no trajectory.jsonl" in r.output

    dst = _copy(run_dir, tmp_path)
    lines = (dst / "trajectory.jsonl").read_text().splitlines()
    (dst / "trajectory.jsonl").write_text(
        "\n".join([lines[0], '{"iteration": 1, "status": "rej', *lines[2:]])
    )
    with pytest.raises(InputError) as err:
        load_run(dst)
    assert err.value.line == 2 and err.value.file.endswith("trajectory.jsonl")
    (dst / "trajectory.jsonl").write_text(lines[0] + "\n" + json.dumps({"score": {}}) + "\n")
    with pytest.raises(InputError, match="'iteration' and 'status'"):
        load_run(dst)
