"""``memsteer batch`` on the local executor with the scripted LM over three small users: the same
per-user folders as the single-user commands, resume and skip, per-user bad input, failures,
summaries pooled over users, one MLflow experiment, the LM concurrency gate and the cross-user
scorer. The Ray executor is tested in test_batch_ray.py."""

from __future__ import annotations

import json
import threading

import pytest
from batch_fixtures import USERS, item_keys, jsonl_rows, scripted_lm_config, write_users
from script_helpers import argv
from typer.testing import CliRunner

from memsteer_dspy.batch import (
    CrossUserScorer,
    LMGate,
    LocalExecutor,
    LocalSlots,
    UserSource,
    attempts,
    build_tasks,
    resolve_users,
    run_batch,
)
from memsteer_dspy.cli import app
from memsteer_dspy.errors import InputError
from memsteer_dspy.evaluation import evaluate_design, read_qa_jsonl, summarize_items
from memsteer_dspy.loaders import load_history
from memsteer_dspy.memory import MemoryDesign, MemorySystem

# The full profile: the small one steers tasks toward number and date answers, which the scripted
# world of batch_fixtures (the demo test's) does not write questions for.
GEN = ["--n", "3", "--max-candidates", "4", "--profile", "full", "--seed", "1"]


@pytest.fixture
def scripted(monkeypatch):
    import memsteer_dspy.lm as lm_pkg

    monkeypatch.setattr(lm_pkg, "load_lm_config", scripted_lm_config)


@pytest.fixture
def users_root(tmp_path):
    return write_users(tmp_path / "users")


def invoke(args):
    res = CliRunner().invoke(app, args)
    return res


def batch(command, root, out, *extra, users="all"):
    return invoke(
        [
            *argv("batch {} --users {} --format jsonl", command, users),
            *argv("--path {} --out {} --workers 3", root, out),
            *extra,
        ]
    )


# ---------------------------------------------------------------------------------------------
# users
# ---------------------------------------------------------------------------------------------


def test_users_from_all_a_file_or_a_list(users_root, tmp_path):
    assert resolve_users("all", "jsonl", users_root) == list(USERS)
    listing = tmp_path / "users.txt"
    listing.write_text("cleo\n# not this one\n\nana  # comment\ncleo\n")
    assert resolve_users(str(listing), "jsonl", users_root) == ["cleo", "ana"]
    assert resolve_users("ben, ana", "jsonl", users_root) == ["ben", "ana"]
    with pytest.raises(InputError, match="cannot name a folder"):
        resolve_users("ana,../x", "jsonl", users_root)
    with pytest.raises(InputError, match="one user's history"):
        resolve_users("all", "jsonl", users_root / "ana")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no user histories"):
        resolve_users("all", "jsonl", tmp_path / "empty")
    with pytest.raises(InputError, match="not supported"):
        resolve_users("all", "hf", users_root)


# ---------------------------------------------------------------------------------------------
# generate: same folders as the single-user command; resume; skip
# ---------------------------------------------------------------------------------------------


def test_batch_generate_writes_what_the_single_user_command_writes(scripted, users_root, tmp_path):
    out = tmp_path / "gen"
    res = batch("generate", users_root, out, *GEN)
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "batch_summary.json").read_text())
    assert set(summary["users"]) == set(USERS) and summary["statuses"] == {"ok": 3}
    # the single-user command for one user writes the same items
    single = tmp_path / "single-ben"
    ben = argv("generate --format jsonl --path {} --user ben --out {}", users_root / "ben", single)
    res = invoke([*ben, *GEN])
    assert res.exit_code == 0, res.output
    assert item_keys(out / "ben") == item_keys(single)
    assert item_keys(out / "ben")["train.jsonl"]
    # the table and the pooled figures come from the users' own summaries
    per_user = {u: json.loads((out / u / "summary.json").read_text()) for u in USERS}
    assert summary["pooled"]["candidates"] == sum(s["candidates"] for s in per_user.values())
    assert summary["pooled"]["accepted"] == sum(s["accepted"] for s in per_user.values())
    assert summary["users"]["ana"]["kept_fraction"] == per_user["ana"]["kept_fraction"]
    table = (out / "batch_summary.md").read_text()
    assert "| ana | ok |" in table and "**pooled**" in table and "kept %" in table


