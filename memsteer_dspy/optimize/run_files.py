"""The run folder of a MemSteer-Opt run: its same-run key, LM-usage ledger, trajectory and outputs.

:class:`RunFiles` is mixed into :class:`~memsteer_dspy.optimize.loop.MemSteerOpt`: opening (or
resuming) the folder through the run-folder layer (:mod:`memsteer_dspy.runfolder`), the key a
resume must match, appending each finished entry to ``trajectory.jsonl`` with the session's LM
usage, and rewriting ``best_design.json`` and the summaries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from memsteer_dspy.memory.design import MemoryDesign
from memsteer_dspy.optimize.callbacks import CompositeCallback
from memsteer_dspy.optimize.config import OptimizeConfig, optimize_run_key, run_settings
from memsteer_dspy.optimize.feedback import Feedback
from memsteer_dspy.optimize.proposer import DesignProposer
from memsteer_dspy.optimize.state import RunState, TrainState
from memsteer_dspy.optimize.summary import write_outputs
from memsteer_dspy.optimize.types import (
    OptimizeResult,
    Proposer,
    TrajectoryEntry,
    usage_delta,
)
from memsteer_dspy.records import History, QAItem
from memsteer_dspy.runfolder import RunFolder


class RunFiles:
    """The run-folder part of :class:`~memsteer_dspy.optimize.loop.MemSteerOpt`, which sets up the
    attributes below and provides ``usage_snapshot``."""

    config: OptimizeConfig
    history: History
    train: list[QAItem]
    val: list[QAItem]
    test: list[QAItem]
    test_source: str
    d0: MemoryDesign
    out: Path
    restart: bool
    state: RunState
    callbacks: CompositeCallback
    search_proposer: Proposer
    folder: RunFolder | None
    _lm_source: Mapping[str, Any] | Callable[[str], Any] | None
    _proposer: DesignProposer | None
    _usage_start: dict[str, dict[str, int]]

    # -- the run folder -----------------------------------------------------------------------
    def _iter_dir(self, t: int) -> Path:
        return self.state.iter_dir(t)

    def _settings(self) -> dict[str, Any]:
        return run_settings(
            self.config,
            self.history,
            self.d0.key(),
            train=self.train,
            val=self.val,
            test=self.test,
            test_source=self.test_source,
        )

    def run_key(self) -> dict[str, Any]:
        """The same-run key of this optimization (:func:`memsteer_dspy.runfolder.run_key`): every
        setting that changes its trajectory or its held-out figures. A resume must match it field
        by field, or :class:`~memsteer_dspy.runfolder.RunMismatchError` names the fields that differ.

        It holds the history fingerprint, the protocol, the initial design's key, the content
        hashes of the train, validation and test items (``qa_hash.train`` / ``.val`` / ``.test``:
        an edited answer or evidence id counts, not just the ids), the LM identities (model and
        sampling settings) of the proposer (LM search only), the answerer and, unless the objective
        is ``recall``, the judge, and every :class:`OptimizeConfig` option but ``iterations`` and
        ``threads`` (objective, feedback, seed, search, accept rule and its parameters, ...)."""
        lms: dict[str, Any] = {"answerer": self._lm_or_none("answerer")}
        if self.config.objective != "recall":
            lms["judge"] = self._lm_or_none("judge")
        if self.search_proposer.uses_feedback:
            lms["proposer"] = (
                getattr(self._proposer, "lm", None)
                if self._proposer is not None
                else self._lm_or_none("proposer")
            )
        return optimize_run_key(
            self.config,
            self.history,
            self.d0.key(),
            train=self.train,
            val=self.val,
            test=self.test,
            lms=lms,
        )

    def _lm_or_none(self, role: str) -> Any:
        """The role's LM for the same-run key, without marking the role as used; None when this run
        has none for it (a role the run never needs, e.g. the answerer of a recall-only run)."""
        src = self._lm_source
        if src is None:
            return None
        if isinstance(src, Mapping):
            return src.get(role)
        try:
            return src(role)
        except Exception:  # noqa: BLE001 - a role that cannot be built is one this run must not need
            return None

    def _open_folder(self) -> RunFolder:
        """Open the run folder through the run-folder layer: resume only the same run (see
        :meth:`run_key`), ``restart`` empties it first. The settings beside the key in ``run.json``
        are descriptive (the report and summaries read them)."""
        folder = RunFolder.open(
            self.out,
            self.run_key(),
            restart=self.restart,
            legacy_files=("trajectory.jsonl",),
            extra=self._settings(),
        )
        folder.state["iterations"] = self.config.iterations
        folder.state["config"] = self.config.model_dump(mode="json")
        return folder

    def _save_usage(self) -> None:
        """This session's LM usage by role (since :meth:`run` started) into the folder's ledger."""
        if self.folder is not None:
            self.folder.add_usage(usage_delta(self._usage_start, self.usage_snapshot()).by_role)
            self.folder.save()

    def read_trajectory(self) -> list[TrajectoryEntry]:
        """Finished iterations on disk (:meth:`~memsteer_dspy.optimize.state.RunState.read_trajectory`)."""
        return self.state.read_trajectory()

    def _append(self, entry: TrajectoryEntry) -> None:
        self.state.append(entry)
        self._save_usage()

    # -- record -------------------------------------------------------------------------------
    def _record(
        self,
        entry: TrajectoryEntry,
        folder: Path,
        feedback: Feedback | None,
        feedback_state: TrainState | None,
        new_state: TrainState | None,
    ) -> None:
        """Announce the finished entry (listeners may stamp it), write it, announce it written."""
        self.callbacks.on_candidate_done(
            {
                "entry": entry,
                "folder": folder,
                "feedback": feedback,
                "feedback_state": feedback_state,
                "new_state": new_state,
            }
        )
        self._append(entry)
        self.callbacks.on_iteration_end(
            {"entry": entry, "total": self.config.iterations, "objective": self.config.objective}
        )

    def _write_outputs(
        self, entries: list[TrajectoryEntry], result: OptimizeResult | None = None
    ) -> None:
        write_outputs(self.out, entries, self.config, self.history, self._settings(), result)
