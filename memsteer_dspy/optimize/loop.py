"""The MemSteer-Opt loop (paper, Section 3.3): evidence-guided memory-design optimization.

    score d0 on the fixed validation set; diagnose its training failures
    for t = 1..T:
        feedback  ← sample failure cases of d_t (mode: stratified by default)
        d'        ← proposer(d_t, design schema, revision history, feedback)
        A(d')     ← build d' (reusing stores and indexes) and score it on the validation set
        accept d' iff A(d') > A(d_t)  (ties rejected); after an accept, rerun the training set
                    to refresh diagnoses and feedback

The answerer, its prompt and the context budget stay fixed across candidates. Every proposal is kept
(``iterations/NNN/``), accepted or not, with its design, rationale, the feedback it was given, and
per-item validation results.

Output folder (everything needed to resume; a rerun continues from the last finished iteration):

* ``trajectory.jsonl`` — append-only, one :class:`TrajectoryEntry` per finished iteration (0 is d0);
* ``best_design.json`` — the current best design (rewritten after every iteration);
* ``summary.md`` — a table of iterations and the accepted path;
* ``run.json`` — the settings a resumed run must share, and the MLflow parent run id;
* ``iterations/NNN/`` — ``proposal.json``, ``design.json``, ``rationale.md``, ``feedback.md``,
  ``feedback.json``, ``val/items.jsonl`` (and ``val-recall/`` under recall-then-accuracy) and, for
  d0 and accepted designs, ``train/items.jsonl`` and ``diagnosis.jsonl``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from memsteer_dspy.errors import ConfigError, InputError
from memsteer_dspy.memory.design import MemoryDesign, store_build_calls
from memsteer_dspy.optimize.diagnosis import Diagnosis, diagnose_failures, stage_counts
from memsteer_dspy.optimize.feedback import FEEDBACK_MODES, Feedback, FeedbackMode, build_feedback
from memsteer_dspy.optimize.objectives import (
    OBJECTIVES,
    Objective,
    Score,
    accept,
    metrics_for,
    passes_screen,
    selected_by,
)
from memsteer_dspy.optimize.proposer import (
    DesignProposer,
    Proposal,
    ProposalAttempt,
    RevisionEntry,
    design_diff,
)
from memsteer_dspy.optimize.splits import ids_digest
from memsteer_dspy.records import History, QAItem
from memsteer_dspy.tracking import Tracker, flatten

Status = Literal["baseline", "accepted", "rejected", "invalid", "duplicate", "failed"]
COMPAT_KEYS = (
    "history_fingerprint",
    "objective",
    "feedback",
    "seed",
    "train_ids",
    "val_ids",
    "init_design_key",
    "protocol",
)
USAGE_KEYS = ("calls", "prompt_tokens", "completion_tokens", "total_tokens")


class OptimizeConfig(BaseModel):
    """Settings of one MemSteer-Opt run."""

    iterations: int = Field(20, ge=0, description="T: proposals after the initial design.")
    objective: Objective = "accuracy"
    feedback: FeedbackMode = "stratified"
    seed: int = 0
    n_random: int = Field(30, ge=1, description="Cases of the random30* modes.")
    per_stage: int = Field(10, ge=1, description="Cases per failure stage under 'stratified'.")
    feedback_tokens: int = Field(3000, ge=200, description="Token budget of the rendered feedback.")
    history_tokens: int = Field(
        900, ge=100, description="Token budget of the rendered revision history."
    )
    protocol: Literal["as_of", "full"] = "full"
    threads: int = Field(1, ge=1, description="QA items evaluated concurrently.")
    max_resamples: int = Field(3, ge=0, description="Re-samples of a duplicate proposal.")
    resample_temperature: float = Field(0.7, gt=0, le=2)
    max_build_calls: int | None = Field(
        None,
        ge=0,
        description="Most LM calls a candidate's store may take to build (fact extraction: one call "
        "per facts_batch records); a design over it is sent back to the proposer. None: no limit.",
    )
    proposer_output: Literal["design", "changes"] = Field(
        "design",
        description="'design': the whole revised design; 'changes': only the fields to change (small LMs).",
    )


class Cost(BaseModel):
    """LM calls and tokens (per role and in total) and wall time."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    seconds: float = 0.0
    by_role: dict[str, dict[str, int]] = Field(default_factory=dict)

    def plus(self, other: Cost) -> Cost:
        roles = {r: dict(v) for r, v in self.by_role.items()}
        for r, v in other.by_role.items():
            mine = roles.setdefault(r, dict.fromkeys(USAGE_KEYS, 0))
            for k in USAGE_KEYS:
                mine[k] = mine.get(k, 0) + v.get(k, 0)
        return Cost(
            calls=self.calls + other.calls, prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens, seconds=round(self.seconds + other.seconds, 3),
            by_role=roles,
        )  # fmt: skip

    def short(self) -> str:
        return f"{self.calls} LM calls, {self.total_tokens:,} tokens, {self.seconds:.0f}s"


