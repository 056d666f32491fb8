"""Table 2 of the MemSteer paper on RHELM: Base-BM25, + Official-QA supervision and + MemSteer
supervision, without and with external sources; accuracy and R@10, overall and by question type
(Table 8), per persona when several share the design (Table 9b).

Protocol (Section 4.1, Appendix A.3): every condition starts from Base-BM25 with the same fixed
context budget, answerer and judge. "+ Official-QA" runs MemSteer-Opt on the benchmark's own QA
split per persona into 40% training and 20% validation; those items stay in the evaluation set, as
in the paper (†). "+ MemSteer" runs MemSteer-Opt on supervision generated from each persona's
history (conversations only under "without"), never on official items. Each optimized design is
evaluated on the official QA items (all, or ``[dataset] eval_items`` per persona), each question
answered from the history before its ``question_date``. With several personas one design is
optimized for all of them (the paper's ten-user setting) and scores pool their questions.

Under ``[dataset] test_on = "unused"`` (the ``cpu`` preset, issue #47) every row is tested on the
official items neither optimization used, retrieval on every item and on all items (†), accuracy on
a stratified sample, with paired 95% intervals against Base-BM25 and between the optimized rows:
see ``_protocol.py``.

Usage::

    python experiments/main.py --preset small                    # embedded LM, one persona (~30 min, 2 cores)
    python experiments/main.py --preset cpu                      # embedded LM, ten personas, w/ (many sessions)
    python experiments/main.py --config experiments/configs/openai.toml --preset full
    python experiments/main.py --preset small --persona Jonas_Richter --out runs/main-jonas

Writes into ``--out`` (default ``experiments/runs/main-<preset>``):

* ``results.md`` — Table 2 (accuracy, w/o and w/), R@10 in the same shape, Table 8 (accuracy by
  question type), per-persona accuracy, what each optimization changed, and the cost of each stage
  (``test_on = "unused"``: with delivered recall, exact agreement and paired 95% intervals);
* ``results.json`` — the same numbers (and ``comparisons``: the paired differences); ``items.jsonl``
  — one line per (condition, setting, persona, test item);
* ``<setting>/supervision/<persona>/`` — the generated supervision (``memsteer generate``'s folder);
* ``<setting>/opt-official/``, ``<setting>/opt-memsteer/`` — the MemSteer-Opt runs;
* ``eval/<setting>/<persona>/<design key>[-<metrics>-<item set>]/items.jsonl`` — per-item results
  with traces;
* ``mlflow.db`` — the study run (table numbers as metrics) with the optimization runs nested in it.

A rerun of the same command resumes every stage where it stopped.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Unpack

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    QUESTION_TYPES,
    SETTING_LABELS,
    ExperimentConfig,
    Study,
    StudyOptions,
    cli,
    md_table,
    official_split,
    optimization_dict,
    optimization_lines,
    pct,
    report_dict,
    safe_name,
    with_delta,
)
from _protocol import RECALL, comparisons, table2_lines, test_row  # noqa: E402

from memsteer_dspy.memory import MemoryDesign  # noqa: E402

METHODS = {"base": "Base-BM25", "official": "+ Official-QA†", "memsteer": "+ MemSteer"}
TITLES = {
    "accuracy": "Table 8 — accuracy",
    "recall_at_10": "R@10",
    "delivered_recall": "Delivered recall",
}


def run(cfg: ExperimentConfig, out: str | Path, **options: Unpack[StudyOptions]) -> Path:
    """Run the Table 2 study (see the module docstring); returns the path of ``results.md``."""
    out = Path(out)
    study = Study("main", cfg, out, **options)
    personas = cfg.personas()
    results: dict[str, Any] = {
        "personas": personas,
        "settings": {},
        "optimizations": {},
        "supervision": {},
        "comparisons": {},
    }
    unused = cfg.dataset.test_on == "unused"
    per_item: dict[str, dict[str, Any]] = {}  # setting -> row -> per-item scores (test_on unused)
    tested: dict[str, dict[str, MemoryDesign]] = {}  # setting -> row -> its design

    def test(
        design: MemoryDesign, condition: str, setting: str, *, answer: bool = not unused
    ) -> dict[str, Any]:
        how = {"external": setting == "with", "condition": condition, "setting": setting}
        if not unused:
            return report_dict(study.test(design, personas, **how))
        tested.setdefault(setting, {})[condition] = design
        row, items = test_row(study, design, personas, answer=answer, **how)
        per_item.setdefault(setting, {})[condition] = items
        results["comparisons"][setting] = comparisons(per_item[setting])
        return row

    study.on_stage = lambda: study.checkpoint(render(study, results), results)
    study.keep_state()  # --state: generation runs for hours inside one stage
    for setting in cfg.dataset.settings:
        external = setting == "with"
        conditions: dict[str, Any] = {}
        results["settings"][setting] = conditions
        histories = {p: study.load(p, external).history for p in personas}
        with study.stage(f"{setting}: Base-BM25 on the test items"):
            conditions["base"] = test(study.base_design(), "base", setting)
        if "official" in cfg.main.sources:
            with study.stage(f"{setting}: + Official-QA (MemSteer-Opt on the official split)"):
                items = study.official(personas, external)
                train, val = official_split(items, cfg.budgets, cfg.dataset.seed)
                res = study.optimize(
                    out / setting / "opt-official",
                    histories,
                    train,
                    val,
                    label=f"{setting}/official",
                )
                results["optimizations"][f"{setting}/official"] = optimization_dict(
                    res, len(train), len(val)
                )
                conditions["official"] = test(res.best_design, "official", setting)
        if "memsteer" in cfg.main.sources:
            generated = []
            with study.stage(f"{setting}: generate MemSteer supervision"):
                for p in personas:
                    g = study.generate(
                        out / setting / "supervision" / safe_name(p), p, external=external
                    )
                    generated.append(g)
                    results["supervision"][f"{setting}/{p}"] = {
                        k: g.summary.get(k)
                        for k in (
                            "candidates",
                            "accepted",
                            "kept_fraction",
                            "train",
                            "val",
                            "tokens_per_accepted",
                            "rejected_by_stage",
                        )
                    }
                    study.save_state()  # one persona's hours of generation kept
            if len(generated) == len(personas):
                with study.stage(f"{setting}: + MemSteer (MemSteer-Opt on generated supervision)"):
                    train = [q for g in generated for q in g.train]
                    val = [q for g in generated for q in g.val]
                    res = study.optimize(
                        out / setting / "opt-memsteer",
                        histories,
                        train,
                        val,
                        label=f"{setting}/memsteer",
                    )
                    results["optimizations"][f"{setting}/memsteer"] = optimization_dict(
                        res, len(train), len(val)
                    )
                    conditions["memsteer"] = test(res.best_design, "memsteer", setting)
        # test_on unused: every row's retrieval is in; now the answerer's sample, row by row
        for condition, design in tested.get(setting, {}).items():
            with study.stage(f"{setting}: {METHODS[condition].rstrip('†')} on the accuracy sample"):
                conditions[condition] = test(design, condition, setting, answer=True)
    metrics = {
        f"{setting}.{method}.{m}": cond.get(m)
        for setting, conds in results["settings"].items()
        for method, cond in conds.items()
        for m in ("accuracy", "qs", *RECALL)
    }
    metrics |= {
        f"{setting}.{method}.all_items.{m}": cond["all_items"][m]
        for setting, conds in results["settings"].items()
        for method, cond in conds.items()
        if "all_items" in cond
        for m in RECALL
    }
    return study.finish(render(study, results), results, metrics)


def _cell(results: dict[str, Any], setting: str, method: str, metric: str) -> str:
    conds = results["settings"].get(setting, {})
    cond = conds.get(method)
    if cond is None:
        return "–"
    base = conds.get("base", {}).get(metric)
    return with_delta(cond[metric], base) if method != "base" else pct(cond[metric])


def _per_persona(
    conds: dict[str, Any],
    personas: list[str],
    metric: str,
    n: str,
    setting: str,
    labels: dict[str, str],
) -> list[str]:
    """Table 9b: one row per persona, ``metric`` under each condition (points over Base-BM25)."""
    rows = []
    for p in personas:
        base = conds.get("base", {}).get("per_persona", {}).get(p, {})
        row = [p.replace("_", " "), base.get(n, "–"), pct(base.get(metric))]
        for m in ("official", "memsteer"):
            value = conds.get(m, {}).get("per_persona", {}).get(p, {}).get(metric)
            row.append(with_delta(value, base.get(metric)))
        rows.append(row)
    title = "accuracy" if metric == "accuracy" else TITLES[metric].lower()
    return [
        f"## Per-persona {title} (%), {SETTING_LABELS[setting]} (Table 9b)",
        "",
        md_table(["Persona", "N", *(labels[m].lstrip("+ ") for m in labels)], rows),
        "",
    ]


def render(study: Study, results: dict[str, Any]) -> str:
    """``results.md``: the paper's Table 2 shape, then R@10, Table 8 and per-persona tables."""
    settings = list(results["settings"])
    personas = results["personas"]
    n_items = {s: next((c["n"] for c in results["settings"][s].values()), 0) for s in settings}
    lines = study.header(
        "Table 2 — RHELM results (accuracy, %)",
        [
            f"- personas: {', '.join(personas)}"
            + (" (one shared design)" if len(personas) > 1 else ""),
            "- test items: " + ", ".join(f"{SETTING_LABELS[s]} {n_items[s]}" for s in settings),
        ],
    )
    unused = study.cfg.dataset.test_on == "unused"
    labels = {**METHODS, "official": "+ Official-QA"} if unused else METHODS
    if unused:
        lines += table2_lines(results, labels)
    else:
        heads = ["Method", *[SETTING_LABELS[s] for s in settings]]
        for metric, title in (
            ("accuracy", "Accuracy (%)"),
            ("recall_at_10", "Evidence recall R@10 (%)"),
        ):
            lines += [
                f"## {title}",
                "",
                md_table(
                    heads,
                    [
                        [label, *[_cell(results, s, m, metric) for s in settings]]
                        for m, label in METHODS.items()
                    ],
                ),
                "",
            ]
    lines += [
        "w/o: conversation records only; w/: conversations plus emails and documents. "
        + (
            "Tables 8 and 9b below are on the unused items."
            if unused
            else "Arrows: points over Base-BM25. † Official-QA training and validation items are "
            "included in evaluation; MemSteer uses no official item for training or design "
            "selection."
        ),
        "",
    ]
    types = list(QUESTION_TYPES)
    for metric in ("accuracy", "recall_at_10", *(["delivered_recall"] if unused else [])):
        for s in settings:
            rows = []
            for m, label in labels.items():
                cond = results["settings"][s].get(m)
                if cond is None:
                    continue
                by_type = [pct(cond["by_type"].get(t, {}).get(metric)) for t in types]
                rows.append([label, *by_type, pct(cond[metric])])
            lines += [
                f"## {TITLES[metric]} (%) by question type, {s} external data sources",
                "",
                md_table(["Model", *QUESTION_TYPES.values(), "Avg"], rows),
                "",
            ]
    lines += [
        "FC fact, TP temporal, AG aggregation, HL hallucination, MI misleading, EX attachments and "
        "emails, MX mixed-context questions. R@10 counts only evidence in the loaded sources (without "
        "external data, items whose evidence lies only in emails or documents have none).",
        "",
    ]
    if len(personas) > 1:
        per_persona = [("accuracy", "n_accuracy" if unused else "n")]
        per_persona += [("delivered_recall", "n")] if unused else []
        for s in settings:
            for metric, n in per_persona:
                lines += _per_persona(results["settings"][s], personas, metric, n, s, labels)
    if results["optimizations"]:
        lines += ["## The optimizations", ""]
        for key, opt in results["optimizations"].items():
            lines += optimization_lines(key, opt)
        lines.append("")
    if results["supervision"]:
        rows = []
        for key, sup in results["supervision"].items():
            per = (sup.get("tokens_per_accepted") or {}).get("total")
            rows.append(
                [
                    key,
                    sup.get("accepted"),
                    sup.get("candidates"),
                    pct(sup.get("kept_fraction")),
                    f"{sup.get('train')}/{sup.get('val')}",
                    "–" if per is None else f"{per / 1000:.1f}",
                ]
            )
        lines += [
            "## Generated supervision",
            "",
            md_table(
                [
                    "setting/persona",
                    "accepted",
                    "candidates",
                    "kept (%)",
                    "train/val",
                    "tokens/item (k)",
                ],
                rows,
            ),
            "",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(cli("main", __doc__, run))
