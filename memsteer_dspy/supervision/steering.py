"""Does supervision steer? A fixed panel of memory designs scored, LM-free, on generated items and
on a reference set, and the agreement of the two rankings.

Supervision exists to tell a good memory design from a bad one. If every design finds the evidence
of every generated item, the optimizer has nothing to learn from them, however well-formed each item
is. :func:`assess_steering` scores the designs of a panel (:data:`PANEL_FILE`, patches of
Base-BM25: dense, hybrid, windows, sections, long dates, neighbours, budgets, the time filter off, …;
a file of the package, never tuned per run) on both sets with retrieval metrics only (R@10 and
delivered recall, :func:`~memsteer_dspy.evaluation.evaluate_design` with ``metrics="recall"``), and
reports per metric:

* each design's score on both sets;
* Kendall's τ-b and Spearman's ρ between the two rankings (``scipy.stats``), each with a bootstrap
  interval that resamples the items of both sets (``None`` where one set ties every design: a
  ranking with no order agrees with nothing);
* whether the generated set's best design (every design tied at its top) is in the reference's top 3;
* the headroom on each set: the best design minus Base-BM25;
* Base-BM25's R@10 on each set, which says how lexically easy the generated questions are.

The reference set is the format's official QA (RHELM) or a hand-written file (the demo's
``qa.jsonl``). Nothing here selects anything: it is a diagnosis of the supervision, so scoring on
every reference item is fair.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, Field
from scipy import stats as sps

from memsteer_dspy.errors import InputError
from memsteer_dspy.evaluation import evaluate_design
from memsteer_dspy.memory.design import MemoryDesign
from memsteer_dspy.memory.system import MemorySystem
from memsteer_dspy.records import History, QAItem
from memsteer_dspy.supervision.run import SupervisionSet

__all__ = [
    "METRICS",
    "PANEL_FILE",
    "STEERING_FILE",
    "DesignScores",
    "RankAgreement",
    "SteeringReport",
    "assess_steering",
    "format_steering",
    "load_panel",
    "merge_patch",
    "question_mix",
    "rank_agreement",
    "save_steering",
    "steering_metrics",
    "steering_of_folder",
    "track_steering",
]

METRICS = ("delivered_recall", "recall_at_10")
BASE = "base-bm25"
PANEL_FILE = "steering_panel.json"
RESAMPLES = 1000
TOP = 3


def merge_patch(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``patch`` merged in, nested objects merged key by key (a JSON merge patch
    without deletions)."""
    out = dict(base)
    for key, value in patch.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_patch(out[key], value)
        else:
            out[key] = value
    return out


def load_panel(
    path: str | Path | None = None, *, base: MemoryDesign | None = None
) -> dict[str, MemoryDesign]:
    """The design panel: name -> design, each a patch of Base-BM25 (or of ``base``: a run's own
    initial design, e.g. the demo's smaller context budget). ``path`` None: the package's own
    panel; a path: a JSON object of the same shape (errors name the file and the design)."""
    if path is None:
        text = resources.files("memsteer_dspy").joinpath("data", PANEL_FILE).read_text("utf-8")
        source = f"memsteer_dspy/data/{PANEL_FILE}"
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot read the design panel: {exc}", file=str(path)) from exc
        source = str(path)
    try:
        patches = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"the design panel is not JSON: {exc.msg}", file=source, line=exc.lineno
        ) from exc
    if not isinstance(patches, dict) or not patches:
        raise InputError(
            "the design panel must be a non-empty JSON object: name -> patch of Base-BM25",
            file=source,
        )
    start = (base or MemoryDesign.base_bm25()).model_dump(mode="json")
    panel: dict[str, MemoryDesign] = {}
    for name, patch in patches.items():
        if not isinstance(patch, dict):
            raise InputError(f"design {name!r}: a patch must be a JSON object", file=source)
        data = merge_patch(start, {**patch, "name": name})
        panel[name] = MemoryDesign.from_dict(data, source=f"{source} (design {name!r})")
    if BASE not in panel:
        raise InputError(
            f"the design panel needs a {BASE!r} entry ({{}}): headroom is measured from it",
            file=source,
        )
    return panel


