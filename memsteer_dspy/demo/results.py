"""What a demo run reports: its stages, one row a design, the result and how it is printed.

:meth:`DemoResult.render` is the table the demo prints and writes to ``results.md``;
:func:`heldout_comparison` pairs the two designs on the hand-written items.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from memsteer_dspy.demo.settings import DemoSettings

SETTINGS_FILE = "demo.json"
RESULTS_FILE = "results.md"


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


def _usd(cost: float | None) -> str:
    return "-" if cost is None else f"${cost:,.4f}"


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
