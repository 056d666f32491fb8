"""The run state: everything a resume needs, read from and written to the run folder in one place
(as GEPA's ``core/state.py``).

* ``trajectory.jsonl`` — one :class:`~memsteer_dspy.optimize.types.TrajectoryEntry` per finished
  iteration, append-only (:meth:`RunState.read_trajectory`, :meth:`RunState.append`);
* ``iterations/NNN/`` — each iteration's files; a saved ``proposal.json`` is reused on resume
  (:meth:`RunState.saved_proposal`), never asked (and paid for) twice;
* the candidate cache — a scored entry as the accept rules and selectors see it, its per-item
  validation results read back from ``val/items.jsonl``;
* the training states — the current designs' training results and diagnoses (the source of
  feedback), the four most recent kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from memsteer_dspy.errors import InputError
from memsteer_dspy.evaluation import ItemResult
from memsteer_dspy.optimize.diagnosis import Diagnosis
from memsteer_dspy.optimize.types import Candidate, Proposal, TrajectoryEntry
from memsteer_dspy.runfolder import JsonlLog, write_atomic

TRAIN_STATES_KEPT = 4


@dataclass
class TrainState:
    """A design's training results and diagnoses (the source of feedback)."""

    iteration: int
    results: list[Any]
    diagnoses: dict[str, Diagnosis]
    errors: dict[str, str] = field(default_factory=dict)


def now() -> str:
    """The time an entry finished, as the trajectory writes it."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def best_of(entries: list[TrajectoryEntry]) -> TrajectoryEntry:
    """The current best design's entry: the last accepted one (the baseline counts as accepted)."""
    return next(e for e in reversed(entries) if e.accepted)


def ceiling_reason(best: TrajectoryEntry, t: int) -> str:
    """Why the loop stops before iteration ``t`` when the best design is at the objective's maximum."""
    who = (
        "the initial design" if best.iteration == 0 else f"the design of iteration {best.iteration}"
    )
    return (
        f"{who} already scores the maximum on validation ({best.score.short() if best.score else '-'}), "
        f"so no candidate can be strictly better there; iterations {t}..: not run "
        "(a larger or harder validation set is needed to separate designs)"
    )


class RunState:
    """The files and caches of one run folder (``out``)."""

    def __init__(self, out: Path):
        self.out = out
        self.candidates: dict[int, Candidate] = {}
        self.train_states: dict[int, TrainState] = {}

    @property
    def trajectory_path(self) -> Path:
        return self.out / "trajectory.jsonl"

    def iter_dir(self, t: int) -> Path:
        return self.out / "iterations" / f"{t:03d}"

    def read_trajectory(self) -> list[TrajectoryEntry]:
        """Finished iterations on disk (the run-folder layer's log: a line torn by an interrupted
        write is cut off, so appending continues cleanly; damage anywhere else is an InputError
        naming the line)."""
        log = JsonlLog(self.trajectory_path)
        entries: list[TrajectoryEntry] = []
        for n, obj in enumerate(log.read(), start=1):
            try:
                e = TrajectoryEntry.model_validate(obj)
            except ValueError as exc:
                raise InputError(
                    f"not a trajectory entry ({exc})",
                    file=log.path,
                    line=n,
                    hint="rerun with --restart to start this run over",
                ) from None
            if e.iteration != len(entries):
                raise InputError(
                    f"iteration {e.iteration} follows iteration {len(entries) - 1}: the trajectory has a gap",
                    file=log.path,
                    line=n,
                    hint="rerun with --restart to start this run over",
                )
            entries.append(e)
        return entries

    def append(self, entry: TrajectoryEntry) -> None:
        JsonlLog(self.trajectory_path).append(entry.model_dump_json())

    def val_items(self, iteration: int) -> list[ItemResult]:
        """The per-item validation results an iteration wrote (``val/items.jsonl``). A scored
        iteration whose file is gone is an InputError: paired accept rules and parent selection
        would otherwise compare against no items."""
        path = self.iter_dir(iteration) / "val" / "items.jsonl"
        if not path.exists():
            raise InputError(
                f"iteration {iteration} is in the trajectory but its per-item validation results "
                "are missing",
                file=path,
                hint="restore the file from where the folder was copied, or rerun with --restart",
            )
        return [ItemResult.model_validate(obj) for obj in JsonlLog(path).read(repair=False)]

    def saved_proposal(
        self,
        t: int,
        name: str = "proposal.json",
        *,
        check: Callable[[Any], None] | None = None,
        retry_failed: bool = True,
    ) -> Proposal | None:
        """A proposal saved before an interruption, to reuse: None when there is none, it does not
        parse, ``check`` now refuses its design (the run's limits may have changed since, e.g.
        ``--max-build-calls``), or it failed and ``retry_failed`` (an LM failure is asked again)."""
        path = self.iter_dir(t) / name
        if not path.exists():
            return None
        try:
            saved = Proposal.model_validate_json(path.read_text(encoding="utf-8"))
        except ValueError:
            return None
        if check is not None and saved.design is not None:
            try:
                check(saved.design)
            except InputError:
                return None
        return None if retry_failed and saved.status == "failed" else saved

    def save_proposal(self, t: int, proposal: Proposal, name: str = "proposal.json") -> None:
        write_atomic(self.iter_dir(t) / name, proposal.model_dump_json(indent=2) + "\n")

    def keep_train_state(self, state: TrainState, *, evict: bool = False) -> TrainState:
        """Cache ``state``; with ``evict``, first drop the oldest beyond :data:`TRAIN_STATES_KEPT`."""
        while evict and len(self.train_states) >= TRAIN_STATES_KEPT:
            self.train_states.pop(next(iter(self.train_states)))
        self.train_states[state.iteration] = state
        return state
