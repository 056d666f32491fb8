"""``memsteer optimize`` (MemSteer-Opt) and ``memsteer tune-prompts`` (GEPA / MIPROv2 with the
same supervision), both tracked in MLflow.

(No ``from __future__ import annotations`` here: typer must see the real ``Annotated`` options.)
"""

from pathlib import Path
from typing import Annotated

import typer

from memsteer_dspy.cli.common import HistoryArgs, cli_errors, echo_json, history_options, lm_options
from memsteer_dspy.cli.evaluate import default_cache_dir
from memsteer_dspy.errors import InputError
from memsteer_dspy.evaluation import read_qa_jsonl
from memsteer_dspy.memory import MemoryDesign
from memsteer_dspy.optimize import (
    FEEDBACK_MODES,
    OBJECTIVES,
    MemSteerOpt,
    OptimizeConfig,
    progress_line,
)
from memsteer_dspy.optimize.defaults import build_call_limit, resolve_defaults
from memsteer_dspy.optimize.search import ACCEPT_RULES, GUARD_METRICS, PARENT_STRATEGIES, SEARCHES
from memsteer_dspy.optimize.splits import (
    carve_test,
    official_test,
    read_supervision,
    split_official,
)
from memsteer_dspy.optimize.tune import OPTIMIZERS
from memsteer_dspy.optimize.tune import tune_prompts as run_tuning
from memsteer_dspy.runfolder import check_not_inputs
from memsteer_dspy.tracking import Tracker

SUPERVISION_HELP = (
    "'official' (the benchmark's own QA split per persona: 40% train, 20% validation, seeded) or a "
    "folder with train.jsonl and val.jsonl (as `memsteer generate` writes)."
)


def load_supervision(spec: str, loaded, *, seed: int):
    """(train, val, description) for ``--supervision``."""
    if spec == "official":
        if not loaded.qa_items:
            raise InputError(
                "the history has no official QA items to split",
                field="--supervision",
                hint="pass --supervision <folder with train.jsonl and val.jsonl> (memsteer generate writes one)",
            )
        train, val = split_official(loaded.qa_items, seed=seed)
        return train, val, f"official QA split (seed {seed})"
    train, val = read_supervision(spec)
    return train, val, str(Path(spec).resolve())


def load_test_split(
    spec: str, loaded, train, val, *, seed: int, test: Path | None, test_fraction: float
):
    """(train, val, test, test source) for ``memsteer optimize``: with official supervision the
    items the official split leaves out; otherwise ``--test PATH`` or a seeded share carved out by
    bundle (``--test-fraction``, 0 for none)."""
    if test is not None:
        return train, val, read_qa_jsonl(test), str(Path(test).resolve())
    if spec == "official":
        return (
            train,
            val,
            official_test(loaded.qa_items, seed=seed),
            f"official held-out items (seed {seed})",
        )
    if test_fraction <= 0:
        return train, val, [], ""
    train, val, held = carve_test(train, val, fraction=test_fraction, seed=seed)
    return train, val, held, f"{test_fraction:.0%} of the generated items by bundle (seed {seed})"


def _tracker(out: Path, loaded, tracking_uri: str | None, no_tracking: bool):
    if no_tracking:
        return Tracker.disabled()
    return Tracker.for_history(
        out, loaded.history.user_id, loaded.history.fingerprint, uri=tracking_uri
    )


def _pct(v) -> str:
    return "  -  " if v is None else f"{100 * v:5.1f}"


def _progress(event: dict) -> None:
    typer.echo(progress_line(event), err=True)


