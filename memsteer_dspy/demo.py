"""``memsteer demo``: the whole MemSteer method once, on the demo history shipped in the package.

The demo is the README's first command. On the embedded local LM (or any LM given with ``--lm``) it
runs the paper's pipeline end to end for one user, Nora Whitfield (``memsteer_dspy.demo_data``):

1. **supervision** — MemSteer turns her unlabeled history into verified QA–evidence supervision
   (:func:`~memsteer_dspy.supervision.run.generate_supervision`), split into train and validation;
2. **optimization** — MemSteer-Opt revises the memory design from Base-BM25 with evidence-guided
   feedback, accepting a revision only when it scores strictly better on validation
   (:class:`~memsteer_dspy.optimize.loop.MemSteerOpt`), tracked in MLflow;
3. **evaluation** — Base-BM25 and the best design are scored on the demo's hand-written QA set
   (never used for optimization): accuracy, QS, R@10, LM calls, tokens and wall time, side by side.

The answer-context budget is the same for both designs (the paper holds it fixed). Every stage
writes to its own subfolder of ``out_dir`` and resumes there, so a rerun reuses finished work:

=========================  ==========================================================================
``supervision/``           ``generate`` output: train.jsonl, val.jsonl, rejected.jsonl, summary.json
``optimize/``              ``optimize`` output: best_design.json, trajectory.jsonl, summary.md, ...
``eval/<design>/recall/``  R@k on every hand-written item (retrieval only)
``eval/<design>/answer/``  accuracy and QS on the answered items (answerer + judge)
``eval/<design>/cost.json`` LM calls, tokens and seconds spent evaluating that design
``indexes/``               built stores and indexes, shared by every design
``mlflow.db``              the MLflow store (``mlflow ui --backend-store-uri sqlite:///<out>/mlflow.db``)
``demo.json``              the settings and the result; ``results.md`` the table
=========================  ==========================================================================

Two sizes: ``small`` (the default) is sized for a 2-core CPU with the embedded 1.5B model
(measured on an AVX2-only 2-core AMD EPYC: 12 min, nearly all of it generating supervision; the README
has every timing) by generating a handful of items, optimizing for delivered recall for a few
iterations (no answering during optimization; stopped early once the best design is at the
maximum on validation) and comparing the designs on R@10 and delivered recall over every
hand-written item with a smaller (fixed) context, answering none unless ``--accuracy-items N``
asks; ``full`` runs the paper-sized version. :meth:`DemoSettings.sized_down` says what
a size changes relative to ``full``, and the demo prints it.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from memsteer_dspy.errors import ConfigError
from memsteer_dspy.memory.design import DEFAULT_CONTEXT_BUDGET, MemoryDesign
from memsteer_dspy.optimize.defaults import ResolvedDefaults, resolve_defaults
from memsteer_dspy.optimize.objectives import Objective
from memsteer_dspy.records import QAItem
from memsteer_dspy.runfolder import RunFolder, run_key, write_atomic

__all__ = [
    "SIZES",
    "DemoResult",
    "DemoSettings",
    "DesignRow",
    "StageReport",
    "accuracy_subset",
    "demo_settings",
    "run_demo",
]

SizeName = Literal["small", "full"]
SETTINGS_FILE = "demo.json"
RESULTS_FILE = "results.md"
USAGE_KEYS = ("calls", "cache_hits", "prompt_tokens", "completion_tokens", "total_tokens")


class DemoSettings(BaseModel):
    """How big one demo run is: supervision, optimization and evaluation budgets.

    ``context_budget`` is the answer-context budget of *both* designs compared (Base-BM25 starts
    with it and MemSteer-Opt keeps it fixed). ``accuracy_items`` hand-written items are answered
    and judged (None: all of them); R@10 is always measured on every hand-written item.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    size: str = Field("small", description="The size's name (small, full, or custom).")
    n_supervision: int = Field(ge=2, description="Accepted QA items wanted from generation.")
    max_candidates: int = Field(ge=1, description="Candidates tried at most during generation.")
    supervision_seconds: float | None = Field(
        None,
        gt=0,
        description="Generation starts no new candidate after this many seconds (None: no limit), "
        "so that a slower CPU ends the stage with fewer items instead of overrunning the demo.",
    )
    bundle_profile: Literal["auto", "small", "full"] = Field(
        "auto", description="Bundle profile: 'small' for a local LM, 'full' for an API LM, or auto."
    )
    iterations: int = Field(ge=0, description="MemSteer-Opt proposals after Base-BM25.")
    objective: Objective | None = Field(
        None,
        description="MemSteer-Opt's objective; None: by the LMs (recall when the answerer runs "
        "in-process, else accuracy; memsteer_dspy.optimize.defaults). A run resolves it at start.",
    )
    paper: bool = Field(
        False,
        description="MemSteer-Opt's options left unset take the paper's setting whatever LMs run "
        "(otherwise the small-proposer setting when the proposer runs in-process).",
    )
    feedback_tokens: int = Field(
        3000, ge=200, description="Token budget of the proposer's feedback."
    )
    per_stage: int = Field(10, ge=1, description="Feedback cases per failure stage (stratified).")
    accuracy_items: int | None = Field(
        None,
        ge=0,
        description="Hand-written items answered and judged (None: all; 0: none, the designs are "
        "compared on R@10 and delivered recall only).",
    )
    context_budget: int = Field(
        DEFAULT_CONTEXT_BUDGET, ge=64, description="The fixed answer-context budget (tokens)."
    )
    answer_max_tokens: int | None = Field(
        None, ge=16, description="Cap on each answer's length in evaluation (None: the LM's own)."
    )
    max_resamples: int = Field(3, ge=0, description="Re-samples of a duplicate proposal.")
    seed: int = 0
    threads: int = Field(1, ge=1, description="Items / candidates run concurrently (API LMs).")

    def identity(self) -> dict[str, Any]:
        """What a resumed run must share with the run it continues (``threads`` may change;
        ``paper`` is left out when off, as demos written before it behaved)."""
        return self.model_dump(
            mode="json", exclude={"threads"} | ({"paper"} if not self.paper else set())
        )

    def resolve(self, lm_config: Any) -> tuple[DemoSettings, ResolvedDefaults]:
        """These settings with the objective resolved for ``lm_config``'s LMs, and MemSteer-Opt's
        LM-dependent options (the size's objective and feedback budget given, the rest auto)."""
        resolved = resolve_defaults(
            {"objective": self.objective, "feedback_tokens": self.feedback_tokens},
            proposer_in_process=lm_config.in_process("proposer"),
            answerer_in_process=lm_config.in_process("answerer"),
            paper=self.paper,
        )
        return self.model_copy(update={"objective": resolved.values["objective"]}), resolved

    def sized_down(self, reference: DemoSettings | None = None) -> list[str]:
        """What this size changes relative to ``reference`` (default: the full size), in words."""
        ref = reference or SIZES["full"]
        out: list[str] = []
        if self.n_supervision < ref.n_supervision:
            within = (
                f" within {self.supervision_seconds / 60:g} min"
                if self.supervision_seconds is not None
                else ""
            )
            out.append(
                f"supervision: {self.n_supervision} accepted QA items wanted from at most "
                f"{self.max_candidates} candidates{within} (full: {ref.n_supervision} from "
                f"{ref.max_candidates})"
            )
        if self.iterations < ref.iterations:
            out.append(f"optimization: {self.iterations} iterations (full: {ref.iterations})")
        if self.objective != ref.objective:
            out.append(
                f"optimization objective: {self.objective} (full: {ref.objective or 'by the LMs'}; "
                + (
                    "candidates are scored by delivered recall, no answering during optimization)"
                    if self.objective == "recall"
                    else "candidates are screened by recall before they are answered)"
                )
            )
        if self.max_resamples < ref.max_resamples:
            out.append(
                f"a proposal repeating an earlier design is re-sampled {self.max_resamples} time(s) "
                f"(full: {ref.max_resamples})"
            )
        if self.feedback_tokens < ref.feedback_tokens or self.per_stage < ref.per_stage:
            out.append(
                f"proposer feedback: {self.per_stage} cases per failure stage within "
                f"{self.feedback_tokens} tokens (full: {ref.per_stage} within {ref.feedback_tokens})"
            )
        if self.accuracy_items == 0 and ref.accuracy_items != 0:
            out.append(
                "accuracy and QS: not measured, no hand-written item is answered (full: all; "
                "--accuracy-items N answers N); R@10 and delivered recall on all of them"
            )
        elif self.accuracy_items is not None and (
            ref.accuracy_items is None or self.accuracy_items < ref.accuracy_items
        ):
            out.append(
                f"accuracy and QS: {self.accuracy_items} hand-written items, stratified by question "
                "type (full: all); R@10 on all of them"
            )
        if (
            self.accuracy_items != 0
            and self.answer_max_tokens is not None
            and (ref.answer_max_tokens is None or self.answer_max_tokens < ref.answer_max_tokens)
        ):
            out.append(
                f"answers: at most {self.answer_max_tokens} tokens each, for both designs "
                "(full: the LM's own limit)"
            )
        if self.context_budget < ref.context_budget:
            out.append(
                f"answer context: {self.context_budget} tokens for both designs "
                f"(full: {ref.context_budget})"
            )
        return out


