"""``memsteer optimize`` and ``memsteer tune-prompts`` through typer's CliRunner (scripted LMs)."""

from __future__ import annotations

import json

import pytest
from memory_fixtures import small_history, small_qa
from optimize_fixtures import ProposerLM, changed, proposal
from script_helpers import argv
from test_optimize_loop import NARROW
from typer.testing import CliRunner

from memsteer_dspy.cli import app


@pytest.fixture
def history_dir(tmp_path):
    folder = tmp_path / "hist"
    folder.mkdir()
    (folder / "records.jsonl").write_text(
        "".join(r.model_dump_json() + "\n" for r in small_history().records)
    )
    sup = tmp_path / "sup"
    sup.mkdir()
    qa = small_qa()
    (sup / "train.jsonl").write_text("".join(q.to_json() + "\n" for q in qa))
    # validation: the first three questions again under their own ids (train and val share no id)
    val = [q.model_copy(update={"id": f"{q.id}-val"}) for q in qa[:3]]
    (sup / "val.jsonl").write_text("".join(q.to_json() + "\n" for q in val))
    design = tmp_path / "narrow.json"
    NARROW.save(design)
    return folder, sup, design


@pytest.fixture
def scripted_config(monkeypatch):
    """Make --lm/--config resolve to an LMConfig whose proposer is scripted."""
    import memsteer_dspy.lm as lm_pkg
    from memsteer_dspy.lm import LMConfig

    holder = {}

    def load(config=None, lm=None, role_lms=None):
        cfg = LMConfig.uniform("openai/gpt-4o-mini")
        cfg.set_lm("proposer", holder["proposer"])
        return cfg

    monkeypatch.setattr(lm_pkg, "load_lm_config", load)
    return holder


def test_optimize_command_runs_and_resumes(history_dir, scripted_config, tmp_path):
    folder, sup, design = history_dir
    out = tmp_path / "run"
    scripted_config["proposer"] = ProposerLM(
        [proposal(changed(NARROW, retrieve__top_k=3, retrieve__pool=3))]
    )
    args = [
        *argv("optimize --format jsonl --path {} --supervision {} --out {}", folder, sup, out),
        *argv("--objective recall --init-design {} --no-tracking --no-cache", design),
    ]
    res = CliRunner().invoke(app, [*args, "--iterations", "1"])
    assert res.exit_code == 0, res.output
    assert "iter   1/1  accepted" in res.output and "best design" in res.output
    assert (out / "best_design.json").exists() and (out / "summary.md").exists()
    # resume with more iterations: one more proposal, shown as JSON
    scripted_config["proposer"] = ProposerLM(
        [proposal(changed(NARROW, retrieve__top_k=2, retrieve__pool=2))]
    )
    res = CliRunner().invoke(app, [*args, "--iterations", "2", "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout[res.stdout.index("{") :])
    assert report["iterations"] == 2 and report["accepted_path"] == [0, 1]
    assert report["best"]["delivered_recall"] > report["baseline"]["delivered_recall"]
    assert len((out / "trajectory.jsonl").read_text().splitlines()) == 3


def test_optimize_command_reports_bad_input(history_dir, scripted_config, tmp_path):
    folder, _, _ = history_dir
    scripted_config["proposer"] = ProposerLM([])

    def optimize(supervision, *more):
        line = "optimize --format jsonl --path {} --supervision {} --out {}"
        return CliRunner().invoke(app, [*argv(line, folder, supervision, tmp_path / "o"), *more])

    res = optimize(tmp_path / "nowhere", "--no-tracking")
    assert res.exit_code == 2 and "train.jsonl" in res.output
    res = optimize("official", "--no-tracking")
    assert res.exit_code == 2 and "no official QA items" in res.output
    res = optimize("official", "--objective", "speed")
    assert res.exit_code != 0 and "--objective" in res.output


def test_tune_prompts_rejects_unknown_optimizer(history_dir, scripted_config, tmp_path):
    folder, sup, _ = history_dir
    scripted_config["proposer"] = ProposerLM([])
    res = CliRunner().invoke(
        app,
        [
            *argv("tune-prompts --format jsonl --path {}", folder),
            *argv("--supervision {} --out {} --optimizer sgd", sup, tmp_path / "t"),
        ],
    )
    assert res.exit_code != 0 and "--optimizer" in res.output


def test_optimize_reports_the_held_out_verdict_and_runs_the_baselines(
    history_dir, scripted_config, tmp_path
):
    pytest.importorskip("optuna")
    folder, sup, design = history_dir
    held = tmp_path / "held.jsonl"
    held.write_text(
        "".join(q.model_copy(update={"id": "t-" + q.id}).to_json() + "\n" for q in small_qa())
    )
    scripted_config["proposer"] = ProposerLM([])
    args = [
        *argv("optimize --format jsonl --path {} --supervision {}", folder, sup),
        *argv("--objective recall --init-design {}", design),
        *argv("--no-tracking --no-cache --iterations 2"),
    ]
    res = CliRunner().invoke(
        app,
        [
            *args,
            *argv("--out {} --search tpe --test {} --accept paired --json", tmp_path / "tpe", held),
        ],
    )
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout[res.stdout.index("{") :])
    assert report["search"] == "tpe" and report["accept"] == "paired" and report["iterations"] == 2
    test = report["test"]
    assert (
        test["n"] == 4
        and test["source"].endswith("held.jsonl")
        and test["verdict"] in ("better", "worse", "inconclusive")
    )
    assert set(test["ci95"]) == {"recall_at_10", "delivered_recall"}
    saved = json.loads((tmp_path / "tpe" / "summary.json").read_text())
    assert saved["test"] == test and len(saved["candidates"]) == 3
    # without --test, a generated folder holds out a share of its items by bundle (recorded in run.json)
    res = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "rnd"), "--search", "random"])
    assert res.exit_code == 0, res.output
    assert "held-out test (" in res.output and "->" in res.output
    run = json.loads((tmp_path / "rnd" / "run.json").read_text())
    assert run["n_test"] >= 1 and "by bundle" in run["test_source"]
    res = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "x"), "--search", "annealing"])
    assert res.exit_code != 0 and "--search" in res.output


