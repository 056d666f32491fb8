"""MLflow tracking for MemSteer-Opt: one experiment per history, one parent run per optimization,
one nested run per candidate design.

Everything goes through :class:`mlflow.MlflowClient` with explicit run ids (no fluent "active run"
state), so worker threads can log safely and several optimizations can share one process. The
default store is the sqlite file ``<out>/mlflow.db`` (:func:`resolve_tracking_uri`); a ``file:``
store is refused, as MLflow 3 deprecates it. Artifacts of a sqlite store go beside the database in
``mlartifacts/``.

Tracking never stops an optimization: the first failure of the tracking store (unreachable
server, locked or unwritable database, MLflow not importable) is reported once as a warning, and
the run goes on writing only its local files (``trajectory.jsonl``, ``summary.md``, ...).

Open the runs with ``mlflow ui --backend-store-uri sqlite:///<out>/mlflow.db``. What the UI shows
first is set here: every experiment is tagged ``mlflow.experimentKind = custom_model_development``
(MLflow 3 opens an experiment without that tag on its GenAI overview of traces, which stays empty
for these runs), and each run records the process that writes it (``memsteer.pid``,
``memsteer.host``), so a run whose process was killed, left "running" by MLflow, is marked
``KILLED`` the next time a tracker on that host opens the experiment, and a resumed run is tagged
``memsteer.resumed`` with a note saying from what.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from memsteer_dspy.errors import ConfigError

logger = logging.getLogger(__name__)

DB_FILE = "mlflow.db"
ARTIFACT_DIR = "mlartifacts"
MAX_PARAM_CHARS = 500  # MLflow 3 accepts 6000; 500 keeps params readable in the UI and portable
PARENT_TAG = "mlflow.parentRunId"
NOTE_TAG = "mlflow.note.content"  # the run's description in the UI (markdown)
# MLflow 3.x reads this experiment tag to choose the experiment's first page: the runs table for
# "custom_model_development", the GenAI overview (traces) when it is missing or "genai_development".
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
# A saved view of the runs table (MLflow 3's "Save view": an experiment tag holding the table's
# state), opened by ``#/experiments/<id>/runs?viewStateShareKey=<key>``: the key metrics and tags
# as columns, newest first (MLflow keeps expanded rows out of a saved view: click a parent's "+").
VIEW_KEY = "memsteer"
VIEW_TAG_PREFIX = "mlflow.sharedViewState."
KEY_METRICS = (
    "val_accuracy",
    "val_delivered_recall",
    "val_recall_at_10",
    "test_accuracy",
    "test_delivered_recall",
    "test_recall_at_10",
    "best_score",
)
KEY_TAGS = ("accepted", "status", "test_verdict", "memsteer.resumed")
PID_TAG, HOST_TAG, PID_START_TAG = "memsteer.pid", "memsteer.host", "memsteer.pid_start"
RESUMED_TAG, ENDED_TAG = "memsteer.resumed", "memsteer.end_reason"


class TrackingWarning(UserWarning):
    """The tracking store failed; the run continues with local files only."""


def resolve_tracking_uri(
    out_dir: str | Path | None, uri: str | None = None, *, env: Mapping[str, str] | None = None
) -> str:
    """The tracking URI: ``uri`` (a CLI flag) > ``MLFLOW_TRACKING_URI`` > ``sqlite:///<out>/mlflow.db``.

    A ``file:`` URI or a bare folder (MLflow's deprecated file store) is refused with the sqlite
    form to use instead.
    """
    env = os.environ if env is None else env
    chosen = uri or env.get("MLFLOW_TRACKING_URI")
    if not chosen:
        if out_dir is None:
            raise ConfigError(
                "no tracking URI: pass an output folder, --tracking-uri, or set MLFLOW_TRACKING_URI"
            )
        return f"sqlite:///{Path(out_dir).expanduser().resolve() / DB_FILE}"
    scheme = (
        chosen.split(":", 1)[0].lower() if "://" in chosen or chosen.startswith("file:") else ""
    )
    if scheme == "file" or not scheme:
        where = chosen.removeprefix("file://").removeprefix("file:")
        raise ConfigError(
            f"tracking URI {chosen!r} is an MLflow file store, which memsteer does not use "
            "(MLflow 3 deprecates it); use a sqlite store, e.g. --tracking-uri "
            f"sqlite:///{Path(where or '.').expanduser().resolve() / DB_FILE}, or an MLflow server (http://host:5000)"
        )
    return chosen


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for other stores)."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri.removeprefix("sqlite:///"))


_SHARED_EXPERIMENT: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "memsteer_shared_experiment", default=None
)


@contextlib.contextmanager
def shared_experiment(name: str | None):
    """Inside, every history's runs go to the one experiment ``name`` (``memsteer batch optimize``:
    users side by side, told apart by the ``memsteer.user`` tag); per context, so parallel batches
    in one process do not mix."""
    token = _SHARED_EXPERIMENT.set(name)
    try:
        yield
    finally:
        _SHARED_EXPERIMENT.reset(token)


def experiment_name(user_id: str, fingerprint: str) -> str:
    """One experiment per history: the user and the history's content fingerprint (or the
    :func:`shared_experiment` in force)."""
    return _SHARED_EXPERIMENT.get() or f"memsteer/{user_id}/{fingerprint}"


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """``{"retrieve": {"bm25": {"k1": 1.5}}}`` → ``{"retrieve.bm25.k1": 1.5}``; lists become JSON."""
    out: dict[str, Any] = {}
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    key = prefix[:-1]
    if isinstance(obj, (list, tuple)):
        out[key] = json.dumps(list(obj), ensure_ascii=False)
    else:
        out[key] = obj
    return out


def _process_start(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, Linux ``/proc``); None if unknown.
    With the pid it tells a live writer from a new process that reuses a dead one's pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]


def process_alive(pid: int, started: str | None = None) -> bool:
    """Whether process ``pid`` (started at ``started``, when known) still runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    except OSError:
        return True
    if started:
        now = _process_start(pid)
        return now is None or now == started
    return True