SIZES: dict[str, DemoSettings] = {
    # Sized for about 15 minutes on a 2-core CPU with the embedded 1.5B model (measured 11 min 34 s
    # on an AVX2-only one, README). Supervision: 8 accepted items wanted (about 5 train / 3
    # validation) from at most 40 candidates, with the lean-anchor pipeline (skipped bundles count as
    # candidates and cost no LM call), and no candidate started after 10 minutes: the yield on this
    # history swung between 5 and 8 of 30 with small changes (README), and a slower CPU (the AMX
    # Xeon: 14 min 51 s for 30) ends the stage with fewer items instead of overrunning the demo.
    # The designs are compared on R@10 and delivered recall
    # (the recall objective's metric) on all 34 hand-written items; answering them with the 1.5B
    # model cost 3 min per design for 6 items in the first measured run (README), so the small
    # size answers none unless asked (--accuracy-items).
    "small": DemoSettings(
        size="small",
        n_supervision=8,
        max_candidates=40,
        supervision_seconds=600,
        bundle_profile="auto",
        iterations=3,
        objective="recall",
        feedback_tokens=1500,
        per_stage=3,
        accuracy_items=0,
        context_budget=1000,
        answer_max_tokens=128,
        max_resamples=1,
    ),
    # The paper-sized run: meant for an API LM or a GPU (hours on the embedded model on a CPU). Its
    # objective follows the LMs: the embedded answerer answers "I don't know" to the RHELM items
    # tried, so accuracy would select on zeros; an API answerer keeps the paper's accuracy.
    "full": DemoSettings(
        size="full",
        n_supervision=100,
        max_candidates=500,
        bundle_profile="auto",
        iterations=20,
        objective=None,
        feedback_tokens=3000,
        per_stage=10,
        accuracy_items=None,
        context_budget=DEFAULT_CONTEXT_BUDGET,
    ),
}
"""The demo's sizes: ``small`` (default) and ``full``."""


def demo_settings(size: str = "small", **overrides: Any) -> DemoSettings:
    """The settings of a named size, with ``overrides`` applied (a changed size is named ``custom``)."""
    if size not in SIZES:
        raise ConfigError(f"unknown demo size {size!r}; choose one of {', '.join(SIZES)}")
    base = SIZES[size]
    if not overrides:
        return base
    values = {**base.model_dump(), **overrides}
    if any(base.model_dump().get(k) != v for k, v in overrides.items() if k != "threads"):
        values["size"] = overrides.get("size", f"{size}-custom")
    return DemoSettings(**values)


