"""The run's summary files: ``summary.md`` (settings, the held-out comparison, a table of
iterations and the accepted path), ``summary.json`` and ``best_design.json``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from memsteer_dspy.memory.design import MemoryDesign
from memsteer_dspy.optimize.config import OptimizeConfig
from memsteer_dspy.optimize.state import best_of
from memsteer_dspy.optimize.types import OptimizeResult, TrajectoryEntry
from memsteer_dspy.records import History
from memsteer_dspy.runfolder import write_atomic, write_json
from memsteer_dspy.stats import PairedComparison, points, points_ci

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]<>()#+!|~])")


def md_text(text: str) -> str:
    """``text`` as literal Markdown inline text: its markup characters escaped, newlines folded
    (a user id such as ``<img src=x>`` or ``*x*`` shows as written, and stays in its heading)."""
    return _MD_SPECIAL.sub(r"\\\1", " ".join(str(text).split()))


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}"


def render_test(test: PairedComparison) -> list[str]:
    """The held-out section of ``summary.md``."""
    lines = [
        "## Held-out test",
        "",
        f"{test.n} items ({test.source or 'test split'}), never used for feedback or selection. "
        f"Verdict on {test.primary}: **{test.verdict}** (paired bootstrap 95% interval, {test.resamples} "
        f"resamples, seed {test.seed}; one-sided p = {test.p_bootstrap:.3f}, sign test p = {test.p_sign:.3f}).",
        "",
        "| metric | initial | best | diff | 95% CI |",
        "|---|---:|---:|---:|---|",
    ]
    for m in test.initial:
        lines.append(
            f"| {m} | {_pct(test.initial[m])} | {_pct(test.best.get(m))} | {points(test.diff.get(m))} | "
            f"{points_ci(test.ci95.get(m))} |"
        )
    return lines + [""]


def render_summary(
    entries: list[TrajectoryEntry],
    config: OptimizeConfig,
    history: History,
    settings: dict[str, Any],
    test: PairedComparison | None = None,
    stopped: str | None = None,
) -> str:
    """``summary.md``: settings, baseline vs best, the held-out comparison, a table of iterations
    and the accepted path."""
    base, best = entries[0], best_of(entries)
    total = entries[-1].cost_total
    lines = [
        f"# MemSteer-Opt: {md_text(history.user_id)}",
        "",
        f"- history fingerprint `{history.fingerprint}`, {len(history)} records",
        f"- supervision: {settings.get('n_train')} train / {settings.get('n_val')} val items",
        f"- objective `{config.objective}`, feedback `{config.feedback}`, seed {config.seed}, "
        f"protocol `{config.protocol}`, iterations {len(entries) - 1} of {config.iterations}",
        f"- search `{config.search}`"
        + (f" (parents: {config.parents})" if config.search == "population" else "")
        + f", accept `{config.accept}`"
        + (
            f" (alpha {config.accept_alpha}, margin {config.accept_margin}, {config.accept_test})"
            if config.accept == "paired"
            else ""
        )
        + f", LM-retrieval margin {config.lm_retrieval_margin}",
        *([f"- {md_text(config.resolved)}"] if config.resolved else []),
        f"- initial design `{base.design_key}`; best design `{best.design_key}` (iteration {best.iteration})",
        f"- validation: initial {base.score.short() if base.score else '-'}; best {best.score.short() if best.score else '-'}",
        f"- cost: {total.short()}",
        *([f"- stopped early: {stopped}"] if stopped else []),
        "",
        *(render_test(test) if test is not None else []),
        "## Iterations",
        "",
        "LM/q: LM calls per question at retrieval time (query rewrite, HyDE, LM rerank, ...).",
        "",
        "| iter | parent | status | val acc | QS | deliv. recall | R@10 | LM/q | changes | selected by | LM calls | tokens | s |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---|---|---:|---:|---:|",
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
            f"| {e.iteration} | {'' if e.parent_iteration is None else e.parent_iteration} | {e.status} | "
            f"{_pct(s.accuracy if s else None)} | {_pct(s.qs if s else None)} | "
            f"{_pct(s.delivered_recall if s else None)} | {_pct(s.recall_at_10 if s else None)} | "
            f"{'' if e.retrieval_lm_calls is None else e.retrieval_lm_calls} | {changes} | "
            f"{e.selected_by or ''} | {e.cost.calls} | {e.cost.total_tokens:,} | {e.cost.seconds:.0f} |"
        )
    path = [e for e in entries if e.accepted]
    lines += ["", "## Accepted path", ""]
    for e in path:
        what = "; ".join(e.changes) if e.changes else "initial design"
        lines.append(
            f"- iteration {e.iteration} `{e.design_key}`: {e.score.short() if e.score else '-'} — {what}"
            + (f" (selected by {e.selected_by})" if e.iteration else "")
        )
    return "\n".join(lines) + "\n"


def write_outputs(
    out: Path,
    entries: list[TrajectoryEntry],
    config: OptimizeConfig,
    history: History,
    settings: dict[str, Any],
    result: OptimizeResult | None = None,
) -> None:
    """Rewrite ``best_design.json`` and ``summary.md`` (after every iteration), and with the final
    ``result`` ``summary.json``."""
    best = best_of(entries)
    MemoryDesign.from_dict(best.design).save(out / "best_design.json")
    test = result.test if result is not None else None
    stopped = result.stopped if result is not None else None
    write_atomic(
        out / "summary.md",
        render_summary(entries, config, history, settings, test=test, stopped=stopped),
    )
    if result is not None:
        c = config
        data = {
            "user": history.user_id,
            "objective": c.objective,
            "search": c.search,
            "parents": c.parents if c.search == "population" else None,
            "accept": c.accept,
            "feedback": c.feedback,
            "n_train": settings.get("n_train"),
            "n_val": settings.get("n_val"),
            "resolved": c.resolved,
            **result.summary(),
        }
        write_json(out / "summary.json", data)
