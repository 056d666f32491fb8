"""MLflow tracking: the sqlite default, URI overrides, nested runs by id, params/metrics/tags/
artifacts/tables, and a failing store that warns once and lets the run go on."""

from __future__ import annotations

import json
import os
import socket
import threading
import warnings

import pytest

from memsteer_dspy.errors import ConfigError
from memsteer_dspy.tracking import (
    ENDED_TAG,
    EXPERIMENT_KIND_TAG,
    HOST_TAG,
    NOTE_TAG,
    PID_TAG,
    RESUMED_TAG,
    Tracker,
    TrackingWarning,
    flatten,
    resolve_tracking_uri,
)


def test_tracking_uri_default_flag_and_environment(tmp_path):
    assert resolve_tracking_uri(tmp_path, env={}) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    assert (
        resolve_tracking_uri(tmp_path, env={"MLFLOW_TRACKING_URI": "http://mlflow:5000"})
        == "http://mlflow:5000"
    )
    assert (
        resolve_tracking_uri(tmp_path, "sqlite:////x/y.db", env={"MLFLOW_TRACKING_URI": "http://a"})
        == "sqlite:////x/y.db"
    )
    for bad in ("file:///tmp/mlruns", "./mlruns", "/tmp/mlruns"):
        with pytest.raises(ConfigError, match="file store"):
            resolve_tracking_uri(tmp_path, bad, env={})


def test_flatten_nested_design_params():
    flat = flatten(
        {"store": {"unit": "record", "fields": ["text", "date"]}, "retrieve": {"bm25": {"k1": 1.5}}}
    )
    assert flat == {
        "store.unit": "record",
        "store.fields": '["text", "date"]',
        "retrieve.bm25.k1": 1.5,
    }


@pytest.fixture(scope="module")
def tracker(tmp_path_factory):
    out = tmp_path_factory.mktemp("tracked")
    t = Tracker.for_history(out, "tester", "abc123", uri=None)
    assert t.connect(), t.failure
    return t


def test_parent_and_nested_runs_with_params_metrics_tags_and_artifacts(tracker, tmp_path):
    from mlflow import MlflowClient

    parent = tracker.start_run("optimize-tester", tags={"memsteer.kind": "optimize"})
    tracker.log_params(parent, {"objective": "recall", "lm": {"proposer": "local/qwen"}})
    child = tracker.start_run("iter-001", parent_run_id=parent)
    tracker.log_params(child, {"design": {"retrieve": {"top_k": 40}}})
    tracker.log_metrics(child, {"val_accuracy": None, "val_delivered_recall": 0.5}, step=1)
    tracker.set_tags(child, {"accepted": "true"})
    tracker.log_text(child, "# why", "rationale.md")
    tracker.log_dict(child, {"retrieve": {"top_k": 40}}, "design.json")
    tracker.log_table(
        child,
        [{"qa_id": "q1", "correct": True, "ids": ["a", "b"]}, {"qa_id": "q2", "correct": False}],
        "val_items.json",
    )
    local = tmp_path / "feedback.md"
    local.write_text("cases")
    tracker.log_artifact(child, local)
    tracker.end_run(child)
    tracker.end_run(parent)
    assert tracker.active

    client = MlflowClient(tracking_uri=tracker.uri)
    run = client.get_run(child)
    assert run.data.tags["mlflow.parentRunId"] == parent and run.data.tags["accepted"] == "true"
    assert run.data.params == {"design.retrieve.top_k": "40"}
    assert run.data.metrics == {"val_delivered_recall": 0.5}
    assert run.info.status == "FINISHED"
    assert {a.path for a in client.list_artifacts(child)} == {
        "rationale.md",
        "design.json",
        "val_items.json",
        "feedback.md",
    }
    table = json.loads(
        open(client.download_artifacts(child, "val_items.json", str(tmp_path))).read()
    )
    assert table["columns"] == ["qa_id", "correct", "ids"] and table["data"][0] == [
        "q1",
        True,
        '["a", "b"]',
    ]
    assert client.get_run(parent).data.params["lm.proposer"] == "local/qwen"
    assert [r.info.run_id for r in tracker.child_runs(parent)] == [child]
    assert tracker.experiment_id


def test_resumed_run_keeps_params_and_tags_changed_values(tracker):
    from mlflow import MlflowClient

    rid = tracker.start_run("optimize-resume")
    tracker.log_params(rid, {"iterations": 5, "seed": 0})
    tracker.end_run(rid, status="KILLED")
    again = tracker.start_run("optimize-resume", resume_run_id=rid)
    assert again == rid
    tracker.log_params(rid, {"iterations": 20, "seed": 0, "objective": "recall"})
    run = MlflowClient(tracking_uri=tracker.uri).get_run(rid)
    assert run.info.status == "RUNNING"
    assert run.data.params == {"iterations": "5", "seed": "0", "objective": "recall"}
    assert run.data.tags["param_changed.iterations"] == "20"
    assert tracker.active