def accuracy_subset(items: list[QAItem], n: int | None) -> list[QAItem]:
    """``n`` items taken round-robin across question types (each type in file order), returned in
    file order; all items when ``n`` is None or not smaller than the set."""
    if n is None or n >= len(items):
        return list(items)
    if n <= 0:
        return []
    by_type: dict[str, list[QAItem]] = {}
    for q in items:
        by_type.setdefault(q.question_type or "unknown", []).append(q)
    chosen: set[str] = set()
    queues = [list(v) for v in by_type.values()]
    while len(chosen) < n:
        for queue in queues:
            if queue and len(chosen) < n:
                chosen.add(queue.pop(0).id)
    return [q for q in items if q.id in chosen]


# --------------------------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------------------------


class StageReport(BaseModel):
    """One stage of the demo: what it did this time and how long it took."""

    name: str
    status: Literal["ran", "resumed", "reused", "skipped"]
    seconds: float = 0.0
    detail: str = ""


class DesignRow(BaseModel):
    """One design scored on the hand-written QA set (a row of the demo's table)."""

    label: str
    design_name: str
    design_key: str
    accuracy: float | None = None
    qs: float | None = None
    n_answered: int = 0
    recall_at_10: float | None = None
    delivered_recall: float | None = None
    n_recall: int = 0
    lm_calls: int = 0
    cache_hits: int = 0
    tokens: int = 0
    cost_usd: float | None = Field(
        None, description="Dollar cost by LiteLLM's price map; None when no call was priced."
    )
    seconds: float = 0.0
    errors: int = 0
    same_as: str | None = Field(
        None, description="The row this one repeats (the best design is the initial one)."
    )
    item_correct: dict[str, float | None] = Field(
        default_factory=dict,
        description="Per answered hand-written item (qa id): 1 correct, 0 not, None failed; for a "
        "paired comparison of two designs on the same items.",
    )
    item_recall: dict[str, float | None] = Field(
        default_factory=dict, description="Per hand-written item (qa id): its R@10."
    )
    item_delivered: dict[str, float | None] = Field(
        default_factory=dict, description="Per hand-written item (qa id): its delivered recall."
    )


class DemoResult(BaseModel):
    """What ``memsteer demo`` did: settings, each stage, the side-by-side table and where it all is."""

    out_dir: str
    settings: DemoSettings
    sized_down: list[str] = Field(default_factory=list)
    user: str
    records: int
    lm: dict[str, str] = Field(default_factory=dict)
    stages: list[StageReport] = Field(default_factory=list)
    supervision: dict[str, Any] = Field(default_factory=dict)
    optimization: dict[str, Any] = Field(default_factory=dict)
    rows: list[DesignRow] = Field(default_factory=list)
    heldout: dict[str, Any] | None = Field(
        None,
        description="MemSteer-Opt vs Base-BM25 on the hand-written items the optimizer never saw: "
        "the same object as an optimize run's summary.json 'test' (n, initial, best, diff, ci95, "
        "verdict), paired bootstrap over items.",
    )
    tracking_uri: str | None = None
    mlflow_ui: str | None = None
    tracking_failure: str | None = None
    notes: list[str] = Field(default_factory=list)
    seconds: float = 0.0
    lm_usage: dict[str, dict[str, Any]] = Field(default_factory=dict)

    def table(self) -> str:
        """The side-by-side table (accuracy, QS, R@10, delivered recall, LM calls, tokens, time)."""
        answered = self.rows[0].n_answered if self.rows else 0
        recalled = self.rows[0].n_recall if self.rows else 0
        head = (
            f"| design | accuracy ({answered} QA) | QS | R@10 ({recalled} QA) | delivered recall "
            "| LM calls | tokens | cost | wall time |"
        )
        lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in self.rows:
            label = r.label + (f" (= {r.same_as})" if r.same_as else "")
            calls = f"{r.lm_calls}" + (f" (+{r.cache_hits} cached)" if r.cache_hits else "")
            lines.append(
                f"| {label} | {_pct(r.accuracy)} | {_pct(r.qs)} | {_pct(r.recall_at_10)} | "
                f"{_pct(r.delivered_recall)} | {calls} | {r.tokens:,} | {_usd(r.cost_usd)} | "
                f"{_secs(r.seconds)} |"
            )
        return "\n".join(lines)

    def render(self) -> str:
        """The report printed at the end: table, what was sized down, where the outputs are."""
        s = self.settings
        lines = [
            f"MemSteer demo ({s.size}) on {self.user}'s history ({self.records} records), "
            f"LM {_lm_summary(self.lm)}",
            "",
            self.table(),
            "",
            f"Both designs answer from the same {s.context_budget:,}-token context budget. "
            "LM calls, tokens, cost and wall time are those of evaluating each design on the hand-written "
            "set (cost: LiteLLM's price map; '-' for models it does not price, like the embedded one).",
        ]
        sup = self.supervision
        if sup:
            lines.append(
                f"Supervision: {sup.get('accepted', 0)} QA items accepted of {sup.get('candidates', 0)} "
                f"candidates ({sup.get('train', 0)} train / {sup.get('val', 0)} validation)."
            )
            if st := sup.get("steering"):
                n_val = st["separated_in"].get("validation", 0)
                lines.append(
                    f"Steering (LM-free panel, diagnosis only): the validation items separate {n_val} "
                    "design score(s)"
                    + (
                        " — they tie every design, so the optimizer has nothing to choose by"
                        if n_val <= 1
                        else ""
                    )
                    + f"; Base-BM25 R@10 {_pct(st['base_r10_generated'])} on "
                    f"the generated items vs {_pct(st['base_r10_reference'])} on the hand-written ones."
                )
        opt = self.optimization
        if opt.get("ran"):
            path = ", ".join(str(i) for i in opt.get("accepted_path", []))
            lines.append(
                f"Optimization: {opt['iterations']} iterations, objective {opt['objective']}; "
                f"validation {opt['baseline']} -> {opt['best']} (accepted path: {path})."
            )
            if opt.get("stopped"):
                lines.append(f"  stopped early: {opt['stopped']}")
            for change in opt.get("changes", []):
                lines.append(f"  best design: {change}")
        h = self.heldout
        if h:
            from memsteer_dspy.stats import points, points_ci

            m = h["primary"]
            lines.append(
                f"Held-out ({h['n']} hand-written QA the optimizer never saw): MemSteer-Opt - Base-BM25 "
                f"on {m} = {points(h['diff'].get(m))} points, 95% interval "
                f"{points_ci(h['ci95'].get(m))} (paired bootstrap): {h['verdict']}"
                + (
                    " — the method did not beat Base-BM25 here."
                    if h["verdict"] != "better"
                    else "."
                )
            )
        if self.sized_down:
            lines += [
                "",
                f"Sized down for the {s.size} run (`memsteer demo --size full` runs the full size):",
            ]
            lines += [f"  - {x}" for x in self.sized_down]
        if self.notes:
            lines += [""] + [f"Note: {n}" for n in self.notes]
        lines += ["", "Stages:"]
        for st in self.stages:
            lines.append(f"  {st.name:<18} {st.status:<8} {_secs(st.seconds):>7}  {st.detail}")
        lines.append(f"  {'total':<18} {'':<8} {_secs(self.seconds):>7}")
        out = Path(self.out_dir)
        lines += [
            "",
            f"Outputs in {out}: {RESULTS_FILE}, {SETTINGS_FILE}, supervision/, optimize/, eval/",
        ]
        if self.mlflow_ui:
            lines.append(f"MLflow runs: {self.tracking_uri}")
            lines.append(f"Open them with: {self.mlflow_ui}")
        elif self.tracking_failure:
            lines.append(
                f"MLflow tracking failed ({self.tracking_failure}); the local files are complete."
            )
        return "\n".join(lines)


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}"