class TrajectoryEntry(BaseModel):
    """One finished iteration (0: the initial design d0)."""

    iteration: int
    status: Status
    accepted: bool
    design: dict[str, Any] | None = None
    design_key: str | None = None
    parent_key: str | None = Field(None, description="Key of the design this one revised.")
    changes: list[str] = Field(default_factory=list)
    rationale: str = ""
    score: Score | None = Field(None, description="Validation score under the objective's metrics.")
    screen_score: Score | None = Field(None, description="recall-then-accuracy: the recall screen.")
    best_key: str = ""
    best_score: Score | None = None
    selected_by: str | None = None
    reason: str | None = Field(
        None, description="Why it was rejected, invalid, a duplicate or failed."
    )
    attempts: list[ProposalAttempt] = Field(default_factory=list)
    train_failures: dict[str, int] | None = Field(
        None, description="Failures per stage after a train refresh."
    )
    cost: Cost = Field(default_factory=Cost)
    cost_total: Cost = Field(default_factory=Cost)
    run_id: str | None = None
    finished_at: str = ""

    def revision(self) -> RevisionEntry:
        """How the proposer sees this entry in the revision history."""
        score = (
            self.score.short()
            if self.score
            else (self.screen_score.short() if self.screen_score else "")
        )
        note = self.reason or ""
        if self.status == "baseline":
            note = "the initial design"
        return RevisionEntry(iteration=self.iteration, status=self.status, changes=self.changes, score=score,
                             rationale=self.rationale, note=note)  # fmt: skip


class OptimizeResult(BaseModel):
    best_design: MemoryDesign
    best_score: Score
    baseline_score: Score
    entries: list[TrajectoryEntry]
    out_dir: str
    parent_run_id: str | None = None
    tracking_uri: str | None = None

    @property
    def accepted_path(self) -> list[int]:
        return [e.iteration for e in self.entries if e.accepted]


@dataclass
class _TrainState:
    """The current design's training results and diagnoses (the source of feedback)."""

    iteration: int
    results: list[Any]
    diagnoses: dict[str, Diagnosis]
    errors: dict[str, str] = field(default_factory=dict)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _usage_delta(
    before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]]
) -> Cost:
    roles: dict[str, dict[str, int]] = {}
    for role, now in after.items():
        was = before.get(role, {})
        d = {k: int(now.get(k, 0) or 0) - int(was.get(k, 0) or 0) for k in USAGE_KEYS}
        if any(d.values()):
            roles[role] = d
    return Cost(**{k: sum(r[k] for r in roles.values()) for k in USAGE_KEYS}, by_role=roles)


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


