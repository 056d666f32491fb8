"""Search strategies at the same evaluation budget, judged on held-out items (issue #12's table).

On RHELM with official supervision (40% train / 20% validation per persona, seeded; the other 40%
is the held-out test split, never used for feedback or selection), the ``recall`` objective (no
answering LM) and the as-of protocol, this runs MemSteer-Opt from Base-BM25 with each ``--search``
strategy for the same number of evaluated designs, per persona and/or with one design shared by
all personas, and tabulates for each: held-out R@10 and delivered recall of the chosen design
against Base-BM25 (paired difference with a seeded 95% bootstrap interval and verdict), LM calls
and tokens, wall time.

For a shared design, the row also breaks the held-out comparison down by persona (each
persona's own test items), so a shared pick that hurts one persona shows.

``random`` and ``tpe`` need no LM (Optuna over the LM-free design space); ``hill`` and
``population`` call the proposer LM (``--lm``, default the embedded model, with the small-model
settings ``--proposer-output changes`` and a 1,200-token feedback budget).

Writes ``<out>/<setting>/<search>/`` (each a resumable ``memsteer optimize`` run folder with
``summary.json``) and ``<out>/results.md`` + ``results.json``; rerunning resumes every run. A run
that fails is listed in ``results.md`` with its error (traceback in ``<out>/errors.log``), the
others go on, and the script exits 1.

    python experiments/search_compare.py --searches random,tpe --iterations 20 --out experiments/runs/search
    python experiments/search_compare.py --searches hill,population --persona Elena_Morales --iterations 10
    python experiments/search_compare.py --searches random,tpe --shared-only --iterations 20
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_rhelm_args, resolve_rhelm_args, shared_optimizer  # noqa: E402

from memsteer_dspy.evaluation import ItemResult  # noqa: E402
from memsteer_dspy.loaders.rhelm import list_personas, load_rhelm  # noqa: E402
from memsteer_dspy.memory import MemoryDesign  # noqa: E402
from memsteer_dspy.optimize import MemSteerOpt, OptimizeConfig, progress_line, split_official  # noqa: E402
from memsteer_dspy.optimize.search import OptunaProposer  # noqa: E402
from memsteer_dspy.optimize.splits import official_test  # noqa: E402
from memsteer_dspy.stats import compare_item_results, points, points_ci  # noqa: E402


def _lm_source(model: str | None, needs_lm: bool):
    if not needs_lm:
        return None, None
    from memsteer_dspy.lm import load_lm_config

    cfg = load_lm_config(None, lm=model, role_lms={})
    return cfg.lm, cfg.usage_by_role


def run_one(
    setting: str, search: str, histories: dict, items: dict, args, out: Path
) -> dict[str, Any]:
    """One optimization (per persona when ``histories`` holds one, else shared) -> its summary."""
    train = [q for p in histories for q in items[p][0]]
    val = [q for p in histories for q in items[p][1]]
    test = [q for p in histories for q in items[p][2]]
    needs_lm = search in ("hill", "population")
    lm, usage = _lm_source(args.lm, needs_lm)
    config = OptimizeConfig(
        iterations=args.iterations,
        objective="recall",
        protocol="as_of",
        seed=args.seed,
        search=search,
        parents=args.parents,
        accept=args.accept,
        proposer_output="changes",
        feedback_tokens=args.feedback_tokens,
        max_build_calls=0,
        max_eval_lm_calls=0,
        max_embed_units=args.max_embed_units or None,
        guard=args.guard or [],
        guard_margin=args.guard_margin,
        val_from=args.val_from,
        tabu=args.tabu,
    )
    folder = out / setting / search
    kwargs: dict[str, Any] = dict(
        config=config,
        lms=lm,
        init_design=MemoryDesign.base_bm25(),
        cache_dir=args.cache_dir,
        usage=usage,
        test_source=f"official held-out ({setting})",
        on_event=lambda e: print(
            f"  [{setting}/{search}] {progress_line(e)}", file=sys.stderr, flush=True
        ),
    )
    if search in ("random", "tpe"):
        kwargs["search_proposer"] = OptunaProposer(
            search,
            MemoryDesign.base_bm25(),
            "recall",
            seed=args.seed,
            indexes=args.indexes.split(","),
        )
    t0 = time.perf_counter()
    if len(histories) == 1:
        ((persona, history),) = histories.items()
        opt = MemSteerOpt(history, train, val, folder, test=test, **kwargs)
    else:
        opt = shared_optimizer(histories, train, val, folder, test=test, **kwargs)
    res = opt.run()
    seconds = time.perf_counter() - t0
    cost = res.entries[-1].cost_total
    t = res.test
    initial_key = MemoryDesign.from_dict(res.entries[0].design).key()
    by_persona = (
        held_out_by_persona(folder, res.best_design.key(), initial_key, args.seed) if t else {}
    )
    return {
        "setting": setting,
        "search": search,
        "iterations": len(res.entries) - 1,
        "n_train": len(train),
        "n_val": len(opt.val),
        "n_test": t.n if t else 0,
        "designs_evaluated": sum(e.score is not None for e in res.entries)
        + sum(1 for e in res.entries for sc in e.sub_screens if sc.get("score")),
        "val_initial": res.baseline_score.delivered_recall,
        "val_best": res.best_score.delivered_recall,
        "test": t.model_dump(mode="json") if t else None,
        "lm_calls": cost.calls,
        "tokens": cost.total_tokens,
        "seconds_recorded": cost.seconds,
        "seconds_this_call": round(seconds, 1),
        "best_iteration": res.best_iteration,
        "best_design_key": res.best_design.key(),
        "out": str(folder),
        "by_persona": by_persona,
    }


def held_out_by_persona(folder: Path, best_key: str, initial_key: str, seed: int) -> dict[str, Any]:
    """A shared design's held-out comparison persona by persona, from the per-persona result
    files the optimizer keeps under ``test/`` (each persona's own test items): does the shared
    pick hurt anyone? Empty where the run kept no per-persona results."""
    best = folder / "test" / ("initial" if best_key == initial_key else f"best-{best_key}")
    initial = folder / "test" / "initial"

    def items(sub: Path) -> list[ItemResult]:
        lines = (sub / "items.jsonl").read_text().splitlines()
        return [ItemResult.model_validate_json(line) for line in lines if line.strip()]

    out: dict[str, Any] = {}
    for sub in sorted(d for d in initial.iterdir() if d.is_dir()) if initial.is_dir() else []:
        comp = compare_item_results(items(sub), items(best / sub.name), answered=False, seed=seed)
        out[sub.name] = {
            "n": comp.n,
            "n_pairs": comp.n_pairs,
            "diff": comp.diff,
            "ci95": comp.ci95,
            "verdict": comp.verdict,
        }
    return out


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}"


def _ci(t: dict, m: str) -> str:
    return f"{points(t['diff'].get(m))} {points_ci(t['ci95'].get(m))}"


def render(
    rows: list[dict[str, Any]], args, failed: dict[tuple[str, str], str] | None = None
) -> str:
    lines = [
        "# Search strategies at the same evaluation budget (held-out)",
        "",
        f"RHELM, external sources on, as-of protocol, official supervision (40/20 train/val per persona, seed "
        f"{args.seed}), objective `recall`, accept `{args.accept}`, guard `{'+'.join(args.guard or []) or 'none'}` (margin {args.guard_margin}), selecting on "
        f"`{args.val_from}`, {args.iterations} iterations each, tabu list {'on' if args.tabu else 'off'}. Test: the "
        "official items the split leaves out (never used for feedback or selection). Diff = chosen design - "
        "Base-BM25 on those items, in points, with the paired bootstrap 95% interval (1,000 resamples); verdict "
        "on delivered recall.",
        "",
        "| setting | search | designs scored | val deliv. (base → best) | test n | test R@10 base / best | ΔR@10 [95% CI] "
        "| test deliv. base / best | Δdeliv. [95% CI] | verdict | LM calls | tokens | wall s |",
        "|---|---|---:|---|---:|---|---|---|---|---|---:|---:|---:|",
    ]
    for r in rows:
        t = r["test"]
        lines.append(
            f"| {r['setting']} | {r['search']} | {r['designs_evaluated']} | {_pct(r['val_initial'])} → {_pct(r['val_best'])} "
            f"| {r['n_test']} | {_pct(t['initial']['recall_at_10'])} / {_pct(t['best']['recall_at_10'])} "
            f"| {_ci(t, 'recall_at_10')} | {_pct(t['initial']['delivered_recall'])} / {_pct(t['best']['delivered_recall'])} "
            f"| {_ci(t, 'delivered_recall')} | {t['verdict']} | {r['lm_calls']} | {r['tokens']:,} | {r['seconds_recorded']:.0f} |"
        )
    if failed:
        lines += ["", "Failed (no row; a rerun resumes each run folder):", ""]
        lines += [f"- {setting} / {search}: {error}" for (setting, search), error in failed.items()]
    for r in rows:
        if not r.get("by_persona"):
            continue
        lines += [
            "",
            f"### {r['setting']} / {r['search']}: the shared design on each persona's held-out items",
            "",
            "| persona | n | ΔR@10 [95% CI] | Δdeliv. [95% CI] | verdict |",
            "|---|---:|---|---|---|",
        ]
        for p, c in r["by_persona"].items():
            lines.append(
                f"| {p} | {c['n']} | {_ci(c, 'recall_at_10')} | {_ci(c, 'delivered_recall')} | {c['verdict']} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    ap.add_argument(
        "--searches", default="random,tpe", help="comma list of hill, population, random, tpe"
    )
    ap.add_argument("--persona", action="append", help="persona (repeatable; default all ten)")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--accept", default="strict", choices=["strict", "paired"])
    ap.add_argument("--parents", default="softmax", choices=["softmax", "pareto"])
    ap.add_argument(
        "--guard",
        action="append",
        help="non-inferiority guard metric (repeatable), e.g. recall_at_10",
    )
    ap.add_argument(
        "--guard-margin",
        type=float,
        default=None,
        help="guards as non-inferiority tests with this margin (0-1)",
    )
    ap.add_argument(
        "--val-from",
        default="val",
        choices=["val", "train+val"],
        help="items that select: validation, or training + validation",
    )
    ap.add_argument(
        "--lm", default=None, help="proposer LM for hill/population (default: the configured one)"
    )
    ap.add_argument(
        "--no-tabu",
        dest="tabu",
        action="store_false",
        help="hill/population: let the proposer repeat changes rejected on their own",
    )
    ap.add_argument("--feedback-tokens", type=int, default=1200)
    ap.add_argument(
        "--max-embed-units",
        type=int,
        default=60000,
        help="send back a dense/hybrid design whose index would embed more units (0: no limit; "
        "default 60000, about an hour of MiniLM on 2 cores: the ten personas' 256-token "
        "sections are 48k units, 32-token sections several times that)",
    )
    ap.add_argument(
        "--indexes",
        default="bm25",
        help="random/tpe: index kinds to sample (bm25,dense,hybrid need the dense extra)",
    )
    ap.add_argument(
        "--shared-only", action="store_true", help="only the design shared by all personas"
    )
    ap.add_argument("--per-persona-only", action="store_true", help="only one design per persona")
    add_rhelm_args(ap)
    ap.add_argument("--out", type=Path, default=Path("experiments/runs/search_compare"))
    args = ap.parse_args(argv)
    root = resolve_rhelm_args(ap, args)
    personas = args.persona or list_personas(root)
    searches = [s.strip() for s in args.searches.split(",") if s.strip()]
    histories, items = {}, {}
    for p in personas:
        loaded = load_rhelm(root, p, external=True)
        histories[p] = loaded.history
        train, val = split_official(loaded.qa_items, seed=args.seed)
        items[p] = (train, val, official_test(loaded.qa_items, seed=args.seed))
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "results.json"
    rows: list[dict[str, Any]] = (
        json.loads(results_path.read_text()) if results_path.exists() else []
    )
    for r in rows:  # rows written before the per-persona breakdown existed
        if r.get("test") and "by_persona" not in r:
            base = MemoryDesign.base_bm25().key()
            r["by_persona"] = held_out_by_persona(
                Path(r["out"]), r["best_design_key"], base, args.seed
            )
    done = {(r["setting"], r["search"], r["iterations"]) for r in rows}
    settings: list[tuple[str, dict]] = []
    if not args.shared_only:
        settings += [(p, {p: histories[p]}) for p in personas]
    if not args.per_persona_only and len(personas) > 1:
        settings.append((f"shared-{len(personas)}", histories))
    failed: dict[tuple[str, str], str] = {}
    for setting, hs in settings:
        for search in searches:
            if (setting, search, args.iterations) in done:
                continue
            print(f"[search_compare] {setting} / {search} ...", file=sys.stderr, flush=True)
            try:
                row = run_one(setting, search, hs, items, args, args.out)
            except Exception as exc:  # noqa: BLE001 - one failed run must not cost the others
                failed[(setting, search)] = f"{type(exc).__name__}: {exc}"
                with open(args.out / "errors.log", "a", encoding="utf-8") as f:
                    f.write(f"== {setting} / {search}\n{traceback.format_exc()}\n")
                print(
                    f"  failed: {failed[(setting, search)]} (traceback in {args.out / 'errors.log'}; "
                    "a rerun resumes its run folder)",
                    file=sys.stderr,
                    flush=True,
                )
                (args.out / "results.md").write_text(render(rows, args, failed))
                continue
            rows = [r for r in rows if (r["setting"], r["search"]) != (setting, search)] + [row]
            results_path.write_text(json.dumps(rows, indent=2) + "\n")
            (args.out / "results.md").write_text(render(rows, args, failed))
            t = row["test"]
            print(
                f"  test deliv. {_ci(t, 'delivered_recall')} R@10 {_ci(t, 'recall_at_10')} -> {t['verdict']}",
                file=sys.stderr,
                flush=True,
            )
    results_path.write_text(json.dumps(rows, indent=2) + "\n")
    (args.out / "results.md").write_text(render(rows, args, failed))
    print(render(rows, args, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
