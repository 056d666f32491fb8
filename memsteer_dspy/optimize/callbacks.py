"""What the engine announces, and who listens (as GEPA's ``core/callbacks.py``).

The engine never calls a tracker or a display: it sends typed events to a
:class:`CompositeCallback`, and :class:`MlflowCallback` (the parent run, one nested run per
candidate, metrics, artifacts) and :class:`ProgressCallback` (the CLI's ``on_event`` dict, shown by
:func:`progress_line`) listen. A listener implements only the ``on_*`` methods it needs; tracking
errors warn inside :class:`~memsteer_dspy.tracking.Tracker` and never stop the run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypedDict

from memsteer_dspy.optimize.feedback import Feedback
from memsteer_dspy.optimize.state import TrainState, now
from memsteer_dspy.optimize.types import Objective, TrajectoryEntry
from memsteer_dspy.runfolder import JsonlLog, write_atomic
from memsteer_dspy.stats import PairedComparison
from memsteer_dspy.tracking import Tracker, flatten

RUN_ARTIFACTS = ("best_design.json", "trajectory.jsonl", "summary.md", "summary.json", "run.json")
RUN_PARAMS = (
    "history_fingerprint",
    "user",
    "objective",
    "feedback",
    "seed",
    "protocol",
    "n_train",
    "n_val",
    "iterations",
    "init_design_key",
    "search",
    "accept",
    "n_test",
)


class RunStart(TypedDict):
    """The run folder is open. ``state`` is its ``run.json`` state (listeners may record in it,
    e.g. the MLflow parent run id; the engine saves it after); ``params``: what to log."""

    user_id: str
    state: dict[str, Any]
    params: dict[str, Any]


class IterationStart(TypedDict):
    iteration: int
    folder: Path


class CandidateDone(TypedDict):
    """An iteration's entry is complete and about to be written. Listeners may stamp it (the MLflow
    callback sets ``entry.run_id``). ``feedback_state``: the training state the feedback came from;
    ``new_state``: the accepted design's, when one was accepted."""

    entry: TrajectoryEntry
    folder: Path
    feedback: Feedback | None
    feedback_state: TrainState | None
    new_state: TrainState | None


class IterationEnd(TypedDict):
    """An entry was written to the trajectory."""

    entry: TrajectoryEntry
    total: int
    objective: Objective


class Stopped(TypedDict):
    reason: str


class HeldOut(TypedDict):
    comparison: PairedComparison
    primary: str
    source: str


class RunEnd(TypedDict):
    status: str
    out: Path


class OptimizeCallback(Protocol):
    """A listener: any of ``on_run_start``, ``on_iteration_start``, ``on_candidate_done``,
    ``on_iteration_end``, ``on_stopped``, ``on_held_out``, ``on_run_end``, each taking its event."""


EVENTS = (
    "on_run_start",
    "on_iteration_start",
    "on_candidate_done",
    "on_iteration_end",
    "on_stopped",
    "on_held_out",
    "on_run_end",
)


class CompositeCallback:
    """Sends each event (an ``on_*`` call named in :data:`EVENTS`) to every listener that has a
    method for it, in order."""

    def __init__(self, callbacks: list[Any]):
        self.callbacks = list(callbacks)

    def __getattr__(self, name: str) -> Callable[[Mapping[str, Any]], None]:
        if name not in EVENTS:
            raise AttributeError(name)

        def send(event: Mapping[str, Any]) -> None:
            for cb in self.callbacks:
                method = getattr(cb, name, None)
                if method is not None:
                    method(event)

        return send


def progress_line(event: Mapping[str, Any]) -> str:
    """One line for an ``on_event`` event of :class:`MemSteerOpt` (the CLI's and the experiment
    scripts' progress display): iteration, status, the candidate's and the best design's primary
    metric (and R@10 under the recall objective), the cost so far, parent and changes or reason."""

    def pct(v: float | None) -> str:
        return "  -  " if v is None else f"{100 * v:5.1f}"

    cand, best, recall = event["candidate"], event["best"], event["objective"] == "recall"
    primary = "delivered_recall" if recall else "accuracy"
    c = getattr(cand, primary, None) if cand is not None else None
    b = getattr(best, primary, None) if best is not None else None
    name = "recall" if recall else "acc"
    line = f"iter {event['iteration']:>3}/{event['total']}  {event['status']:<9} candidate {name} {pct(c)}"
    if recall:
        line += f" R@10 {pct(getattr(cand, 'recall_at_10', None) if cand is not None else None)}"
    line += f"  best {pct(b)}"
    if recall:
        line += f" R@10 {pct(getattr(best, 'recall_at_10', None) if best is not None else None)}"
    line += f"  cost {event['cost_total'].short()}"
    if event.get("parent") is not None and event["iteration"]:
        line += f"  parent {event['parent']}"
    if event.get("lm_per_question"):
        line += f"  LM/q {event['lm_per_question']}"
    if event["status"] in ("invalid", "failed", "duplicate") and event.get("reason"):
        line += f"  ({event['reason'][:100]})"
    elif event.get("changes"):
        line += "  [" + "; ".join(event["changes"])[:120] + "]"
    return line