def _secs(v: float) -> str:
    return f"{v:.0f}s" if v < 120 else f"{int(v // 60)}m{int(v % 60):02d}s"


def _lm_summary(lm: Mapping[str, str]) -> str:
    models = sorted(set(lm.values()))
    if len(models) == 1:
        return models[0]
    return ", ".join(f"{role}={model}" for role, model in lm.items())


# --------------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------------


def _usage(lm_config: Any) -> dict[str, float]:
    total: dict[str, float] = dict.fromkeys((*USAGE_KEYS, "cost_usd"), 0)
    for u in lm_config.usage_by_role().values():
        for k in USAGE_KEYS:
            total[k] += int(u.get(k, 0) or 0)
        total["cost_usd"] += float(u.get("cost_usd") or 0.0)
    return total


def _usd(cost: float | None) -> str:
    return "-" if cost is None else f"${cost:,.4f}"


class _CostBook:
    """The LM calls, tokens and seconds spent evaluating one design, kept in ``cost.json`` and
    added to after every finished item, so a resumed evaluation reports the whole cost."""

    def __init__(self, path: Path, lm_config: Any):
        self.path = path
        self.lm_config = lm_config
        self.totals: dict[str, float | None] = {k: 0 for k in (*USAGE_KEYS, "seconds")}
        self.totals["cost_usd"] = None  # nothing priced yet
        if path.exists():
            try:
                saved = json.loads(path.read_text(encoding="utf-8"))
                self.totals.update({k: saved.get(k, v) for k, v in self.totals.items()})
            except (json.JSONDecodeError, AttributeError):
                pass  # a torn file from an interrupted write: start the book afresh
        self.items = 0
        self._mark()

    def _mark(self) -> None:
        self._usage = _usage(self.lm_config)
        self._t = time.perf_counter()

    def book(self, *, item: bool = True) -> None:
        """Add what was spent since the last booking: after a finished item (``item``), or at
        the end, when only LM usage is added (a fully resumed evaluation adds no time)."""
        now = _usage(self.lm_config)
        for k in USAGE_KEYS:
            self.totals[k] += now[k] - self._usage[k]
        if now["cost_usd"] != self._usage["cost_usd"]:
            spent = now["cost_usd"] - self._usage["cost_usd"]
            self.totals["cost_usd"] = (self.totals.get("cost_usd") or 0.0) + spent
        self.items += item
        if self.items:
            self.totals["seconds"] = round(
                self.totals["seconds"] + time.perf_counter() - self._t, 3
            )
        self._mark()
        write_atomic(self.path, json.dumps(self.totals, indent=2) + "\n")


class _Progress:
    """Stage lines and progress bars: to stderr (True), to a function (lines only), or nowhere."""

    def __init__(self, progress: bool | Callable[[str], None]):
        self.fn = progress if callable(progress) else None
        self.bars = progress is True

    def __call__(self, line: str) -> None:
        if self.fn is not None:
            self.fn(line)
        elif self.bars:
            print(line, file=sys.stderr, flush=True)

    def bar(self, total: int, desc: str, initial: int = 0):
        if not self.bars:
            return None
        from tqdm import tqdm

        return tqdm(
            total=total, initial=initial, desc=desc, unit="QA", dynamic_ncols=True, file=sys.stderr
        )


def _check_folder(out: Path, identity: dict[str, Any], *, restart: bool = False) -> RunFolder:
    """The demo's same-run check, through the run-folder layer: a folder holding a demo with
    other settings (size, LMs, history) is a RunMismatchError naming them; ``restart`` empties it.
    The returned folder holds the writer lock until it is closed."""
    return RunFolder.open(
        out, run_key("demo", options=identity), restart=restart, legacy_files=(SETTINGS_FILE,)
    )