def test_rerun_skips_finished_users_and_reruns_changed_settings(scripted, users_root, tmp_path):
    out = tmp_path / "gen"
    assert batch("generate", users_root, out, *GEN).exit_code == 0
    first = {
        u: attempts(t)
        for u, t in zip(
            USERS,
            build_tasks("generate", USERS, out, format="jsonl", path=users_root, extra=GEN),
            strict=True,
        )
    }
    assert all(len(a) == 1 for a in first.values())
    res = batch("generate", users_root, out, *GEN, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout[res.stdout.index("{") :])["statuses"] == {"skipped": 3}
    # another n is other settings: each user's command runs again and resumes its own folder
    more = [*GEN[:1], "4", *GEN[2:]]
    res = batch("generate", users_root, out, *more, "--json")
    assert res.exit_code == 0, res.output
    tasks = build_tasks("generate", USERS, out, format="jsonl", path=users_root, extra=more)
    assert all(len(attempts(t)) == 2 for t in tasks)
    for u in USERS:  # resumed, never duplicated
        ids = [k[0] for rows in item_keys(out / u).values() for k in rows]
        assert len(ids) == len(set(ids))
    # another seed: each user's command refuses the folder; that is the batch's fault, not the users'
    res = batch("generate", users_root, out, *GEN, "--seed", "2", "--json")
    assert res.exit_code == 1
    refused = json.loads(res.stdout[res.stdout.index("{") :])
    assert (
        refused["statuses"] == {"failed": 3}
        and "holds a different run" in refused["users"]["ana"]["error"]
    )


def test_a_users_bad_input_is_reported_without_failing_the_batch(scripted, users_root, tmp_path):
    (users_root / "ben" / "records.jsonl").write_text('{"id": "x", "kind": "note"}\n')  # no text
    out = tmp_path / "gen"
    res = batch("generate", users_root, out, *GEN)
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "batch_summary.json").read_text())
    assert summary["users"]["ben"]["status"] == "bad_input"
    assert "records.jsonl:1" in summary["users"]["ben"]["error"]
    assert summary["users"]["ana"]["status"] == "ok" and summary["statuses"] == {
        "ok": 2,
        "bad_input": 1,
    }
    assert "ben** (bad_input)" in (out / "batch_summary.md").read_text()
    assert "records.jsonl:1" in (out / "_batch" / "ben.log").read_text()


def test_a_user_failing_otherwise_fails_the_batch_after_the_others_finish(
    scripted, users_root, tmp_path, monkeypatch
):
    import memsteer_dspy.supervision.run as run_mod

    real = run_mod.generate_supervision

    def flaky(history, *a, **k):
        if history.user_id == "cleo":
            raise RuntimeError("disk on fire")
        return real(history, *a, **k)

    monkeypatch.setattr(run_mod, "generate_supervision", flaky)
    out = tmp_path / "gen"
    res = batch("generate", users_root, out, *GEN)
    assert res.exit_code == 1
    summary = json.loads((out / "batch_summary.json").read_text())
    assert summary["users"]["cleo"] == {"status": "failed", "error": "RuntimeError: disk on fire"}
    assert summary["statuses"] == {"ok": 2, "failed": 1}
    assert "disk on fire" in (out / "_batch" / "cleo.log").read_text()


def test_options_that_do_not_parse_stop_the_batch_before_any_user(scripted, users_root, tmp_path):
    out = tmp_path / "gen"
    res = batch("generate", users_root, out, "--n", "many")
    assert res.exit_code == 2 and "do not parse" in res.output
    assert not any((out / u).exists() for u in USERS)


# ---------------------------------------------------------------------------------------------
# evaluate and optimize
# ---------------------------------------------------------------------------------------------