class ProgressCallback:
    """Hands ``on_event`` (the CLI's and experiment scripts' display) one dict per written entry:
    iteration, total, status, candidate and best scores, objective, cost so far, reason, changes,
    parent and retrieval LM calls per question (what :func:`progress_line` shows)."""

    def __init__(self, on_event: Callable[[dict[str, Any]], None]):
        self.on_event = on_event

    def on_iteration_end(self, event: IterationEnd) -> None:
        entry = event["entry"]
        self.on_event(
            {
                "iteration": entry.iteration,
                "total": event["total"],
                "status": entry.status,
                "candidate": entry.score or entry.screen_score,
                "best": entry.best_score,
                "objective": event["objective"],
                "cost_total": entry.cost_total,
                "reason": entry.reason,
                "changes": entry.changes,
                "parent": entry.parent_iteration,
                "lm_per_question": entry.retrieval_lm_calls,
            }
        )


class MlflowCallback:
    """The run in MLflow: a parent run (resumed with the folder), one nested run per candidate
    (params, metrics, the design, rationale, per-item tables, diagnoses, feedback, proposal
    attempts), the parent's per-iteration metrics, the held-out comparison and the run's files.
    ``iter_dir(t)`` is the iteration's folder, where the candidate run id and a ``.tracked``
    marker (artifacts already logged) are kept for a resume."""

    def __init__(self, tracker: Tracker, iter_dir: Callable[[int], Path], objective: Objective):
        self.tracker, self.iter_dir, self.objective = tracker, iter_dir, objective
        self.parent_run_id: str | None = None
        self._runs: dict[int, str | None] = {}

    def on_run_start(self, event: RunStart) -> None:
        state = event["state"]
        self.parent_run_id = self.tracker.start_run(
            f"optimize-{event['user_id']}",
            resume_run_id=state.get("parent_run_id"),
            tags={"memsteer.kind": "optimize", "memsteer.user": event["user_id"]},
        )
        if self.parent_run_id:
            state["parent_run_id"] = self.parent_run_id
            state["tracking_uri"] = self.tracker.uri
        self.tracker.log_params(self.parent_run_id, event["params"])

    def on_iteration_start(self, event: IterationStart) -> None:
        t = event["iteration"]
        if not self.tracker.active or not self.parent_run_id:
            self._runs[t] = None
            return
        marker = event["folder"] / "mlflow_run_id"
        previous = marker.read_text().strip() if marker.exists() else None
        run_id = self.tracker.start_run(
            f"iter-{t:03d}",
            parent_run_id=self.parent_run_id,
            resume_run_id=previous,
            tags={"memsteer.iteration": t},
        )
        if run_id:
            write_atomic(marker, run_id + "\n")
        self._runs[t] = run_id

    def on_candidate_done(self, event: CandidateDone) -> None:
        entry = event["entry"]
        entry.run_id = self._runs.pop(entry.iteration, None)
        rid = entry.run_id
        if not rid or not self.tracker.active:
            return
        self._log_candidate(rid, entry)
        folder = event["folder"]
        if (folder / ".tracked").exists():  # artifacts already logged before an interruption
            self.tracker.end_run(rid)
            return
        self._log_artifacts(rid, event)
        if self.tracker.active:
            write_atomic(folder / ".tracked", now() + "\n")
        self.tracker.end_run(rid)

    def _log_candidate(self, rid: str, entry: TrajectoryEntry) -> None:
        tr = self.tracker
        params: dict[str, Any] = {
            "iteration": entry.iteration,
            "status": entry.status,
            "parent_key": entry.parent_key,
            "design_key": entry.design_key,
        }
        if entry.design is not None:
            design = {k: v for k, v in entry.design.items() if k != "name"}
            params.update({f"design.{k}": v for k, v in flatten(design).items()})
        tr.log_params(rid, params)
        s = entry.score or entry.screen_score
        failures = entry.train_failures or {}
        tr.log_metrics(
            rid,
            {
                "val_accuracy": s.accuracy if s else None,
                "val_qs": s.qs if s else None,
                "val_recall_at_10": s.recall_at_10 if s else None,
                "val_delivered_recall": s.delivered_recall if s else None,
                "lm_calls": entry.cost.calls,
                "lm_tokens": entry.cost.total_tokens,
                "lm_prompt_tokens": entry.cost.prompt_tokens,
                "lm_completion_tokens": entry.cost.completion_tokens,
                "wall_seconds": entry.cost.seconds,
                "lm_cost_usd": entry.cost.cost_usd,
                "retrieval_lm_calls_per_question": entry.retrieval_lm_calls,
                "accept_p": (entry.accept_stats or {}).get("p"),
                "accept_gain": (entry.accept_stats or {}).get("gain"),
                **{f"train_{k}_failures": v for k, v in failures.items()},
            },
            step=entry.iteration,
        )
        tr.set_tags(
            rid,
            {
                "accepted": "true" if entry.accepted else "false",
                "status": entry.status,
                "selected_by": entry.selected_by or "",
                "reason": entry.reason or "",
            },
        )

    def _log_artifacts(self, rid: str, event: CandidateDone) -> None:
        tr, entry, folder = self.tracker, event["entry"], event["folder"]
        if entry.design is not None:
            tr.log_dict(rid, entry.design, "design.json")
        tr.log_text(
            rid,
            f"# Iteration {entry.iteration} ({entry.status})\n\n{entry.rationale or '(initial design)'}\n\n"
            + "## Changes\n\n"
            + ("".join(f"- {c}\n" for c in entry.changes) or "(none)\n")
            + (f"\n## Outcome\n\n{entry.reason}\n" if entry.reason else ""),
            "rationale.md",
        )
        for sub in ("val", "val-recall"):
            items = folder / sub / "items.jsonl"
            if items.exists():
                tr.log_table(rid, item_rows(items), f"{sub}_items.json")
        for state, name in (
            (event["feedback_state"], "diagnosis.json"),
            (event["new_state"], "train_diagnosis.json"),
        ):
            if state is not None:
                tr.log_table(rid, [d.row() for d in state.diagnoses.values()], name)
        if event["feedback"] is not None:
            tr.log_artifact(rid, folder / "feedback.md")
            tr.log_artifact(rid, folder / "feedback.json")
        if entry.attempts:
            tr.log_dict(
                rid, [a.model_dump(mode="json") for a in entry.attempts], "proposal_attempts.json"
            )

    def on_iteration_end(self, event: IterationEnd) -> None:
        entry = event["entry"]
        best, cand = entry.best_score, entry.score or entry.screen_score
        self.tracker.log_metrics(
            self.parent_run_id,
            {
                "best_score": best.primary(event["objective"]) if best else None,
                "best_accuracy": best.accuracy if best else None,
                "best_delivered_recall": best.delivered_recall if best else None,
                "best_recall_at_10": best.recall_at_10 if best else None,
                "candidate_accuracy": entry.score.accuracy if entry.score else None,
                "candidate_delivered_recall": cand.delivered_recall if cand else None,
                "candidate_recall_at_10": cand.recall_at_10 if cand else None,
                "accepted": float(entry.accepted),
                "cost_lm_calls": entry.cost_total.calls,
                "cost_tokens": entry.cost_total.total_tokens,
                "cost_seconds": entry.cost_total.seconds,
                "cost_usd": entry.cost_total.cost_usd,
            },
            step=entry.iteration,
        )

    def on_stopped(self, event: Stopped) -> None:
        self.tracker.log_params(self.parent_run_id, {"stopped": event["reason"]})

    def on_held_out(self, event: HeldOut) -> None:
        comp = event["comparison"]
        out: dict[str, float | None] = {
            "test_n": float(comp.n),
            "test_p_bootstrap": comp.p_bootstrap,
            "test_p_sign": comp.p_sign,
        }
        for m in comp.initial:
            ci = comp.ci95.get(m)
            out.update(
                {
                    f"test_initial_{m}": comp.initial.get(m),
                    f"test_best_{m}": comp.best.get(m),
                    f"test_diff_{m}": comp.diff.get(m),
                    f"test_ci_low_{m}": ci[0] if ci else None,
                    f"test_ci_high_{m}": ci[1] if ci else None,
                }
            )
        self.tracker.log_metrics(self.parent_run_id, out)
        self.tracker.set_tags(
            self.parent_run_id,
            {
                "test_verdict": comp.verdict,
                "test_primary": event["primary"],
                "test_source": event["source"],
            },
        )

    def on_run_end(self, event: RunEnd) -> None:
        rid = self.parent_run_id
        if not rid:
            return
        for name in RUN_ARTIFACTS:
            if (event["out"] / name).exists():
                self.tracker.log_artifact(rid, event["out"] / name)
        self.tracker.end_run(rid, status=event["status"])


def item_rows(path: Path) -> list[dict[str, Any]]:
    """Per-item results as the MLflow table of a candidate shows them."""
    rows = []
    for r in JsonlLog(path).read(repair=False):
        trace = r.get("trace") or {}
        rows.append(
            {
                "qa_id": r.get("qa_id"),
                "question": r.get("question"),
                "question_type": r.get("question_type"),
                "reference": r.get("reference"),
                "prediction": r.get("prediction"),
                "correct": r.get("correct"),
                "qs": r.get("qs"),
                "recall_at_10": r.get("recall_at_10"),
                "delivered_recall": r.get("delivered_recall"),
                "evidence_ids": r.get("evidence_ids"),
                "delivered_ids": trace.get("delivered_record_ids"),
                "error": r.get("error"),
            }
        )
    return rows
