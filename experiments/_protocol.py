"""main.py's test protocol under ``[dataset] test_on = "unused"`` (issue #47; the ``cpu`` preset).

Every row (Base-BM25, + Official-QA, + MemSteer) is scored on the same items, with the same
context budget:

* **retrieval** on every official item of each persona, LM-free (``metrics="recall"``): R@10 and
  delivered recall, reported on the items the Official-QA split leaves out (40% training and 20%
  validation per persona, the study's seed and caps: :func:`_common.unused_items`) — the only
  official items neither optimization selected on — and on all of them as the paper reports them
  (marked †: + Official-QA's own training and validation items are among them);
* **accuracy** (and exact agreement, since a small judge's verdicts need a check beside them) with
  the study's answerer and judge on a sample of the unused items (:func:`_common.accuracy_sample`:
  stratified by question type and persona, seeded, the same for every row);
* **paired 95% intervals** (:func:`memsteer_dspy.stats.paired_comparison`: bootstrap, 1,000
  resamples, seed 0), item by item in one order, of each optimized row against Base-BM25 and of
  + MemSteer against + Official-QA — as ``systems.py`` compares rows on its held-out split.

Each evaluation is one folder per (persona, design, item set, metrics, scoring LMs)
(:meth:`_common.Study.eval_folder`): a rerun resumes it with no LM call paid twice, and a rerun
under other settings starts a new folder instead of reusing it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from _common import (
    SETTING_LABELS,
    Study,
    md_table,
    pct,
    persona_of,
    unused_items,
)

from memsteer_dspy.evaluation import EvaluationReport, ItemResult, evaluate_design, summarize_items
from memsteer_dspy.memory import MemoryDesign, MemorySystem
from memsteer_dspy.stats import paired_comparison, points, points_ci

RECALL = ("recall_at_10", "delivered_recall")
ANSWERED = ("accuracy", "exact")
#: The paired comparisons: name -> (reference row, compared row).
PAIRS = {
    "official-base": ("base", "official"),
    "memsteer-base": ("base", "memsteer"),
    "memsteer-official": ("official", "memsteer"),
}

# One tested item: its persona, its retrieval-only result and its answered result (sampled only).
Entry = tuple[str, ItemResult, ItemResult | None]


def recall_reports(
    study: Study, design: MemoryDesign, personas: Sequence[str], *, external: bool, setting: str
) -> dict[str, EvaluationReport]:
    """R@10 and delivered recall of ``design`` on every official item of each persona (no LM
    unless the design's own retrieval needs one)."""
    threads = study.cfg.budgets.threads
    reports = {}
    for persona in personas:
        loaded = study.load(persona, external)
        lms = {"answerer": study.lm.lm("answerer")} if design.lm_uses(answering=False) else {}
        system = MemorySystem.from_design(
            design, loaded.history, cache_dir=study.cache_dir, lms=lms, threads=threads
        )
        items = loaded.qa_items
        reports[persona] = evaluate_design(
            system,
            items,
            metrics="recall",
            protocol="as_of",
            threads=threads,
            out_dir=study.eval_folder(setting, persona, design, items, "recall"),
        )
    return reports


def test_row(
    study: Study,
    design: MemoryDesign,
    personas: Sequence[str],
    *,
    external: bool,
    condition: str,
    setting: str,
    answer: bool = True,
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """One row of the table: (its scores on the unused items, with ``all_items`` (†) beside them;
    its per-item scores by ``<persona>/<qa id>`` for :func:`comparisons`). ``answer``: also answer
    and judge the accuracy sample (else its accuracy is None: main.py scores every row's
    retrieval first, then spends the answerer). The row's lines in the study's ``items.jsonl``,
    one per official item flagged ``unused`` and ``sampled``, replace any it had."""
    recall = recall_reports(study, design, personas, external=external, setting=setting)
    how = {"external": external, "condition": condition, "setting": setting, "rows": False}
    answered = study.test(design, personas, **how) if answer else {}
    seed = study.cfg.dataset.seed
    official = study.official(personas, external)
    unused = {(persona_of(q), q.id) for q in unused_items(official, study.cfg.budgets, seed)}
    sample = {(persona_of(q), q.id) for q in study.accuracy_items(personas, external)}
    study.rows[:] = [
        r for r in study.rows if (r["condition"], r["setting"]) != (condition, setting)
    ]
    per_item: dict[str, dict[str, Any]] = {}
    everything: list[Entry] = []
    for persona, rep in recall.items():
        judged = {r.qa_id: r for r in answered[persona].items} if persona in answered else {}
        for r in rep.items:
            a = judged.get(r.qa_id)
            everything.append((persona, r, a))
            per_item[f"{persona}/{r.qa_id}"] = {
                **{m: getattr(r, m) for m in RECALL},
                "accuracy": None if a is None else float(bool(a.correct)),
                "exact": None if a is None else float(bool(a.exact)),
                "unused": (persona, r.qa_id) in unused,
            }
        study.add_rows(
            [judged.get(r.qa_id, r) for r in rep.items],
            condition,
            setting,
            persona,
            design,
            extra={
                r.qa_id: {
                    "unused": (persona, r.qa_id) in unused,
                    "sampled": (persona, r.qa_id) in sample,
                }
                for r in rep.items
            },
        )
    row = _block([e for e in everything if (e[0], e[1].qa_id) in unused])
    row["all_items"] = _block([(p, r, None) for p, r, _ in everything])
    return row, per_item


def _scores(entries: Sequence[Entry]) -> dict[str, Any]:
    r = summarize_items([e[1] for e in entries], "recall")
    judged = [e[2] for e in entries if e[2] is not None]
    a = summarize_items(judged, "all") if judged else None
    return {
        "n": r.n,
        "recall_at_10": r.recall_at_10,
        "delivered_recall": r.delivered_recall,
        "n_accuracy": len(judged),
        "accuracy": a.accuracy if a else None,
        "exact": sum(bool(x.exact) for x in judged) / len(judged) if judged else None,
        "qs": a.qs if a else None,
        "errors": r.errors + (a.errors if a else 0),
    }


def _block(entries: Sequence[Entry]) -> dict[str, Any]:
    """Scores over ``entries``, by question type and per persona."""
    by_type: dict[str, list[Entry]] = {}
    per_persona: dict[str, list[Entry]] = {}
    for e in entries:
        by_type.setdefault(e[1].question_type or "unknown", []).append(e)
        per_persona.setdefault(e[0], []).append(e)
    return {
        **_scores(entries),
        "by_type": {t: _scores(es) for t, es in sorted(by_type.items())},
        "per_persona": {p: _scores(es) for p, es in per_persona.items()},
    }


def _paired(
    a: Mapping[str, dict[str, Any]],
    b: Mapping[str, dict[str, Any]],
    keys: Sequence[str],
    metrics: Sequence[str],
) -> dict[str, dict[str, Any]]:
    cmp = paired_comparison(
        {m: [a[k][m] for k in keys] for m in metrics},
        {m: [b[k][m] for k in keys] for m in metrics},
        "delivered_recall",
    )
    return {
        m: {
            "a": cmp.initial[m],
            "b": cmp.best[m],
            "diff": cmp.diff[m],
            "ci95": cmp.ci95[m],
            "n": cmp.n_pairs[m],
        }
        for m in metrics
    }


def comparisons(per_item: Mapping[str, Mapping[str, dict[str, Any]]]) -> dict[str, Any]:
    """The paired comparisons (:data:`PAIRS`) between the rows of one setting that are there
    (``per_item``: row -> :func:`test_row`'s per-item scores): ``unused`` (R@10, delivered recall,
    accuracy, exact; accuracy pairs are the sampled items) and ``all`` († R@10 and delivered
    recall), each metric's mean of both rows (``a``, ``b``), ``diff`` (b − a), ``ci95``, ``n``
    pairs."""
    out: dict[str, Any] = {}
    for name, (ref, row) in PAIRS.items():
        if ref not in per_item or row not in per_item:
            continue
        a, b = per_item[ref], per_item[row]
        keys = [k for k in a if k in b]
        out[name] = {
            "unused": _paired(a, b, [k for k in keys if a[k]["unused"]], (*RECALL, *ANSWERED)),
            "all": _paired(a, b, keys, RECALL),
        }
    return out


def _delta(cmp: Mapping[str, Any] | None, metric: str) -> str:
    c = (cmp or {}).get(metric)
    return "–" if not c or c["diff"] is None else f"{points(c['diff'])} {points_ci(c['ci95'])}"


def table2_lines(results: Mapping[str, Any], labels: Mapping[str, str]) -> list[str]:
    """Table 2 on the unused items, the same on all items (†) and + MemSteer against
    + Official-QA, per setting: scores with paired 95% intervals, in points."""
    lines: list[str] = []
    for setting, conds in results["settings"].items():
        if "base" not in conds:
            continue
        cmp = results.get("comparisons", {}).get(setting, {})
        base, tag = conds["base"], SETTING_LABELS[setting]
        unused, everything = [], []
        for m, label in labels.items():
            if m not in conds:
                continue
            c, vs = conds[m], cmp.get(f"{m}-base", {})
            u, al = vs.get("unused"), vs.get("all")
            unused.append(
                [label, pct(c["accuracy"]), _delta(u, "accuracy"), pct(c["exact"])]
                + [x for r in RECALL for x in (pct(c[r]), _delta(u, r))]
            )
            everything.append(
                [label + " †"]
                + [x for r in RECALL for x in (pct(c["all_items"][r]), _delta(al, r))]
            )
        lines += [
            f"## Table 2 — {tag}: the {base['n']} official items neither optimization used",
            "",
            md_table(
                ["Method", "Accuracy (%)", "ΔAcc. [95% CI]", "Exact (%)"]
                + ["R@10 (%)", "ΔR@10 [95% CI]", "Delivered (%)", "ΔDeliv. [95% CI]"],
                unused,
            ),
            "",
            (
                f"Accuracy and exact agreement on a sample of {base['n_accuracy']} of them, "
                "stratified by question type and persona (seeded), answered and judged under "
                "every row"
                if base["n_accuracy"]
                else "Accuracy: not answered yet (the sample is answered once every row's "
                "retrieval is in)"
            )
            + f"; R@10 and delivered recall on all {base['n']}. Δ: points against Base-BM25, "
            "paired bootstrap 95% interval (1,000 resamples, seed 0).",
            "",
            f"## All {base['all_items']['n']} official items † ({tag}; retrieval)",
            "",
            md_table(
                ["Method", "R@10 (%)", "ΔR@10 [95% CI]", "Delivered (%)", "ΔDeliv. [95% CI]"],
                everything,
            ),
            "",
            "† As the paper evaluates: + Official-QA's training and validation items are among "
            "these; + MemSteer used no official item for training or selection.",
            "",
        ]
        if "memsteer-official" in cmp:
            u, al = cmp["memsteer-official"]["unused"], cmp["memsteer-official"]["all"]
            lines += [
                f"## + MemSteer against + Official-QA ({tag}; points, paired 95% CI)",
                "",
                md_table(
                    ["items", "ΔAcc.", "ΔExact", "ΔR@10", "ΔDeliv."],
                    [
                        [f"unused ({base['n']})", *(_delta(u, m) for m in (*ANSWERED, *RECALL))],
                        [
                            f"all † ({base['all_items']['n']})",
                            "–",
                            "–",
                            *(_delta(al, m) for m in RECALL),
                        ],
                    ],
                ),
                "",
            ]
    return lines