def test_batch_ingest_reports_each_user_and_the_pooled_counts(users_root, tmp_path):
    out = tmp_path / "ingest"
    res = batch("ingest", users_root, out, users="cleo,ana")
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "batch_summary.json").read_text())
    assert list(summary["users"]) == ["cleo", "ana"]
    for u in ("cleo", "ana"):
        report = load_history("jsonl", users_root / u, user=u).report()
        assert json.loads((out / u / "ingest.json").read_text())["records"] == report["records"]
        assert summary["users"][u]["records"] == report["records"]
    assert summary["pooled"]["records"] == sum(
        summary["users"][u]["records"] for u in ("cleo", "ana")
    )


def test_batch_evaluate_pools_over_items(users_root, tmp_path):
    out = tmp_path / "eval"
    res = batch(
        "evaluate",
        users_root,
        out,
        *argv("-- --metrics recall --qa {} --no-cache", users_root / "{user}" / "qa.jsonl"),
    )
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "batch_summary.json").read_text())
    items = []
    for u in USERS:  # recompute each user's items directly
        loaded = load_history("jsonl", users_root / u, user=u)
        system = MemorySystem.from_design(MemoryDesign.base_bm25(), loaded.history)
        report = evaluate_design(
            system, read_qa_jsonl(users_root / u / "qa.jsonl"), metrics="recall"
        )
        assert summary["users"][u]["recall_at_10"] == report.summary.recall_at_10
        items += report.items
    pooled = summarize_items(items, "recall")
    assert summary["pooled"]["n"] == pooled.n == sum(summary["users"][u]["n"] for u in USERS)
    assert summary["pooled"]["recall_at_10"] == pytest.approx(pooled.recall_at_10)


def test_batch_optimize_one_experiment_parent_run_per_user(scripted, users_root, tmp_path):
    from mlflow import MlflowClient

    gen = tmp_path / "gen"
    more = ["--n", "8", "--max-candidates", "10", *GEN[4:]]  # enough items for train, val and test
    assert batch("generate", users_root, gen, *more).exit_code == 0
    out = tmp_path / "opt"
    res = batch(
        "optimize",
        users_root,
        out,
        *argv("--supervision {} --objective recall", gen / "{user}"),
        *argv("--iterations 2 --no-cache --experiment pop-1"),
    )
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "batch_summary.json").read_text())
    for u in USERS:
        traj = jsonl_rows(out / u / "trajectory.jsonl")
        assert len(traj) == 3 and (out / u / "best_design.json").exists()
        assert summary["users"][u]["iterations"] == 2
        assert summary["users"][u]["val_best"] == traj[-1]["best_score"]
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    exp = client.get_experiment_by_name("pop-1")
    parents = client.search_runs(
        [exp.experiment_id], filter_string="tags.`memsteer.kind` = 'optimize'"
    )
    assert sorted(r.data.tags["memsteer.user"] for r in parents) == sorted(USERS)
    assert "no held-out test" in (out / "batch_summary.md").read_text() or "verdict" in summary[
        "users"
    ]["ana"].get("test", {})


def test_optimize_summary_reads_held_out_figures(tmp_path):
    from memsteer_dspy.batch.summary import collect, markdown

    for user, n, init, best, verdict in (
        ("a", 10, 0.4, 0.5, "better"),
        ("b", 30, 0.6, 0.6, "no difference"),
    ):
        (tmp_path / user).mkdir()
        (tmp_path / user / "summary.json").write_text(
            json.dumps(
                {
                    "test": {
                        "n": n,
                        "source": "official",
                        "initial": {"recall_at_10": init},
                        "best": {"recall_at_10": best},
                        "diff": {"recall_at_10": best - init},
                        "ci95": {"recall_at_10": [-0.05, 0.2]},
                        "verdict": verdict,
                    }
                }
            )
        )
    s = collect("optimize", tmp_path, {"a": {"status": "ok"}, "b": {"status": "ok"}})
    assert s["pooled"]["test"]["n"] == 40
    assert s["pooled"]["test"]["initial"]["recall_at_10"] == pytest.approx(
        (10 * 0.4 + 30 * 0.6) / 40
    )
    assert s["pooled"]["test"]["best"]["recall_at_10"] == pytest.approx((10 * 0.5 + 30 * 0.6) / 40)
    assert s["pooled"]["test"]["verdicts"] == {"better": 1, "no difference": 1}
    table = markdown(s)
    assert "| a | ok | – → – | 10 | 40.0 → 50.0 | +10.0 [-5.0, +20.0] | better |" in table