def run_demo(
    out_dir: str | Path,
    lm_config: Any,
    *,
    size: str = "small",
    settings: DemoSettings | None = None,
    cache_dir: str | Path | None = None,
    tracking_uri: str | None = None,
    tracking: bool = True,
    progress: bool | Callable[[str], None] = True,
    restart: bool = False,
    steering: bool | str | Path = True,
) -> DemoResult:
    """Run (or resume) the demo into ``out_dir`` and return its result (also in ``demo.json``).

    Args:
        out_dir: the demo's folder; a rerun with the same settings and LMs resumes it.
        lm_config: an :class:`~memsteer_dspy.lm.LMConfig` (role → LM; the embedded model by default).
        size: ``"small"`` (sized for a 2-core CPU with the embedded model; 12 min measured on
            an AVX2-only one) or ``"full"``.
        settings: explicit :class:`DemoSettings` instead of a named size (tests, custom runs).
        cache_dir: where stores and indexes are kept (default ``out_dir/indexes``).
        tracking_uri: MLflow tracking URI (default ``$MLFLOW_TRACKING_URI``, else
            ``sqlite:///<out_dir>/mlflow.db``).
        tracking: False writes only the local files.
        progress: True prints stage lines and progress bars to stderr; a function receives the
            stage lines instead; False is silent.
        restart: empty ``out_dir`` first instead of resuming (a folder holding a demo with other
            settings is otherwise a :class:`~memsteer_dspy.runfolder.RunMismatchError`).
        steering: score the steering panel on the accepted and the hand-written items (a
            diagnosis, LM-free; True: the package's panel, a path: that panel, False: skip).
    """
    from memsteer_dspy.demo_data import load_demo
    from memsteer_dspy.tracking import Tracker

    t_start = time.perf_counter()
    settings, resolved = (settings or demo_settings(size)).resolve(lm_config)
    out = Path(out_dir).expanduser()
    say = _Progress(progress)
    loaded = load_demo()
    history = loaded.history
    described = lm_config.describe()
    identity = {**settings.identity(), "lm": described, "history_fingerprint": history.fingerprint}
    folder = _check_folder(out, identity, restart=restart)  # held (one writer) until the demo ends
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(cache_dir).expanduser() if cache_dir is not None else out / "indexes"
    if tracking:
        tracker = Tracker.for_history(out, history.user_id, history.fingerprint, uri=tracking_uri)
    else:
        tracker = Tracker.disabled()
    result = DemoResult(
        out_dir=str(out.resolve()),
        settings=settings,
        sized_down=settings.sized_down(),
        user=history.user_id,
        records=len(history),
        lm=described,
    )
    _save(out, identity, result)
    d0 = MemoryDesign.base_bm25()
    d0 = d0.model_copy(
        update={"context": d0.context.model_copy(update={"budget_tokens": settings.context_budget})}
    )
    say(
        f"MemSteer demo ({settings.size}) on {history.user_id}: {len(history)} records, "
        f"{len(loaded.qa_items)} hand-written QA items; LM {_lm_summary(described)}; output {out}"
    )
    for line in result.sized_down:
        say(f"  sized down: {line}")
    say(f"  MemSteer-Opt {resolved.line()}")

    # 1. supervision ----------------------------------------------------------------------------
    train, val = _supervision(history, lm_config, out / "supervision", settings, say, result)
    _save(out, identity, result)
    if (train or val) and steering is not False:  # does it steer? a diagnosis: nothing reads it
        panel = None if steering is True else Path(steering)
        _steering(history, loaded.qa_items, out / "supervision", d0, panel, cache, say, result)
        _save(out, identity, result)

    # 2. optimization ---------------------------------------------------------------------------
    best = _optimize(
        history,
        train,
        val,
        d0,
        lm_config,
        out / "optimize",
        settings,
        resolved,
        tracker,
        cache,
        say,
        result,
    )
    _save(out, identity, result)

    # 3. evaluation on the hand-written set -----------------------------------------------------
    items = list(loaded.qa_items)
    answered = accuracy_subset(items, settings.accuracy_items)
    designs = [("Base-BM25", d0), ("MemSteer-Opt", best)]
    for i, (label, design) in enumerate(designs):
        if i and design.key() == d0.key():
            row = result.rows[0].model_copy(
                update={
                    "label": label,
                    "same_as": "Base-BM25",
                    "lm_calls": 0,
                    "cache_hits": 0,
                    "tokens": 0,
                    "seconds": 0.0,
                }
            )
            result.rows.append(row)
            result.stages.append(
                StageReport(
                    name=f"eval {label}",
                    status="skipped",
                    detail="no revision was accepted: the best design is Base-BM25",
                )
            )
            say(f"[{3 + i}/4] evaluation of {label}: skipped, {result.stages[-1].detail}")
            continue
        _evaluate(
            label,
            design,
            history,
            items,
            answered,
            lm_config,
            out / "eval" / _slug(label),
            settings,
            tracker,
            cache,
            say,
            result,
            step=3 + i,
        )
        _save(out, identity, result)

    if len(result.rows) == 2:
        result.heldout = heldout_comparison(result.rows[0], result.rows[1], settings.objective)
    result.tracking_uri = tracker.uri if tracker.active else None
    result.mlflow_ui = tracker.ui_command() if tracker.active else None
    result.tracking_failure = tracker.failure
    result.lm_usage = lm_config.usage_by_role()
    result.seconds = round(time.perf_counter() - t_start, 1)
    _save(out, identity, result)
    write_atomic(out / RESULTS_FILE, _results_md(result))
    folder.close()
    return result


def heldout_comparison(base: DesignRow, best: DesignRow, objective: str) -> dict[str, Any]:
    """The paired comparison of two rows on the hand-written items (``memsteer_dspy.stats``).

    The verdict follows the optimization objective's primary metric (delivered recall for
    ``recall``, accuracy otherwise); R@10 and delivered recall pair over every hand-written item,
    accuracy over the answered subset.
    """
    from memsteer_dspy.stats import paired_comparison

    def vectors(per_item: dict[str, float | None], other: dict[str, float | None]) -> tuple:
        ids = sorted(set(per_item) | set(other))
        return [per_item.get(i) for i in ids], [other.get(i) for i in ids]

    initial: dict[str, list[float | None]] = {}
    challenger: dict[str, list[float | None]] = {}
    for metric, attr in (
        ("recall_at_10", "item_recall"),
        ("delivered_recall", "item_delivered"),
        ("accuracy", "item_correct"),
    ):
        a, b = vectors(getattr(base, attr), getattr(best, attr))
        if a:
            initial[metric], challenger[metric] = a, b
    primary = "delivered_recall" if objective == "recall" else "accuracy"
    if primary not in initial:
        primary = "recall_at_10"
    comp = paired_comparison(
        initial, challenger, primary, source="hand-written QA (never seen by the optimizer)"
    )
    return comp.model_dump(mode="json")


