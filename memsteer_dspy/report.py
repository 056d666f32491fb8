"""``memsteer report RUN_DIR``: one self-contained HTML page (plus the PNG figures beside it) that
shows what an optimization run did, drawn with matplotlib from the run folder's files only.

Read from ``RUN_DIR`` (a ``memsteer optimize`` output folder):

* ``trajectory.jsonl`` (required) — one line per finished iteration: status, accepted, score,
  changes, train failures by stage, cost (per iteration and running total, by role);
* ``run.json`` (optional) — objective, user, supervision sizes, the MLflow parent run and store;
* ``summary.json`` (optional) — its ``test`` object is the held-out verdict
  ``{"n", "source", "primary", "initial", "best", "diff", "ci95", "verdict"}`` (metric → value
  maps; ``ci95`` metric → ``[low, high]``).

Written to ``RUN_DIR/report/`` (or ``--out``): ``report.html`` (figures embedded as data URIs, so
the one file can be mailed or opened anywhere), ``score.png`` (validation score per iteration with
the accepted path), ``diagnosis.png`` (training failures by stage for every accepted design),
``cost.png`` (LM calls and tokens by role), ``heldout.png`` (mean paired difference with its 95 %
interval, when there is a held-out verdict), and ``report.json`` (the numbers the figures show).
:func:`log_report` adds the folder to the MLflow parent run as artifacts under ``report/``.
"""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memsteer_dspy.errors import InputError, MissingExtraError
from memsteer_dspy.tracking import Tracker

REPORT_DIR = "report"
STAGES = ("storage", "retrieval", "answering")
UNSCORED = ("invalid", "duplicate", "failed")
# colour per status; accepted steps are drawn on top in the path colour
STATUS_STYLE = {
    "baseline": ("#1f77b4", "o"),
    "accepted": ("#2ca02c", "o"),
    "rejected": ("#7f7f7f", "o"),
    "invalid": ("#d62728", "x"),
    "duplicate": ("#ff7f0e", "x"),
    "failed": ("#d62728", "x"),
}
STAGE_COLOURS = {"storage": "#9467bd", "retrieval": "#ff7f0e", "answering": "#17becf"}
METRIC_LABELS = {
    "accuracy": "accuracy",
    "delivered_recall": "delivered recall",
    "recall_at_10": "R@10",
    "qs": "QS",
}


def primary_metric(objective: str) -> str:
    """The score field an objective maximizes (as :meth:`Score.primary` reads it)."""
    return "delivered_recall" if objective == "recall" else "accuracy"


@dataclass
class RunFiles:
    """What an optimize run folder holds, as plain data (read by :func:`load_run`)."""

    path: Path
    entries: list[dict[str, Any]]
    run: dict[str, Any] = field(default_factory=dict)
    test: dict[str, Any] | None = None

    @property
    def objective(self) -> str:
        return str(
            self.run.get("objective")
            or (self.run.get("config") or {}).get("objective")
            or "accuracy"
        )

    @property
    def accepted(self) -> list[dict[str, Any]]:
        return [e for e in self.entries if e.get("accepted")]


@dataclass
class Report:
    """The files :func:`write_report` wrote."""

    folder: Path
    html: Path
    figures: dict[str, Path]
    data: dict[str, Any]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON: {exc.msg} (line {exc.lineno})", file=path) from None