def test_logging_from_worker_threads_by_run_id(tracker):
    from mlflow import MlflowClient

    parent = tracker.start_run("threads")
    ids = [tracker.start_run(f"c{i}", parent_run_id=parent) for i in range(4)]

    def work(i):
        tracker.log_metrics(ids[i], {"val_recall_at_10": i / 10}, step=i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    client = MlflowClient(tracking_uri=tracker.uri)
    assert [client.get_run(r).data.metrics["val_recall_at_10"] for r in ids] == [0.0, 0.1, 0.2, 0.3]


def test_a_failing_store_warns_once_and_the_run_goes_on(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the database folder should be")
    t = Tracker(f"sqlite:///{blocker}/sub/mlflow.db", "exp")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rid = t.start_run("optimize")
        t.log_params(rid, {"a": 1})
        t.log_metrics("some-id", {"m": 1.0})
        t.log_text("some-id", "x", "x.md")
        t.end_run("some-id")
    tracking = [w for w in caught if issubclass(w.category, TrackingWarning)]
    assert rid is None and len(tracking) == 1
    assert "tracking is off" in str(tracking[0].message) and not t.active and t.failure


def test_disabled_tracker_logs_nothing(tmp_path):
    t = Tracker.disabled()
    assert t.start_run("x") is None and not t.active
    t.log_metrics("x", {"m": 1.0})
    assert not (tmp_path / "mlflow.db").exists()


def test_experiments_open_on_their_runs_table(tmp_path):
    """MLflow 3 opens an experiment tagged custom_model_development on its runs, not the GenAI
    overview; an experiment made before memsteer set the tag gets it when next opened."""
    from mlflow import MlflowClient

    t = Tracker.for_history(tmp_path, "kind", "f1")
    assert t.connect(), t.failure
    client = MlflowClient(tracking_uri=t.uri)
    assert (
        client.get_experiment(t.experiment_id).tags[EXPERIMENT_KIND_TAG]
        == "custom_model_development"
    )
    old = client.create_experiment("memsteer/kind/f2")
    assert EXPERIMENT_KIND_TAG not in client.get_experiment(old).tags
    t2 = Tracker.for_history(tmp_path, "kind", "f2")
    assert t2.connect() and t2.experiment_id == old
    assert client.get_experiment(old).tags[EXPERIMENT_KIND_TAG] == "custom_model_development"


def test_a_run_whose_process_died_is_marked_killed_then_resumed(tmp_path):
    from mlflow import MlflowClient
    from tracked_run import dead_pid

    t = Tracker.for_history(tmp_path, "killed", "f")
    dead = t.start_run("optimize-killed")
    child = t.start_run("iter-003", parent_run_id=dead)
    live = t.start_run("optimize-live")  # this process: alive, left alone
    t.log_metrics(dead, {"best_score": 0.5}, step=3)
    client = MlflowClient(tracking_uri=t.uri)
    tags = client.get_run(dead).data.tags
    assert tags[PID_TAG] == str(os.getpid()) and tags[HOST_TAG] == socket.gethostname()
    pid = dead_pid()
    for rid in (dead, child):  # as if another process, since killed, had written them
        client.set_tag(rid, PID_TAG, str(pid))
    other_host = t.start_run("optimize-elsewhere")
    client.set_tag(other_host, HOST_TAG, "another-host")
    client.set_tag(other_host, PID_TAG, str(pid))

    t2 = Tracker.for_history(tmp_path, "killed", "f")  # the next process to open the experiment
    assert t2.connect()
    for rid in (dead, child):
        run = client.get_run(rid)
        assert run.info.status == "KILLED", rid
        assert f"process {pid}" in run.data.tags[ENDED_TAG] and "Killed:" in run.data.tags[NOTE_TAG]
    assert (
        client.get_run(dead).info.end_time
        == client.get_metric_history(dead, "best_score")[0].timestamp
    )
    assert client.get_run(live).info.status == "RUNNING"  # its process (this one) runs
    assert client.get_run(other_host).info.status == "RUNNING"  # cannot tell: left alone

    assert t2.start_run("optimize-killed", resume_run_id=dead) == dead
    run = client.get_run(dead)
    assert run.info.status == "RUNNING" and run.data.tags[RESUMED_TAG] == "1"
    assert run.data.tags["memsteer.resumed_from"] == "KILLED"
    assert "Resumed at" in run.data.tags[NOTE_TAG] and run.data.tags[PID_TAG] == str(os.getpid())
    t2.end_run(dead, status="KILLED")
    t2.start_run("optimize-killed", resume_run_id=dead)
    assert client.get_run(dead).data.tags[RESUMED_TAG] == "2"


def test_tracker_for_an_existing_run_adds_to_it(tracker, tmp_path):
    from mlflow import MlflowClient

    rid = tracker.start_run("optimize-for-run")
    tracker.end_run(rid)
    (tmp_path / "report.html").write_text("<html></html>")
    t = Tracker.for_run(tracker.uri, rid)
    assert (
        t.connect()
        and t.experiment_id == tracker.experiment_id
        and t.experiment == tracker.experiment
    )
    t.log_artifact(rid, tmp_path / "report.html", "report")
    assert [
        a.path for a in MlflowClient(tracking_uri=tracker.uri).list_artifacts(rid, "report")
    ] == ["report/report.html"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TrackingWarning)
        missing = Tracker.for_run(tracker.uri, "0" * 32)
        assert not missing.connect() and "0000" in missing.failure