class DesignScores(BaseModel):
    """One design of the panel: its mean scores on each set."""

    name: str
    design_key: str
    generated: dict[str, float | None] = Field(
        description="Metric -> mean over the generated items."
    )
    reference: dict[str, float | None] = Field(
        description="Metric -> mean over the reference items."
    )


class RankAgreement(BaseModel):
    """How one metric ranks the panel on the generated set against the reference set."""

    metric: str
    kendall_tau: float | None = Field(
        description="Kendall's tau-b; None where a set ties every design."
    )
    kendall_ci95: list[float] | None = None
    spearman_rho: float | None = None
    spearman_ci95: list[float] | None = None
    undefined_share: float = Field(
        0.0, description="Share of bootstrap resamples with tau undefined."
    )
    generated_best: list[str] = Field(
        description="The design(s) tied at the top on the generated set."
    )
    reference_top: list[str] = Field(
        description=f"The reference's top {TOP} (every design tied into it)."
    )
    best_in_reference_top: bool = Field(
        description=f"Every generated-best design is in the reference's top {TOP}."
    )
    headroom_generated: float | None = Field(
        description="Best design minus Base-BM25, generated set."
    )
    headroom_reference: float | None = Field(
        description="Best design minus Base-BM25, reference set."
    )
    separated: int = Field(description="Distinct scores among the panel on the generated set.")
    upper_designs: list[str] = Field(
        default_factory=list,
        description="The designs the reference scores at or above Base-BM25 (Base-BM25 included): "
        "the part of the panel an optimizer starting from Base-BM25 chooses among.",
    )
    kendall_tau_upper: float | None = Field(
        None,
        description="Kendall's tau-b over ``upper_designs`` only; None where either set ties them "
        "all or fewer than three are there. A panel-wide tau can be high because both sets put "
        "the broken designs last while the generated set cannot tell the good ones apart.",
    )


class SteeringReport(BaseModel):
    """The result of :func:`assess_steering` (``steering.json``, ``summary.json`` ``steering``)."""

    user: str
    n_generated: int
    n_reference: int
    reference_source: str
    protocol: str
    panel: list[DesignScores]
    agreement: dict[str, RankAgreement]
    base_r10_generated: float | None
    base_r10_reference: float | None
    lexical_gap: float | None = Field(
        description="Base-BM25 R@10 on the generated items minus on the reference items."
    )
    lexical_by_evidence: dict[str, dict[str, float | int | None]] = Field(
        default_factory=dict,
        description="'1' / '2+' evidence records -> Base-BM25 R@10 on the generated and on the "
        "reference items of that many records, and their counts: R@10 asks for every evidence "
        "record in the top ten, so items of more records are harder for any wording.",
    )
    lexical_gap_same_mix: float | None = Field(
        None,
        description="Base-BM25 R@10 on the generated items minus the reference's R@10 reweighted "
        "to the generated items' evidence-count mix: the part of the lexical gap that is wording, "
        "not how many records the questions need.",
    )
    separated_in: dict[str, int] = Field(
        default_factory=dict,
        description="Group of generated items (e.g. 'validation') -> distinct panel scores on it "
        "(delivered recall): 1 means the group ties every design and cannot steer a choice.",
    )
    panel_split: dict[str, dict[str, float | int]] = Field(
        default_factory=dict,
        description="'generated' / 'reference' -> shares of items that every design of the panel "
        "finds (R@10 1 under each), that no design finds (R@10 0 under each) and that separate "
        "designs (R@10 differs across the panel), and their count 'n'. Only the separating items "
        "move a ranking: a set found by every design is too easy to steer, and one found by none "
        "may be unanswerable or vague rather than hard (read it beside the items).",
    )
    mix: dict[str, dict[str, dict[str, float]]] = Field(
        default_factory=dict,
        description="'generated' / 'reference' -> 'question_type' / 'evidence' -> share of items "
        "(evidence: '1' or '2+' records); the accepted mix beside the reference's.",
    )
    resamples: int = RESAMPLES
    seed: int = 0

    def headline(self) -> dict[str, Any]:
        """The few numbers a summary line, a progress line or MLflow carries."""
        main = self.agreement[METRICS[0]]
        return {
            "kendall_tau": main.kendall_tau,
            "kendall_ci95": main.kendall_ci95,
            "kendall_tau_upper": main.kendall_tau_upper,
            "spearman_rho": main.spearman_rho,
            "best_in_reference_top3": main.best_in_reference_top,
            "headroom_generated": main.headroom_generated,
            "headroom_reference": main.headroom_reference,
            "base_r10_generated": self.base_r10_generated,
            "base_r10_reference": self.base_r10_reference,
            "lexical_gap": self.lexical_gap,
            "lexical_gap_same_mix": self.lexical_gap_same_mix,
            "separated_designs": main.separated,
            "separated_in": self.separated_in,
            "multi_record_share": self.mix.get("generated", {}).get("evidence", {}).get("2+", 0.0),
            "separating_share": self.panel_split.get("generated", {}).get("separating"),
            "found_by_no_design_share": self.panel_split.get("generated", {}).get("no_design"),
            "metric": main.metric,
        }