def load_run(run_dir: str | Path) -> RunFiles:
    """Read an optimize run folder; a missing or malformed ``trajectory.jsonl`` is an
    :class:`InputError` naming the file and line."""
    folder = Path(run_dir)
    traj = folder / "trajectory.jsonl"
    if not folder.is_dir():
        raise InputError(
            "no such folder", file=folder, hint="pass the --out folder of a memsteer optimize run"
        )
    if not traj.exists():
        raise InputError(
            "no trajectory.jsonl: this is not a memsteer optimize output folder, or no iteration "
            "has finished yet",
            file=folder,
            hint="pass the --out folder of a memsteer optimize run",
        )
    entries: list[dict[str, Any]] = []
    lines = traj.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"not valid JSON: {exc.msg}", file=traj, line=n) from None
        if not isinstance(entry, dict) or "iteration" not in entry or "status" not in entry:
            raise InputError(
                "a trajectory line needs at least 'iteration' and 'status'", file=traj, line=n
            )
        entries.append(entry)
    if not entries:
        raise InputError("trajectory.jsonl holds no iteration yet", file=traj)
    run = _read_json(folder / "run.json") if (folder / "run.json").exists() else {}
    test = None
    if (folder / "summary.json").exists():
        summary = _read_json(folder / "summary.json")
        test = summary.get("test") if isinstance(summary, dict) else None
        if test is not None and not isinstance(test, dict):
            raise InputError("'test' must be an object", file=folder / "summary.json")
    return RunFiles(
        path=folder, entries=entries, run=run if isinstance(run, dict) else {}, test=test
    )


# -- numbers -----------------------------------------------------------------------------------
def _score(entry: dict[str, Any]) -> dict[str, Any]:
    return entry.get("score") or entry.get("screen_score") or {}


def score_rows(run: RunFiles) -> list[dict[str, Any]]:
    """One row per iteration: status, the objective's score, the best so far, the changes."""
    metric = primary_metric(run.objective)
    rows = []
    for e in run.entries:
        s = e.get("score") or {}
        best = e.get("best_score") or {}
        rows.append(
            {
                "iteration": e["iteration"],
                "status": e["status"],
                "accepted": bool(e.get("accepted")),
                "score": s.get(metric),
                "screen_recall": (e.get("screen_score") or {}).get("delivered_recall"),
                "best": best.get(metric),
                "recall_at_10": _score(e).get("recall_at_10"),
                "delivered_recall": _score(e).get("delivered_recall"),
                "accuracy": s.get("accuracy"),
                "changes": list(e.get("changes") or []),
                "reason": e.get("reason"),
                "selected_by": e.get("selected_by"),
                "rationale": e.get("rationale") or "",
            }
        )
    return rows


def diagnosis_rows(run: RunFiles) -> list[dict[str, Any]]:
    """Training failures by stage for d0 and every accepted design (after its train refresh)."""
    out = []
    for e in run.accepted:
        tf = e.get("train_failures")
        if tf:
            out.append({"iteration": e["iteration"], **{s: int(tf.get(s, 0)) for s in STAGES}})
    return out


def cost_by_role(run: RunFiles) -> dict[str, dict[str, int]]:
    """LM calls and tokens per role over the whole run (the last entry's running total)."""
    total = (run.entries[-1].get("cost_total") or {}).get("by_role") or {}
    return {
        role: {
            k: int(v.get(k, 0) or 0)
            for k in ("calls", "prompt_tokens", "completion_tokens", "total_tokens")
        }
        for role, v in sorted(total.items())
    }


