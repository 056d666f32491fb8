"""The generated supervision handed to existing optimizers: DSPy's GEPA and MIPROv2 versus
Official-QA (the paper's Section 3.3, "Supervision for existing memory-design optimizers", and the
external-optimizer rows of Table 1).

Each optimizer keeps its own design space and procedure: the memory design stays Base-BM25 and the
optimizer tunes the prompts of the LM roles on its question path (the answerer; a query rewriter
where the design has one) — ``memsteer tune-prompts``
(:func:`memsteer_dspy.optimize.tune.tune_prompts`). It is given, per persona, either the
Official-QA split (40% train / 20% validation, †: those items stay in the evaluation set) or
MemSteer-generated supervision; GEPA's feedback text also uses the evidence annotations. The tuned
program is then evaluated on the persona's official QA, answering exactly as the untuned one does
except for the tuned instructions.

MIPROv2 needs ``optuna`` (``pip install optuna``); without it its rows say so and the rest runs.

Usage::

    python experiments/existing_optimizers.py --preset small
    python experiments/existing_optimizers.py --config experiments/configs/openai.toml --preset full

Writes into ``--out`` (default ``experiments/runs/existing_optimizers-<preset>``): ``results.md``
(the table, the tuned instructions, costs), ``results.json``, ``items.jsonl``,
``supervision/<persona>/``, ``tune-<optimizer>-<source>/<persona>/`` (``tuned_program.json``,
``instructions.json``, ``result.json``; GEPA's log), ``eval/`` (``tuned/…`` for the tuned
programs) and ``mlflow.db``. A finished tuning is not redone on a rerun.
"""

from __future__ import annotations

import importlib.util
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
    official_split,
    pct,
    report_dict,
    safe_name,
    with_delta,
    with_persona,
)

from memsteer_dspy.evaluation import EvaluationReport, evaluate_design  # noqa: E402
from memsteer_dspy.memory import MemoryDesign, MemorySystem  # noqa: E402
from memsteer_dspy.runfolder import lm_identity  # noqa: E402

LABELS = {"gepa": "GEPA", "mipro": "MIPROv2"}
SOURCES = {"official": "Official-QA†", "memsteer": "MemSteer"}


class TunedSystem:
    """A memory system that answers through a prompt-tuned ``MemoryQA`` program: the same store,
    retrieval and context, the tuned instructions. Duck-types what :func:`evaluate_design` uses."""

    def __init__(
        self, system: MemorySystem, instructions: dict[str, str], *, protocol: str = "as_of"
    ):
        from memsteer_dspy.optimize.tune import MemoryQA

        self.system = system
        self.program = MemoryQA(system, protocol=protocol)
        for name, predictor in self.program.named_predictors():
            if name in instructions:
                predictor.signature = predictor.signature.with_instructions(instructions[name])
        self.design: MemoryDesign = system.design
        self.user_history = system.user_history
        self.answerer = self.program.answerer

    def __call__(self, question: str, question_date=None, as_of=None):
        return self.program(question=question, question_date=question_date)

    def retrieve(self, question: str, question_date=None, as_of=None):
        return self.system.retrieve(question, question_date=question_date, as_of=as_of)


def run(cfg: ExperimentConfig, out: str | Path, **options: Unpack[StudyOptions]) -> Path:
    """Run the existing-optimizers study (see the module docstring); returns ``results.md``'s path."""
    from memsteer_dspy.optimize.tune import TuneResult, tune_prompts

    out = Path(out)
    study = Study("existing_optimizers", cfg, out, **options)
    personas = cfg.personas()
    opts = cfg.existing_optimizers
    design = study.base_design()
    results: dict[str, Any] = {"personas": personas, "runs": {}, "skipped": {}}
    study.on_stage = lambda: study.checkpoint(render(study, results), results)
    with study.stage("Base-BM25 (untuned) on the test items"):
        results["base"] = report_dict(study.test(design, personas, condition="base"))
    supervision: dict[tuple[str, str], tuple[list, list]] = {}
    for p in personas:
        if "official" in opts.sources:
            supervision[("official", p)] = official_split(
                with_persona(study.load(p).qa_items, p), cfg.budgets, cfg.dataset.seed
            )
        if "memsteer" in opts.sources:
            with study.stage(f"generate MemSteer supervision for {p}"):
                g = study.generate(out / "supervision" / safe_name(p), p)
                supervision[("memsteer", p)] = (g.train, g.val)
    for optimizer in opts.optimizers:
        for source in opts.sources:
            key = f"{optimizer}-{source}"
            if optimizer == "mipro" and importlib.util.find_spec("optuna") is None:
                reason = "MIPROv2 needs optuna, which is not installed (pip install optuna)"
                results["skipped"][key] = reason
                study.log(f"{key}: skipped — {reason}")
                continue
            reports: dict[str, EvaluationReport] = {}
            tuned: dict[str, Any] = {}
            with study.stage(f"{LABELS[optimizer]} with {source} supervision"):
                for p in personas:
                    if (source, p) not in supervision:
                        raise RuntimeError(f"no {source} supervision for {p} (see the stage above)")
                    train, val = supervision[(source, p)]
                    folder = out / f"tune-{key}" / safe_name(p)
                    done = folder / "result.json"
                    if done.exists():
                        result = TuneResult.model_validate_json(done.read_text(encoding="utf-8"))
                    else:
                        result = tune_prompts(
                            study.load(p).history,
                            train,
                            val,
                            design,
                            out_dir=folder,
                            optimizer=optimizer,
                            answerer_lm=study.lm.lm("answerer"),
                            judge_lm=study.lm.lm("judge"),
                            reflection_lm=study.lm.lm("proposer"),
                            auto=None if opts.max_metric_calls else opts.auto,
                            max_metric_calls=opts.max_metric_calls,
                            seed=cfg.dataset.seed,
                            threads=cfg.budgets.threads,
                            protocol="as_of",
                            cache_dir=study.cache_dir,
                            tracker=study.tracker,
                            run_params={"study": study.name, "supervision": source, "persona": p},
                        )
                        if result.run_id and study.run_id:
                            study.tracker.set_tags(
                                result.run_id, {"mlflow.parentRunId": study.run_id}
                            )
                    tuned[p] = {
                        "val_before": result.val_before,
                        "val_after": result.val_after,
                        "n_train": len(train),
                        "n_val": len(val),
                        "instructions": result.instructions,
                    }
                    reports[p] = evaluate_tuned(
                        study, design, p, result.instructions, condition=key
                    )
                results["runs"][key] = {
                    "optimizer": optimizer,
                    "source": source,
                    "per_persona": tuned,
                    "test": report_dict(reports),
                }
    metrics = {
        f"{k}.{m}": r["test"].get(m) for k, r in results["runs"].items() for m in ("accuracy", "qs")
    }
    metrics.update({f"base.{m}": results.get("base", {}).get(m) for m in ("accuracy", "qs")})
    return study.finish(render(study, results), results, metrics)