def _slug(label: str) -> str:
    return label.lower().replace(" ", "-")


def _save(out: Path, identity: dict[str, Any], result: DemoResult) -> None:
    payload = {"identity": identity, "result": result.model_dump(mode="json")}
    write_atomic(out / SETTINGS_FILE, json.dumps(payload, indent=2, ensure_ascii=False) + "\n")


def _results_md(result: DemoResult) -> str:
    return f"# MemSteer demo ({result.settings.size})\n\n{result.render()}\n"


def _supervision(history, lm_config, folder: Path, settings: DemoSettings, say, result: DemoResult):
    """Stage 1: generate (or resume) QA–evidence supervision; returns (train, val)."""
    from memsteer_dspy.bundles import BundleConfig, small_lm_bundle_config
    from memsteer_dspy.supervision.program import GENERATION_ROLES
    from memsteer_dspy.supervision.run import (
        GenerationConfig,
        SupervisionSet,
        generate_supervision,
        read_log,
        small_lm_generation_config,
    )

    t0 = time.perf_counter()
    profile = settings.bundle_profile
    if profile == "auto":
        profile = "small" if lm_config.in_process("planner") else "full"
    # length limits in the output schemas, for LMs that decode under them (in-process llama.cpp)
    bounded = lm_config.in_process(*GENERATION_ROLES)
    fields = {
        "bounded": bounded,
        "n": settings.n_supervision,
        "max_candidates": settings.max_candidates,
        "time_budget_s": settings.supervision_seconds,
        "seed": settings.seed,
        "threads": settings.threads,
        "batch_size": min(4, settings.max_candidates),
    }
    # in-process LMs on small bundles get the pipeline measured cheapest on the embedded model
    # (lean prompts, anchored planner); any other LM the paper's prompts
    if profile == "small" and bounded:
        config = small_lm_generation_config(**fields)
    else:
        bundle = small_lm_bundle_config() if profile == "small" else BundleConfig()
        config = GenerationConfig(**fields, bundle=bundle)
    done = read_log(folder)
    accepted_before = sum(r.status == "accepted" for r in done)
    summary_file = folder / "summary.json"
    spent = summary_file.exists() and (
        json.loads(summary_file.read_text(encoding="utf-8")).get("stopped_by") == "time_budget"
    )
    finished = accepted_before >= config.n or len(done) >= config.candidate_limit or spent
    within = (
        f" within {config.time_budget_s / 60:g} min" if config.time_budget_s is not None else ""
    )
    say(
        f"[1/4] supervision: MemSteer generates up to {config.n} verified QA items from at most "
        f"{config.candidate_limit} candidates{within} ({profile} bundles"
        + ("; lean prompts, anchored planner" if config.anchored else "")
        + f") -> {folder}"
        + (f"  [{len(done)} candidates already done]" if done else "")
    )
    lms = {role: lm_config.lm(role) for role in GENERATION_ROLES}

    def hook(rec, counts) -> None:
        if say.fn is not None:
            say.fn(
                f"  candidate {rec.index}: {rec.status}"
                + (f" ({rec.reason})" if rec.reason else "")
            )

    summary = generate_supervision(
        history,
        lms,
        folder,
        config,
        lm_description=lm_config.describe(),
        progress=True if say.bars else (hook if say.fn is not None else False),
    )
    sup = SupervisionSet.load(folder)
    result.supervision = {
        "folder": str(folder),
        "accepted": summary.get("accepted", 0),
        "candidates": summary.get("candidates", 0),
        "skipped_bundles": summary.get("skipped_bundles", 0),
        "train": len(sup.train),
        "val": len(sup.val),
        "kept_fraction": summary.get("kept_fraction"),
        "rejected_by_stage": summary.get("rejected_by_stage", {}),
        "lm_calls": sum(summary.get("lm_calls", {}).values()),
        "wall_seconds": summary.get("wall_seconds"),
        "pipeline": "lean-anchor" if config.anchored else "v1",
        "stopped_by": summary.get("stopped_by"),
    }
    status = "reused" if finished else ("resumed" if done else "ran")
    result.stages.append(
        StageReport(
            name="supervision",
            status=status,
            seconds=round(time.perf_counter() - t0, 1),
            detail=f"{len(sup)} accepted of {summary.get('candidates', 0)} candidates "
            f"({len(sup.train)} train / {len(sup.val)} val)"
            + (
                "; stopped by its time budget" if summary.get("stopped_by") == "time_budget" else ""
            ),
        )
    )
    say(f"  supervision: {result.stages[-1].detail}")
    return sup.train, sup.val


def _steering(
    history, reference, folder: Path, d0: MemoryDesign, panel: Path | None, cache: Path, say, result
) -> None:
    """Stage 1b: the steering panel (patches of the demo's Base-BM25) on the accepted items and on
    the hand-written ones, retrieval only (``memsteer assess --steering``): whether the generated
    items can tell designs apart. It selects nothing; the optimizer never sees the hand-written
    items' scores."""
    from memsteer_dspy.supervision.run import SupervisionSet
    from memsteer_dspy.supervision.steering import (
        STEERING_FILE,
        SteeringReport,
        load_panel,
        save_steering,
        steering_of_folder,
    )

    t0 = time.perf_counter()
    designs = load_panel(panel, base=d0)
    keys = [d.key() for d in designs.values()]
    saved, status = folder / STEERING_FILE, "ran"
    report = (
        SteeringReport.model_validate_json(saved.read_text("utf-8")) if saved.exists() else None
    )
    if report is not None and (
        [r.design_key for r in report.panel] != keys
        or report.n_generated != len(SupervisionSet.load(folder))
    ):
        report = None  # another panel or more items since: measure again
    if report is None:
        report = steering_of_folder(
            history,
            folder,
            list(reference),
            protocol="full",
            panel=designs,
            cache_dir=cache,
            reference_source="the hand-written items",
        )
        save_steering(folder, report)
    else:
        status = "reused"
    head = report.headline()
    result.supervision["steering"] = head
    tau = head["kendall_tau"]
    detail = (
        f"panel of {len(report.panel)} designs: validation items separate {head['separated_in'].get('validation', 0)}"
        f" scores; Kendall tau vs the hand-written ranking {'undefined' if tau is None else f'{tau:+.2f}'}; "
        f"Base-BM25 R@10 {100 * (head['base_r10_generated'] or 0):.1f} generated vs "
        f"{100 * (head['base_r10_reference'] or 0):.1f} hand-written"
    )
    result.stages.append(
        StageReport(
            name="steering",
            status=status,
            seconds=round(time.perf_counter() - t0, 1),
            detail=detail,
        )
    )
    say(f"  steering: {detail}")


