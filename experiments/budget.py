"""Figure 4 of the MemSteer paper: the effect of the supervision budget.

One pool of MemSteer-generated supervision is built from the personas' histories, large enough
for the biggest budget (``[budget] sizes``, the paper's 100–500 training questions). For each
size, MemSteer-Opt runs from the same Base-BM25 with that many training questions and a
validation set scaled to keep the generator's train:validation ratio (about 60:40, Appendix B.2),
both drawn from the pool's disjoint train and validation parts. Draws are nested — one seeded
order, each budget takes its first items — so a bigger budget only adds questions. Each best
design is evaluated on the official QA; budget 0 is Base-BM25.

Usage::

    python experiments/budget.py --preset small
    python experiments/budget.py --config experiments/configs/openai.toml --preset full

Writes into ``--out`` (default ``experiments/runs/budget-<preset>``): ``results.md`` (the Figure 4
numbers as a table with text bars, the optimizations, costs), ``results.json``, ``items.jsonl``,
``supervision/<persona>/`` (the pool), ``opt-n<size>/`` (one MemSteer-Opt run per budget),
``eval/`` and ``mlflow.db``. A rerun resumes every stage; adding a size reuses the pool.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any, Unpack

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    ExperimentConfig,
    Study,
    StudyOptions,
    ceil_div,
    cli,
    md_table,
    optimization_dict,
    optimization_lines,
    pct,
    report_dict,
    safe_name,
    with_delta,
)
from feedback_ablation import bar  # noqa: E402


def val_size(n_train: int, train_fraction: float) -> int:
    """Validation questions for ``n_train`` training questions at the generator's ratio."""
    return max(1, round(n_train * (1 - train_fraction) / train_fraction))


def run(cfg: ExperimentConfig, out: str | Path, **options: Unpack[StudyOptions]) -> Path:
    """Run the Figure 4 study (see the module docstring); returns the path of ``results.md``."""
    out = Path(out)
    study = Study("budget", cfg, out, **options)
    personas = cfg.personas()
    sizes = sorted(set(cfg.budget.sizes))
    tf = cfg.budgets.train_fraction
    histories = {p: study.load(p).history for p in personas}
    per_persona = ceil_div(ceil_div(max(sizes), tf), len(personas))
    results: dict[str, Any] = {
        "personas": personas,
        "sizes": sizes,
        "pool_per_persona": per_persona,
        "budgets": {},
        "optimizations": {},
    }
    study.on_stage = lambda: study.checkpoint(render(study, results), results)
    with study.stage("Base-BM25 on the test items (budget 0)"):
        results["base"] = report_dict(study.test(study.base_design(), personas, condition="base"))
    generated = []
    with study.stage(f"generate the supervision pool ({per_persona} items per persona)"):
        for p in personas:
            generated.append(study.generate(out / "supervision" / safe_name(p), p, n=per_persona))
    if len(generated) == len(personas):
        train_pool = sorted((q for g in generated for q in g.train), key=lambda q: q.id)
        val_pool = sorted((q for g in generated for q in g.val), key=lambda q: q.id)
        random.Random(f"budget:{cfg.dataset.seed}:train").shuffle(train_pool)
        random.Random(f"budget:{cfg.dataset.seed}:val").shuffle(val_pool)
        results["pool"] = {"train": len(train_pool), "val": len(val_pool)}
        for n in sizes:
            n_val = val_size(n, tf)
            entry: dict[str, Any] = {"train": n, "val": n_val}
            results["budgets"][str(n)] = entry
            with study.stage(f"MemSteer-Opt with {n} training questions"):
                if n > len(train_pool) or n_val > len(val_pool):
                    raise RuntimeError(
                        f"the pool has {len(train_pool)} train / {len(val_pool)} val items, fewer than "
                        f"{n} / {n_val}; raise max_candidates under [budgets]"
                    )
                res = study.optimize(
                    out / f"opt-n{n}", histories, train_pool[:n], val_pool[:n_val], label=f"n{n}"
                )
                results["optimizations"][str(n)] = optimization_dict(res, n, n_val)
                entry["test"] = report_dict(
                    study.test(res.best_design, personas, condition=f"n{n}")
                )
    metrics = {
        f"n{n}.{m}": (e.get("test") or {}).get(m)
        for n, e in results["budgets"].items()
        for m in ("accuracy", "qs", "recall_at_10")
    }
    metrics.update(
        {f"n0.{m}": results.get("base", {}).get(m) for m in ("accuracy", "qs", "recall_at_10")}
    )
    return study.finish(render(study, results), results, metrics)


def render(study: Study, results: dict[str, Any]) -> str:
    base = results.get("base") or {}
    pool = results.get("pool") or {}
    lines = study.header(
        "Figure 4 — effect of the supervision budget",
        [
            f"- personas: {', '.join(results['personas'])}; pool: {pool.get('train', '–')} train / "
            f"{pool.get('val', '–')} val generated items"
        ],
    )
    rows = [
        [
            "0 (Base-BM25)",
            "–",
            pct(base.get("accuracy")),
            pct(base.get("qs")),
            pct(base.get("recall_at_10")),
            f"`{bar(base.get('qs'))}`",
        ]
    ]
    for n, e in results["budgets"].items():
        t = e.get("test") or {}
        rows.append(
            [
                n,
                e["val"],
                with_delta(t.get("accuracy"), base.get("accuracy")),
                with_delta(t.get("qs"), base.get("qs")),
                with_delta(t.get("recall_at_10"), base.get("recall_at_10")),
                f"`{bar(t.get('qs'))}`",
            ]
        )
    lines += [
        "## Figure 4 — training questions vs. official-QA scores (%)",
        "",
        md_table(["Training questions", "Validation", "Acc", "QS", "R@10", "QS bar"], rows),
        "",
        "All runs start from the same Base-BM25 (budget 0); arrows are points over it.",
        "",
    ]
    if results["optimizations"]:
        lines += ["## The optimizations", ""]
        for n, opt in results["optimizations"].items():
            lines += optimization_lines(f"{n} training questions", opt)
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(cli("budget", __doc__, run))
