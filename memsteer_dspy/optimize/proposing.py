"""What an iteration of MemSteer-Opt proposes from: the parent's training results, feedback, proposals.

:class:`Proposing` is mixed into :class:`~memsteer_dspy.optimize.loop.MemSteerOpt`: the parent
design run (or resumed) on the training items and its failures diagnosed, the feedback built from
them (``feedback.json`` / ``.md``), and the proposal asked for (or the one saved before an
interruption), with ``--proposals K`` the best of K by validation recall.
"""

from __future__ import annotations

from collections.abc import Mapping

from memsteer_dspy.memory.design import MemoryDesign
from memsteer_dspy.optimize.config import OptimizeConfig
from memsteer_dspy.optimize.diagnosis import diagnose_failures
from memsteer_dspy.optimize.evaluator import BuildCheck
from memsteer_dspy.optimize.feedback import Feedback, build_feedback
from memsteer_dspy.optimize.objectives import Score
from memsteer_dspy.optimize.state import RunState, TrainState
from memsteer_dspy.optimize.strategies.screening import best_by_recall
from memsteer_dspy.optimize.types import Proposal, Proposer, TrajectoryEntry
from memsteer_dspy.records import History, QAItem
from memsteer_dspy.runfolder import write_atomic


class Proposing:
    """The proposing part of :class:`~memsteer_dspy.optimize.loop.MemSteerOpt`, which sets up the
    attributes below and provides ``evaluate`` and ``_iter_dir``."""

    config: OptimizeConfig
    history: History
    train: list[QAItem]
    val: list[QAItem]
    state: RunState
    check: BuildCheck
    search_proposer: Proposer

    # -- training results and feedback --------------------------------------------------------
    def _train_state(self, design: MemoryDesign, t: int) -> TrainState:
        """Run (or resume) ``design`` on the training set and diagnose its failures."""
        folder = self._iter_dir(t)
        metrics = "recall" if self.config.objective == "recall" else "all"
        system, report = self.evaluate(design, self.train, metrics, folder / "train")
        errors: dict[str, str] = {}
        diagnoses = diagnose_failures(
            system, self.train, report.items, protocol=self.config.protocol, errors=errors
        )
        write_atomic(
            folder / "diagnosis.jsonl",
            "".join(d.model_dump_json() + "\n" for d in diagnoses.values()),
        )
        return TrainState(iteration=t, results=report.items, diagnoses=diagnoses, errors=errors)

    def _state_for(self, entry: TrajectoryEntry) -> TrainState:
        cached = self.state.train_states.get(entry.iteration)
        if cached is not None:
            return cached
        design = MemoryDesign.from_dict(entry.design)
        return self.state.keep_train_state(self._train_state(design, entry.iteration), evict=True)

    def _feedback(self, state: TrainState | None, t: int) -> tuple[Feedback | None, str]:
        """The parent's failure cases for iteration ``t`` (written to ``feedback.json`` / ``.md``),
        and their rendering within the feedback token budget; none for a proposer without use of it."""
        if state is None:
            return None, ""
        c, folder = self.config, self._iter_dir(t)
        feedback = build_feedback(
            self.train,
            state.results,
            state.diagnoses,
            self.history,
            mode=c.feedback,
            seed=c.seed,
            iteration=t,
            n_random=c.n_random,
            per_stage=c.per_stage,
        )
        text = feedback.render(c.feedback_tokens)
        write_atomic(folder / "feedback.json", feedback.model_dump_json(indent=2) + "\n")
        write_atomic(folder / "feedback.md", text + "\n")
        return feedback, text

    # -- propose ------------------------------------------------------------------------------
    def _ask(
        self,
        parent: MemoryDesign,
        entries: list[TrajectoryEntry],
        feedback_text: str,
        iteration: int,
        seen_extra: Mapping[str, str] | None = None,
    ) -> Proposal:
        seen = {
            e.design_key: f"iteration {e.iteration} ({e.status})" for e in entries if e.design_key
        }
        try:
            return self.search_proposer.propose(
                parent,
                [e.revision() for e in entries],
                feedback_text,
                seen={**seen, **(seen_extra or {})},
                iteration=iteration,
            )
        except Exception as exc:  # noqa: BLE001 - the proposer never stops the loop
            return Proposal(status="failed", error=f"{type(exc).__name__}: {exc}")

    def _propose(
        self, t: int, parent: MemoryDesign, entries: list[TrajectoryEntry], feedback_text: str
    ) -> Proposal:
        """This iteration's proposal: the one saved before an interruption (reused, never asked and
        paid for twice), else a new one; with ``--proposals K`` the best of K by recall."""
        proposal = self.state.saved_proposal(t, check=self.check)
        if proposal is None:
            proposal = self._ask(parent, entries, feedback_text, t)
            self.state.save_proposal(t, proposal)
        if self.config.proposals > 1 and proposal.status == "ok":
            proposal = self._best_of_k(t, parent, entries, feedback_text, proposal)
        return proposal

    def _best_of_k(
        self,
        t: int,
        parent: MemoryDesign,
        entries: list[TrajectoryEntry],
        feedback_text: str,
        first: Proposal,
    ) -> Proposal:
        """``--proposals K``: K-1 more proposals (each told the earlier ones, so they differ), all
        screened by retrieval-only recall on validation; returns the best, with every attempt."""
        found, attempts = [first], list(first.attempts)
        extra_seen = {first.design.key(): f"proposal 1 of iteration {t}"}
        for k in range(2, self.config.proposals + 1):
            name = f"proposal-{k}.json"
            prop = self.state.saved_proposal(t, name, retry_failed=False)
            if prop is None:
                prop = self._ask(parent, entries, feedback_text, t * 100 + k, extra_seen)
                self.state.save_proposal(t, prop, name)
            attempts += prop.attempts
            if prop.status == "ok" and prop.design is not None:
                extra_seen[prop.design.key()] = f"proposal {k} of iteration {t}"
                found.append(prop)
        best = None
        if len(found) > 1:
            folder = self._iter_dir(t)

            def recall_of(design: MemoryDesign, k: int) -> Score:
                _, rep = self.evaluate(design, self.val, "recall", folder / f"screen-{k}")
                return Score.from_summary(rep.summary, "recall")

            best = best_by_recall(found, recall_of, attempts)
        return best or first.model_copy(update={"attempts": attempts})