class MemSteerOpt:
    """One MemSteer-Opt run over one user's history (see the module docstring).

    Args:
        history: the user's history H.
        train, val: QA–evidence supervision (generated, or official QA split).
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
    """

    def __init__(
        self, history: History, train: list[QAItem], val: list[QAItem], out_dir: str | Path, *,
        config: OptimizeConfig | None = None, lms: Mapping[str, Any] | Callable[[str], Any] | None = None,
        init_design: MemoryDesign | None = None, proposer: DesignProposer | None = None,
        tracker: Tracker | None = None, cache_dir: str | Path | None = None,
        usage: Callable[[], Mapping[str, Mapping[str, Any]]] | None = None,
        on_event: Callable[[dict[str, Any]], None] | None = None, run_params: Mapping[str, Any] | None = None,
    ):  # fmt: skip
        self.config = config or OptimizeConfig()
        if self.config.objective not in OBJECTIVES:
            raise ConfigError(
                f"unknown objective {self.config.objective!r}; choose one of {', '.join(OBJECTIVES)}"
            )
        if self.config.feedback not in FEEDBACK_MODES:
            raise ConfigError(
                f"unknown feedback mode {self.config.feedback!r}; choose one of {', '.join(FEEDBACK_MODES)}"
            )
        if not train or not val:
            raise InputError(
                f"MemSteer-Opt needs training and validation QA items (got {len(train)} train, {len(val)} val)",
                hint="generate supervision (memsteer generate) or use --supervision official",
            )  # fmt: skip
        self.history = history
        self.train = train
        self.val = val
        self.out = Path(out_dir)
        self.d0 = init_design or MemoryDesign.base_bm25()
        self.fixed_budget = self.d0.context.budget_tokens
        self._lm_source = lms
        self._lms_used: dict[str, Any] = {}
        self._proposer = proposer
        self.tracker = tracker or Tracker.disabled()
        self.cache_dir = cache_dir
        self._usage = usage
        self.on_event = on_event
        self.run_params = dict(run_params or {})
        self._systems: dict[tuple[str, bool], Any] = {}
        self.parent_run_id: str | None = None

    # -- resources ----------------------------------------------------------------------------
    def lm(self, role: str) -> Any:
        src = self._lm_source
        if src is None:
            raise ConfigError(
                f"MemSteer-Opt needs an LM for the {role} role: pass lms={{'{role}': <dspy LM>}}"
            )
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
            self._proposer = DesignProposer(
                self.lm("proposer"), fixed_budget=self.fixed_budget, max_resamples=self.config.max_resamples,
                resample_temperature=self.config.resample_temperature, history_tokens=self.config.history_tokens,
                output=self.config.proposer_output, check=self._check_buildable,
            )  # fmt: skip
        elif self._proposer.fixed_budget is None:
            self._proposer.fixed_budget = self.fixed_budget
        return self._proposer

    def _check_buildable(self, design: MemoryDesign) -> None:
        """Raise :class:`InputError` naming the field when this machine cannot build ``design``: a
        model folder that is not there, or a store over the ``max_build_calls`` budget."""
        from memsteer_dspy.memory.embedders import check_local_models

        check_local_models(design)
        limit = self.config.max_build_calls
        needed = store_build_calls(design, len(self.history))
        if limit is not None and needed > limit:
            raise InputError(
                f"store.unit {design.store.unit!r} needs about {needed} LM calls to build over "
                f"{len(self.history)} records; this run allows {limit}",
                field="store.unit",
                hint="choose a unit that needs no LM to build: record, window, thread or section",
            )

    def system(self, design: MemoryDesign):
        """The memory system of ``design`` (store and index reused from the cache when they exist)."""
        from memsteer_dspy.memory.system import MemorySystem

        answering = self.config.objective != "recall"
        key = (design.key(), answering)
        if key not in self._systems:
            lms = {"answerer": self.lm("answerer")} if design.lm_uses(answering=answering) else {}
            system = MemorySystem.from_design(design, self.history, cache_dir=self.cache_dir, lms=lms,
                                              threads=self.config.threads)  # fmt: skip
            while len(self._systems) >= 2:  # the current design and one candidate
                self._systems.pop(next(iter(self._systems)))
            self._systems[key] = system
        return self._systems[key]

    def evaluate(self, design: MemoryDesign, items: list[QAItem], metrics: str, folder: Path):
        """Score ``design`` on ``items``; per-item results go to ``folder/items.jsonl`` (resumable)."""
        from memsteer_dspy.evaluation import evaluate_design

        system = self.system(design)
        judge = self.lm("judge") if metrics == "all" else None
        report = evaluate_design(system, items, metrics=metrics, judge_lm=judge, protocol=self.config.protocol,
                                 threads=self.config.threads, out_dir=folder)  # fmt: skip
        return system, report

    # -- files --------------------------------------------------------------------------------
    def _iter_dir(self, t: int) -> Path:
        return self.out / "iterations" / f"{t:03d}"

    def _settings(self) -> dict[str, Any]:
        c = self.config
        return {
            "history_fingerprint": self.history.fingerprint, "user": self.history.user_id, "objective": c.objective,
            "feedback": c.feedback, "seed": c.seed, "train_ids": ids_digest(self.train), "val_ids": ids_digest(self.val),
            "init_design_key": self.d0.key(), "protocol": c.protocol, "n_train": len(self.train), "n_val": len(self.val),
        }  # fmt: skip

    def _open_run_file(self) -> dict[str, Any]:
        path = self.out / "run.json"
        settings = self._settings()
        if path.exists():
            try:
                saved = json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise InputError(
                    f"not valid JSON: {exc.msg}",
                    file=path,
                    hint="delete it to start the run afresh",
                ) from None
            diff = [k for k in COMPAT_KEYS if saved.get(k) != settings.get(k)]
            if diff and (self.out / "trajectory.jsonl").exists():
                detail = "; ".join(
                    f"{k}: {saved.get(k)!r} here, {settings.get(k)!r} now" for k in diff
                )
                raise ConfigError(
                    f"{self.out} holds an optimization with other settings ({detail}); rerun with the same "
                    "history, supervision, objective, feedback mode, seed and initial design to resume it, or "
                    "pass a new --out folder"
                )
            settings = {**saved, **{k: v for k, v in settings.items() if k not in saved}}
        settings["iterations"] = self.config.iterations
        settings["config"] = self.config.model_dump(mode="json")
        return settings

    def _save_run_file(self, run: dict[str, Any]) -> None:
        _write_atomic(self.out / "run.json", json.dumps(run, indent=2, ensure_ascii=False) + "\n")

    def read_trajectory(self) -> list[TrajectoryEntry]:
        """Finished iterations on disk. A line cut by an interrupted write is dropped (and the
        file repaired), so appending continues cleanly."""
        path = self.out / "trajectory.jsonl"
        if not path.exists():
            return []
        text = path.read_text(encoding="utf-8")
        entries: list[TrajectoryEntry] = []
        good: list[str] = []
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                e = TrajectoryEntry.model_validate_json(line)
            except ValueError:
                continue
            if e.iteration != len(entries):
                break  # a gap means the rest is not trustworthy
            entries.append(e)
            good.append(line)
        repaired = "".join(g + "\n" for g in good)
        if repaired != text:
            _write_atomic(path, repaired)
        return entries

    def _append(self, entry: TrajectoryEntry) -> None:
        with open(self.out / "trajectory.jsonl", "a", encoding="utf-8") as f:
            f.write(entry.model_dump_json() + "\n")
            f.flush()
            os.fsync(f.fileno())

    # -- training results and feedback --------------------------------------------------------
    def _train_state(self, design: MemoryDesign, t: int) -> _TrainState:
        """Run (or resume) ``design`` on the training set and diagnose its failures."""
        folder = self._iter_dir(t)
        metrics = "recall" if self.config.objective == "recall" else "all"
        system, report = self.evaluate(design, self.train, metrics, folder / "train")
        errors: dict[str, str] = {}
        diagnoses = diagnose_failures(
            system, self.train, report.items, protocol=self.config.protocol, errors=errors
        )
        _write_atomic(
            folder / "diagnosis.jsonl",
            "".join(d.model_dump_json() + "\n" for d in diagnoses.values()),
        )
        return _TrainState(iteration=t, results=report.items, diagnoses=diagnoses, errors=errors)

    def _feedback(self, state: _TrainState, t: int) -> Feedback:
        c = self.config
        return build_feedback(self.train, state.results, state.diagnoses, self.history, mode=c.feedback, seed=c.seed,
                              iteration=t, n_random=c.n_random, per_stage=c.per_stage)  # fmt: skip

    # -- one candidate ------------------------------------------------------------------------
    def _score(
        self, design: MemoryDesign, folder: Path, current: Score | None
    ) -> tuple[Score | None, Score | None, str | None]:
        """(final score, recall screen score, reason) of a candidate on the validation set."""
        objective = self.config.objective
        screen = None
        if objective == "recall-then-accuracy" and current is not None:
            _, rep = self.evaluate(design, self.val, "recall", folder / "val-recall")
            screen = Score.from_summary(rep.summary, "recall")
            if not passes_screen(objective, screen, current):
                return None, screen, (f"screened out by recall ({screen.short()} vs the current "
                                      f"{current.short()}); not answered")  # fmt: skip
        metrics = metrics_for(objective)
        _, rep = self.evaluate(design, self.val, metrics, folder / "val")
        return Score.from_summary(rep.summary, metrics), screen, None

    def _propose(
        self, t: int, current: MemoryDesign, entries: list[TrajectoryEntry], feedback_text: str
    ) -> Proposal:
        path = self._iter_dir(t) / "proposal.json"
        if path.exists():  # proposed before an interruption: reuse, never ask (and pay) twice
            try:
                saved = Proposal.model_validate_json(path.read_text(encoding="utf-8"))
            except ValueError:
                saved = None
            if saved is not None and saved.design is not None:
                try:  # the run's limits may have changed since (e.g. --max-build-calls)
                    self._check_buildable(saved.design)
                except InputError:
                    saved = None
            if saved is not None and saved.status != "failed":  # an LM failure is asked again
                return saved
        seen = {
            e.design_key: f"iteration {e.iteration} ({e.status})" for e in entries if e.design_key
        }
        history = [e.revision() for e in entries]
        try:
            proposal = self.proposer(current, history, feedback_text, seen=seen, iteration=t)
        except Exception as exc:  # the proposer never stops the loop
            proposal = Proposal(status="failed", error=f"{type(exc).__name__}: {exc}")
        _write_atomic(path, proposal.model_dump_json(indent=2) + "\n")
        return proposal

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> OptimizeResult:
        """Run (or resume) the optimization; returns the best design and the trajectory."""
        self.out.mkdir(parents=True, exist_ok=True)
        run = self._open_run_file()
        entries = self.read_trajectory()
        self.parent_run_id = self.tracker.start_run(
            f"optimize-{self.history.user_id}", resume_run_id=run.get("parent_run_id"),
            tags={"memsteer.kind": "optimize", "memsteer.user": self.history.user_id},
        )  # fmt: skip
        if self.parent_run_id:
            run["parent_run_id"] = self.parent_run_id
            run["tracking_uri"] = self.tracker.uri
        self._save_run_file(run)
        self.tracker.log_params(self.parent_run_id, {
            **{k: run[k] for k in ("history_fingerprint", "user", "objective", "feedback", "seed", "protocol",
                                   "n_train", "n_val", "iterations", "init_design_key")},
            "init_design": self.d0.name, **self.run_params,
        })  # fmt: skip
        status = "FAILED"
        try:
            result = self._loop(entries)
            status = "FINISHED"
            return result
        except KeyboardInterrupt:
            status = "KILLED"
            raise
        finally:
            self._finish(status)

    def _loop(self, entries: list[TrajectoryEntry]) -> OptimizeResult:
        train_state: _TrainState | None = None
        if not entries:
            baseline, train_state = self._baseline()
            entries.append(baseline)
        current_entry = next(e for e in reversed(entries) if e.accepted)
        current = MemoryDesign.from_dict(current_entry.design)
        for t in range(len(entries), self.config.iterations + 1):
            if train_state is None or train_state.iteration != current_entry.iteration:
                train_state = self._train_state(current, current_entry.iteration)
            entry, new_state = self._iteration(t, current, current_entry, train_state, entries)
            entries.append(entry)
            if entry.accepted:
                current_entry, current = entry, MemoryDesign.from_dict(entry.design)
                train_state = new_state
            self._write_outputs(entries)
        self._write_outputs(entries)
        best = next(e for e in reversed(entries) if e.accepted)
        return OptimizeResult(
            best_design=MemoryDesign.from_dict(best.design), best_score=best.score, baseline_score=entries[0].score,
            entries=entries, out_dir=str(self.out), parent_run_id=self.parent_run_id,
            tracking_uri=self.tracker.uri if self.tracker.active else None,
        )  # fmt: skip

    def _baseline(self) -> tuple[TrajectoryEntry, _TrainState]:
        t0, before = time.perf_counter(), self.usage_snapshot()
        folder = self._iter_dir(0)
        d0 = self.d0
        folder.mkdir(parents=True, exist_ok=True)
        d0.save(folder / "design.json")
        run_id = self._start_candidate_run(0)
        score, _, _ = self._score(d0, folder, None)
        state = self._train_state(d0, 0)
        cost = _usage_delta(before, self.usage_snapshot())
        cost.seconds = round(time.perf_counter() - t0, 3)
        entry = TrajectoryEntry(
            iteration=0, status="baseline", accepted=True, design=d0.model_dump(mode="json"), design_key=d0.key(),
            score=score, best_key=d0.key(), best_score=score, selected_by="initial design",
            train_failures=stage_counts(state.diagnoses), cost=cost, cost_total=cost, run_id=run_id, finished_at=_now(),
        )  # fmt: skip
        self._track_candidate(entry, None, state)
        self._append(entry)
        self._event(entry)
        return entry, state

    def _iteration(
        self, t: int, current: MemoryDesign, current_entry: TrajectoryEntry, state: _TrainState,
        entries: list[TrajectoryEntry],
    ) -> tuple[TrajectoryEntry, _TrainState | None]:  # fmt: skip
        t0, before = time.perf_counter(), self.usage_snapshot()
        folder = self._iter_dir(t)
        folder.mkdir(parents=True, exist_ok=True)
        run_id = self._start_candidate_run(t)
        feedback = self._feedback(state, t)
        feedback_text = feedback.render(self.config.feedback_tokens)
        _write_atomic(folder / "feedback.json", feedback.model_dump_json(indent=2) + "\n")
        _write_atomic(folder / "feedback.md", feedback_text + "\n")
        proposal = self._propose(t, current, entries, feedback_text)
        current_score = current_entry.score
        entry = TrajectoryEntry(
            iteration=t, status="failed", accepted=False, parent_key=current.key(), attempts=proposal.attempts,
            rationale=proposal.rationale, best_key=current_entry.design_key or "", best_score=current_score,
        )  # fmt: skip
        new_state = None
        if proposal.status != "ok" or proposal.design is None:
            entry.status = "failed" if proposal.status == "failed" else proposal.status
            entry.reason = proposal.error or f"the proposal was {proposal.status}"
            if proposal.design is not None:
                entry.design = proposal.design.model_dump(mode="json")
                entry.changes = design_diff(current, proposal.design)
        else:
            design = proposal.design.model_copy(update={"name": f"opt-{t:03d}"})
            entry.design, entry.design_key = design.model_dump(mode="json"), design.key()
            entry.changes = design_diff(current, design)
            design.save(folder / "design.json")
            _write_atomic(folder / "rationale.md", f"# Iteration {t}\n\n{proposal.rationale.strip()}\n\n## Changes\n\n"
                          + "".join(f"- {c}\n" for c in entry.changes))  # fmt: skip
            try:
                score, screen, reason = self._score(design, folder, current_score)
            except (
                Exception
            ) as exc:  # a candidate that cannot be built or scored never stops the loop
                score, screen, reason = (
                    None,
                    None,
                    f"could not build or score the design: {type(exc).__name__}: {exc}",
                )
            entry.score, entry.screen_score = score, screen
            if score is None:
                entry.status = (
                    "rejected"
                    if screen is not None and reason and reason.startswith("screened")
                    else "failed"
                )
                entry.reason = reason
            elif accept(self.config.objective, score, current_score):
                entry.status, entry.accepted = "accepted", True
                entry.selected_by = selected_by(self.config.objective)
                entry.best_key, entry.best_score = design.key(), score
                new_state = self._train_state(design, t)
                entry.train_failures = stage_counts(new_state.diagnoses)
            else:
                entry.status = "rejected"
                entry.reason = f"not better than the current design ({current_score.short() if current_score else '-'})"
        cost = _usage_delta(before, self.usage_snapshot())
        cost.seconds = round(time.perf_counter() - t0, 3)
        entry.cost = cost
        entry.cost_total = entries[-1].cost_total.plus(cost)
        entry.run_id = run_id
        entry.finished_at = _now()
        self._track_candidate(entry, feedback, new_state, diagnosis_for_feedback=state)
        self._append(entry)
        self._event(entry)
        return entry, new_state

    # -- outputs ------------------------------------------------------------------------------
    def _event(self, entry: TrajectoryEntry) -> None:
        self.tracker.log_metrics(self.parent_run_id, {
            "best_score": entry.best_score.primary(self.config.objective) if entry.best_score else None,
            "best_accuracy": entry.best_score.accuracy if entry.best_score else None,
            "best_delivered_recall": entry.best_score.delivered_recall if entry.best_score else None,
            "best_recall_at_10": entry.best_score.recall_at_10 if entry.best_score else None,
            "candidate_accuracy": entry.score.accuracy if entry.score else None,
            "candidate_delivered_recall": (entry.score or entry.screen_score).delivered_recall if (entry.score or entry.screen_score) else None,
            "candidate_recall_at_10": (entry.score or entry.screen_score).recall_at_10 if (entry.score or entry.screen_score) else None,
            "accepted": float(entry.accepted), "cost_lm_calls": entry.cost_total.calls,
            "cost_tokens": entry.cost_total.total_tokens, "cost_seconds": entry.cost_total.seconds,
        }, step=entry.iteration)  # fmt: skip
        if self.on_event is not None:
            self.on_event({
                "iteration": entry.iteration, "total": self.config.iterations, "status": entry.status,
                "candidate": entry.score or entry.screen_score, "best": entry.best_score,
                "objective": self.config.objective, "cost_total": entry.cost_total, "reason": entry.reason,
                "changes": entry.changes,
            })  # fmt: skip

    def _start_candidate_run(self, t: int) -> str | None:
        if not self.tracker.active or not self.parent_run_id:
            return None
        marker = self._iter_dir(t) / "mlflow_run_id"
        previous = marker.read_text().strip() if marker.exists() else None
        run_id = self.tracker.start_run(f"iter-{t:03d}", parent_run_id=self.parent_run_id, resume_run_id=previous,
                                        tags={"memsteer.iteration": t})  # fmt: skip
        if run_id:
            _write_atomic(marker, run_id + "\n")
        return run_id

    def _track_candidate(
        self, entry: TrajectoryEntry, feedback: Feedback | None, new_state: _TrainState | None,
        diagnosis_for_feedback: _TrainState | None = None,
    ) -> None:  # fmt: skip
        rid = entry.run_id
        if not rid or not self.tracker.active:
            return
        folder = self._iter_dir(entry.iteration)
        tr = self.tracker
        params: dict[str, Any] = {"iteration": entry.iteration, "status": entry.status, "parent_key": entry.parent_key,
                                  "design_key": entry.design_key}  # fmt: skip
        if entry.design is not None:
            params.update(
                {
                    f"design.{k}": v
                    for k, v in flatten(
                        {k: v for k, v in entry.design.items() if k != "name"}
                    ).items()
                }
            )
        tr.log_params(rid, params)
        s = entry.score or entry.screen_score
        tr.log_metrics(rid, {
            "val_accuracy": s.accuracy if s else None, "val_qs": s.qs if s else None,
            "val_recall_at_10": s.recall_at_10 if s else None, "val_delivered_recall": s.delivered_recall if s else None,
            "lm_calls": entry.cost.calls, "lm_tokens": entry.cost.total_tokens,
            "lm_prompt_tokens": entry.cost.prompt_tokens, "lm_completion_tokens": entry.cost.completion_tokens,
            "wall_seconds": entry.cost.seconds,
            **({f"train_{k}_failures": v for k, v in entry.train_failures.items()} if entry.train_failures else {}),
        }, step=entry.iteration)  # fmt: skip
        tr.set_tags(rid, {"accepted": "true" if entry.accepted else "false", "status": entry.status,
                          "selected_by": entry.selected_by or "", "reason": entry.reason or ""})  # fmt: skip
        if (folder / ".tracked").exists():  # artifacts already logged before an interruption
            tr.end_run(rid)
            return
        if entry.design is not None:
            tr.log_dict(rid, entry.design, "design.json")
        tr.log_text(rid, f"# Iteration {entry.iteration} ({entry.status})\n\n{entry.rationale or '(initial design)'}\n\n"
                    + "## Changes\n\n" + ("".join(f"- {c}\n" for c in entry.changes) or "(none)\n")
                    + (f"\n## Outcome\n\n{entry.reason}\n" if entry.reason else ""), "rationale.md")  # fmt: skip
        for sub in ("val", "val-recall"):
            items = folder / sub / "items.jsonl"
            if items.exists():
                tr.log_table(rid, _item_rows(items), f"{sub}_items.json")
        if diagnosis_for_feedback is not None:
            tr.log_table(
                rid, [d.row() for d in diagnosis_for_feedback.diagnoses.values()], "diagnosis.json"
            )
        if new_state is not None:
            tr.log_table(
                rid, [d.row() for d in new_state.diagnoses.values()], "train_diagnosis.json"
            )
        if feedback is not None:
            tr.log_artifact(rid, folder / "feedback.md")
            tr.log_artifact(rid, folder / "feedback.json")
        if entry.attempts:
            tr.log_dict(
                rid, [a.model_dump(mode="json") for a in entry.attempts], "proposal_attempts.json"
            )
        if tr.active:
            (folder / ".tracked").write_text(_now() + "\n")
        tr.end_run(rid)

    def _write_outputs(self, entries: list[TrajectoryEntry]) -> None:
        best = next(e for e in reversed(entries) if e.accepted)
        design = MemoryDesign.from_dict(best.design)
        design.save(self.out / "best_design.json")
        _write_atomic(
            self.out / "summary.md",
            render_summary(entries, self.config, self.history, self._settings()),
        )

    def _finish(self, status: str) -> None:
        rid = self.parent_run_id
        if not rid:
            return
        for name in ("best_design.json", "trajectory.jsonl", "summary.md", "run.json"):
            self.tracker.log_artifact(rid, self.out / name)
        self.tracker.end_run(rid, status=status)


