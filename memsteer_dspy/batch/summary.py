"""``batch_summary.json`` and ``batch_summary.md``: each user's figures, read from the folder the
single-user command wrote, and the same figures pooled.

* ingest — records, spans, QA items, evidence resolved (``ingest.json``);
* generate — candidates, accepted, kept fraction, train/val, LM calls and tokens (``summary.json``);
* evaluate — n, accuracy, QS, R@1/5/10, delivered recall (``summary.json``); pooled over the items
  of every user (``items.jsonl``), exactly as one evaluation over all of them would average;
* optimize — the validation score of the initial and the best design (the data the run selected
  on), the held-out test figures with the paired interval and verdict when the run wrote them
  (``summary.json`` ``test``: ``n``, ``initial``, ``best``, ``diff``, ``ci95``, ``verdict``), and
  the cost (``trajectory.jsonl``). Pooled held-out figures are item-weighted means of the users'
  test sets, with the count of users whose verdict was better, worse or no difference.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

METRICS = ("accuracy", "qs", "recall_at_1", "recall_at_5", "recall_at_10", "delivered_recall")


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]


def _weighted(rows: list[dict[str, Any]], key: str, weight: str = "n") -> float | None:
    pairs = [(r[key], r.get(weight) or 0) for r in rows if r.get(key) is not None]
    total = sum(w for _, w in pairs)
    return round(sum(v * w for v, w in pairs) / total, 4) if total else None


# ---------------------------------------------------------------------------------------------
# per command: one user's figures, and the pooled ones
# ---------------------------------------------------------------------------------------------


def ingest_figures(folder: Path) -> dict[str, Any] | None:
    rep = _read_json(folder / "ingest.json")
    if rep is None:
        return None
    keys = ("records", "spans", "threads", "qa_items", "evidence_resolved_fraction")
    return {k: rep.get(k) for k in keys}


def ingest_pooled(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out = {k: sum(r.get(k) or 0 for r in rows) for k in ("records", "spans", "threads", "qa_items")}
    out["evidence_resolved_fraction"] = _weighted(rows, "evidence_resolved_fraction", "qa_items")
    return out


def generate_figures(folder: Path) -> dict[str, Any] | None:
    s = _read_json(folder / "summary.json")
    if s is None:
        return None
    per = (s.get("tokens_per_accepted") or {}).get("total", 0.0)
    return {
        "candidates": s.get("candidates", 0),
        "accepted": s.get("accepted", 0),
        "kept_fraction": s.get("kept_fraction"),
        "train": s.get("train", 0),
        "val": s.get("val", 0),
        "lm_calls": sum((s.get("lm_calls") or {}).values()),
        "tokens": round(per * s.get("accepted", 0)),
        "wall_seconds": s.get("wall_seconds"),
    }


def generate_pooled(rows: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("candidates", "accepted", "train", "val", "lm_calls", "tokens")
    out: dict[str, Any] = {k: sum(r.get(k) or 0 for r in rows) for k in keys}
    out["kept_fraction"] = (
        round(out["accepted"] / out["candidates"], 4) if out["candidates"] else None
    )
    return out


def evaluate_figures(folder: Path) -> dict[str, Any] | None:
    s = _read_json(folder / "summary.json")
    if s is None:
        return None
    return {
        "n": s.get("n", 0),
        **{m: s.get(m) for m in METRICS},
        "errors": s.get("errors", 0),
        "design": s.get("design_name"),
        "metrics": s.get("metrics"),
    }


def evaluate_pooled(folders: list[Path]) -> dict[str, Any]:
    from memsteer_dspy.evaluation import ItemResult, summarize_items

    items = [ItemResult.model_validate(r) for f in folders for r in _jsonl(f / "items.jsonl")]
    metrics = "all" if any(i.metrics == "all" for i in items) else "recall"
    s = summarize_items(items, metrics)
    return {"n": s.n, **{m: getattr(s, m) for m in METRICS}, "errors": s.errors}


def optimize_figures(folder: Path) -> dict[str, Any] | None:
    entries = _jsonl(folder / "trajectory.jsonl")
    summary = _read_json(folder / "summary.json") or {}
    if not entries and not summary:
        return None
    first, last = (entries[0], entries[-1]) if entries else ({}, {})
    cost = last.get("cost_total") or {}
    out: dict[str, Any] = {
        "iterations": max(0, len(entries) - 1),
        "accepted": [e["iteration"] for e in entries if e.get("accepted") and e.get("iteration")],
        "val_initial": first.get("score"),
        "val_best": last.get("best_score"),
        "cost": {k: cost.get(k) for k in ("calls", "total_tokens", "seconds")},
    }
    test = summary.get("test")
    if isinstance(test, dict):
        out["test"] = {
            k: test.get(k) for k in ("n", "source", "initial", "best", "diff", "ci95", "verdict")
        }
    return out


def optimize_pooled(rows: list[dict[str, Any]]) -> dict[str, Any]:
    cost = {
        k: sum((r.get("cost") or {}).get(k) or 0 for r in rows)
        for k in ("calls", "total_tokens", "seconds")
    }
    out: dict[str, Any] = {"users": len(rows), "cost": cost}
    tests = [r["test"] for r in rows if isinstance(r.get("test"), dict) and r["test"].get("n")]
    if tests:
        names = sorted({m for t in tests for m in (t.get("initial") or {})})
        initial = {
            m: _weighted([{"v": (t.get("initial") or {}).get(m), "n": t["n"]} for t in tests], "v")
            for m in names
        }
        best = {
            m: _weighted([{"v": (t.get("best") or {}).get(m), "n": t["n"]} for t in tests], "v")
            for m in names
        }
        verdicts: dict[str, int] = {}
        for t in tests:
            verdicts[str(t.get("verdict"))] = verdicts.get(str(t.get("verdict")), 0) + 1
        out["test"] = {
            "n": sum(t["n"] for t in tests),
            "users": len(tests),
            "initial": initial,
            "best": best,
            "verdicts": verdicts,
        }
    return out


FIGURES = {
    "ingest": ingest_figures,
    "generate": generate_figures,
    "evaluate": evaluate_figures,
    "optimize": optimize_figures,
}


def collect(command: str, out: Path, outcomes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The batch summary: ``users`` (user → status and figures) and ``pooled``."""
    users: dict[str, Any] = {}
    ok_rows, ok_folders = [], []
    for user, outcome in outcomes.items():
        row: dict[str, Any] = {"status": outcome["status"]}
        if outcome.get("error"):
            row["error"] = outcome["error"]
        figures = FIGURES[command](out / user) if outcome["status"] in ("ok", "skipped") else None
        if figures is not None:
            row.update(figures)
            ok_rows.append(figures)
            ok_folders.append(out / user)
        users[user] = row
    if command == "evaluate":
        pooled = evaluate_pooled(ok_folders) if ok_folders else {}
    else:
        pooled = {
            "ingest": ingest_pooled,
            "generate": generate_pooled,
            "optimize": optimize_pooled,
        }[command](ok_rows)
    counts: dict[str, int] = {}
    for o in outcomes.values():
        counts[o["status"]] = counts.get(o["status"], 0) + 1
    return {"command": command, "statuses": counts, "users": users, "pooled": pooled}