def _optimize(
    history,
    train,
    val,
    d0: MemoryDesign,
    lm_config,
    folder: Path,
    settings: DemoSettings,
    resolved: ResolvedDefaults,
    tracker,
    cache: Path,
    say,
    result: DemoResult,
) -> MemoryDesign:
    """Stage 2: MemSteer-Opt from Base-BM25 (resumable); returns the best design."""
    from memsteer_dspy.optimize.loop import MemSteerOpt, OptimizeConfig

    t0 = time.perf_counter()
    if not train or not val:
        reason = (
            f"generation accepted {len(train) + len(val)} QA item(s) ({len(train)} train / {len(val)} val), "
            "and MemSteer-Opt needs at least one of each"
        )
        say(f"[2/4] optimization: skipped: {reason}")
        result.notes.append(
            f"optimization skipped: {reason}; the best design is Base-BM25. Rerun with a larger "
            "--size, or a stronger --lm for generation."
        )
        result.optimization = {"ran": False, "reason": reason}
        result.stages.append(StageReport(name="optimization", status="skipped", detail=reason))
        return d0
    v = resolved.values
    config = OptimizeConfig(
        iterations=settings.iterations,
        objective=v["objective"],
        feedback="stratified",
        seed=settings.seed,
        per_stage=settings.per_stage,
        feedback_tokens=v["feedback_tokens"],
        protocol="full",
        threads=settings.threads,
        max_resamples=settings.max_resamples,
        stop_at_max=True,
        proposer_output=v["proposer_output"],
        accept=v["accept"],
        guard=v["guard"],
        guard_margin=v["guard_margin"],
        val_from=v["val_from"],
        max_eval_lm_calls=v["max_eval_lm_calls"],
        resolved=resolved.line(),
    )

    def on_event(event: dict[str, Any]) -> None:
        primary = "delivered_recall" if event["objective"] == "recall" else "accuracy"
        cand, best = event["candidate"], event["best"]
        c = getattr(cand, primary, None) if cand is not None else None
        b = getattr(best, primary, None) if best is not None else None
        name = "delivered recall" if primary == "delivered_recall" else "accuracy"
        line = (
            f"  iteration {event['iteration']}/{event['total']}: {event['status']}, candidate {name} "
            f"{_pct(c)}, best {_pct(b)} ({event['cost_total'].short()})"
        )
        if event.get("changes"):
            line += "  [" + "; ".join(event["changes"])[:160] + "]"
        elif event.get("reason") and event["status"] not in ("baseline", "accepted"):
            line += f"  ({str(event['reason'])[:160]})"
        say(line)

    opt = MemSteerOpt(
        history,
        train,
        val,
        folder,
        config=config,
        lms=lm_config.lm,
        init_design=d0,
        tracker=tracker,
        cache_dir=cache,
        usage=lm_config.usage_by_role,
        on_event=on_event,
        run_params={
            "supervision": str(Path(folder).parent / "supervision"),
            "lm": lm_config.describe(),
            "demo_size": settings.size,
            "context_budget": settings.context_budget,
        },
    )
    done = len(opt.read_trajectory()) if (folder / "trajectory.jsonl").exists() else 0
    say(
        f"[2/4] optimization: MemSteer-Opt from Base-BM25, {config.iterations} iterations, objective "
        f"{config.objective}, on {len(train)} train / {len(val)} val items -> {folder}"
        + (f"  [{done - 1} iterations already done]" if done else "")
    )
    res = opt.run()
    best = res.best_design
    best_entry = next(e for e in reversed(res.entries) if e.accepted)
    changes = [c for e in res.entries if e.accepted for c in e.changes]
    result.optimization = {
        "ran": True,
        "folder": str(folder),
        "objective": config.objective,
        "iterations": len(res.entries) - 1,
        "accepted_path": res.accepted_path,
        "baseline": res.baseline_score.short(),
        "best": res.best_score.short(),
        "best_design_key": best.key(),
        "best_iteration": best_entry.iteration,
        "changes": changes,
        "statuses": [e.status for e in res.entries],
        "cost": res.entries[-1].cost_total.model_dump(),
        "parent_run_id": res.parent_run_id,
        "stopped": res.stopped,
        "resolved": resolved.line(),
    }
    status = "reused" if done and done > config.iterations else ("resumed" if done else "ran")
    result.stages.append(
        StageReport(
            name="optimization",
            status=status,
            seconds=round(time.perf_counter() - t0, 1),
            detail=f"{len(res.entries) - 1} iterations, accepted path {res.accepted_path}; "
            f"validation {res.baseline_score.short()} -> {res.best_score.short()}"
            + ("; stopped early: validation at its maximum" if res.stopped else ""),
        )
    )
    return best.model_copy(update={"name": best.name or "best"})


