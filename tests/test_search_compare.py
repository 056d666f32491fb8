"""experiments/search_compare.py: each search a resumable optimize run, scored on held-out items,
with its progress on stderr."""

from __future__ import annotations

import json

import pytest
from script_helpers import load_script


def test_random_search_reports_held_out_rows_progress_and_resumes(rhelm_root, tmp_path, capsys):
    """One persona, random search (no LM): the row's test split is exactly the persona's official
    held-out items, every iteration prints a progress line as it finishes, a rerun recomputes
    nothing, and a rerun with more iterations resumes the same run folder."""
    pytest.importorskip("optuna")
    from memsteer_dspy.loaders.rhelm import load_rhelm
    from memsteer_dspy.optimize.splits import official_test

    sc = load_script("experiments/search_compare.py")
    out = tmp_path / "sc"
    args = ["--searches", "random", "--persona", "Elena_Morales", "--rhelm-root", str(rhelm_root),
            "--cache-dir", str(tmp_path / "cache"), "--out", str(out)]  # fmt: skip
    assert sc.main([*args, "--iterations", "2"]) == 0
    err = capsys.readouterr().err
    for line in ("[Elena_Morales/random] iter   0/2  baseline", "[Elena_Morales/random] iter   1/2",
                 "[Elena_Morales/random] iter   2/2"):  # fmt: skip
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