def _item_rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            trace = r.get("trace") or {}
            rows.append({
                "qa_id": r.get("qa_id"), "question": r.get("question"), "question_type": r.get("question_type"),
                "reference": r.get("reference"), "prediction": r.get("prediction"), "correct": r.get("correct"),
                "qs": r.get("qs"), "recall_at_10": r.get("recall_at_10"), "delivered_recall": r.get("delivered_recall"),
                "evidence_ids": r.get("evidence_ids"), "delivered_ids": trace.get("delivered_record_ids"),
                "error": r.get("error"),
            })  # fmt: skip
    return rows


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}"


def render_summary(
    entries: list[TrajectoryEntry],
    config: OptimizeConfig,
    history: History,
    settings: dict[str, Any],
) -> str:
    """``summary.md``: settings, baseline vs best, a table of iterations and the accepted path."""
    base, best = entries[0], next(e for e in reversed(entries) if e.accepted)
    total = entries[-1].cost_total
    lines = [
        f"# MemSteer-Opt: {history.user_id}",
        "",
        f"- history fingerprint `{history.fingerprint}`, {len(history)} records",
        f"- supervision: {settings.get('n_train')} train / {settings.get('n_val')} val items",
        f"- objective `{config.objective}`, feedback `{config.feedback}`, seed {config.seed}, "
        f"protocol `{config.protocol}`, iterations {len(entries) - 1} of {config.iterations}",
        f"- initial design `{base.design_key}`; best design `{best.design_key}` (iteration {best.iteration})",
        f"- validation: initial {base.score.short() if base.score else '-'}; best {best.score.short() if best.score else '-'}",
        f"- cost: {total.short()}",
        "",
        "| iter | status | val acc | QS | deliv. recall | R@10 | changes | selected by | LM calls | tokens | s |",
        "|---:|---|---:|---:|---:|---:|---|---|---:|---:|---:|",
    ]
    for e in entries:
        s = e.score or e.screen_score
        changes = (
            "; ".join(e.changes) if e.changes else ("(initial)" if e.status == "baseline" else "–")
        )
        if e.reason and not e.accepted:
            changes += f" — {e.reason}"
        changes = " ".join(changes.split()).replace("|", "\\|")
        if len(changes) > 300:
            changes = changes[:297] + "..."
        lines.append(
            f"| {e.iteration} | {e.status} | {_pct(s.accuracy if s else None)} | {_pct(s.qs if s else None)} | "
            f"{_pct(s.delivered_recall if s else None)} | {_pct(s.recall_at_10 if s else None)} | {changes} | "
            f"{e.selected_by or ''} | {e.cost.calls} | {e.cost.total_tokens:,} | {e.cost.seconds:.0f} |"
        )
    path = [e for e in entries if e.accepted]
    lines += ["", "## Accepted path", ""]
    for e in path:
        what = "; ".join(e.changes) if e.changes else "initial design"
        lines.append(f"- iteration {e.iteration} `{e.design_key}`: {e.score.short() if e.score else '-'} — {what}"
                     + (f" (selected by {e.selected_by})" if e.iteration else ""))  # fmt: skip
    return "\n".join(lines) + "\n"
