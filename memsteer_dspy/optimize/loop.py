"""The MemSteer-Opt engine (paper, Section 3.3): evidence-guided memory-design optimization.

    score d0 on the fixed validation set; diagnose its training failures
    for t = 1..T:
        parent    ← the current best (search 'hill') or a pool member (search 'population':
                    softmax over validation score, or the per-item Pareto front)
        feedback  ← sample failure cases of the parent (mode: stratified by default)
        d'        ← proposer(parent, design schema, revision history, feedback)  (or an Optuna
                    sample: search 'random' / 'tpe', no feedback)
        A(d')     ← build d' (reusing stores and indexes) and score it on the validation set
        accept d' iff the accept rule says it beats the current best ('strict': A(d') > A(d_t),
                    ties rejected; 'paired': a significant paired gain on the validation items),
                    and an LM-using retrieval beats the best LM-free design by the LM margin
        (--stop-at-max: stop early when the current best already scores the objective's maximum
        on validation: no rule can accept anything then, and every proposal is LM time for nothing)
    score d0 and the best design on the held-out test items; paired bootstrap verdict

One iteration reads propose → score → decide → screen → record; each step returns its value to the
next. The pieces live beside it, along GEPA's seams: the data types and protocols
(:mod:`~memsteer_dspy.optimize.types`), the settings and same-run key
(:mod:`~memsteer_dspy.optimize.config`), the run state (:mod:`~memsteer_dspy.optimize.state`), the
strategies (:mod:`~memsteer_dspy.optimize.strategies`: accept rules, parent selection, proposers,
screening), the parent's training results, feedback and proposals
(:mod:`~memsteer_dspy.optimize.proposing`), the run folder and trajectory
(:mod:`~memsteer_dspy.optimize.run_files`), the listeners
(:mod:`~memsteer_dspy.optimize.callbacks`: MLflow and the progress line) and the summary files
(:mod:`~memsteer_dspy.optimize.summary`). The answerer, its prompt and the
context budget stay fixed across candidates. Every proposal is kept (``iterations/NNN/``), accepted
or not, with its design, rationale, the feedback it was given, and per-item validation results.

Output folder (everything needed to resume; a rerun continues from the last finished iteration):

* ``trajectory.jsonl`` — append-only, one :class:`TrajectoryEntry` per finished iteration (0 is d0);
* ``best_design.json`` — the current best design (rewritten after every iteration);
* ``summary.md`` — settings, the held-out comparison, a table of iterations and the accepted path;
* ``summary.json`` — the result, machine-readable (``test``: n, source, initial, best, diff, ci95,
  verdict; every candidate's scores, retrieval LM calls per question and cost);
* ``run.json`` — the run-folder layer's file (:mod:`memsteer_dspy.runfolder`): the same-run ``key``
  (:meth:`MemSteerOpt.run_key`) a resume must match, the ``sessions`` with each one's LM usage by
  role, and beside them the settings, the test split and the MLflow parent run id;
* ``test/initial``, ``test/best-<design key>`` — per-item held-out results of the two designs;
* ``iterations/NNN/`` — ``proposal.json``, ``design.json``, ``rationale.md``, ``feedback.md``,
  ``feedback.json``, ``val/items.jsonl`` (and ``val-recall/`` under recall-then-accuracy,
  ``sub-K/`` for screened single-field sub-changes, ``screen-K/`` for ``--proposals K``) and, for
  d0 and accepted designs, ``train/items.jsonl`` and ``diagnosis.jsonl``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memsteer_dspy.errors import ConfigError, InputError
from memsteer_dspy.memory.design import MemoryDesign
from memsteer_dspy.optimize.callbacks import (
    RUN_PARAMS,
    CompositeCallback,
    MlflowCallback,
    ProgressCallback,
    progress_line,
)
from memsteer_dspy.optimize.config import (
    KEY_EXCLUDED,
    OptimizeConfig,
    val_items,
)
from memsteer_dspy.optimize.diagnosis import stage_counts
from memsteer_dspy.optimize.evaluator import (
    BuildCheck,
    HistoryEvaluator,
    candidate_of,
    retrieval_lm_calls,
)
from memsteer_dspy.optimize.feedback import FEEDBACK_MODES
from memsteer_dspy.optimize.objectives import (
    OBJECTIVES,
    at_ceiling,
    metrics_for,
    passes_screen,
    selected_by,
    unscored_fields,
)
from memsteer_dspy.optimize.proposer import DesignProposer
from memsteer_dspy.optimize.proposing import Proposing
from memsteer_dspy.optimize.run_files import RunFiles
from memsteer_dspy.optimize.state import RunState, TrainState, best_of, ceiling_reason, now
from memsteer_dspy.optimize.strategies.acceptance import Judge, accept_rule, guards_of
from memsteer_dspy.optimize.strategies.lm_proposer import LMProposer
from memsteer_dspy.optimize.strategies.optuna_proposer import OptunaProposer
from memsteer_dspy.optimize.strategies.parents import parent_selector
from memsteer_dspy.optimize.strategies.screening import (
    SubScreens,
    screen_subchanges,
)
from memsteer_dspy.optimize.summary import render_summary
from memsteer_dspy.optimize.types import (
    USAGE_KEYS,
    Candidate,
    Cost,
    Decision,
    Evaluator,
    OptimizeResult,
    Proposal,
    Proposer,
    Score,
    TrajectoryEntry,
    design_diff,
    usage_delta,
)
from memsteer_dspy.records import History, QAItem
from memsteer_dspy.runfolder import RunFolder, write_atomic
from memsteer_dspy.stats import PairedComparison, compare_item_results
from memsteer_dspy.tracking import Tracker

# Kept importable from here (the experiment scripts, the demo and older callers use these names).
_usage_delta = usage_delta
__all__ = [
    "KEY_EXCLUDED",
    "USAGE_KEYS",
    "Cost",
    "MemSteerOpt",
    "OptimizeConfig",
    "OptimizeResult",
    "TrajectoryEntry",
    "best_of",
    "ceiling_reason",
    "lm_usage",
    "progress_line",
    "render_summary",
]


def lm_usage(lm: Any) -> dict[str, int]:
    """Calls and tokens an LM has used so far: its role meter if it has one, else its history."""
    meter, role = getattr(lm, "meter", None), getattr(lm, "role", None)
    if meter is not None and role is not None:
        u = meter.by_role().get(role, {})
        return {k: int(u.get(k, 0)) for k in USAGE_KEYS}
    history = list(getattr(lm, "history", []) or [])
    out = dict.fromkeys(USAGE_KEYS, 0)
    out["calls"] = len(history)
    for h in history:
        usage = h.get("usage") or {}
        for k in USAGE_KEYS[1:]:
            v = usage.get(k)
            out[k] += int(v) if isinstance(v, (int, float)) else 0
    return out


@dataclass
class Scored:
    """A design scored on the validation items: the final score (None when screened out or not
    scorable), the recall screen's score, why it has no final score, and its per-item results."""

    score: Score | None
    screen: Score | None = None
    reason: str | None = None
    items: list[Any] | None = None