def evaluate_tuned(
    study: Study,
    design: MemoryDesign,
    persona: str,
    instructions: dict[str, str],
    *,
    condition: str,
) -> EvaluationReport:
    """The tuned program on the persona's official test items (resumable per item)."""
    history = study.load(persona).history
    system = MemorySystem.from_design(
        design, history, cache_dir=study.cache_dir, lms={"answerer": study.lm.lm("answerer")}
    )
    folder = study.out / "eval" / "tuned" / condition / safe_name(persona)
    rep = evaluate_design(
        TunedSystem(system, instructions),
        study.test_items(persona),
        judge_lm=study.lm.lm("judge"),
        protocol="as_of",
        threads=study.cfg.budgets.threads,
        out_dir=folder,
        # the tuned prompts change answers under the same design key: part of the run's key
        key_options={
            "instructions": instructions,
            "answerer": lm_identity(study.lm.lm("answerer")),
        },
    )
    study.add_rows(rep.items, condition, "with", persona, design)
    return rep


def render(study: Study, results: dict[str, Any]) -> str:
    base = results.get("base") or {}
    lines = study.header(
        "Existing optimizers with generated supervision (DSPy GEPA / MIPROv2)",
        [
            f"- personas: {', '.join(results['personas'])}; the design stays Base-BM25, the "
            "optimizer tunes its answerer (and query-rewriter) prompts"
        ],
    )
    rows = [
        [
            "Base-BM25 (untuned)",
            "–",
            "–",
            "–",
            pct(base.get("accuracy")),
            pct(base.get("qs")),
            pct(base.get("recall_at_10")),
        ]
    ]
    for r in results["runs"].values():
        per = r["per_persona"].values()
        n_val = sum(x["n_val"] for x in per)
        before = sum(x["val_before"] * x["n_val"] for x in per) / n_val if n_val else None
        after = sum(x["val_after"] * x["n_val"] for x in per) / n_val if n_val else None
        t = r["test"]
        rows.append(
            [
                f"+ {LABELS[r['optimizer']]}",
                SOURCES[r["source"]],
                pct(before),
                pct(after),
                with_delta(t.get("accuracy"), base.get("accuracy")),
                with_delta(t.get("qs"), base.get("qs")),
                pct(t.get("recall_at_10")),
            ]
        )
    for key in results["skipped"]:
        optimizer, source = key.split("-", 1)
        rows.append([f"+ {LABELS[optimizer]}", SOURCES[source], "–", "–", "skipped", "–", "–"])
    lines += [
        "## Official QA (%)",
        "",
        md_table(
            ["Optimizer", "Supervision", "val before", "val after", "Acc", "QS", "R@10"], rows
        ),
        "",
        "val before/after: the optimizer's own validation accuracy of the untuned and tuned prompts "
        "(on its supervision's validation items). Acc/QS/R@10: the official QA; arrows are points over "
        "the untuned Base-BM25. † Official-QA items used for tuning stay in the evaluation set.",
        "",
    ]
    if results["skipped"]:
        lines += [
            "Skipped: "
            + "; ".join(f"{k} ({v.splitlines()[0]})" for k, v in results["skipped"].items()),
            "",
        ]
    for key, r in results["runs"].items():
        for p, x in r["per_persona"].items():
            for name, text in x["instructions"].items():
                lines += [
                    f"### Tuned `{name}` instruction — {key}, {p}",
                    "",
                    "```",
                    text.strip()[:1500],
                    "```",
                    "",
                ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(cli("existing_optimizers", __doc__, run))
