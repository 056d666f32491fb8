"""MLflow tracking: the sqlite default, URI overrides, nested runs by id, params/metrics/tags/
artifacts/tables, and a failing store that warns once and lets the run go on."""

from __future__ import annotations

import json
import threading
import warnings

import pytest

from memsteer_dspy.errors import ConfigError
from memsteer_dspy.tracking import Tracker, TrackingWarning, flatten, resolve_tracking_uri


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
    tracker.log_table(child, [{"qa_id": "q1", "correct": True, "ids": ["a", "b"]}, {"qa_id": "q2", "correct": False}],
                      "val_items.json")  # fmt: skip
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