@dataclass
class Verdict:
    """What deciding on a proposal found: the entry's status, whether (and which design) was
    accepted, the accept rule's statistic, and the reason of a rejection."""

    status: str
    accepted: MemoryDesign | None = None
    stats: dict[str, Any] | None = None
    reason: str | None = None


class MemSteerOpt(RunFiles, Proposing):
    """One MemSteer-Opt run over one user's history (see the module docstring).

    Args:
        history: the user's history H.
        train: QA–evidence supervision to learn from (generated, or the official QA split).
        val: the validation items that select (with ``val_from='train+val'``, the training items too).
        out_dir: the run's folder (created; an existing one is resumed).
        config: :class:`OptimizeConfig`.
        lms: role → LM (``answerer``, ``judge``, ``proposer``), or a function role → LM called
            only when a role is needed (the ``recall`` objective answers nothing).
        init_design: d0 (default Base-BM25); ``--init-design`` for transfer and continuation.
        proposer: a ready :class:`DesignProposer` (default: one on ``lms('proposer')``).
        tracker: MLflow :class:`~memsteer_dspy.tracking.Tracker` (default: none).
        cache_dir: where stores and indexes are kept and reused across candidates.
        usage: function returning role → {calls, prompt_tokens, completion_tokens, total_tokens}
            (the CLI passes ``lm_config.usage_by_role``); default: from the LMs used.
        on_event: called with a dict after d0 and after each iteration (progress display).
        run_params: extra parameters to record on the MLflow parent run (supervision, LMs, ...).
        test: held-out QA items the run never uses for feedback or selection; at the end (and on
            resume) the initial and the best design are scored on them and compared (paired
            bootstrap interval and verdict: :attr:`OptimizeResult.test`, ``summary.json``, MLflow).
        test_source: where the test items came from (recorded in ``run.json`` and the summary).
        evaluator: an :class:`~memsteer_dspy.optimize.types.Evaluator` (default: a
            :class:`~memsteer_dspy.optimize.evaluator.HistoryEvaluator` over ``history``).
        search_proposer: a :class:`~memsteer_dspy.optimize.types.Proposer` (default: from
            ``config.search``: the LM proposer, or Optuna's random / TPE sampler).
        restart: empty ``out_dir`` and start over. Without it an existing folder resumes, and only
            if its same-run key (:meth:`run_key`) equals this run's: otherwise
            :class:`~memsteer_dspy.runfolder.RunMismatchError` names the differing fields.
    """

    def __init__(
        self,
        history: History,
        train: list[QAItem],
        val: list[QAItem],
        out_dir: str | Path,
        *,
        config: OptimizeConfig | None = None,
        lms: Mapping[str, Any] | Callable[[str], Any] | None = None,
        init_design: MemoryDesign | None = None,
        proposer: DesignProposer | None = None,
        tracker: Tracker | None = None,
        cache_dir: str | Path | None = None,
        usage: Callable[[], Mapping[str, Mapping[str, Any]]] | None = None,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        run_params: Mapping[str, Any] | None = None,
        test: list[QAItem] | None = None,
        test_source: str = "",
        evaluator: Evaluator | None = None,
        search_proposer: Proposer | None = None,
        restart: bool = False,
    ):
        self.config = c = config or OptimizeConfig()
        _check_inputs(c, train, val, test or [])
        self.history, self.train, self.out = history, train, Path(out_dir)
        self.val = val_items(train, val, c)
        self.d0 = init_design or MemoryDesign.base_bm25()
        self.fixed_budget = self.d0.context.budget_tokens
        self._lm_source, self._lms_used = lms, {}
        self._proposer = proposer
        self.cache_dir, self._usage = cache_dir, usage
        self.run_params = dict(run_params or {})
        self.test, self.test_source = list(test or []), test_source
        self.restart = restart
        self.state = RunState(self.out)
        self.tracking = MlflowCallback(
            tracker or Tracker.disabled(), self.state.iter_dir, c.objective
        )
        listeners: list[Any] = [self.tracking] + ([ProgressCallback(on_event)] if on_event else [])
        self.callbacks = CompositeCallback(listeners)
        self.check = BuildCheck(history, len(self.val), c)
        self.evaluator: Evaluator = evaluator or HistoryEvaluator(
            history,
            lm=self.lm,
            protocol=c.protocol,
            threads=c.threads,
            cache_dir=cache_dir,
            answering=c.objective != "recall",
        )
        self.rule, self.guards = accept_rule(c), guards_of(c)
        self.judge = Judge(self.rule, self.guards, c.objective, c.lm_retrieval_margin)
        self.selector = parent_selector(c.search, c.parents, c.objective, c.softmax_temperature)
        self.search_proposer = search_proposer or self._default_proposer()
        if c.proposals > 1 and not self.search_proposer.uses_feedback:
            raise ConfigError(
                "--proposals K applies to the LM proposer (--search hill or population)"
            )
        self.folder: RunFolder | None = None
        self._usage_start: dict[str, dict[str, int]] = {}

    def _default_proposer(self) -> Proposer:
        c = self.config
        if c.search in ("random", "tpe"):
            return OptunaProposer(c.search, self.d0, c.objective, seed=c.seed)
        return LMProposer(lambda: self.proposer)

    # -- resources ----------------------------------------------------------------------------
    @property
    def tracker(self) -> Tracker:
        return self.tracking.tracker

    @property
    def parent_run_id(self) -> str | None:
        return self.tracking.parent_run_id

    def lm(self, role: str) -> Any:
        src = self._lm_source
        lm = None
        if src is not None:
            lm = src(role) if callable(src) and not isinstance(src, Mapping) else src.get(role)
        if lm is None:
            raise ConfigError(
                f"MemSteer-Opt needs an LM for the {role} role: pass lms={{'{role}': <dspy LM>}}"
            )
        self._lms_used[role] = lm
        return lm

    def usage_snapshot(self) -> dict[str, dict[str, int]]:
        if self._usage is not None:
            return {r: dict(v) for r, v in self._usage().items()}
        return {role: lm_usage(lm) for role, lm in self._lms_used.items()}

    @property
    def proposer(self) -> DesignProposer:
        if self._proposer is None:
            c = self.config
            self._proposer = DesignProposer(
                self.lm("proposer"),
                fixed_budget=self.fixed_budget,
                max_resamples=c.max_resamples,
                resample_temperature=c.resample_temperature,
                history_tokens=c.history_tokens,
                output=c.proposer_output,
                check=self.check,
                tabu=c.tabu,
                unscored=unscored_fields(c.objective),
            )
        elif self._proposer.fixed_budget is None:
            self._proposer.fixed_budget = self.fixed_budget
        return self._proposer

    def _check_buildable(self, design: MemoryDesign) -> None:
        """Raise :class:`InputError` naming the field when this run cannot build ``design``
        (:class:`~memsteer_dspy.optimize.evaluator.BuildCheck`)."""
        self.check(design)

    def system(self, design: MemoryDesign):
        """The memory system of ``design`` (store and index reused from the cache when they exist)."""
        system = getattr(self.evaluator, "system", None)
        if system is None:
            raise ConfigError("this run's evaluator builds no single memory system")
        return system(design)

    def evaluate(self, design: MemoryDesign, items: list[QAItem], metrics: str, folder: Path):
        """Score ``design`` on ``items``; per-item results go to ``folder/items.jsonl`` (resumable)."""
        return self.evaluator.evaluate(design, items, metrics, folder)

    # -- candidates ---------------------------------------------------------------------------
    def _candidate_of(
        self, iteration: int, design: MemoryDesign, score: Score, items: list[Any]
    ) -> Candidate:
        return candidate_of(
            iteration, design, score, items, self.val, self.config.objective, self.config.guard
        )

    def candidate(self, entry: TrajectoryEntry) -> Candidate:
        """A scored entry as accept rules and parent selectors see it (per-item validation scores
        read back from its ``val/items.jsonl``; where that file is gone and validation needs no
        LM, the same design is scored again on the same items — the file of a run folder copied
        without its bulky per-item results)."""
        cache = self.state.candidates
        if entry.iteration not in cache:
            design = MemoryDesign.from_dict(entry.design)
            folder = self.state.iter_dir(entry.iteration) / "val"
            metrics = metrics_for(self.config.objective)
            if metrics == "recall" and not (folder / "items.jsonl").exists():
                items = self.evaluate(design, self.val, metrics, folder)[1].items
            else:
                items = self.state.val_items(entry.iteration)
            cache[entry.iteration] = self._candidate_of(entry.iteration, design, entry.score, items)
        return cache[entry.iteration]

    def pool(self, entries: list[TrajectoryEntry]) -> list[Candidate]:
        """Every scored design so far (the population search's pool)."""
        return [
            self.candidate(e)
            for e in entries
            if e.score is not None
            and e.design is not None
            and e.status in ("baseline", "accepted", "rejected")
        ]

    def _best_lm_free(self, entries: list[TrajectoryEntry]) -> Candidate | None:
        free = [c for c in self.pool(entries) if not c.uses_lm]
        if not free:
            return None
        objective = self.config.objective
        return max(free, key=lambda c: (c.score.primary(objective) or 0.0, c.score.recall_key()))

    def _decide(
        self, cand: Candidate, incumbent: Candidate, entries: list[TrajectoryEntry]
    ) -> Decision:
        return self.judge.decide(cand, incumbent, self._best_lm_free(entries))

    # -- score --------------------------------------------------------------------------------
    def _score(self, design: MemoryDesign, folder: Path, current: Score | None) -> Scored:
        """A candidate's score on the validation set (behind the recall screen under
        ``recall-then-accuracy``)."""
        objective = self.config.objective
        screen = None
        if objective == "recall-then-accuracy" and current is not None:
            _, rep = self.evaluate(design, self.val, "recall", folder / "val-recall")
            screen = Score.from_summary(rep.summary, "recall")
            if not passes_screen(objective, screen, current):
                return Scored(
                    None,
                    screen,
                    (
                        f"screened out by recall ({screen.short()} vs the current "
                        f"{current.short()}); not answered"
                    ),
                )
        metrics = metrics_for(objective)
        _, rep = self.evaluate(design, self.val, metrics, folder / "val")
        return Scored(Score.from_summary(rep.summary, metrics), screen, None, rep.items)

    def _try_score(self, design: MemoryDesign, folder: Path, current: Score | None) -> Scored:
        try:
            return self._score(design, folder, current)
        except Exception as exc:  # noqa: BLE001 - a candidate that cannot be built or scored never stops the loop
            return Scored(
                None, None, f"could not build or score the design: {type(exc).__name__}: {exc}"
            )

    # -- decide -------------------------------------------------------------------------------
    def _judge(
        self,
        t: int,
        design: MemoryDesign,
        scored: Scored,
        incumbent: Candidate,
        entries: list[TrajectoryEntry],
    ) -> Verdict:
        """Accept, reject or fail a scored proposal (a screened-out one is rejected)."""
        if scored.score is None:
            screened = (
                scored.screen is not None and scored.reason and scored.reason.startswith("screened")
            )
            return Verdict("rejected" if screened else "failed", reason=scored.reason)
        cand = self._candidate_of(t, design, scored.score, scored.items or [])
        self.state.candidates[t] = cand
        decision = self._decide(cand, incumbent, entries)
        if decision.accepted:
            return Verdict("accepted", design, decision.stats or None)
        return Verdict("rejected", None, decision.stats or None, decision.reason)

    # -- screen -------------------------------------------------------------------------------
    def _screens_subchanges(self) -> bool:
        c = self.config  # the random/TPE baselines keep their evaluation budget
        return (
            c.screen_subchanges and c.objective == "recall" and self.search_proposer.uses_feedback
        )

    def _screen(
        self,
        t: int,
        parent: MemoryDesign,
        proposed: MemoryDesign,
        incumbent: Candidate,
        entries: list[TrajectoryEntry],
    ) -> SubScreens | None:
        """Score each single-field sub-change of a rejected or failed multi-field proposal."""

        def score(design: MemoryDesign, i: int) -> tuple[Score, Candidate]:
            self.check(design)
            scored = self._score(design, self._iter_dir(t) / f"sub-{i}", incumbent.score)
            return scored.score, self._candidate_of(t, design, scored.score, scored.items or [])

        seen = {e.design_key for e in entries if e.design_key}
        return screen_subchanges(
            t,
            parent,
            proposed,
            seen,
            self.config.objective,
            score=score,
            decide=lambda cand: self._decide(cand, incumbent, entries),
        )

    def _adopt_subchange(
        self, t: int, parent: MemoryDesign, entry: TrajectoryEntry, screens: SubScreens
    ) -> MemoryDesign:
        """Make the accepted sub-change this iteration's design: the entry, ``design.json`` and
        ``val/items.jsonl`` (the pool reads the entry's per-item results from there)."""
        sub, cand, folder = screens.chosen.design, screens.chosen.candidate, self._iter_dir(t)
        entry.screen_score = entry.score
        entry.score, entry.design, entry.design_key = (
            cand.score,
            sub.model_dump(mode="json"),
            sub.key(),
        )
        entry.reason = (
            f"the proposal as a whole was {entry.status} ({entry.reason}); its sub-change "
            f"{'; '.join(design_diff(parent, sub))} was accepted on its own"
        )
        entry.changes = design_diff(parent, sub)
        entry.retrieval_lm_calls = cand.retrieval_lm_calls
        entry.status, entry.accepted = "accepted", True
        self.state.candidates[t] = cand
        sub.save(folder / "design.json")
        src = folder / f"sub-{screens.chosen.index}" / "val" / "items.jsonl"
        if src.exists():
            write_atomic(folder / "val" / "items.jsonl", src.read_text(encoding="utf-8"))
        return sub

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> OptimizeResult:
        """Run (or resume) the optimization; returns the best design and the trajectory."""
        self._usage_start = self.usage_snapshot()
        self.folder = self._open_folder()
        run = self.folder.state
        entries = self.read_trajectory()
        params = {
            **{k: run[k] for k in RUN_PARAMS},
            "init_design": self.d0.name,
            **self.run_params,
        }
        self.callbacks.on_run_start(
            {"user_id": self.history.user_id, "state": run, "params": params}
        )
        self.folder.save()
        status = "FAILED"
        try:
            result = self._loop(entries)
            status = "FINISHED"
            return result
        except KeyboardInterrupt:
            status = "KILLED"
            raise
        finally:
            try:
                self._save_usage()
                self.callbacks.on_run_end({"status": status, "out": self.out})
            finally:
                self.folder.close()

    def _loop(self, entries: list[TrajectoryEntry]) -> OptimizeResult:
        if not entries:
            entries.append(self._baseline())
        for e in entries:  # a resumed Optuna search rebuilds its study from the trajectory
            self.search_proposer.observe(e)
        stopped = None
        for t in range(len(entries), self.config.iterations + 1):
            best_entry = best_of(entries)
            if self.config.stop_at_max and at_ceiling(self.config.objective, best_entry.score):
                stopped = ceiling_reason(best_entry, t)
                self.callbacks.on_stopped({"reason": stopped})
                break
            parent_entry = self._parent(t, entries, best_entry)
            state = self._state_for(parent_entry) if self.search_proposer.uses_feedback else None
            entry = self._iteration(t, parent_entry, best_entry, state, entries)
            entries.append(entry)
            self.search_proposer.observe(entry)
            self._write_outputs(entries)
        self._write_outputs(entries)
        best = best_of(entries)
        result = OptimizeResult(
            best_design=MemoryDesign.from_dict(best.design),
            best_score=best.score,
            baseline_score=entries[0].score,
            entries=entries,
            out_dir=str(self.out),
            parent_run_id=self.parent_run_id,
            tracking_uri=self.tracker.uri if self.tracker.active else None,
            best_iteration=best.iteration,
            stopped=stopped,
        )
        result.test = self._held_out(entries)
        self._write_outputs(entries, result)
        return result

    def _parent(
        self, t: int, entries: list[TrajectoryEntry], best_entry: TrajectoryEntry
    ) -> TrajectoryEntry:
        """The entry whose design iteration ``t`` revises (the selector's choice from the pool)."""
        if self.selector.name == "hill":
            return best_entry
        rng = random.Random(f"parent:{self.config.seed}:{t}")
        chosen = self.selector.select(self.pool(entries), self.candidate(best_entry), rng)
        return entries[chosen.iteration]

    def _held_out(self, entries: list[TrajectoryEntry]) -> PairedComparison | None:
        """Score the initial and the best design on the test items and compare them (resumable:
        ``test/initial`` and ``test/best-<design key>`` keep per-item results)."""
        if not self.test:
            return None
        objective = self.config.objective
        metrics = metrics_for(objective)
        initial = MemoryDesign.from_dict(entries[0].design)
        chosen = MemoryDesign.from_dict(best_of(entries).design)
        _, r0 = self.evaluate(initial, self.test, metrics, self.out / "test" / "initial")
        # one folder per chosen design: a run resumed with more iterations can choose another
        # design, whose held-out scoring must not meet the earlier best's per-item results
        same = chosen.key() == initial.key()
        folder = self.out / "test" / ("initial" if same else f"best-{chosen.key()}")
        _, r1 = self.evaluate(chosen, self.test, metrics, folder)
        primary = "delivered_recall" if objective == "recall" else "accuracy"
        comp = compare_item_results(
            r0.items,
            r1.items,
            answered=metrics == "all",
            primary=primary,
            source=self.test_source,
            seed=self.config.seed,
        )
        self.callbacks.on_held_out(
            {"comparison": comp, "primary": primary, "source": self.test_source}
        )
        return comp

    def _baseline(self) -> TrajectoryEntry:
        t0, before = time.perf_counter(), self.usage_snapshot()
        folder, d0 = self._iter_dir(0), self.d0
        folder.mkdir(parents=True, exist_ok=True)
        d0.save(folder / "design.json")
        self.callbacks.on_iteration_start({"iteration": 0, "folder": folder})
        scored = self._score(d0, folder, None)
        state = None
        if self.search_proposer.uses_feedback:
            state = self.state.keep_train_state(self._train_state(d0, 0))
        cost = usage_delta(before, self.usage_snapshot())
        cost.seconds = round(time.perf_counter() - t0, 3)
        entry = TrajectoryEntry(
            iteration=0,
            status="baseline",
            accepted=True,
            design=d0.model_dump(mode="json"),
            design_key=d0.key(),
            score=scored.score,
            best_key=d0.key(),
            best_score=scored.score,
            selected_by="initial design",
            train_failures=stage_counts(state.diagnoses) if state else None,
            cost=cost,
            cost_total=cost,
            finished_at=now(),
            retrieval_lm_calls=retrieval_lm_calls(d0),
        )
        self._record(entry, folder, None, None, state)
        return entry

    def _iteration(
        self,
        t: int,
        parent_entry: TrajectoryEntry,
        best_entry: TrajectoryEntry,
        state: TrainState | None,
        entries: list[TrajectoryEntry],
    ) -> TrajectoryEntry:
        """One iteration: propose → score → decide → screen → record."""
        t0, before = time.perf_counter(), self.usage_snapshot()
        folder = self._iter_dir(t)
        folder.mkdir(parents=True, exist_ok=True)
        self.callbacks.on_iteration_start({"iteration": t, "folder": folder})
        parent = MemoryDesign.from_dict(parent_entry.design)
        feedback, feedback_text = self._feedback(state, t)
        proposal = self._propose(t, parent, entries, feedback_text)
        entry = TrajectoryEntry(
            iteration=t,
            status="failed",
            accepted=False,
            parent_key=parent.key(),
            attempts=proposal.attempts,
            rationale=proposal.rationale,
            best_key=best_entry.design_key or "",
            best_score=best_entry.score,
            parent_iteration=parent_entry.iteration,
            search_params=proposal.search_params,
        )
        if proposal.status != "ok" or proposal.design is None:
            _record_unusable(entry, parent, proposal)
            accepted = None
        else:
            accepted = self._candidate_step(t, parent, proposal, best_entry, entries, entry)
        new_state = self._accepted(t, entry, accepted) if accepted is not None else None
        entry.cost = usage_delta(before, self.usage_snapshot())
        entry.cost.seconds = round(time.perf_counter() - t0, 3)
        entry.cost_total = entries[-1].cost_total.plus(entry.cost)
        entry.finished_at = now()
        self._record(entry, folder, feedback, state, new_state)
        return entry

    def _candidate_step(
        self,
        t: int,
        parent: MemoryDesign,
        proposal: Proposal,
        best_entry: TrajectoryEntry,
        entries: list[TrajectoryEntry],
        entry: TrajectoryEntry,
    ) -> MemoryDesign | None:
        """Score, decide and (when it is rejected) screen a usable proposal; returns the accepted
        design, if any, having filled in the entry."""
        folder = self._iter_dir(t)
        design = proposal.design.model_copy(update={"name": f"opt-{t:03d}"})
        entry.design, entry.design_key = design.model_dump(mode="json"), design.key()
        entry.changes = design_diff(parent, design)
        entry.retrieval_lm_calls = retrieval_lm_calls(design)
        design.save(folder / "design.json")
        write_atomic(
            folder / "rationale.md",
            f"# Iteration {t}\n\n{proposal.rationale.strip()}\n\n## Changes\n\n"
            + "".join(f"- {c}\n" for c in entry.changes),
        )
        scored = self._try_score(design, folder, best_entry.score)
        entry.score, entry.screen_score = scored.score, scored.screen
        incumbent = self.candidate(best_entry)
        verdict = self._judge(t, design, scored, incumbent, entries)
        entry.status, entry.accepted = verdict.status, verdict.accepted is not None
        entry.accept_stats, entry.reason = verdict.stats, verdict.reason
        if entry.accepted or not self._screens_subchanges():
            return verdict.accepted
        screens = self._screen(t, parent, design, incumbent, entries)
        if screens is None:
            return None
        entry.sub_screens.extend(screens.screens)
        entry.tried_alone = screens.tried
        if screens.chosen is None:
            return None
        return self._adopt_subchange(t, parent, entry, screens)

    def _accepted(self, t: int, entry: TrajectoryEntry, design: MemoryDesign) -> TrainState | None:
        """Record an accepted design as the new best; with a feedback-using proposer, run it on the
        training items (the next iterations' feedback) and return that state."""
        entry.selected_by = selected_by(self.config.objective) + (
            f" ({self.rule.name} rule)" if self.rule.name != "strict" else ""
        )
        entry.best_key, entry.best_score = design.key(), entry.score
        if not self.search_proposer.uses_feedback:
            return None
        new_state = self.state.keep_train_state(self._train_state(design, t))
        entry.train_failures = stage_counts(new_state.diagnoses)
        return new_state


