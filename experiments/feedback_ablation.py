"""Figure 3 of the MemSteer paper: does evidence-guided feedback improve optimization?

The same MemSteer-generated supervision drives four MemSteer-Opt runs from Base-BM25 that differ
only in the feedback the design proposer reads (Section 4.5, Appendix A.5):

* ``random30`` — up to 30 random failures: question, reference, prediction, score, ranked
  retrieved ids, ids delivered to the answerer and a context excerpt; gold evidence unmarked;
* ``random30+gold`` — adds the required evidence ids and gold-record excerpts, no attribution;
* ``random30+diagnosis`` — adds the failure stage (storage / retrieval / answering), missing
  evidence ids, evidence checks and memory-lookup results;
* ``stratified`` — the same diagnosis, sampled per failure stage (up to 10 each): the full
  MemSteer-Opt.

Each best design is evaluated on the official QA (accuracy, QS and R@10; the paper's bars show QS
and R@10).

Usage::

    python experiments/feedback_ablation.py --preset small
    python experiments/feedback_ablation.py --config experiments/configs/openai.toml --preset full

Writes into ``--out`` (default ``experiments/runs/feedback_ablation-<preset>``): ``results.md``
(the Figure 3 numbers as a table with text bars, each run's accepted revisions, costs),
``results.json``, ``items.jsonl``, ``supervision/<persona>/``, ``opt-<mode>/`` (the four
MemSteer-Opt runs, each with its ``iterations/NNN/feedback.md``), ``eval/`` and ``mlflow.db``.
A rerun resumes every stage.
"""

from __future__ import annotations

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
)

LABELS = {
    "random30": "Random-30",
    "random30+gold": "Random-30 + Gold evidence",
    "random30+diagnosis": "Random-30 + Diagnosis",
    "stratified": "Diagnosis + stratified sampling (ours)",
}


def run(cfg: ExperimentConfig, out: str | Path, **options: Unpack[StudyOptions]) -> Path:
    """Run the Figure 3 study (see the module docstring); returns the path of ``results.md``."""
    out = Path(out)
    study = Study("feedback_ablation", cfg, out, **options)
    personas = cfg.personas()
    histories = {p: study.load(p).history for p in personas}
    results: dict[str, Any] = {"personas": personas, "modes": {}, "optimizations": {}}
    study.on_stage = lambda: study.checkpoint(render(study, results), results)
    with study.stage("Base-BM25 on the test items"):
        results["base"] = report_dict(study.test(study.base_design(), personas, condition="base"))
    generated = []
    with study.stage("generate MemSteer supervision"):
        for p in personas:
            generated.append(study.generate(out / "supervision" / safe_name(p), p))
    if len(generated) == len(personas):
        train = [q for g in generated for q in g.train]
        val = [q for g in generated for q in g.val]
        for mode in cfg.feedback_ablation.modes:
            with study.stage(f"MemSteer-Opt with {mode} feedback"):
                res = study.optimize(
                    out / f"opt-{safe_name(mode)}", histories, train, val, feedback=mode, label=mode
                )
                results["optimizations"][mode] = optimization_dict(res, len(train), len(val))
                results["modes"][mode] = report_dict(
                    study.test(res.best_design, personas, condition=mode)
                )
    metrics = {
        f"{mode}.{m}": r.get(m)
        for mode, r in results["modes"].items()
        for m in ("accuracy", "qs", "recall_at_10")
    }
    metrics.update(
        {f"base.{m}": results.get("base", {}).get(m) for m in ("accuracy", "qs", "recall_at_10")}
    )
    return study.finish(render(study, results), results, metrics)


def bar(v: float | None, width: int = 20) -> str:
    """A text bar for a fraction (the paper's figure, in Markdown)."""
    return "" if v is None else "█" * round(width * v) + "·" * (width - round(width * v))


def render(study: Study, results: dict[str, Any]) -> str:
    base = results.get("base") or {}
    lines = study.header(
        "Figure 3 — attribution and sampling ablation",
        [f"- personas: {', '.join(results['personas'])}"],
    )
    rows = [
        [
            "Base-BM25",
            pct(base.get("accuracy")),
            pct(base.get("qs")),
            pct(base.get("recall_at_10")),
            "–",
            f"`{bar(base.get('qs'))}`",
            f"`{bar(base.get('recall_at_10'))}`",
        ]
    ]
    for mode, r in results["modes"].items():
        opt = results["optimizations"][mode]
        rows.append(
            [
                LABELS[mode],
                with_delta(r.get("accuracy"), base.get("accuracy")),
                with_delta(r.get("qs"), base.get("qs")),
                with_delta(r.get("recall_at_10"), base.get("recall_at_10")),
                len(opt["accepted_path"]) - 1,
                f"`{bar(r.get('qs'))}`",
                f"`{bar(r.get('recall_at_10'))}`",
            ]
        )
    header = ["Feedback", "Acc", "QS", "R@10", "accepted revisions", "QS bar", "R@10 bar"]
    lines += [
        "## Figure 3 — feedback modes (official QA, %)",
        "",
        md_table(header, rows),
        "",
        "Every optimized condition uses the same MemSteer-generated supervision and starts from "
        "Base-BM25; arrows are points over Base-BM25.",
        "",
    ]
    if results["optimizations"]:
        lines += ["## The optimizations", ""]
        for mode, opt in results["optimizations"].items():
            lines += optimization_lines(LABELS[mode], opt)
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(cli("feedback_ablation", __doc__, run))