def _mean(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def _correlations(a: np.ndarray, b: np.ndarray) -> tuple[float | None, float | None]:
    """Kendall tau-b and Spearman rho of two score vectors; None where either has no order."""
    if len(a) < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return None, None
    tau = sps.kendalltau(a, b).statistic
    rho = sps.spearmanr(a, b).statistic
    return (None if math.isnan(tau) else float(tau)), (None if math.isnan(rho) else float(rho))


def _top(names: Sequence[str], scores: np.ndarray, k: int) -> list[str]:
    """Designs whose score is at least the k-th best (ties at the boundary all count)."""
    if len(scores) == 0:
        return []
    cut = np.sort(scores)[::-1][min(k, len(scores)) - 1]
    return [n for n, s in zip(names, scores, strict=True) if s >= cut - 1e-12]


def rank_agreement(
    names: Sequence[str],
    generated: np.ndarray,
    reference: np.ndarray,
    *,
    metric: str,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> RankAgreement:
    """Agreement of the panel's rankings. ``generated`` and ``reference`` are item x design score
    matrices (NaN where an item has no score); the bootstrap resamples items of each set."""
    g_mean, r_mean = np.nanmean(generated, axis=0), np.nanmean(reference, axis=0)
    tau, rho = _correlations(g_mean, r_mean)
    rng = np.random.default_rng(seed)
    taus, rhos, undefined = [], [], 0
    for _ in range(resamples):
        g = generated[rng.integers(0, len(generated), len(generated))]
        r = reference[rng.integers(0, len(reference), len(reference))]
        t, p = _correlations(np.nanmean(g, axis=0), np.nanmean(r, axis=0))
        if t is None:
            undefined += 1
            continue
        taus.append(t)
        rhos.append(p if p is not None else np.nan)

    def ci(values: list[float]) -> list[float] | None:
        values = [v for v in values if not math.isnan(v)]
        if not values or tau is None:
            return None
        return [float(q) for q in np.quantile(values, [0.025, 0.975])]

    base = list(names).index(BASE)
    upper = [i for i in range(len(names)) if r_mean[i] >= r_mean[base] - 1e-12]
    tau_upper = _correlations(g_mean[upper], r_mean[upper])[0] if len(upper) >= 3 else None
    best_g = _top(names, g_mean, 1)
    top_r = _top(names, r_mean, TOP)
    return RankAgreement(
        metric=metric,
        kendall_tau=tau,
        kendall_ci95=ci(taus),
        spearman_rho=rho,
        spearman_ci95=ci(rhos),
        undefined_share=undefined / resamples if resamples else 0.0,
        generated_best=best_g,
        reference_top=top_r,
        best_in_reference_top=bool(best_g)
        and set(best_g) <= set(top_r)
        and len(best_g) < len(names),
        headroom_generated=float(g_mean.max() - g_mean[base]),
        headroom_reference=float(r_mean.max() - r_mean[base]),
        separated=len({round(float(v), 9) for v in g_mean}),
        upper_designs=[names[i] for i in upper],
        kendall_tau_upper=tau_upper,
    )


def _scores(
    system: MemorySystem, items: list[QAItem], protocol: str
) -> dict[str, list[float | None]]:
    report = evaluate_design(system, items, metrics="recall", protocol=protocol)  # type: ignore[arg-type]
    return {m: [getattr(r, m) for r in report.items] for m in METRICS}


def _matrix(
    per_design: Mapping[str, Mapping[str, list[float | None]]], names: Sequence[str], metric: str
) -> np.ndarray:
    """item x design; items with no score under any design (no resolved evidence) dropped."""
    cols = [[np.nan if v is None else v for v in per_design[n][metric]] for n in names]
    m = np.array(cols, dtype=float).T
    return m[~np.all(np.isnan(m), axis=1)] if m.size else m.reshape(0, len(names))


def panel_split(matrix: np.ndarray) -> dict[str, float | int]:
    """Shares of items (rows of an item x design R@10 matrix) that every design finds, that no
    design finds, and that separate designs (scores differ across the panel; an item of several
    records that every design half-finds is in none of the three)."""
    n = len(matrix)
    if n == 0:
        return {"every_design": 0.0, "no_design": 0.0, "separating": 0.0, "n": 0}
    low, high = np.nanmin(matrix, axis=1), np.nanmax(matrix, axis=1)
    every = float(np.mean(low >= 1.0))
    none = float(np.mean(high <= 0.0))
    return {
        "every_design": round(every, 4),
        "no_design": round(none, 4),
        "separating": round(float(np.mean(high > low)), 4),
        "n": n,
    }


def assess_steering(
    history: History,
    generated: list[QAItem],
    reference: list[QAItem],
    *,
    protocol: str = "full",
    panel: Mapping[str, MemoryDesign] | None = None,
    cache_dir: str | Path | None = None,
    reference_source: str = "reference",
    resamples: int = RESAMPLES,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    groups: Mapping[str, Sequence[str]] | None = None,
) -> SteeringReport:
    """Score every design of ``panel`` (default :func:`load_panel`) on ``generated`` and
    ``reference`` (retrieval only, no LM) and measure how well the generated ranking agrees with the
    reference one. Designs whose retrieval needs an LM are refused: the panel is LM-free.
    ``groups`` names subsets of the generated items (by id) whose own separation is reported."""
    if not generated:
        raise InputError(
            "no generated items to assess", hint="the supervision folder has no train/val items"
        )
    if not reference:
        raise InputError(
            "no reference items to assess against",
            hint="pass --reference <QA JSONL> or use a format with official QA (rhelm)",
        )
    panel = dict(panel or load_panel())
    names = list(panel)
    if BASE not in panel:
        raise InputError(f"the design panel needs a {BASE!r} design")
    for name, design in panel.items():
        if design.lm_uses(answering=False):
            raise InputError(
                f"design {name!r} of the steering panel needs an LM ({', '.join(design.lm_uses(answering=False))}); "
                "the panel is scored LM-free"
            )
    per_gen: dict[str, dict[str, list[float | None]]] = {}
    per_ref: dict[str, dict[str, list[float | None]]] = {}
    for i, (name, design) in enumerate(panel.items(), 1):
        if progress is not None:
            progress(f"steering panel {i}/{len(panel)}: {name}")
        system = MemorySystem.from_design(design, history, cache_dir=cache_dir)
        per_gen[name] = _scores(system, generated, protocol)
        per_ref[name] = _scores(system, reference, protocol)
    rows = [
        DesignScores(
            name=n,
            design_key=panel[n].key(),
            generated={m: _mean(per_gen[n][m]) for m in METRICS},
            reference={m: _mean(per_ref[n][m]) for m in METRICS},
        )
        for n in names
    ]
    agreement = {}
    for m in METRICS:
        g, r = _matrix(per_gen, names, m), _matrix(per_ref, names, m)
        if len(g) == 0 or len(r) == 0:
            raise InputError(
                f"no item of the {'generated' if len(g) == 0 else 'reference'} set has "
                "evidence in this history: nothing to score"
            )
        agreement[m] = rank_agreement(names, g, r, metric=m, resamples=resamples, seed=seed)
    separated_in = {}
    for group, ids in (groups or {}).items():
        keep = [i for i, q in enumerate(generated) if q.id in set(ids)]
        means = [_mean([per_gen[n][METRICS[0]][i] for i in keep]) for n in names]
        separated_in[group] = len({round(m, 9) for m in means if m is not None})
    base = next(r for r in rows if r.name == BASE)
    g10, r10 = base.generated["recall_at_10"], base.reference["recall_at_10"]
    by_evidence, same_mix = lexical_by_evidence(
        generated, per_gen[BASE]["recall_at_10"], reference, per_ref[BASE]["recall_at_10"]
    )
    return SteeringReport(
        user=history.user_id,
        n_generated=len(generated),
        n_reference=len(reference),
        reference_source=reference_source,
        protocol=protocol,
        panel=rows,
        agreement=agreement,
        base_r10_generated=g10,
        base_r10_reference=r10,
        lexical_gap=None if g10 is None or r10 is None else g10 - r10,
        lexical_by_evidence=by_evidence,
        lexical_gap_same_mix=same_mix,
        separated_in=separated_in,
        panel_split={
            "generated": panel_split(_matrix(per_gen, names, "recall_at_10")),
            "reference": panel_split(_matrix(per_ref, names, "recall_at_10")),
        },
        mix={"generated": question_mix(generated), "reference": question_mix(reference)},
        resamples=resamples,
        seed=seed,
    )


def _stratum(item: QAItem) -> str:
    return "1" if len(set(item.evidence_ids)) <= 1 else "2+"


def lexical_by_evidence(
    generated: Sequence[QAItem],
    gen_r10: Sequence[float | None],
    reference: Sequence[QAItem],
    ref_r10: Sequence[float | None],
) -> tuple[dict[str, dict[str, float | int | None]], float | None]:
    """Base-BM25 R@10 per evidence-count stratum ('1', '2+') on each set, and the gap between the
    generated items and the reference reweighted to the generated items' strata (None when a
    stratum the generated items have is empty in the reference). Scores are aligned with their
    items; None (no resolved evidence) is left out."""
    strata: dict[str, dict[str, float | int | None]] = {}
    for key in ("1", "2+"):
        g = [
            v
            for q, v in zip(generated, gen_r10, strict=True)
            if v is not None and _stratum(q) == key
        ]
        r = [
            v
            for q, v in zip(reference, ref_r10, strict=True)
            if v is not None and _stratum(q) == key
        ]
        strata[key] = {
            "generated": sum(g) / len(g) if g else None,
            "reference": sum(r) / len(r) if r else None,
            "n_generated": len(g),
            "n_reference": len(r),
        }
    n = sum(int(v["n_generated"] or 0) for v in strata.values())
    if not n or any(v["n_generated"] and v["reference"] is None for v in strata.values()):
        return strata, None
    gen = sum(float(v["generated"] or 0) * int(v["n_generated"] or 0) for v in strata.values()) / n
    ref = sum(float(v["reference"] or 0) * int(v["n_generated"] or 0) / n for v in strata.values())
    return strata, gen - ref


def question_mix(items: Sequence[QAItem]) -> dict[str, dict[str, float]]:
    """Shares of question types and of one- vs multi-record evidence among ``items``."""
    n = len(items) or 1
    types: dict[str, float] = {}
    for q in items:
        t = q.question_type or "unknown"
        types[t] = types.get(t, 0.0) + 1 / n
    multi = sum(_stratum(q) == "2+" for q in items) / n
    return {
        "question_type": {k: round(v, 4) for k, v in sorted(types.items())},
        "evidence": {"1": round(1 - multi, 4), "2+": round(multi, 4)},
    }


def _pct(v: float | None) -> str:
    return "    -" if v is None else f"{100 * v:5.1f}"


def _num(v: float | None) -> str:
    return "undefined" if v is None else f"{v:+.2f}"


def _ci(ci: Sequence[float] | None) -> str:
    return "" if not ci else f" [{ci[0]:+.2f}, {ci[1]:+.2f}]"


def format_steering(report: SteeringReport) -> str:
    """The steering report as text: the panel table, then the agreement per metric."""
    lines = [
        f"steering: {report.n_generated} generated vs {report.n_reference} reference items "
        f"({report.reference_source}), {len(report.panel)} designs, protocol {report.protocol}, "
        "retrieval only",
        f"{'design':<22} {'gen R@10':>8} {'gen deliv':>9} {'ref R@10':>8} {'ref deliv':>9}",
    ]
    for row in report.panel:
        lines.append(
            f"{row.name:<22} {_pct(row.generated['recall_at_10']):>8} "
            f"{_pct(row.generated['delivered_recall']):>9} {_pct(row.reference['recall_at_10']):>8} "
            f"{_pct(row.reference['delivered_recall']):>9}"
        )
    for m, a in report.agreement.items():
        why = " (a set ties every design)" if a.kendall_tau is None else ""
        lines.append(
            f"{m}: Kendall tau {_num(a.kendall_tau)}{_ci(a.kendall_ci95)}{why}, Spearman rho "
            f"{_num(a.spearman_rho)}{_ci(a.spearman_ci95)}; generated best {', '.join(a.generated_best)} "
            f"{'is' if a.best_in_reference_top else 'is not'} in the reference top {TOP} "
            f"({', '.join(a.reference_top)}); headroom generated {100 * (a.headroom_generated or 0):+.1f}, "
            f"reference {100 * (a.headroom_reference or 0):+.1f} points; {a.separated} distinct scores "
            "on the generated set"
        )
        lines.append(
            f"  among the {len(a.upper_designs)} designs the reference puts at or above "
            f"{BASE}: Kendall tau {_num(a.kendall_tau_upper)}"
            + (" (the generated set ties them, or too few)" if a.kendall_tau_upper is None else "")
        )
    for group, n in report.separated_in.items():
        lines.append(
            f"{group} items: {n} distinct delivered-recall scores across the panel"
            + (" (they tie every design: nothing to steer a choice)" if n <= 1 else "")
        )
    if report.panel_split:
        g, r = report.panel_split["generated"], report.panel_split["reference"]
        lines.append(
            "items every design finds / no design finds / that separate designs (R@10): generated "
            f"{100 * g['every_design']:.0f}% / {100 * g['no_design']:.0f}% / {100 * g['separating']:.0f}%"
            f" vs reference {100 * r['every_design']:.0f}% / {100 * r['no_design']:.0f}% / "
            f"{100 * r['separating']:.0f}%"
        )
    for side in ("generated", "reference"):
        if m := report.mix.get(side):
            kinds = ", ".join(f"{k} {100 * v:.0f}%" for k, v in m["question_type"].items())
            lines.append(
                f"{side} mix: {kinds}; evidence of 2+ records {100 * m['evidence']['2+']:.0f}%"
            )
    gap = report.lexical_gap
    lines.append(
        f"lexical easiness: Base-BM25 R@10 {_pct(report.base_r10_generated).strip()} on the generated "
        f"items vs {_pct(report.base_r10_reference).strip()} on the reference"
        + ("" if gap is None else f" ({100 * gap:+.1f} points)")
    )
    if report.lexical_by_evidence:
        parts = [
            f"{k} record{'s' if k != '1' else ''}: {_pct(v['generated']).strip()} "
            f"(n={v['n_generated']}) vs {_pct(v['reference']).strip()} (n={v['n_reference']})"
            for k, v in report.lexical_by_evidence.items()
        ]
        same = report.lexical_gap_same_mix
        lines.append(
            "  by evidence count, "
            + "; ".join(parts)
            + ("" if same is None else f"; at the generated items' mix {100 * same:+.1f} points")
        )
    return "\n".join(lines)


STEERING_FILE = "steering.json"


def steering_of_folder(
    history: History,
    folder: str | Path,
    reference: list[QAItem],
    **kwargs: Any,
) -> SteeringReport:
    """:func:`assess_steering` of the items a ``memsteer generate`` folder accepted (train and
    validation together) against ``reference``."""
    sup = SupervisionSet.load(folder)
    groups = {"validation": [q.id for q in sup.val]}
    return assess_steering(history, sup.train + sup.val, reference, groups=groups, **kwargs)


def save_steering(folder: str | Path, report: SteeringReport) -> Path:
    """Write ``steering.json`` into ``folder`` and put the headline into its ``summary.json``
    (``steering``), when there is one. Returns the path written."""
    folder = Path(folder)
    path = folder / STEERING_FILE
    path.write_text(report.model_dump_json(indent=2) + "\n", encoding="utf-8")
    summary_path = folder / "summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
        summary["steering"] = report.headline()
        summary_path.write_text(
            json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
    return path


def steering_metrics(report: SteeringReport) -> dict[str, float | None]:
    """Flat metrics for MLflow: the agreement per metric, then every design's four scores."""
    out: dict[str, float | None] = {
        "steering.base_r10_generated": report.base_r10_generated,
        "steering.base_r10_reference": report.base_r10_reference,
        "steering.lexical_gap": report.lexical_gap,
        "steering.lexical_gap_same_mix": report.lexical_gap_same_mix,
    }
    for side, split in report.panel_split.items():
        for part in ("every_design", "no_design", "separating"):
            out[f"steering.{side}.{part}_share"] = float(split[part])
    for m, a in report.agreement.items():
        out |= {
            f"steering.{m}.kendall_tau": a.kendall_tau,
            f"steering.{m}.kendall_tau_upper": a.kendall_tau_upper,
            f"steering.{m}.spearman_rho": a.spearman_rho,
            f"steering.{m}.best_in_reference_top3": float(a.best_in_reference_top),
            f"steering.{m}.headroom_generated": a.headroom_generated,
            f"steering.{m}.headroom_reference": a.headroom_reference,
            f"steering.{m}.separated": float(a.separated),
        }
    for row in report.panel:
        for side, scores in (("generated", row.generated), ("reference", row.reference)):
            for m, v in scores.items():
                out[f"panel.{row.name}.{side}.{m}"] = v
    return out


def track_steering(
    tracker: Any, report: SteeringReport, *, run_name: str, tags: Mapping[str, Any]
) -> str | None:
    """Log ``report`` as one MLflow run (metrics, the report as an artifact); the run id, or None
    when tracking is off or failed (tracking never fails the command)."""
    run_id = tracker.start_run(run_name, tags={"memsteer.kind": "steering", **tags})
    tracker.log_params(
        run_id,
        {
            "n_generated": report.n_generated,
            "n_reference": report.n_reference,
            "reference": report.reference_source,
            "protocol": report.protocol,
            "panel": ",".join(r.name for r in report.panel),
        },
    )
    tracker.log_metrics(run_id, steering_metrics(report))
    tracker.log_dict(run_id, report.model_dump(mode="json"), STEERING_FILE)
    tracker.end_run(run_id)
    return run_id
