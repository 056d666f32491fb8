"""``memsteer batch`` on a local Ray cluster (``ray.init(num_cpus=2)`` on this machine) with the
scripted LM over three small users: ``batch generate`` and ``batch optimize`` give the results of
``--executor local``; a worker killed mid-batch (SIGKILL to its PID) is replaced, the user it held
is rerun and resumes, and nothing is lost or duplicated; the LM gate and the cross-user scorer work
across worker processes. Skipped where Ray (the ``ray`` extra) is not installed."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from batch_fixtures import USERS, item_keys, jsonl_rows, scripted_lm_config, write_users
from script_helpers import argv
from typer.testing import CliRunner

from memsteer_dspy.batch import (
    CrossUserScorer,
    RayExecutor,
    UserSource,
    attempts,
    build_tasks,
    run_batch,
)
from memsteer_dspy.cli import app
from memsteer_dspy.memory import MemoryDesign

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'memsteer-dspy[ray]')")

TESTS = Path(__file__).resolve().parent
# --batch-size 1: a candidate redone after the kill then sees exactly the accepted items
# (de-duplication) it saw in the uninterrupted run; with staged batches of several candidates,
# `generate` resumed mid-batch gives batch-mates other demos, so its items may differ. --max-demos 0:
# the scripted questions share one template, which the copied-demo check rejects once demos exist.
# The full profile (the small one steers toward number/date tasks the scripted world cannot write) and
# enough items for optimize's train / validation / held-out split.
GEN = argv("--n 8 --max-candidates 10 --profile full --seed 1 --batch-size 1 --max-demos 0")
LATENCY = (
    "0.15"  # seconds per scripted LM call under Ray: a user takes long enough to be killed mid-run
)


@pytest.fixture(scope="module")
def cluster():
    """A two-CPU Ray cluster on 127.0.0.1 whose workers resolve every LM to the scripted one."""
    if ray.is_initialized():
        ray.shutdown()
    path = os.pathsep.join([str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")])
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        namespace="memsteer",
        configure_logging=False,
        _node_ip_address="127.0.0.1",
        runtime_env={
            "worker_process_setup_hook": "batch_fixtures.install_scripted_lm",
            "env_vars": {"PYTHONPATH": path, "MEMSTEER_TEST_LM_LATENCY": LATENCY},
        },
    )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def users_root(tmp_path_factory):
    return write_users(tmp_path_factory.mktemp("users"))


@pytest.fixture(scope="module")
def local_runs(users_root, tmp_path_factory):
    """The same batches on the local executor, the reference the Ray runs must equal."""
    import memsteer_dspy.lm as lm_pkg

    mp = pytest.MonkeyPatch()
    mp.setattr(lm_pkg, "load_lm_config", scripted_lm_config)
    root = tmp_path_factory.mktemp("local")
    try:
        assert _batch("generate", users_root, root / "gen", "local", *GEN).exit_code == 0
        res = _batch(
            "optimize",
            users_root,
            root / "opt",
            "local",
            *argv("--supervision {}", root / "gen" / "{user}"),
            *argv("--objective recall --iterations 2 --no-cache"),
        )
        assert res.exit_code == 0, res.output
    finally:
        mp.undo()
    for step in ("gen", "opt"):
        assert json.loads((root / step / "batch_summary.json").read_text())["statuses"] == {
            "ok": 3
        }, step
    return root


def _batch(command, root, out, executor, *extra):
    return CliRunner().invoke(
        app,
        [
            *argv("batch {} --users all --format jsonl", command),
            *argv("--path {} --out {} --executor {}", root, out, executor),
            *extra,
        ],
    )


def test_killed_worker_mid_batch_user_is_rerun_and_results_equal_local(
    cluster, users_root, local_runs, tmp_path
):
    out = tmp_path / "gen"
    tasks = build_tasks("generate", USERS, out, format="jsonl", path=users_root, extra=GEN)
    executor = RayExecutor()
    result: dict = {}
    runner = threading.Thread(
        target=lambda: result.update(summary=run_batch(tasks, executor, progress=False))
    )
    runner.start()
    # wait until some user's worker has written part of its folder, then kill that worker
    victim, pid = None, None
    deadline = time.monotonic() + 240
    while victim is None and time.monotonic() < deadline and runner.is_alive():
        for t in tasks:
            started = attempts(t)
            logs = list(t.user_dir.glob("*.jsonl")) if t.user_dir.exists() else []
            if (
                started
                and any(p.stat().st_size for p in logs)
                and not (out / "_batch" / f"{t.user}.done.json").exists()
            ):
                victim, pid = t, started[-1]["pid"]
                break
        time.sleep(0.05)
    assert victim is not None, "no user was caught mid-run"
    os.kill(pid, signal.SIGKILL)
    runner.join(timeout=300)
    assert not runner.is_alive()
    summary = result["summary"]
    assert summary["statuses"] == {"ok": 3}
    held = attempts(victim)
    assert len(held) == 2 and held[0]["pid"] == pid and held[1]["pid"] != pid
    assert all(len(attempts(t)) == 1 for t in tasks if t.user != victim.user)
    for u in USERS:
        ours, ref = item_keys(out / u), item_keys(local_runs / "gen" / u)
        assert ours == ref, u  # nothing lost, nothing duplicated, same items as the local executor
        ids = [i[0] for rows in ours.values() for i in rows]
        assert len(ids) == len(set(ids))
    assert (
        summary["pooled"]
        == json.loads((local_runs / "gen" / "batch_summary.json").read_text())["pooled"]
    )


def test_batch_optimize_on_ray_equals_local(cluster, users_root, local_runs, tmp_path):
    out = tmp_path / "opt"
    res = _batch(
        "optimize",
        users_root,
        out,
        "ray",
        *argv("--supervision {}", local_runs / "gen" / "{user}"),
        *argv("--objective recall --iterations 2 --no-cache --max-concurrent-lm 1"),
    )
    assert res.exit_code == 0, res.output
    assert json.loads((out / "batch_summary.json").read_text())["statuses"] == {"ok": 3}
    for u in USERS:
        ours = json.loads((out / u / "best_design.json").read_text())
        ref = json.loads((local_runs / "opt" / u / "best_design.json").read_text())
        assert ours == ref, u
        steps = [
            (e["iteration"], e["status"], e.get("best_key"))
            for e in jsonl_rows(out / u / "trajectory.jsonl")
        ]
        ref_steps = [
            (e["iteration"], e["status"], e.get("best_key"))
            for e in jsonl_rows(local_runs / "opt" / u / "trajectory.jsonl")
        ]
        assert steps == ref_steps
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    exp = client.get_experiment_by_name(f"memsteer-batch/{out.name}")
    parents = client.search_runs(
        [exp.experiment_id], filter_string="tags.`memsteer.kind` = 'optimize'"
    )
    assert sorted(r.data.tags["memsteer.user"] for r in parents) == sorted(USERS)


def test_cross_user_scorer_on_ray_actors_equals_local(cluster, users_root):
    sources = {
        u: UserSource("jsonl", str(users_root / u), u, qa=str(users_root / u / "qa.jsonl"))
        for u in USERS
    }
    base = MemoryDesign.base_bm25()
    local = CrossUserScorer(sources, executor="local", shards=2)
    remote = CrossUserScorer(sources, executor="ray", shards=2)
    try:
        want = local.score(base)
        got = remote.score(base)
        assert {u: [r.model_dump(exclude={"seconds"}) for r in v] for u, v in got.items()} == {
            u: [r.model_dump(exclude={"seconds"}) for r in v] for u, v in want.items()
        }
        remote.score(base, ["ben"])
        assert (
            sum(s["builds"] for s in remote.stats()) == 3
        )  # each user's memory built once, in its actor
    finally:
        local.close()
        remote.close()