def _check_inputs(
    c: OptimizeConfig, train: list[QAItem], val: list[QAItem], test: list[QAItem]
) -> None:
    """Refuse an unknown objective or feedback mode, missing supervision, or test items that are
    also train or validation items."""
    if c.objective not in OBJECTIVES:
        raise ConfigError(
            f"unknown objective {c.objective!r}; choose one of {', '.join(OBJECTIVES)}"
        )
    if c.feedback not in FEEDBACK_MODES:
        raise ConfigError(
            f"unknown feedback mode {c.feedback!r}; choose one of {', '.join(FEEDBACK_MODES)}"
        )
    if not train or not val:
        raise InputError(
            f"MemSteer-Opt needs training and validation QA items (got {len(train)} train, {len(val)} val)",
            hint="generate supervision (memsteer generate) or use --supervision official",
        )
    overlap = {q.id for q in test} & {q.id for q in [*train, *val]}
    if overlap:
        raise InputError(
            f"{len(overlap)} test item(s) are also train or validation items (e.g. {sorted(overlap)[0]!r})",
            field="--test",
            hint="held-out items must be ones the optimizer never sees",
        )


def _record_unusable(entry: TrajectoryEntry, parent: MemoryDesign, proposal: Proposal) -> None:
    """An invalid, duplicate or failed proposal: its status, why, and the design it named if any."""
    entry.status = "failed" if proposal.status == "failed" else proposal.status
    entry.reason = proposal.error or f"the proposal was {proposal.status}"
    if proposal.design is not None:
        entry.design = proposal.design.model_dump(mode="json")
        entry.changes = design_diff(parent, proposal.design)