# ---------------------------------------------------------------------------------------------
# the LM gate and the cross-user scorer
# ---------------------------------------------------------------------------------------------


def test_max_concurrent_lm_bounds_calls_in_flight(monkeypatch, users_root, tmp_path):
    import memsteer_dspy.lm as lm_pkg

    monkeypatch.setenv("MEMSTEER_TEST_LM_LATENCY", "0.02")
    monkeypatch.setattr(lm_pkg, "load_lm_config", scripted_lm_config)
    executor = LocalExecutor(workers=3, max_concurrent_lm=1)
    seen = set()
    real_acquire = executor.slots.acquire

    def acquire(ep):
        seen.add(threading.current_thread().name)
        real_acquire(ep)

    executor.slots.acquire = acquire
    tasks = build_tasks(
        "generate", USERS, tmp_path / "gen", format="jsonl", path=users_root, extra=GEN
    )
    summary = run_batch(tasks, executor, progress=False)
    assert summary["statuses"] == {"ok": 3}
    assert len(seen) >= 2  # calls came from several users' threads ...
    assert executor.slots.peak == {"scripted/demo": 1}  # ... never two at once


def test_gate_releases_a_slot_when_the_call_fails():
    slots = LocalSlots(1)
    gate = LMGate(slots)

    class FakeLM:
        model = "openai/x"
        kwargs = {"api_base": "http://h:1"}

    gate.on_lm_start("c1", FakeLM(), {})
    assert slots.in_flight == {"openai/x@http://h:1": 1}
    gate.on_lm_end("c1", None, exception=RuntimeError("boom"))
    gate.on_lm_start("c2", FakeLM(), {})  # would block forever if the slot had leaked
    gate.on_lm_end("c2", None)
    assert slots.peak == {"openai/x@http://h:1": 1} and slots.in_flight == {
        "openai/x@http://h:1": 0
    }


def test_cross_user_scorer_matches_per_user_evaluation_and_reuses_systems(users_root):
    sources = {
        u: UserSource("jsonl", str(users_root / u), u, qa=str(users_root / u / "qa.jsonl"))
        for u in USERS
    }
    scorer = CrossUserScorer(sources, executor="local", shards=2)
    try:
        base = MemoryDesign.base_bm25()
        other = base.model_copy(
            update={"retrieve": base.retrieve.model_copy(update={"top_k": 3, "pool": 3})}
        )
        scores = scorer.score(base)
        assert set(scores) == set(USERS)
        for u in USERS:
            loaded = load_history("jsonl", users_root / u, user=u)
            direct = evaluate_design(
                MemorySystem.from_design(base, loaded.history),
                read_qa_jsonl(users_root / u / "qa.jsonl"),
                metrics="recall",
            )
            assert [r.recall_at_10 for r in scores[u]] == [r.recall_at_10 for r in direct.items]
        builds = sum(s["builds"] for s in scorer.stats())
        assert builds == 3
        scorer.score(base, ["ana"])  # cached: nothing rebuilt
        assert sum(s["builds"] for s in scorer.stats()) == 3
        narrow = scorer.score(other)
        assert sum(s["builds"] for s in scorer.stats()) == 6
        pooled = CrossUserScorer.pooled(narrow)
        assert pooled.n == sum(len(v) for v in narrow.values())
        assert pooled.recall_at_10 <= CrossUserScorer.pooled(scores).recall_at_10
    finally:
        scorer.close()