def _evaluate(
    label: str,
    design: MemoryDesign,
    history,
    items: list[QAItem],
    answered: list[QAItem],
    lm_config,
    folder: Path,
    settings: DemoSettings,
    tracker,
    cache: Path,
    say,
    result: DemoResult,
    *,
    step: int,
) -> None:
    """Stage 3/4: score one design on the hand-written set: R@k on every item, accuracy and QS
    on ``answered``; books its LM cost and logs an MLflow run."""
    from memsteer_dspy.evaluation import evaluate_design
    from memsteer_dspy.memory.system import MemorySystem

    t0 = time.perf_counter()
    book = _CostBook(folder / "cost.json", lm_config)
    before = _items_done(folder / "answer" / "items.jsonl") + _items_done(
        folder / "recall" / "items.jsonl"
    )
    say(
        f"[{step}/4] evaluation of {label} (design {design.key()}): R@10 on {len(items)} hand-written "
        f"items, accuracy and QS on {len(answered)} -> {folder}"
        + (f"  [{before} item results already on disk]" if before else "")
    )
    answerer = lm_config.lm("answerer")
    if settings.answer_max_tokens is not None:  # the same cap for every design compared
        answerer = answerer.copy(max_tokens=settings.answer_max_tokens)
    lms = {"answerer": answerer}
    system = MemorySystem.from_design(
        design, history, cache_dir=cache, lms=lms, threads=settings.threads
    )
    bar = say.bar(len(items) + len(answered), f"evaluate {label}", initial=0)

    def on_item(r) -> None:
        book.book()
        if bar is not None:
            bar.update(1)
        elif say.fn is not None and r.metrics == "all":  # answered items only: recall is instant
            verdict = "failed: " + r.error if r.error else ("correct" if r.correct else "incorrect")
            say.fn(f"  {r.qa_id} ({r.question_type}): {verdict}")

    try:
        recall = evaluate_design(
            system,
            items,
            metrics="recall",
            protocol="full",
            threads=settings.threads,
            out_dir=folder / "recall",
            on_item=on_item,
        )
        if bar is not None:
            bar.update(len(items) - bar.n)  # items resumed from disk
        answer = None
        if answered:
            answer = evaluate_design(
                system,
                answered,
                metrics="all",
                judge_lm=lm_config.lm("judge"),
                protocol="full",
                threads=settings.threads,
                out_dir=folder / "answer",
                on_item=on_item,
            )
        if bar is not None:
            bar.update(bar.total - bar.n)
    finally:
        if bar is not None:
            bar.close()
    book.book(item=False)
    rs = recall.summary
    a = answer.summary if answer is not None else None
    cost = book.totals
    row = DesignRow(
        label=label,
        design_name=design.name,
        design_key=design.key(),
        accuracy=a.accuracy if a else None,
        qs=a.qs if a else None,
        n_answered=a.n if a else 0,
        recall_at_10=rs.recall_at_10,
        delivered_recall=rs.delivered_recall,
        n_recall=rs.n,
        lm_calls=int(cost["calls"]),
        cache_hits=int(cost["cache_hits"]),
        tokens=int(cost["total_tokens"]),
        seconds=round(float(cost["seconds"]), 1),
        errors=rs.errors + (a.errors if a else 0),
        cost_usd=cost.get("cost_usd"),
        item_correct={
            i.qa_id: None if i.correct is None else float(i.correct)
            for i in (answer.items if answer is not None else [])
        },
        item_recall={i.qa_id: i.recall_at_10 for i in recall.items},
        item_delivered={i.qa_id: i.delivered_recall for i in recall.items},
    )
    result.rows.append(row)
    if row.errors:
        result.notes.append(
            f"{row.errors} evaluation item(s) of {label} failed and scored 0 (see 'error' in {folder}/*/items.jsonl)"
        )
    n_new = len(items) + len(answered) - before
    status = "reused" if n_new <= 0 else ("resumed" if before else "ran")
    result.stages.append(
        StageReport(
            name=f"eval {label}",
            status=status,
            seconds=round(time.perf_counter() - t0, 1),
            detail=(
                f"accuracy {_pct(row.accuracy)}, QS {_pct(row.qs)} on {row.n_answered}; "
                if answered
                else ""
            )
            + f"R@10 {_pct(row.recall_at_10)}, delivered recall {_pct(row.delivered_recall)} on {row.n_recall}"
            + ("" if answered else " (no item answered)"),
        )
    )
    say(f"  {label}: {result.stages[-1].detail}")
    _track_evaluation(tracker, folder, label, design, row, settings)


def _items_done(path: Path) -> int:
    if not path.exists():
        return 0
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def _track_evaluation(
    tracker, folder: Path, label: str, design: MemoryDesign, row: DesignRow, settings: DemoSettings
) -> None:
    """One MLflow run per evaluated design (resumed by the run id kept in the folder)."""
    from memsteer_dspy.tracking import flatten

    if not tracker.active:
        return
    marker = folder / "mlflow_run_id"
    previous = marker.read_text().strip() if marker.exists() else None
    rid = tracker.start_run(
        f"demo-eval-{_slug(label)}",
        resume_run_id=previous,
        tags={"memsteer.kind": "demo-evaluation", "memsteer.design": label},
    )
    if not rid:
        return
    write_atomic(marker, rid + "\n")
    params = {
        "label": label,
        "design_key": row.design_key,
        "demo_size": settings.size,
        "context_budget": settings.context_budget,
        "n_answered": row.n_answered,
        "n_recall": row.n_recall,
    }
    params.update(
        {
            f"design.{k}": v
            for k, v in flatten(design.model_dump(mode="json", exclude={"name"})).items()
        }
    )
    tracker.log_params(rid, params)
    tracker.log_metrics(
        rid,
        {
            "accuracy": row.accuracy,
            "qs": row.qs,
            "recall_at_10": row.recall_at_10,
            "delivered_recall": row.delivered_recall,
            "lm_calls": row.lm_calls,
            "lm_tokens": row.tokens,
            "wall_seconds": row.seconds,
            "lm_cost_usd": row.cost_usd,
        },
    )
    for sub in ("answer", "recall"):
        summary = folder / sub / "summary.json"
        if summary.exists():
            tracker.log_artifact(rid, summary, sub)
    tracker.end_run(rid)
