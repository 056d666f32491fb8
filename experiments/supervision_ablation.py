"""Tables 4 and 5 of the MemSteer paper: which supervision-construction choices matter.

Every generation method of the paper's ablations runs on the same personas, seed and budget, with
and without the source-grounded checks (plan checks, audit, blind read):

* ``naive`` — records picked at random for the bundle, then question, answer and evidence in one
  call (the paper's Naive-QA);
* ``direct`` — graph-expanded bundles, question, answer and evidence in one call (Direct QA);
* ``joint`` — an evidence-grounded answer plan and the question in one call (Joint Plan–Q);
* ``memsteer`` — plan, programmatic plan checks, then the question in a separate call (Two-stage
  Plan–Q, the full MemSteer);
* ``ragas`` — Ragas-QA, the paper's external generator: Ragas's own testset generation (the
  ``[ragas]`` extra, its knowledge graph and query synthesizers) on the seed records a MemSteer run
  draws, as many samples as it has candidates; "with checks" runs MemSteer's audit and blind read on
  its items (``Study.generate_ragas``). Ragas's LLM is the planner's (the embedded model served by
  llama.cpp for the run).

For each: **kept %** (accepted / candidates tried; "–" without checks, which filter nothing),
**QA quality** (the four-criteria judge — premise support, clarity, answer support, evidence
support — an item scores 1 only if all four hold; on up to ``budgets.quality_items`` items per
persona), **tokens per accepted item** (all generation roles, checks included), and the
**downstream** accuracy and R@10 of MemSteer-Opt run with that supervision from Base-BM25,
evaluated on the official QA; and (``steering``) whether the items rank the LM-free design panel as
the official QA does (Kendall τ per persona, ``memsteer assess --steering``). Table 5 is the same
data for direct / joint / two-stage with checks: the paper filters all three with one shared LLM
filter; here the shared filter is the checks.

Usage::

    python experiments/supervision_ablation.py --preset small
    python experiments/supervision_ablation.py --config experiments/configs/deepseek.toml --preset full

Writes into ``--out`` (default ``experiments/runs/supervision_ablation-<preset>``): ``results.md``
(Table 4, Table 5, the criteria breakdown, costs), ``results.json``, ``items.jsonl`` (official test
items per condition), ``quality.jsonl`` (every judged item with its four verdicts),
``supervision/<method>-<checks|nochecks>/<persona>/`` (each generation run), ``opt-<condition>/``
(MemSteer-Opt runs), ``eval/`` and ``mlflow.db``. A rerun resumes every stage.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Unpack

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    ExperimentConfig,
    Study,
    StudyOptions,
    cli,
    md_table,
    optimization_dict,
    optimization_lines,
    pct,
    report_dict,
    safe_name,
    with_delta,
    write_atomic,
)

LABELS = {
    "naive": "Naive-QA",
    "direct": "Direct QA",
    "joint": "Joint Plan–Q",
    "memsteer": "MemSteer",
    "ragas": "Ragas-QA",
}
CRITERIA = ("premise_support", "clarity", "answer_support", "evidence_support")


def condition_key(method: str, checks: bool) -> str:
    return f"{method}-{'checks' if checks else 'nochecks'}"


def row_label(method: str, checks: bool) -> str:
    if method == "memsteer":
        return "MemSteer" if checks else "MemSteer w/o checks"
    return f"{LABELS[method]} + checks" if checks else LABELS[method]


def _tokens(summary: dict[str, Any]) -> int:
    return sum(
        int(t.get("prompt_tokens", 0)) + int(t.get("completion_tokens", 0))
        for t in (summary.get("tokens_by_role") or {}).values()
    )


def run(cfg: ExperimentConfig, out: str | Path, **options: Unpack[StudyOptions]) -> Path:
    """Run the Tables 4/5 study (see the module docstring); returns the path of ``results.md``."""
    from memsteer_dspy.supervision.quality import assess_quality

    out = Path(out)
    study = Study("supervision_ablation", cfg, out, **options)
    personas = cfg.personas()
    opts = cfg.supervision_ablation
    histories = {p: study.load(p).history for p in personas}
    results: dict[str, Any] = {"personas": personas, "conditions": {}, "optimizations": {}}
    study.on_stage = lambda: study.checkpoint(render(study, results), results)
    judged: list[dict[str, Any]] = []
    if opts.downstream:
        with study.stage("Base-BM25 on the test items"):
            results["base"] = report_dict(
                study.test(study.base_design(), personas, condition="base")
            )
    for method in opts.methods:
        for checks in opts.checks:
            key = condition_key(method, checks)
            cond: dict[str, Any] = {"method": method, "checks": checks}
            results["conditions"][key] = cond
            generated = []
            with study.stage(f"{key}: generate"):
                for p in personas:
                    folder = out / "supervision" / key / safe_name(p)
                    if method == "ragas":
                        generated.append(study.generate_ragas(folder, p, checks=checks))
                    else:
                        generated.append(study.generate(folder, p, method=method, checks=checks))
            if len(generated) < len(personas):
                continue
            accepted = sum(g.summary.get("accepted", 0) for g in generated)
            tried = sum(g.summary.get("candidates", 0) for g in generated)
            tokens = sum(_tokens(g.summary) for g in generated)
            cond.update(
                accepted=accepted,
                candidates=tried,
                kept=accepted / tried if tried else None,
                tokens_per_item=tokens / accepted if accepted else None,
                train=sum(len(g.train) for g in generated),
                val=sum(len(g.val) for g in generated),
            )
            if opts.steering:
                with study.stage(f"{key}: steering"):
                    cond["steering"] = _steering(study, personas, generated)
            with study.stage(f"{key}: QA quality"):
                rows = []
                for p, g in zip(personas, generated, strict=True):
                    rep = assess_quality(
                        histories[p],
                        g.folders,
                        study.lm.lm("quality_judge"),
                        limit=cfg.budgets.quality_items,
                        seed=cfg.dataset.seed,
                    )
                    for r in next(iter(rep["by_method"].values()))["judged"]:
                        rows.append({"condition": key, "persona": p, **r})
                judged += rows
                n = len(rows)
                cond["quality_items"] = n
                cond["quality"] = sum(r["score"] for r in rows) / n if n else None
                cond["criteria"] = {
                    c: sum(bool(r["criteria"][c]) for r in rows) / n if n else None
                    for c in CRITERIA
                }
                cond["quality_errors"] = sum(r["error"] is not None for r in rows)
            if opts.downstream:
                with study.stage(f"{key}: MemSteer-Opt with this supervision"):
                    train = [q for g in generated for q in g.train]
                    val = [q for g in generated for q in g.val]
                    res = study.optimize(out / f"opt-{key}", histories, train, val, label=key)
                    results["optimizations"][key] = optimization_dict(res, len(train), len(val))
                    cond["test"] = report_dict(study.test(res.best_design, personas, condition=key))
    write_atomic(
        out / "quality.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in judged)
    )
    metrics: dict[str, float | None] = {}
    for key, cond in results["conditions"].items():
        metrics.update(
            {
                f"{key}.kept": cond.get("kept"),
                f"{key}.quality": cond.get("quality"),
                f"{key}.tokens_per_item": cond.get("tokens_per_item"),
                f"{key}.accuracy": (cond.get("test") or {}).get("accuracy"),
                f"{key}.recall_at_10": (cond.get("test") or {}).get("recall_at_10"),
            }
        )
    return study.finish(render(study, results), results, metrics)


def _steering(study: Study, personas: list[str], generated: list[Any]) -> dict[str, Any]:
    """Per persona: the LM-free design panel scored on the condition's items and on the official
    QA — Kendall τ with its interval, the best design of each, Base-BM25 R@10 on each."""
    from memsteer_dspy.supervision.steering import load_panel, steering_of_folder

    panel = load_panel(study.cfg.supervision_ablation.steering_panel)
    rows = {}
    for p, g in zip(personas, generated, strict=True):
        if not (g.train or g.val):
            rows[p] = {"items": 0}
            continue
        loaded = study.load(p)
        rep = steering_of_folder(
            loaded.history,
            g.folders[0],
            loaded.qa_items,
            protocol="as_of",  # RHELM's: no record on or after the question date is retrieved
            panel=panel,
            reference_source="official",
            cache_dir=study.cache_dir,
        )
        rows[p] = {"items": len(g.train) + len(g.val), **rep.headline()}
    return rows


def _tau(r: dict[str, Any]) -> str:
    tau, ci = r.get("kendall_tau"), r.get("kendall_ci95")
    if tau is None:
        return "–"
    return f"{tau:+.2f}" + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else "")


def _k(tokens: float | None) -> str:
    return "–" if tokens is None else f"{tokens / 1000:.1f}"


def render(study: Study, results: dict[str, Any]) -> str:
    base = results.get("base") or {}
    lines = study.header(
        "Tables 4 and 5 — QA-generation methods and verification",
        [f"- personas: {', '.join(results['personas'])}"],
    )
    rows = []
    if base:
        rows.append(
            [
                "Base-BM25 (no supervision)",
                pct(base.get("accuracy")),
                pct(base.get("recall_at_10")),
                "–",
                "–",
                "–",
            ]
        )
    for c in results["conditions"].values():
        test = c.get("test") or {}
        rows.append(
            [
                row_label(c["method"], c["checks"]),
                with_delta(test.get("accuracy"), base.get("accuracy")),
                with_delta(test.get("recall_at_10"), base.get("recall_at_10")),
                pct(c.get("quality")),
                pct(c.get("kept")) if c["checks"] else "–",
                _k(c.get("tokens_per_item")),
            ]
        )
    lines += [
        "## Table 4 — generation methods with and without checks",
        "",
        md_table(
            ["Method", "Acc (%)", "R@10 (%)", "QA quality (%)", "Kept (%)", "Tokens/item (k)"], rows
        ),
        "",
        "Acc and R@10: the official QA after MemSteer-Opt with that supervision (arrows: points over "
        "Base-BM25). QA quality: an item scores 1 only if all four criteria hold. Kept: accepted / "
        'candidates tried ("–": no filtering).',
        "",
    ]
    t5 = [
        [
            {"direct": "Direct QA", "joint": "Joint Plan–Q", "memsteer": "Two-stage Plan–Q"}[
                c["method"]
            ],
            pct(c.get("quality")),
            _k(c.get("tokens_per_item")),
            c.get("accepted", "–"),
        ]
        for c in results["conditions"].values()
        if c["checks"] and c["method"] in ("direct", "joint", "memsteer")
    ]
    if t5:
        lines += [
            "## Table 5 — generated QA quality",
            "",
            md_table(["Generation", "Quality (%)", "Tokens/q (k)", "items"], t5),
            "",
            "All three pass the same filter (here the source-grounded checks); quality is judged on the "
            "items that pass it.",
            "",
        ]
    crit = [
        [
            row_label(c["method"], c["checks"]),
            c.get("quality_items", "–"),
            *[pct((c.get("criteria") or {}).get(k)) for k in CRITERIA],
            c.get("quality_errors", "–"),
        ]
        for c in results["conditions"].values()
    ]
    lines += [
        "## QA quality by criterion (%)",
        "",
        md_table(
            [
                "Method",
                "judged",
                "premise",
                "clarity",
                "answer support",
                "evidence support",
                "judge errors",
            ],
            crit,
        ),
        "",
    ]
    steer = [
        [
            row_label(c["method"], c["checks"]),
            persona,
            r.get("items", 0),
            _tau(r),
            "yes" if r.get("best_in_reference_top3") else "no" if "kendall_tau" in r else "–",
            pct(r.get("base_r10_generated")),
            pct(r.get("base_r10_reference")),
            pct(r.get("multi_record_share")),
        ]
        for c in results["conditions"].values()
        for persona, r in (c.get("steering") or {}).items()
    ]
    if steer:
        lines += [
            "## Steering: do the items rank designs as the official QA does?",
            "",
            md_table(
                [
                    "Method",
                    "persona",
                    "items",
                    "Kendall τ, delivered [95%]",
                    "best in official top 3",
                    "Base-BM25 R@10 items",
                    "official",
                    "2+ records",
                ],
                steer,
            ),
            "",
            "The LM-free design panel of `memsteer assess --steering`, scored on each condition's "
            "kept items and on the persona's official QA (as-of protocol).",
            "",
        ]
    if results["optimizations"]:
        lines += ["## The optimizations", ""]
        for key, opt in results["optimizations"].items():
            lines += optimization_lines(key, opt)
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(cli("supervision_ablation", __doc__, run))