# -- figures -----------------------------------------------------------------------------------
def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise MissingExtraError("matplotlib", "report", "memsteer report") from exc
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def plot_scores(run: RunFiles, path: Path) -> Path:
    """Every candidate's validation score, the accepted path (best so far) as a step line, and the
    proposals that produced no score (invalid, duplicate, failed) as crosses on the floor."""
    plt = _pyplot()
    rows = score_rows(run)
    metric = primary_metric(run.objective)
    fig, ax = plt.subplots(figsize=(8, 4.2))
    xs = [r["iteration"] for r in rows]
    best = [r["best"] for r in rows]
    if any(b is not None for b in best):
        ax.step(
            xs,
            [b if b is not None else float("nan") for b in best],
            where="post",
            color="#2ca02c",
            lw=2,
            alpha=0.8,
            label="best so far (accepted path)",
            zorder=1,
        )
    scored = [r["score"] for r in rows if r["score"] is not None]
    lo, hi = (min(scored), max(scored)) if scored else (0.0, 1.0)
    span = max(hi - lo, 0.1)
    floor = lo - 0.18 * span  # a band under the scores for the proposals that got none
    if any(r["score"] is None for r in rows):
        ax.axhspan(floor - 0.06 * span, floor + 0.06 * span, color="#f2dede", zorder=0)
        ax.text(xs[0] - 0.4, floor, "no score", va="center", ha="left", fontsize=8, color="#a94442")
    for status, (colour, marker) in STATUS_STYLE.items():
        pts = [r for r in rows if r["status"] == status]
        if not pts:
            continue
        with_score = [r for r in pts if r["score"] is not None]
        without = [r for r in pts if r["score"] is None]
        if with_score:
            ax.scatter(
                [r["iteration"] for r in with_score],
                [r["score"] for r in with_score],
                c=colour,
                marker=marker,
                s=60 if status in ("accepted", "baseline") else 36,
                zorder=3,
                edgecolors="black" if status in ("accepted", "baseline") else "none",
                label=status,
            )
        if without:
            ax.scatter(
                [r["iteration"] for r in without],
                [floor] * len(without),
                c=colour,
                marker="x",
                s=40,
                zorder=3,
                label=f"{status} (no score)",
            )
    for r in rows:
        if r["accepted"] and r["score"] is not None:
            ax.annotate(
                f"{r['score']:.3f}",
                (r["iteration"], r["score"]),
                textcoords="offset points",
                xytext=(0, 8),
                ha="center",
                fontsize=8,
                color="#1a661a",
            )
    ax.set_ylim(floor - 0.1 * span, hi + 0.15 * span)
    ax.set_xlim(xs[0] - 0.5, xs[-1] + 0.5)
    ax.set_xlabel("iteration (0 = initial design)")
    ax.set_ylabel(f"validation {METRIC_LABELS.get(metric, metric)}")
    ax.set_xticks(xs if len(xs) <= 30 else xs[:: max(1, len(xs) // 15)])
    ax.set_title(
        f"{run.run.get('user', '')}: validation score per iteration (objective: {run.objective})"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _save(fig, path)


def plot_diagnosis(run: RunFiles, path: Path) -> Path | None:
    """Stacked bars: training failures by stage for each design on the accepted path."""
    rows = diagnosis_rows(run)
    if not rows:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(4.5, 1.1 * len(rows) + 2), 3.8))
    labels = [f"iter {r['iteration']}" for r in rows]
    bottom = [0] * len(rows)
    for s in STAGES:
        vals = [r[s] for r in rows]
        bars = ax.bar(labels, vals, bottom=bottom, color=STAGE_COLOURS[s], label=s)
        for b, v, y0, r in zip(bars, vals, bottom, rows, strict=True):
            if v and v < sum(r[x] for x in STAGES):  # a share of the bar: label it
                ax.text(
                    b.get_x() + b.get_width() / 2,
                    y0 + v / 2,
                    str(v),
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white",
                )
        bottom = [a + v for a, v in zip(bottom, vals, strict=True)]
    for i, total in enumerate(bottom):
        ax.text(i, total, f"{total}", ha="center", va="bottom", fontsize=9)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_ylim(0, max(bottom + [1]) * 1.15)
    ax.set_ylabel("failed training items")
    n = run.run.get("n_train")
    ax.set_title(
        "training failures by stage, per accepted design" + (f" ({n} training items)" if n else "")
    )
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def plot_cost(run: RunFiles, path: Path) -> Path | None:
    """Horizontal bars: prompt and completion tokens by role, with the call count."""
    roles = cost_by_role(run)
    if not roles:
        return None
    plt = _pyplot()
    names = list(roles)
    fig, ax = plt.subplots(figsize=(7, 0.6 * len(names) + 1.6))
    prompt = [roles[r]["prompt_tokens"] for r in names]
    completion = [roles[r]["completion_tokens"] for r in names]
    ax.barh(names, prompt, color="#1f77b4", label="prompt tokens")
    ax.barh(names, completion, left=prompt, color="#aec7e8", label="completion tokens")
    for i, r in enumerate(names):
        ax.text(
            prompt[i] + completion[i],
            i,
            f"  {roles[r]['calls']:,} calls, {roles[r]['total_tokens']:,} tokens",
            va="center",
            fontsize=8,
        )
    ax.set_xlabel("tokens")
    ax.set_xlim(0, max(p + c for p, c in zip(prompt, completion, strict=True)) * 1.6 or 1)
    ax.set_title("LM cost by role (whole run)")
    ax.legend(fontsize=8, loc="lower right")
    return _save(fig, path)


def plot_heldout(run: RunFiles, path: Path) -> Path | None:
    """Mean paired difference (best − initial) per metric on the held-out items with its 95 %
    interval; the verdict follows the primary metric's interval."""
    test = run.test
    if not test:
        return None
    diff, ci = test.get("diff") or {}, test.get("ci95") or {}
    metrics = [m for m in diff if diff.get(m) is not None]
    if not metrics:
        return None
    plt = _pyplot()
    primary = test.get("primary") or primary_metric(run.objective)
    fig, ax = plt.subplots(figsize=(7, 0.55 * len(metrics) + 1.8))
    for i, m in enumerate(metrics):
        lo, hi = (ci.get(m) or [diff[m], diff[m]])[:2]
        colour = {"better": "#2ca02c", "worse": "#d62728"}.get(
            "better" if lo > 0 else "worse" if hi < 0 else "", "#7f7f7f"
        )
        ax.errorbar(
            diff[m],
            i,
            xerr=[[diff[m] - lo], [hi - diff[m]]],
            fmt="o",
            color=colour,
            capsize=4,
            lw=2.5 if m == primary else 1.2,
        )
        ax.text(hi, i, f"  {diff[m]:+.3f} [{lo:+.3f}, {hi:+.3f}]", va="center", fontsize=8)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(range(len(metrics)))
    initial, best = test.get("initial") or {}, test.get("best") or {}
    ax.set_yticklabels(
        [
            METRIC_LABELS.get(m, m)
            + (" (primary)" if m == primary else "")
            + (
                f"\n{_fmt(initial.get(m))} → {_fmt(best.get(m))}"
                if m in initial and m in best
                else ""
            )
            for m in metrics
        ]
    )
    ax.set_ylim(len(metrics) - 0.5, -0.5)
    lo_all = min((ci.get(m) or [diff[m]])[0] for m in metrics)
    hi_all = max((ci.get(m) or [0, diff[m]])[-1] for m in metrics)
    span = max(hi_all - lo_all, 0.05)
    ax.set_xlim(min(lo_all, 0) - 0.1 * span, max(hi_all, 0) + 0.6 * span)
    ax.set_xlabel("best − initial, mean paired difference with 95 % interval")
    ax.set_title(
        f"held-out verdict: {test.get('verdict', '?')} (n = {test.get('n', '?')}, {test.get('source') or 'test items'})"
    )
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


# -- the page ----------------------------------------------------------------------------------
def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.3f}"
    return html.escape(str(v))


def _img(path: Path | None, alt: str) -> str:
    if path is None:
        return ""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


CSS = """body{font-family:system-ui,sans-serif;max-width:980px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:.9em}td,th{border:1px solid #ccc;padding:.25em .5em;
vertical-align:top;text-align:left}th{background:#f3f3f3}img{max-width:100%}.num{text-align:right}
.better{color:#1a7f1a;font-weight:bold}.worse{color:#b00;font-weight:bold}.inconclusive{color:#666;font-weight:bold}
code{background:#f5f5f5;padding:0 .2em}"""


def render_html(run: RunFiles, figures: dict[str, Path | None], data: dict[str, Any]) -> str:
    r, rows = run.run, data["iterations"]
    metric = primary_metric(run.objective)
    base, best = rows[0], next(x for x in reversed(rows) if x["accepted"])
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>MemSteer-Opt report: {html.escape(str(r.get('user', run.path.name)))}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>MemSteer-Opt: {html.escape(str(r.get('user', run.path.name)))}</h1>",
        "<ul>",
        f"<li>run folder <code>{html.escape(str(run.path.resolve()))}</code></li>",
        f"<li>objective <code>{html.escape(run.objective)}</code>, feedback <code>{_fmt(r.get('feedback'))}</code>, "
        f"seed {_fmt(r.get('seed'))}, {len(rows) - 1} iterations of {_fmt(r.get('iterations'))}</li>",
        f"<li>supervision: {_fmt(r.get('n_train'))} train / {_fmt(r.get('n_val'))} validation items</li>",
        f"<li>validation {METRIC_LABELS.get(metric, metric)}: initial {_fmt(base['score'])} → best "
        f"{_fmt(best['score'])} (iteration {best['iteration']}); accepted path: iterations "
        f"{', '.join(str(x['iteration']) for x in rows if x['accepted'])}</li>",
    ]
    if r.get("parent_run_id"):
        parts.append(
            f"<li>MLflow parent run <code>{html.escape(str(r['parent_run_id']))}</code> in "
            f"<code>{html.escape(str(r.get('tracking_uri', '')))}</code></li>"
        )
    parts.append("</ul>")
    parts += ["<h2>Held-out verdict</h2>"]
    test = run.test
    if test:
        verdict = str(test.get("verdict", "?"))
        parts.append(
            f"<p>On {_fmt(test.get('n'))} items the run never used ({_fmt(test.get('source'))}), the best "
            f"design is <span class='{html.escape(verdict)}'>{html.escape(verdict)}</span> than the initial "
            f"one (primary metric <code>{_fmt(test.get('primary') or metric)}</code>).</p>"
        )
        parts.append(
            "<table><tr><th>metric</th><th>initial</th><th>best</th><th>diff</th><th>95 % interval</th></tr>"
        )
        for m in test.get("diff") or {}:
            ci = (test.get("ci95") or {}).get(m)
            ci_text = f"[{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "–"
            d = (test.get("diff") or {}).get(m)
            parts.append(
                f"<tr><td>{_fmt(m)}</td><td class=num>{_fmt((test.get('initial') or {}).get(m))}</td>"
                f"<td class=num>{_fmt((test.get('best') or {}).get(m))}</td>"
                f"<td class=num>{'–' if d is None else f'{d:+.3f}'}</td><td class=num>{ci_text}</td></tr>"
            )
        parts.append("</table>")
        parts.append(_img(figures.get("heldout"), "held-out paired differences"))
    else:
        parts.append(
            "<p><b>No held-out verdict</b>: this run's <code>summary.json</code> has no <code>test</code> "
            "object. The scores below are on the validation items the run selected designs with, so "
            "they overstate what the best design would do on new questions.</p>"
        )
    parts += [
        "<h2>Score per iteration</h2>",
        _img(figures.get("score"), "validation score per iteration"),
    ]
    parts += [
        "<h2>Accepted steps</h2>",
        "<table><tr><th>iteration</th><th>score</th><th>design diff</th>"
        "<th>selected by</th><th>rationale</th></tr>",
    ]
    for x in rows:
        if not x["accepted"]:
            continue
        diff = "<br>".join(html.escape(c) for c in x["changes"]) or (
            "(initial design)" if x["iteration"] == 0 else "–"
        )
        parts.append(
            f"<tr><td class=num>{x['iteration']}</td><td class=num>{_fmt(x['score'])}</td><td>{diff}</td>"
            f"<td>{_fmt(x['selected_by'])}</td><td>{html.escape(x['rationale'][:600])}</td></tr>"
        )
    parts.append("</table>")
    parts += ["<h2>Training failures by stage</h2>"]
    if data["diagnosis"]:
        parts.append(_img(figures.get("diagnosis"), "training failures by stage"))
        parts.append(
            "<table><tr><th>accepted design</th>"
            + "".join(f"<th>{s}</th>" for s in STAGES)
            + "</tr>"
        )
        for d in data["diagnosis"]:
            parts.append(
                f"<tr><td>iteration {d['iteration']}</td>"
                + "".join(f"<td class=num>{d[s]}</td>" for s in STAGES)
                + "</tr>"
            )
        parts.append("</table>")
    else:
        parts.append("<p>No diagnosis recorded.</p>")
    parts += ["<h2>Cost by role</h2>"]
    if data["cost_by_role"]:
        parts.append(_img(figures.get("cost"), "LM cost by role"))
        parts.append(
            "<table><tr><th>role</th><th>calls</th><th>prompt tokens</th><th>completion tokens</th>"
            "<th>total tokens</th></tr>"
        )
        for role, c in data["cost_by_role"].items():
            parts.append(
                f"<tr><td>{html.escape(role)}</td>"
                + "".join(
                    f"<td class=num>{c[k]:,}</td>"
                    for k in ("calls", "prompt_tokens", "completion_tokens", "total_tokens")
                )
                + "</tr>"
            )
        parts.append("</table>")
    else:
        parts.append("<p>No LM usage recorded.</p>")
    total = run.entries[-1].get("cost_total") or {}
    parts.append(
        f"<p>Whole run: {int(total.get('calls', 0)):,} LM calls, {int(total.get('total_tokens', 0)):,} "
        f"tokens, {float(total.get('seconds', 0.0)):.0f} s.</p>"
    )
    parts += [
        "<h2>All iterations</h2>",
        "<table><tr><th>iter</th><th>status</th>"
        f"<th>{METRIC_LABELS.get(metric, metric)}</th><th>best so far</th><th>changes / outcome</th></tr>",
    ]
    for x in rows:
        what = "; ".join(x["changes"]) or ("(initial)" if x["iteration"] == 0 else "–")
        if x["reason"] and not x["accepted"]:
            what += f" — {x['reason']}"
        parts.append(
            f"<tr><td class=num>{x['iteration']}</td><td>{html.escape(x['status'])}</td>"
            f"<td class=num>{_fmt(x['score'])}</td><td class=num>{_fmt(x['best'])}</td>"
            f"<td>{html.escape(what[:400])}</td></tr>"
        )
    parts.append("</table></body></html>")
    return "\n".join(parts) + "\n"


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Report:
    """Draw the figures and write ``report.html`` (+ PNGs and ``report.json``) for a run folder."""
    run = load_run(run_dir)
    folder = Path(out) if out is not None else run.path / REPORT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    figures = {
        "score": plot_scores(run, folder / "score.png"),
        "diagnosis": plot_diagnosis(run, folder / "diagnosis.png"),
        "cost": plot_cost(run, folder / "cost.png"),
        "heldout": plot_heldout(run, folder / "heldout.png"),
    }
    for name, p in figures.items():  # a figure this run has no data for must not linger from before
        if p is None and (folder / f"{name}.png").exists():
            (folder / f"{name}.png").unlink()
    data = {
        "objective": run.objective,
        "metric": primary_metric(run.objective),
        "iterations": score_rows(run),
        "diagnosis": diagnosis_rows(run),
        "cost_by_role": cost_by_role(run),
        "test": run.test,
    }
    (folder / "report.json").write_text(
        json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    page = folder / "report.html"
    page.write_text(render_html(run, figures, data), encoding="utf-8")
    return Report(
        folder=folder,
        html=page,
        figures={k: v for k, v in figures.items() if v is not None},
        data=data,
    )


def log_report(
    report: Report, run_dir: str | Path, *, tracking_uri: str | None = None
) -> dict[str, str] | None:
    """Add the report's files to the run's MLflow parent run under ``report/``. Returns the parent
    run id, the ``mlflow ui`` command and the runs page address, or None when the run has no
    tracked parent run or tracking failed (a warning says why)."""
    run = load_run(run_dir).run
    parent, uri = run.get("parent_run_id"), tracking_uri or run.get("tracking_uri")
    if not parent or not uri:
        return None
    tracker = Tracker.for_run(uri, parent)
    if not tracker.connect():
        return None
    for path in sorted(report.folder.iterdir()):
        if path.is_file():
            tracker.log_artifact(parent, path, REPORT_DIR)
    if not tracker.active:
        return None
    return {
        "parent_run_id": parent,
        "ui_command": tracker.ui_command(),
        "ui_url": tracker.ui_url() or "",
    }