def test_evaluate_compare_two_designs(history_dir, tmp_path):
    folder, _, design = history_dir
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(q.to_json() + "\n" for q in small_qa()))
    args = argv("evaluate --format jsonl --path {} --qa {} --metrics recall --no-cache", folder, qa)
    res = CliRunner().invoke(
        app,
        [*args, "--compare", str(design), "base-bm25", "--json", "--out", str(tmp_path / "cmp")],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout[res.stdout.index("{") :])
    assert (
        out["n"] == 4 and out["primary"] == "delivered_recall" and out["b"]["spec"] == "base-bm25"
    )
    assert (
        out["best"]["recall_at_10"] >= out["initial"]["recall_at_10"]
    )  # top-20 retrieves what top-1 does
    assert out["diff"]["delivered_recall"] == pytest.approx(
        out["best"]["delivered_recall"] - out["initial"]["delivered_recall"]
    )
    assert (tmp_path / "cmp" / "A" / "items.jsonl").exists() and (
        tmp_path / "cmp" / "comparison.json"
    ).exists()
    res = CliRunner().invoke(app, [*args, "--compare", "base-bm25", "base-bm25"])
    assert res.exit_code == 0 and "inconclusive" in res.output and "B - A" in res.output


def test_optimize_guard_and_val_from_reach_the_run(history_dir, scripted_config, tmp_path):
    pytest.importorskip("optuna")
    folder, sup, design = history_dir
    scripted_config["proposer"] = ProposerLM([])
    args = [
        *argv("optimize --format jsonl --path {} --supervision {}", folder, sup),
        *argv("--objective recall --init-design {}", design),
        *argv("--no-tracking --no-cache --iterations 1 --search random"),
    ]
    res = CliRunner().invoke(
        app,
        [
            *args,
            *argv("--out {} --guard recall_at_10", tmp_path / "g"),
            *argv("--guard recall_at_5 --val-from train+val"),
        ],
    )
    assert res.exit_code == 0, res.output
    run = json.loads((tmp_path / "g" / "run.json").read_text())
    assert run["guard"] == ["recall_at_10", "recall_at_5"] and run["val_from"] == "train+val"
    assert run["n_val"] > 0 and run["n_val"] >= run["n_train"]  # the training items select too
    bad = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "b"), "--guard", "recall_at_7"])
    assert bad.exit_code != 0 and "--guard" in bad.output
    acc = CliRunner().invoke(
        app,
        [*args[:-2], *argv("--out {} --objective accuracy --val-from train+val", tmp_path / "a")],
    )
    assert acc.exit_code != 0 and "objective recall" in acc.output


def test_compare_out_is_a_run_folder_that_refuses_a_user_folder_and_restarts(history_dir, tmp_path):
    """#46: --compare wrote comparison.json into whatever --out named; now --out is a run folder:
    a user's folder is refused with nothing written, a rerun resumes, --restart empties only it."""
    folder, _, _ = history_dir
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(q.to_json() + "\n" for q in small_qa()))
    args = f"evaluate --format jsonl --metrics recall --no-cache --path {folder} --qa {qa}".split()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "comparison.json").write_text("my notes\n")
    res = CliRunner().invoke(
        app, [*args, "--compare", "base-bm25", "base-bm25", "--out", str(mine)]
    )
    assert res.exit_code == 2 and "not a memsteer run folder" in res.output, res.output
    assert [p.name for p in mine.iterdir()] == ["comparison.json"]
    assert (mine / "comparison.json").read_text() == "my notes\n"
    cmp_dir = tmp_path / "cmp"
    for extra in ([], [], ["--restart"]):
        res = CliRunner().invoke(
            app, [*args, "--compare", "base-bm25", "base-bm25", "--out", str(cmp_dir), *extra]
        )
        assert res.exit_code == 0, res.output
    assert json.loads((cmp_dir / "run.json").read_text())["key"]["stage"] == "compare"
    assert (cmp_dir / "comparison.json").exists() and (cmp_dir / "B" / "items.jsonl").exists()