# ---------------------------------------------------------------------------------------------
# the Markdown table
# ---------------------------------------------------------------------------------------------


def _pct(v: Any) -> str:
    return "–" if v is None else f"{100 * v:.1f}"


def _metric(score: dict[str, Any] | None, name: str) -> Any:
    return None if not score else score.get(name)


def _row(cells: list[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def markdown(summary: dict[str, Any]) -> str:
    cmd, users, pooled = summary["command"], summary["users"], summary["pooled"]
    lines = [
        f"# memsteer batch {cmd}",
        "",
        "statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(summary["statuses"].items())),
        "",
    ]
    if cmd == "ingest":
        head = ["user", "status", "records", "spans", "QA items", "evidence resolved %"]

        def cells(r):  # noqa: E306
            return [
                r.get("records", "–"),
                r.get("spans", "–"),
                r.get("qa_items", "–"),
                _pct(r.get("evidence_resolved_fraction")),
            ]
    elif cmd == "generate":
        head = [
            "user",
            "status",
            "candidates",
            "accepted",
            "kept %",
            "train/val",
            "LM calls",
            "tokens",
        ]

        def cells(r):  # noqa: E306
            return [
                r.get("candidates", "–"),
                r.get("accepted", "–"),
                _pct(r.get("kept_fraction")),
                f"{r.get('train', '–')}/{r.get('val', '–')}",
                r.get("lm_calls", "–"),
                r.get("tokens", "–"),
            ]
    elif cmd == "evaluate":
        head = ["user", "status", "n", "acc %", "QS %", "R@10 %", "delivered %", "errors"]

        def cells(r):  # noqa: E306
            return [
                r.get("n", "–"),
                _pct(r.get("accuracy")),
                _pct(r.get("qs")),
                _pct(r.get("recall_at_10")),
                _pct(r.get("delivered_recall")),
                r.get("errors", "–"),
            ]
    else:
        head = [
            "user",
            "status",
            "val R@10 base → best",
            "held-out n",
            "held-out R@10 base → best",
            "diff (95% CI)",
            "verdict",
            "LM calls",
            "tokens",
        ]

        def cells(r):  # noqa: E306
            test = r.get("test") or {}
            ci = test.get("ci95")
            diff = test.get("diff")
            diff_r10 = diff.get("recall_at_10") if isinstance(diff, dict) else diff
            ci_r10 = ci.get("recall_at_10") if isinstance(ci, dict) else ci
            diff_txt = "–" if diff_r10 is None else f"{100 * diff_r10:+.1f}"
            if isinstance(ci_r10, (list, tuple)) and len(ci_r10) == 2:
                diff_txt += f" [{100 * ci_r10[0]:+.1f}, {100 * ci_r10[1]:+.1f}]"
            cost = r.get("cost") or {}
            held = (
                f"{_pct(_metric(test.get('initial'), 'recall_at_10'))} → {_pct(_metric(test.get('best'), 'recall_at_10'))}"
                if test
                else "no held-out test"
            )
            return [
                f"{_pct(_metric(r.get('val_initial'), 'recall_at_10'))} → {_pct(_metric(r.get('val_best'), 'recall_at_10'))}",
                test.get("n", "–"),
                held,
                diff_txt,
                test.get("verdict", "–"),
                cost.get("calls", "–"),
                cost.get("total_tokens", "–"),
            ]

    lines += [_row(head), _row(["---"] * len(head))]
    for user, r in users.items():
        shown = (
            cells(r) if r["status"] in ("ok", "skipped") and len(r) > 1 else ["–"] * (len(head) - 2)
        )
        lines.append(_row([user, r["status"], *shown]))
    if cmd == "optimize":
        test = pooled.get("test") or {}
        held = (
            f"{_pct(_metric(test.get('initial'), 'recall_at_10'))} → {_pct(_metric(test.get('best'), 'recall_at_10'))}"
            if test
            else "–"
        )
        verdicts = (
            ", ".join(f"{k} {v}" for k, v in sorted((test.get("verdicts") or {}).items())) or "–"
        )
        cost = pooled.get("cost") or {}
        lines.append(
            _row(
                [
                    "**pooled**",
                    f"{pooled.get('users', 0)} users",
                    "",
                    test.get("n", "–"),
                    held,
                    "",
                    verdicts,
                    cost.get("calls", "–"),
                    cost.get("total_tokens", "–"),
                ]
            )
        )
    elif pooled:
        lines.append(_row(["**pooled**", "", *cells(pooled)]))
    failed = {u: r for u, r in users.items() if r["status"] in ("bad_input", "failed")}
    if failed:
        lines += ["", "## Users that did not finish", ""]
        lines += [
            f"- **{u}** ({r['status']}): {(r.get('error') or '').splitlines()[0] if r.get('error') else ''}"
            for u, r in failed.items()
        ]
    return "\n".join(lines) + "\n"
