"""experiments/search_compare.py: each search a resumable optimize run, scored on held-out items,
with its progress on stderr."""

from __future__ import annotations

import json

import pytest
from script_helpers import argv, load_script, rhelm_args


def test_random_search_reports_held_out_rows_progress_and_resumes(rhelm_root, tmp_path, capsys):
    """One persona, random search (no LM): the row's test split is exactly the persona's official
    held-out items, every iteration prints a progress line as it finishes, a rerun recomputes
    nothing, and a rerun with more iterations resumes the same run folder."""
    pytest.importorskip("optuna")
    from memsteer_dspy.loaders.rhelm import load_rhelm
    from memsteer_dspy.optimize.splits import official_test

    sc = load_script("experiments/search_compare.py")
    out = tmp_path / "sc"
    args = [
        *argv("--searches random --persona Elena_Morales"),
        *rhelm_args(rhelm_root, tmp_path),
        *argv("--out {}", out),
    ]
    assert sc.main([*args, "--iterations", "2"]) == 0
    err = capsys.readouterr().err
    for line in (
        "[Elena_Morales/random] iter   0/2  baseline",
        "[Elena_Morales/random] iter   1/2",
        "[Elena_Morales/random] iter   2/2",
    ):
        assert line in err, err
    assert " R@10 " in err  # the recall objective's guard metric is shown beside delivered recall

    (row,) = json.loads((out / "results.json").read_text())
    held_out = official_test(
        load_rhelm(rhelm_root, "Elena_Morales", external=True).qa_items, seed=0
    )
    assert row["setting"] == "Elena_Morales" and row["iterations"] == 2
    assert row["n_test"] == len(held_out) and row["test"]["verdict"] in {
        "better",
        "worse",
        "inconclusive",
    }
    assert row["lm_calls"] == 0 and row["designs_evaluated"] >= 3
    summary = json.loads((out / "Elena_Morales" / "random" / "summary.json").read_text())
    assert summary["test"]["n"] == len(held_out)
    assert "| Elena_Morales | random |" in (out / "results.md").read_text()

    # the same command again: the row is done, no iteration runs
    assert sc.main([*args, "--iterations", "2"]) == 0
    assert "iter " not in capsys.readouterr().err

    # more iterations: the folder resumes from iteration 2 (0-2 are not run again)
    assert sc.main([*args, "--iterations", "3"]) == 0
    err = capsys.readouterr().err
    assert "iter   3/3" in err and "iter   1/3" not in err, err
    (row,) = json.loads((out / "results.json").read_text())
    assert row["iterations"] == 3


def test_a_shared_row_breaks_its_held_out_comparison_down_by_persona(rhelm_root, tmp_path):
    """One design shared by two personas: the row carries each persona's own held-out comparison,
    computed from that persona's per-item results (its n is the persona's official test split;
    the item-weighted differences add up to the pooled one), and results.md tabulates it."""
    pytest.importorskip("optuna")
    from memsteer_dspy.loaders.rhelm import load_rhelm
    from memsteer_dspy.optimize.splits import official_test

    sc = load_script("experiments/search_compare.py")
    out = tmp_path / "sc"
    personas = ["Elena_Morales", "Jonas_Richter"]
    args = [
        *argv("--searches random --shared-only --iterations 3"),
        *rhelm_args(rhelm_root, tmp_path),
        *argv("--out {}", out),
    ]
    for p in personas:
        args += ["--persona", p]
    assert sc.main(args) == 0
    (row,) = json.loads((out / "results.json").read_text())
    assert row["setting"] == "shared-2" and set(row["by_persona"]) == set(personas)
    sizes = {
        p: len(official_test(load_rhelm(rhelm_root, p, external=True).qa_items, seed=0))
        for p in personas
    }
    assert {p: c["n"] for p, c in row["by_persona"].items()} == sizes
    assert sum(sizes.values()) == row["n_test"]
    # a row written before the breakdown existed gets it on the next run
    del row["by_persona"]
    (out / "results.json").write_text(json.dumps([row]))
    assert sc.main(args) == 0
    (row,) = json.loads((out / "results.json").read_text())
    for c in row["by_persona"].values():
        assert set(c["diff"]) >= {"recall_at_10", "delivered_recall"}
        assert c["verdict"] in {"better", "worse", "inconclusive"}
    # the personas' item-weighted differences add up to the pooled one
    for m in ("recall_at_10", "delivered_recall"):
        parts = row["by_persona"].values()
        pooled = sum(c["diff"][m] * c["n_pairs"][m] for c in parts) / sum(
            c["n_pairs"][m] for c in parts
        )
        assert pooled == pytest.approx(row["test"]["diff"][m])
    assert (
        row["best_design_key"] != row["test"].get("initial_key", "")
        and row["test"]["diff"]["delivered_recall"] != 0
    )
    md = (out / "results.md").read_text()
    assert "shared design on each persona's held-out items" in md and "| Jonas_Richter |" in md


def test_one_failed_run_is_recorded_and_the_others_go_on(rhelm_root, tmp_path, capsys, monkeypatch):
    """A run that raises (here the first persona's) is listed with its error in results.md and
    errors.log, the next persona still runs and gets its row, and the script exits 1; a rerun
    once the cause is gone fills the missing row without redoing the finished one."""
    pytest.importorskip("optuna")
    sc = load_script("experiments/search_compare.py")
    real = sc.run_one

    def flaky(setting, *a, **k):
        if setting == "Elena_Morales":
            raise OSError("disk full while writing the index")
        return real(setting, *a, **k)

    monkeypatch.setattr(sc, "run_one", flaky)
    out = tmp_path / "sc"
    args = [
        *argv("--searches random --per-persona-only --iterations 1"),
        *argv("--persona Elena_Morales --persona Jonas_Richter"),
        *rhelm_args(rhelm_root, tmp_path),
        *argv("--out {}", out),
    ]
    assert sc.main(args) == 1
    assert "failed: OSError: disk full" in capsys.readouterr().err
    assert [r["setting"] for r in json.loads((out / "results.json").read_text())] == [
        "Jonas_Richter"
    ]
    assert "- Elena_Morales / random: OSError: disk full" in (out / "results.md").read_text()
    assert "Traceback" in (out / "errors.log").read_text()

    calls: list[str] = []
    monkeypatch.setattr(
        sc, "run_one", lambda setting, *a, **k: calls.append(setting) or real(setting, *a, **k)
    )
    assert sc.main(args) == 0 and calls == ["Elena_Morales"]
    rows = json.loads((out / "results.json").read_text())
    assert sorted(r["setting"] for r in rows) == ["Elena_Morales", "Jonas_Richter"]
    assert "Failed" not in (out / "results.md").read_text()