@cli_errors
@history_options
@lm_options
def optimize(
    history: HistoryArgs,
    lm_config,
    supervision: Annotated[str, typer.Option("--supervision", "-s", help=SUPERVISION_HELP)],
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            "-o",
            help="Run folder: best_design.json, trajectory.jsonl, summary.md, iterations/, mlflow.db, run.json. "
            "A rerun resumes the same run (see --restart).",
        ),
    ],
    iterations: Annotated[
        int,
        typer.Option(
            "--iterations",
            "-T",
            min=0,
            help="Proposals after the initial design (the paper runs 20).",
        ),
    ] = 20,
    objective: Annotated[
        str | None,
        typer.Option(
            "--objective",
            help="'accuracy' (validation accuracy A(d), the paper's), 'recall' (delivered recall, R@10 tie-break; no answering LM) or 'recall-then-accuracy'. "
            "Default: recall when the answerer runs in-process, else accuracy (see --paper).",
        ),
    ] = None,
    feedback: Annotated[
        str,
        typer.Option(
            "--feedback",
            help="'stratified' (diagnosis, up to 10 cases per failure stage), 'random30', 'random30+gold' or 'random30+diagnosis'.",
        ),
    ] = "stratified",
    init_design: Annotated[
        Path | None,
        typer.Option(
            "--init-design",
            help="Start from this design JSON instead of Base-BM25 (transfer, continuation).",
        ),
    ] = None,
    seed: Annotated[
        int, typer.Option("--seed", help="Seeds the official split and the feedback sampling.")
    ] = 0,
    feedback_tokens: Annotated[
        int | None,
        typer.Option(
            "--feedback-tokens",
            min=200,
            help="Token budget of the feedback given to the proposer (keep the proposer's context in mind). "
            "Default: 1200 when the proposer runs in-process, else 3000.",
        ),
    ] = None,
    proposer_output: Annotated[
        str | None,
        typer.Option(
            "--proposer-output",
            help="'design' (the whole revised design as structured output) or 'changes' (only the fields to change: a much shorter output, for small local proposers). "
            "Default: changes when the proposer runs in-process, else design.",
        ),
    ] = None,
    max_build_calls: Annotated[
        int | None,
        typer.Option(
            "--max-build-calls",
            min=0,
            help="Most LM calls a candidate design may take to build its store (fact extraction); a "
            "design over it is sent back to the proposer. Default: 0 when the answerer is an "
            "in-process model (fact extraction over a whole history takes hours on a CPU), else no limit.",
        ),
    ] = None,
    max_eval_lm_calls: Annotated[
        int | None,
        typer.Option(
            "--max-eval-lm-calls",
            min=0,
            help="Most retrieval-time LM calls one scoring of a candidate may take (query rewrite, "
            "HyDE, decomposition, multi-query, LM rerank: one per question each); a design over it "
            "is sent back to the proposer. 0 keeps the search LM-free at retrieval. Default: 0 when the "
            "proposer runs in-process, else no limit.",
        ),
    ] = None,
    max_embed_units: Annotated[
        int | None,
        typer.Option(
            "--max-embed-units",
            min=0,
            help="Most memory units a candidate's dense or hybrid index may embed (one vector each; "
            "MiniLM embeds about 17 a second on 2 CPU cores); a design over it is sent back to the "
            "proposer. Default: no limit.",
        ),
    ] = None,
    tracking_uri: Annotated[
        str | None,
        typer.Option(
            "--tracking-uri",
            help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///<out>/mlflow.db).",
        ),
    ] = None,
    no_tracking: Annotated[
        bool, typer.Option("--no-tracking", help="Write only the local files; no MLflow.")
    ] = False,
    dspy_autolog: Annotated[
        bool,
        typer.Option(
            "--dspy-autolog",
            help="Also record every LM call as an MLflow trace (mlflow.dspy.autolog).",
        ),
    ] = False,
    threads: Annotated[
        int,
        typer.Option(
            "--threads", "-t", min=1, help="QA items evaluated concurrently (useful with API LMs)."
        ),
    ] = 1,
    protocol: Annotated[
        str | None, typer.Option("--protocol", help="'as_of' (default for RHELM) or 'full'.")
    ] = None,
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            "--cache-dir",
            help="Where stores and indexes are kept and reused across candidates (default as for `memsteer evaluate`).",
        ),
    ] = None,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Keep built memories in memory only.")
    ] = False,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json", help="Print one JSON object (the result, summary.json's content) at the end."
        ),
    ] = False,
    restart: Annotated[
        bool,
        typer.Option(
            "--restart",
            help="Empty the --out run folder (never a folder of your own: it is refused) and start over (a rerun otherwise resumes, and only with the same "
            "history, protocol, initial design, train/val/test items, LMs, objective, search, accept rule, "
            "seed and other options; --iterations and --threads may change).",
        ),
    ] = False,
    test: Annotated[
        Path | None,
        typer.Option(
            "--test",
            help="Held-out QA file (QAItem per line) scored at the end for the initial and "
            "the best design. Default: the official items the split leaves out (--supervision official), "
            "else --test-fraction of the generated items carved out by bundle.",
        ),
    ] = None,
    test_fraction: Annotated[
        float,
        typer.Option(
            "--test-fraction",
            min=0.0,
            max=0.9,
            help="Generated supervision without --test: share of the items (whole bundles, seeded) held "
            "out as the test split; 0 keeps every item for train/val and reports no held-out verdict.",
        ),
    ] = 0.3,
    search: Annotated[
        str,
        typer.Option(
            "--search",
            help="'hill' (the paper's single path), 'population' (a pool of every scored "
            "design; parents by --parents), 'random' or 'tpe' (proposer-free Optuna baselines over the "
            "LM-free design space, same number of evaluated designs).",
        ),
    ] = "hill",
    parents: Annotated[
        str,
        typer.Option(
            "--parents",
            help="--search population: 'softmax' over validation score (M*) or 'pareto' "
            "(per-item Pareto front, GEPA).",
        ),
    ] = "softmax",
    accept_rule: Annotated[
        str | None,
        typer.Option(
            "--accept",
            help="'strict' (strictly better on validation; the paper's) or 'paired' (a "
            "significant paired gain on the validation items: one-sided p < --accept-alpha). "
            "Default: paired when the proposer runs in-process, else strict.",
        ),
    ] = None,
    accept_alpha: Annotated[
        float,
        typer.Option(
            "--accept-alpha", min=0.001, max=0.5, help="--accept paired: significance level."
        ),
    ] = 0.1,
    accept_margin: Annotated[
        float,
        typer.Option(
            "--accept-margin", min=0.0, max=1.0, help="--accept paired: minimum mean gain (0-1)."
        ),
    ] = 0.0,
    accept_test: Annotated[
        str,
        typer.Option(
            "--accept-test",
            help="--accept paired: 'bootstrap' (paired, 1,000 resamples) or 'sign' (exact).",
        ),
    ] = "bootstrap",
    guard: Annotated[
        list[str] | None,
        typer.Option(
            "--guard",
            metavar="METRIC",
            help="Non-inferiority guard (repeatable): reject a candidate significantly below the current "
            "design in this metric (recall_at_1/5/10, delivered_recall, accuracy), paired over the "
            "selecting items, one-sided at --accept-alpha with --accept-test; applies to both accept rules. "
            "Default: recall_at_10 when the proposer runs in-process, else none.",
        ),
    ] = None,
    guard_margin: Annotated[
        float | None,
        typer.Option(
            "--guard-margin",
            min=0.001,
            max=0.5,
            help="Make each --guard a non-inferiority test: a candidate passes only when the paired "
            "bootstrap shows it above the current design minus this margin (p < --accept-alpha); "
            "default: 0.02 when the proposer runs in-process, else none (reject only a significant loss).",
        ),
    ] = None,
    val_from: Annotated[
        str | None,
        typer.Option(
            "--val-from",
            help="Items that select (accept rule, guards, parents, best design): 'val', or 'train+val' "
            "(--objective recall only; feedback still comes from the training items alone). "
            "Default: train+val when the proposer runs in-process and the objective is recall, else val.",
        ),
    ] = None,
    proposals: Annotated[
        int,
        typer.Option(
            "--proposals",
            min=1,
            max=8,
            help="K proposals per iteration (hill/population), each screened by retrieval-only recall "
            "on validation before the best is scored (and answered, under accuracy objectives).",
        ),
    ] = 1,
    tabu: Annotated[
        bool,
        typer.Option(
            "--tabu/--no-tabu",
            help="LM proposer: never propose again a change rejected on its own earlier in the run "
            "(a repeat is re-sampled; a --proposer-output changes grammar does not offer it).",
        ),
    ] = True,
    stop_at_max: Annotated[
        bool,
        typer.Option(
            "--stop-at-max/--no-stop-at-max",
            help="Stop before an iteration once the best design scores the objective's maximum on "
            "validation (delivered recall and R@10 1.0, or accuracy 1.0): no candidate can be accepted "
            "then. Off by default (the paper's T iterations).",
        ),
    ] = False,
    lm_retrieval_margin: Annotated[
        float,
        typer.Option(
            "--lm-retrieval-margin",
            min=0.0,
            max=1.0,
            help="A design that calls an LM at retrieval (rewrite, HyDE, LM rerank, ...) must beat the best "
            "LM-free design found so far by this much on the primary metric (0-1).",
        ),
    ] = 0.02,
    paper: Annotated[
        bool,
        typer.Option(
            "--paper",
            help="The paper's setting for every option above left unset (--objective accuracy "
            "--proposer-output design --feedback-tokens 3000 --accept strict, no guard, --val-from val, "
            "no retrieval LM-call limit), whatever LMs run. Without it those options default by the "
            "LMs: the small-proposer setting when the proposer runs in-process.",
        ),
    ] = False,
) -> None:
    """MemSteer-Opt: optimize the memory design for this history with evidence-guided feedback,
    accepting a revision only when it scores better on validation (strictly, or significantly with
    --accept paired); scores the initial and the best design on held-out items at the end, with a
    paired 95% interval and a verdict; tracked in MLflow."""
    resolved = resolve_defaults(
        {
            "objective": objective,
            "proposer_output": proposer_output,
            "feedback_tokens": feedback_tokens,
            "accept": accept_rule,
            "guard": guard or None,
            "guard_margin": guard_margin,
            "val_from": val_from,
            "max_eval_lm_calls": max_eval_lm_calls,
        },
        proposer_in_process=lm_config.in_process("proposer"),
        answerer_in_process=lm_config.in_process("answerer"),
        paper=paper,
    )
    v = resolved.values
    objective, proposer_output, feedback_tokens, accept_rule = (
        v["objective"],
        v["proposer_output"],
        v["feedback_tokens"],
        v["accept"],
    )
    guard, guard_margin, val_from, max_eval_lm_calls = (
        v["guard"],
        v["guard_margin"],
        v["val_from"],
        v["max_eval_lm_calls"],
    )
    if objective not in OBJECTIVES:
        raise typer.BadParameter(f"choose one of {', '.join(OBJECTIVES)}", param_hint="--objective")
    if feedback not in FEEDBACK_MODES:
        raise typer.BadParameter(
            f"choose one of {', '.join(FEEDBACK_MODES)}", param_hint="--feedback"
        )
    if protocol is not None and protocol not in ("as_of", "full"):
        raise typer.BadParameter("choose 'as_of' or 'full'", param_hint="--protocol")
    if proposer_output not in ("design", "changes"):
        raise typer.BadParameter("choose 'design' or 'changes'", param_hint="--proposer-output")
    for value, allowed, hint in (
        (search, SEARCHES, "--search"),
        (parents, PARENT_STRATEGIES, "--parents"),
        (accept_rule, ACCEPT_RULES, "--accept"),
        (accept_test, ("bootstrap", "sign"), "--accept-test"),
        (val_from, ("val", "train+val"), "--val-from"),
        *((g, GUARD_METRICS, "--guard") for g in guard or ()),
    ):
        if value not in allowed:
            raise typer.BadParameter(f"choose one of {', '.join(allowed)}", param_hint=hint)
    check_not_inputs(out, [history.path, supervision, test, init_design])
    d0 = MemoryDesign.load(init_design) if init_design is not None else MemoryDesign.base_bm25()
    loaded = history.load()
    train, val, source = load_supervision(supervision, loaded, seed=seed)
    train, val, test_items, test_source = load_test_split(
        supervision, loaded, train, val, seed=seed, test=test, test_fraction=test_fraction
    )
    config = OptimizeConfig(
        iterations=iterations,
        objective=objective,
        feedback=feedback,
        seed=seed,
        feedback_tokens=feedback_tokens,
        protocol=protocol or ("as_of" if history.format == "rhelm" else "full"),
        threads=threads,
        proposer_output=proposer_output,
        max_build_calls=_build_call_limit(max_build_calls, lm_config),
        max_eval_lm_calls=max_eval_lm_calls,
        max_embed_units=max_embed_units,
        search=search,
        parents=parents,
        accept=accept_rule,
        accept_alpha=accept_alpha,
        accept_margin=accept_margin,
        accept_test=accept_test,
        lm_retrieval_margin=lm_retrieval_margin,
        proposals=proposals,
        guard=list(guard or []),
        guard_margin=guard_margin,
        val_from=val_from,
        tabu=tabu,
        stop_at_max=stop_at_max,
        resolved=resolved.line(),
    )
    tracker = _tracker(out, loaded, tracking_uri, no_tracking)
    if dspy_autolog:
        tracker.enable_dspy_autolog()
    typer.echo(resolved.line(), err=True)
    typer.echo(
        f"MemSteer-Opt on {loaded.history.user_id}: {len(train)} train / {len(val)} val / {len(test_items)} test "
        f"items ({source}); objective {objective}, search {search}, accept {accept_rule}, {iterations} iterations -> {out}",
        err=True,
    )
    opt = MemSteerOpt(
        loaded.history,
        train,
        val,
        out,
        config=config,
        lms=lm_config.lm,
        init_design=d0,
        tracker=tracker,
        cache_dir=None if no_cache else (cache_dir or default_cache_dir()),
        usage=lm_config.usage_by_role,
        on_event=_progress,
        run_params={
            "supervision": source,
            "lm": lm_config.describe(),
            "format": history.format,
            "external": history.external,
        },
        test=test_items,
        test_source=test_source,
        restart=restart,
    )
    result = opt.run()
    best, base = result.best_score, result.baseline_score
    summary = {
        "user": loaded.history.user_id,
        "objective": objective,
        "feedback": feedback,
        "search": search,
        "accept": accept_rule,
        "resolved": resolved.line(),
        **result.summary(),
        "baseline": base.model_dump(),
        "lm_usage": lm_config.usage_by_role(),
    }
    if json_out:
        echo_json(summary)
        return
    typer.echo(f"initial design: {base.short()}")
    typer.echo(
        f"best design:    {best.short()}  (accepted path: iterations {result.accepted_path})"
    )
    if result.stopped:
        typer.echo(f"stopped early: {result.stopped}")
    if result.test is not None:
        t, m = result.test, result.test.primary
        ci = t.ci95.get(m)
        typer.echo(
            f"held-out test ({t.n} items, {t.source}): {m} initial {_pct(t.initial.get(m))} best {_pct(t.best.get(m))}"
            f"  diff {_pct(t.diff.get(m))}  95% CI [{_pct(ci[0]) if ci else '-'}, {_pct(ci[1]) if ci else '-'}]"
            f"  -> {t.verdict}"
        )
    else:
        typer.echo("held-out test: none (no test items; pass --test PATH or --test-fraction > 0)")
    typer.echo(
        f"wrote {out / 'best_design.json'}, {out / 'trajectory.jsonl'}, {out / 'summary.md'}, {out / 'summary.json'}"
    )
    if result.tracking_uri:
        typer.echo(f"MLflow runs: mlflow ui --backend-store-uri {result.tracking_uri}")
    elif not no_tracking:
        typer.echo(f"MLflow tracking failed ({tracker.failure}); the local files are complete.")