def _writer_tags() -> dict[str, str]:
    pid = os.getpid()
    return {
        PID_TAG: str(pid),
        HOST_TAG: socket.gethostname(),
        PID_START_TAG: _process_start(pid) or "",
    }


def runs_view() -> str:
    """The value of the ``mlflow.sharedViewState.memsteer`` experiment tag (see ``VIEW_KEY``)."""
    now = int(time.time() * 1000)
    state = {
        "searchFilter": "",
        "orderByKey": "attributes.start_time",
        "orderByAsc": False,
        "startTime": "ALL",
        "lifecycleFilter": "Active",
        "modelVersionFilter": "All Runs",
        "datasetsFilter": [],
        "selectedColumns": [f"metrics.`{m}`" for m in KEY_METRICS]
        + [f"tags.`{t}`" for t in KEY_TAGS],
        "runsHiddenMode": "SHOW_ALL",
    }
    return json.dumps(
        {
            "name": "memsteer: candidates and key metrics",
            "createdAt": now,
            "updatedAt": now,
            "state": json.dumps(state),
        }
    )


def _param_value(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)
    return text if len(text) <= MAX_PARAM_CHARS else text[: MAX_PARAM_CHARS - 3] + "..."


class Tracker:
    """Logs runs, params, metrics, tags and artifacts to one MLflow experiment, by run id.

    Every method returns quietly once tracking has failed (after one :class:`TrackingWarning`);
    ``active`` says whether tracking still works. Use :meth:`disabled` for a tracker that logs
    nothing (``--no-tracking``).
    """

    def __init__(
        self, uri: str, experiment: str, *, artifact_root: str | Path | None = None
    ) -> None:
        self.uri = uri
        self.experiment = experiment
        self._artifact_root = artifact_root
        self._client = None
        self._experiment_id: str | None = None
        self._failed: str | None = None
        self._lock = threading.Lock()
        self._enabled = True
        self._run_for_experiment: str | None = None

    @classmethod
    def disabled(cls) -> Tracker:
        t = cls("disabled", "disabled")
        t._enabled = False
        return t

    @classmethod
    def for_run(cls, uri: str, run_id: str) -> Tracker:
        """A tracker on the experiment that holds ``run_id`` (to add to a finished run, e.g.
        ``memsteer report``). Tracking fails (one warning) if the run is not in the store."""
        t = cls(uri, "")
        t._run_for_experiment = run_id
        return t

    @classmethod
    def for_history(
        cls, out_dir: str | Path | None, user_id: str, fingerprint: str, *, uri: str | None = None
    ) -> Tracker:
        """The tracker of an optimization writing to ``out_dir`` over one history."""
        return cls(resolve_tracking_uri(out_dir, uri), experiment_name(user_id, fingerprint))

    # -- state ------------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return self._enabled and self._failed is None

    @property
    def failure(self) -> str | None:
        """Why tracking stopped (None while it works)."""
        return self._failed

    @property
    def experiment_id(self) -> str | None:
        return self._experiment_id

    def _fail(self, what: str, exc: BaseException) -> None:
        with self._lock:
            if self._failed is not None:
                return
            self._failed = f"{what}: {type(exc).__name__}: {exc}"
        msg = (
            f"MLflow tracking failed ({self._failed}); tracking is off for the rest of this run, "
            f"which goes on writing its local files. Tracking URI: {self.uri}"
        )
        logger.warning(msg)
        warnings.warn(msg, TrackingWarning, stacklevel=3)

    def _call(self, what: str, fn: Callable[[Any], Any]) -> Any:
        if not self.active:
            return None
        try:
            client = self._ensure()
            if client is None:
                return None
            return fn(client)
        except Exception as exc:  # a tracking failure never stops the optimization
            self._fail(what, exc)
            return None

    def _ensure(self):
        if self._client is not None:
            return self._client
        with self._lock:
            if self._client is not None:
                return self._client
            from mlflow import MlflowClient  # slow import: only when tracking is used

            db = sqlite_path(self.uri)
            if db is not None:
                db.parent.mkdir(parents=True, exist_ok=True)
            client = MlflowClient(tracking_uri=self.uri)
            if self._run_for_experiment:
                exp = client.get_experiment(
                    client.get_run(self._run_for_experiment).info.experiment_id
                )
                self.experiment = exp.name
            else:
                exp = client.get_experiment_by_name(self.experiment)
            if exp is None:
                location = self._artifact_root
                if location is None and db is not None:
                    location = db.parent / ARTIFACT_DIR
                kwargs = (
                    {"artifact_location": Path(location).resolve().as_uri()}
                    if location is not None
                    else {}
                )
                exp_id = client.create_experiment(
                    self.experiment, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}, **kwargs
                )
            else:
                exp_id = exp.experiment_id
                if EXPERIMENT_KIND_TAG not in exp.tags:  # made before memsteer set it
                    client.set_experiment_tag(exp_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
            if exp is None or VIEW_TAG_PREFIX + VIEW_KEY not in exp.tags:
                client.set_experiment_tag(exp_id, VIEW_TAG_PREFIX + VIEW_KEY, runs_view())
            self._experiment_id = exp_id
            self._client = client
            try:
                self._close_dead_runs(client)
            except Exception as exc:  # tidying the table is a courtesy: it never stops tracking
                logger.debug("could not check for runs of dead processes: %s", exc)
        return client

    def _close_dead_runs(self, client) -> None:
        """Mark ``KILLED`` the runs of this experiment that are still "running" although the
        process that wrote them (on this host) is gone; runs of other hosts are left alone."""
        from mlflow.entities import RunTag

        host = socket.gethostname()
        runs = client.search_runs(
            [self._experiment_id],
            filter_string=f"attributes.status = 'RUNNING' and tags.`{HOST_TAG}` = '{host}'",
            max_results=1000,
        )
        for run in runs:
            tags = run.data.tags
            try:
                pid = int(tags.get(PID_TAG, ""))
            except ValueError:
                continue
            if process_alive(pid, tags.get(PID_START_TAG) or None):
                continue
            metrics = getattr(run.data, "_metric_objs", None) or []  # latest value of each metric
            last = max([m.timestamp for m in metrics] + [run.info.start_time or 0])
            reason = (
                f"process {pid} on {host} ended without closing the run (killed); "
                f"marked KILLED at {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC"
            )
            note = (tags.get(NOTE_TAG, "") + f"\n\nKilled: {reason}.").strip()
            client.log_batch(
                run.info.run_id, tags=[RunTag(ENDED_TAG, reason), RunTag(NOTE_TAG, note)]
            )
            client.set_terminated(run.info.run_id, status="KILLED", end_time=last or None)

    def connect(self) -> bool:
        """Open the store and the experiment now (otherwise on first use); False if that failed."""
        self._call("opening the tracking store", lambda c: True)
        return self.active

    # -- runs -------------------------------------------------------------------------------
    def start_run(
        self,
        name: str,
        *,
        parent_run_id: str | None = None,
        tags: Mapping[str, Any] | None = None,
        resume_run_id: str | None = None,
    ) -> str | None:
        """Create a run (nested under ``parent_run_id`` if given), or mark ``resume_run_id``
        running again if it still exists. Returns the run id (None when tracking is off)."""

        def go(client):
            if resume_run_id:
                try:
                    run = client.get_run(resume_run_id)
                except Exception:
                    run = None
                if run is not None and run.info.experiment_id == self._experiment_id:
                    self._mark_resumed(client, run)
                    return resume_run_id
            all_tags = {k: str(v) for k, v in (tags or {}).items()} | _writer_tags()
            if parent_run_id:
                all_tags[PARENT_TAG] = parent_run_id
            run = client.create_run(self._experiment_id, run_name=name, tags=all_tags)
            return run.info.run_id

        return self._call(f"starting run {name!r}", go)

    def ui_url(self, base: str = "http://127.0.0.1:5000") -> str | None:
        """The experiment's runs table in the saved memsteer view, on the Model-training side of
        the UI (MLflow 3.17 opens experiments on the GenAI overview unless told otherwise)."""
        if self._experiment_id is None:
            return None
        return f"{base}/#/experiments/{self._experiment_id}/runs?workflowType=machine_learning&viewStateShareKey={VIEW_KEY}"

    @staticmethod
    def _mark_resumed(client, run) -> None:
        """A run continued by a new process: running again, tagged with how often it was
        resumed and from what state, its description saying so, and the new writer recorded."""
        from mlflow.entities import RunTag

        tags, run_id = run.data.tags, run.info.run_id
        was = run.info.status
        if was == "RUNNING":  # the old writer is gone or this is a second writer; say which
            pid = tags.get(PID_TAG, "")
            alive = (
                pid.isdigit()
                and tags.get(HOST_TAG) == socket.gethostname()
                and process_alive(int(pid), tags.get(PID_START_TAG) or None)
            )
            was = "RUNNING (another process is still writing it)" if alive else "KILLED"
        n = int(tags.get(RESUMED_TAG, "0") or 0) + 1
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
        note = tags.get(NOTE_TAG, "")
        line = f"Resumed at {when} UTC (resume {n}; the run was {was})."
        new = {
            RESUMED_TAG: str(n),
            "memsteer.resumed_from": was,
            NOTE_TAG: (note + "\n\n" + line).strip(),
        }
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in (new | _writer_tags()).items()])
        client.update_run(run_id, status="RUNNING")

    def end_run(self, run_id: str | None, status: str = "FINISHED") -> None:
        if run_id:
            self._call("ending a run", lambda c: c.set_terminated(run_id, status=status))

    def get_run(self, run_id: str):
        return self._call("reading a run", lambda c: c.get_run(run_id))

    def child_runs(self, parent_run_id: str) -> list:
        """The nested runs of ``parent_run_id``."""
        res = self._call(
            "searching runs",
            lambda c: c.search_runs(
                [self._experiment_id],
                filter_string=f"tags.`{PARENT_TAG}` = '{parent_run_id}'",
                max_results=5000,
            ),
        )
        return list(res or [])

    # -- values -----------------------------------------------------------------------------
    def log_params(self, run_id: str | None, params: Mapping[str, Any]) -> None:
        """Log params (nested mappings are flattened with dots). A param already logged with
        another value (a resumed run with a changed setting) is kept, and the new value is
        recorded as tag ``param_changed.<name>``."""
        if not run_id or not params:
            return
        flat = {k: _param_value(v) for k, v in flatten(dict(params)).items() if v is not None}

        def go(client):
            from mlflow.entities import Param, RunTag

            existing = client.get_run(run_id).data.params
            new = [Param(k, v) for k, v in flat.items() if k not in existing]
            changed = [
                RunTag(f"param_changed.{k}", v)
                for k, v in flat.items()
                if k in existing and existing[k] != v
            ]
            for i in range(0, len(new), 100):
                client.log_batch(run_id, params=new[i : i + 100])
            if changed:
                client.log_batch(run_id, tags=changed)

        self._call("logging params", go)

    def log_metrics(
        self, run_id: str | None, metrics: Mapping[str, float | None], *, step: int | None = None
    ) -> None:
        """Log numeric metrics (None values are skipped)."""
        if not run_id:
            return
        vals = {
            k: float(v) for k, v in metrics.items() if v is not None and not isinstance(v, bool)
        }
        if not vals:
            return

        def go(client):
            import time

            from mlflow.entities import Metric

            ts = int(time.time() * 1000)
            client.log_batch(run_id, metrics=[Metric(k, v, ts, step or 0) for k, v in vals.items()])

        self._call("logging metrics", go)

    def set_tags(self, run_id: str | None, tags: Mapping[str, Any]) -> None:
        if not run_id or not tags:
            return

        def go(client):
            from mlflow.entities import RunTag

            client.log_batch(run_id, tags=[RunTag(k, _param_value(v)) for k, v in tags.items()])

        self._call("setting tags", go)

    # -- artifacts --------------------------------------------------------------------------
    def log_artifact(
        self, run_id: str | None, path: str | Path, artifact_path: str | None = None
    ) -> None:
        if run_id and Path(path).exists():
            self._call(
                "logging an artifact", lambda c: c.log_artifact(run_id, str(path), artifact_path)
            )

    def log_text(self, run_id: str | None, text: str, artifact_file: str) -> None:
        if run_id:
            self._call("logging a text artifact", lambda c: c.log_text(run_id, text, artifact_file))

    def log_dict(self, run_id: str | None, obj: Any, artifact_file: str) -> None:
        if run_id:
            self._call("logging a JSON artifact", lambda c: c.log_dict(run_id, obj, artifact_file))

    def log_table(
        self, run_id: str | None, rows: Iterable[Mapping[str, Any]], artifact_file: str
    ) -> None:
        """Log ``rows`` (one dict per row) as an MLflow table (shown in the UI's evaluation view).
        Values that are not scalars are written as JSON text."""
        if not run_id:
            return
        rows = list(rows)
        if not rows:
            return
        columns: dict[str, None] = {}
        for r in rows:
            columns.update(dict.fromkeys(r))

        def cell(v: Any) -> Any:
            if v is None or isinstance(v, (str, int, float, bool)):
                return v
            return json.dumps(v, ensure_ascii=False, default=str)

        data = {c: [cell(r.get(c)) for r in rows] for c in columns}
        self._call(
            "logging a table", lambda c: c.log_table(run_id, data=data, artifact_file=artifact_file)
        )

    # -- DSPy traces ------------------------------------------------------------------------
    def enable_dspy_autolog(self) -> bool:
        """Turn on ``mlflow.dspy.autolog()`` traces into this experiment (process-wide, as MLflow
        autologging is). Returns whether it is on."""

        def go(client):
            import mlflow

            mlflow.set_tracking_uri(self.uri)
            mlflow.set_experiment(experiment_id=self._experiment_id)
            mlflow.dspy.autolog()
            return True

        return bool(self._call("enabling mlflow.dspy.autolog", go))

    def ui_command(self) -> str:
        """How to open these runs (then go to :meth:`ui_url`)."""
        return f"mlflow ui --backend-store-uri {self.uri}"