@cli_errors
@history_options
@lm_options
def tune_prompts(
    history: HistoryArgs,
    lm_config,
    supervision: Annotated[str, typer.Option("--supervision", "-s", help=SUPERVISION_HELP)],
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            "-o",
            help="Folder for the tuned program, its instructions and the before/after scores.",
        ),
    ],
    design: Annotated[
        str,
        typer.Option(
            "--design",
            "-d",
            help="'base-bm25' or a design JSON (e.g. an optimize run's best_design.json); held fixed.",
        ),
    ] = "base-bm25",
    optimizer: Annotated[
        str,
        typer.Option(
            "--optimizer",
            help="'gepa' (reflective prompt evolution, with feedback text) or 'mipro' (MIPROv2; needs optuna).",
        ),
    ] = "gepa",
    auto: Annotated[
        str, typer.Option("--auto", help="Budget preset: light, medium or heavy.")
    ] = "light",
    max_metric_calls: Annotated[
        int | None,
        typer.Option(
            "--max-metric-calls", min=1, help="GEPA: a budget in metric calls instead of --auto."
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    tracking_uri: Annotated[
        str | None,
        typer.Option(
            "--tracking-uri",
            help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///<out>/mlflow.db).",
        ),
    ] = None,
    no_tracking: Annotated[bool, typer.Option("--no-tracking")] = False,
    threads: Annotated[int, typer.Option("--threads", "-t", min=1)] = 1,
    protocol: Annotated[
        str | None, typer.Option("--protocol", help="'as_of' (default for RHELM) or 'full'.")
    ] = None,
    cache_dir: Annotated[Path | None, typer.Option("--cache-dir")] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print one JSON object at the end.")
    ] = False,
) -> None:
    """Hand the supervision to DSPy's GEPA or MIPROv2: tune the answerer and query-rewriter
    prompts of a fixed design on train, select on validation; logged to the same MLflow experiment."""
    if optimizer not in OPTIMIZERS:
        raise typer.BadParameter(f"choose one of {', '.join(OPTIMIZERS)}", param_hint="--optimizer")
    if auto not in ("light", "medium", "heavy"):
        raise typer.BadParameter("choose light, medium or heavy", param_hint="--auto")
    check_not_inputs(out, [history.path, supervision, design])
    d = MemoryDesign.base_bm25() if design == "base-bm25" else MemoryDesign.load(design)
    loaded = history.load()
    train, val, source = load_supervision(supervision, loaded, seed=seed)
    tracker = _tracker(out, loaded, tracking_uri, no_tracking)
    result = run_tuning(
        loaded.history,
        train,
        val,
        d,
        out_dir=out,
        optimizer=optimizer,
        answerer_lm=lm_config.lm("answerer"),
        judge_lm=lm_config.lm("judge"),
        reflection_lm=lm_config.lm("proposer"),
        auto=None if max_metric_calls else auto,
        max_metric_calls=max_metric_calls,
        seed=seed,
        threads=threads,
        protocol=protocol or ("as_of" if history.format == "rhelm" else "full"),
        cache_dir=cache_dir or default_cache_dir(),
        tracker=tracker,
        run_params={"supervision": source, "lm": lm_config.describe()},
    )
    report = result.model_dump(mode="json") | {"lm_usage": lm_config.usage_by_role()}
    if json_out:
        echo_json(report)
        return
    typer.echo(
        f"validation accuracy: {result.val_before:.3f} before -> {result.val_after:.3f} after ({optimizer})"
    )
    for name, text in result.instructions.items():
        typer.echo(f"[{name}] {text[:300]}")
    typer.echo(f"wrote {out / 'tuned_program.json'} and {out / 'instructions.json'}")
    if result.tracking_uri:
        typer.echo(f"MLflow runs: mlflow ui --backend-store-uri {result.tracking_uri}")


def _build_call_limit(given: int | None, lm_config) -> int | None:
    return build_call_limit(given, answerer_in_process=lm_config.in_process("answerer"))
