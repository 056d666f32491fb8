"""``memsteer generate`` and ``memsteer assess``: build verified QA–evidence supervision from a
user's history, and judge its quality (or the checks' fidelity on human-annotated QA).

(No ``from __future__ import annotations`` here: typer must see the real ``Annotated`` options.)
"""

import json
from pathlib import Path
from typing import Annotated

import typer

from memsteer_dspy.cli.common import HistoryArgs, cli_errors, echo_json, history_options, lm_options
from memsteer_dspy.errors import InputError
from memsteer_dspy.runfolder import check_not_inputs

PROFILES = ("auto", "small", "full")
# The steering panel's options, shared by `generate` (at its end) and `assess --steering`.
ReferenceOption = Annotated[
    Path | None,
    typer.Option(
        "--reference",
        help="Steering: a QA JSONL file to measure against (default: the format's own QA).",
    ),
]
PanelOption = Annotated[
    Path | None,
    typer.Option(
        "--panel",
        help="Steering: a JSON object name -> patch of Base-BM25 (default: the package's panel).",
    ),
]


def _bundle_config(
    profile: str,
    lm_config,
    budget: int,
    record_token_cap: int | None,
    steer_by_yield: bool = False,
    yield_power: float = 1.0,
    anchored: bool = False,
    seed_kind_power: float | None = None,
    bridge_events: str | None = None,
):
    from memsteer_dspy.bundles import (
        ANCHORED_SAMPLING,
        BRIDGE_EVENTS,
        BundleConfig,
        small_lm_bundle_config,
    )

    if profile not in PROFILES:
        raise typer.BadParameter(f"choose one of {', '.join(PROFILES)}", param_hint="--profile")
    if profile == "auto":
        profile = "small" if lm_config.in_process("planner") else "full"
    overrides = {"token_budget": budget}
    if record_token_cap is not None:
        overrides["record_token_cap"] = record_token_cap
    if steer_by_yield:
        overrides["steer_by_yield"] = True
    if yield_power != 1.0:
        if not steer_by_yield:
            raise typer.BadParameter("needs --steer-by-yield", param_hint="--yield-power")
        overrides["yield_power"] = yield_power
    if anchored:  # sampled for the anchored planner (bundles.ANCHORED_SAMPLING)
        overrides.update(ANCHORED_SAMPLING)
    if seed_kind_power is not None:
        overrides["seed_kind_power"] = seed_kind_power
    if bridge_events is not None:
        if bridge_events not in BRIDGE_EVENTS:
            raise typer.BadParameter(
                f"choose one of {', '.join(BRIDGE_EVENTS)}", param_hint="--bridge-events"
            )
        overrides["bridge_events"] = bridge_events
    config = (
        small_lm_bundle_config(**overrides) if profile == "small" else BundleConfig(**overrides)
    )
    if bridge_events is not None and not config.bridges:
        raise typer.BadParameter(
            "bridges are asked by the anchored planner only (--anchored, or the small profile's "
            "default pipeline)",
            param_hint="--bridge-events",
        )
    return config, profile


def _pipeline_name(config) -> str:
    if config.anchored:
        name = "lean prompts, anchored planner"
    else:
        name = "lean prompts" if config.lean else "the paper's prompts"
    if config.writer_examples:
        sources = ", ".join(e.source for e in config.writer_examples)
        name += f"; question-writer examples {sources}"
    return name


@cli_errors
@history_options
@lm_options
def generate(
    history: HistoryArgs,
    lm_config,
    out: Annotated[
        Path,
        typer.Option(
            "--out", "-o", help="Output folder (created; rerun the same command to resume)."
        ),
    ],
    n: Annotated[int, typer.Option("--n", "-n", min=1, help="Accepted QA items wanted.")] = 100,
    max_candidates: Annotated[
        int | None,
        typer.Option("--max-candidates", min=1, help="Candidates to try at most (default 5 x N)."),
    ] = None,
    time_budget: Annotated[
        float | None,
        typer.Option(
            "--time-budget",
            min=1,
            help="Start no new candidate after this many seconds of generation (all sessions of "
            "the run together); the summary's stopped_by says which limit ended it.",
        ),
    ] = None,
    method: Annotated[
        str,
        typer.Option(
            "--method",
            help="memsteer (plan, then question), joint, direct or naive (the paper's ablations).",
        ),
    ] = "memsteer",
    checks: Annotated[
        bool,
        typer.Option(
            "--checks/--no-checks",
            help="Plan checks, audit and blind read (--no-checks skips them).",
        ),
    ] = True,
    seed: Annotated[
        int,
        typer.Option(
            "--seed",
            help="Seed: which seeds, tasks and bundles (a rerun with the same seed resumes).",
        ),
    ] = 0,
    threads: Annotated[
        int,
        typer.Option(
            "--threads",
            min=1,
            help="Candidates in parallel (API LMs; keep 1 for the embedded model).",
        ),
    ] = 1,
    budget: Annotated[
        int, typer.Option("--budget", min=100, help="Bundle token budget (cl100k tokens).")
    ] = 2500,
    profile: Annotated[
        str,
        typer.Option(
            "--profile",
            help="Bundle profile: small (3 short records, mostly 1-2 evidence records), full, or auto (small for local/llamacpp planners).",
        ),
    ] = "auto",
    record_token_cap: Annotated[
        int | None,
        typer.Option(
            "--record-token-cap",
            min=20,
            help="Keep only each record's leading spans within this many tokens.",
        ),
    ] = None,
    batch_size: Annotated[
        int,
        typer.Option(
            "--batch-size",
            min=1,
            help="Candidates run stage by stage together (lets a local LM reuse its prompt cache).",
        ),
    ] = 8,
    max_demos: Annotated[
        int | None,
        typer.Option(
            "--max-demos",
            min=0,
            help="Few-shot demonstrations bootstrapped from accepted items (default 2; 0 for the "
            "embedded model, which copies a real demo's answer into other bundles).",
        ),
    ] = None,
    writer_examples: Annotated[
        int | None,
        typer.Option(
            "--writer-examples",
            min=0,
            help="Show the question writer K hand-written questions of another history (one of "
            "each answer kind in turn), each in the writer's own input format, before the "
            "fictional cold-start one (0: none; default: 4 with the small-LM pipeline that an "
            "unset --lean chooses for an in-process model, else 0).",
        ),
    ] = None,
    writer_examples_from: Annotated[
        Path | None,
        typer.Option(
            "--writer-examples-from",
            help="Where --writer-examples come from: a JSONL history with its questions "
            "(records.jsonl + qa.jsonl; default: the package's fictional examples, "
            "data/writer_examples). Never the history generated for.",
        ),
    ] = None,
    lean: Annotated[
        bool | None,
        typer.Option(
            "--lean/--no-lean",
            help="The cheaper pipeline (same stages): compact prompts, bundles with nothing concrete "
            "rejected before any LM call, the blind read before the audit, tight output caps. "
            "Default: for an in-process planner on small bundles with method memsteer and none of "
            "--anchored / --steer-by-yield given, lean with the anchored planner and the squared-yield "
            "sampler (the benchmark's lean-anchor, measured cheapest per verified item on the "
            "embedded model: README); otherwise the paper's prompts. --no-lean: the paper's prompts.",
        ),
    ] = None,
    steer_by_yield: Annotated[
        bool,
        typer.Option(
            "--steer-by-yield",
            help="Small profile: weigh each task kind (answer type, evidence count) the accepted "
            "items lack also by the share of its tasks kept so far, so a kind the LM keeps failing "
            "is asked for less (default: by the lag alone; summary.json kept_by_task shows both).",
        ),
    ] = False,
    yield_power: Annotated[
        float,
        typer.Option(
            "--yield-power",
            min=1.0,
            max=4.0,
            help="With --steer-by-yield: the power each kind's kept share is raised to (default 1). "
            "At 2 a kind that keeps failing loses its draws within about ten tries; at 1 the lag "
            "term kept giving two-record tasks half the draws after 19 failures (README).",
        ),
    ] = 1.0,
    anchored: Annotated[
        bool,
        typer.Option(
            "--anchored",
            help="The planner chooses its reference answer by number from the names, numbers, "
            "lists and record dates the program reads off the bundle's sentences, instead of "
            "writing it (method memsteer; the small profile then steers toward the answer types "
            "a bundle has options for). Every check stays on.",
        ),
    ] = False,
    seed_kind_power: Annotated[
        float | None,
        typer.Option(
            "--seed-kind-power",
            min=0.0,
            max=1.0,
            help="Draw each seed's record kind (conversation turn, email, document section) with "
            "probability proportional to its record count to this power (default 0.5, the square "
            "root, which over-samples the rarer kinds such as emails; 1: as the history has them).",
        ),
    ] = None,
    bridge_events: Annotated[
        str | None,
        typer.Option(
            "--bridge-events",
            help="Which sentence of another record of the day may name a two-record question's "
            'day ("…, on the day I cycled over to the clinic?"): subject (default: a first clause '
            "with a subject) or told (also no question, no word to the assistant, no feeling or "
            "wish: a conversation's \"I think you're right\" says nothing of the day).",
        ),
    ] = None,
    own_words: Annotated[
        bool,
        typer.Option(
            "--own-words/--copy-words",
            help="With checks: re-write (then reject as question:echoes) a question that copies its "
            "evidence records' wording; --copy-words keeps such questions (the earlier behaviour).",
        ),
    ] = True,
    steering: Annotated[
        bool,
        typer.Option(
            "--steering/--no-steering",
            help="At the end, score the steering panel (memsteer assess --steering) on the accepted "
            "items and on the reference (--reference, or the format's own QA), LM-free; written to "
            "steering.json, summary.json and MLflow. Skipped where there is no reference.",
        ),
    ] = True,
    reference: ReferenceOption = None,
    panel: PanelOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    restart: Annotated[
        bool,
        typer.Option(
            "--restart",
            help="Empty the --out run folder (never a folder of your own: it is refused) and start over (a rerun otherwise resumes, and only with the "
            "same history, method, seed, checks, bundle settings and LMs).",
        ),
    ] = False,
) -> None:
    """Generate verified QA-evidence supervision (train.jsonl, val.jsonl, rejected.jsonl,
    summary.json, dataset/) from a user's history."""
    from memsteer_dspy.supervision.program import GENERATION_ROLES
    from memsteer_dspy.supervision.run import (
        METHODS,
        GenerationConfig,
        format_summary,
        generate_supervision,
    )
    from memsteer_dspy.supervision.writer_examples import SMALL_LM_WRITER_EXAMPLES

    if method not in METHODS:
        raise typer.BadParameter(f"choose one of {', '.join(METHODS)}", param_hint="--method")
    # length limits in the output schemas, for LMs that decode under them (in-process llama.cpp)
    bounded = lm_config.in_process(*GENERATION_ROLES)
    small = profile == "small" or (profile == "auto" and lm_config.in_process("planner"))
    # unset --lean: the small-LM pipeline (benchmarks/generate_cost.py's lean-anchor) or the paper's
    small_lm_default = False
    if lean is None:
        lean = small_lm_default = (
            small and bounded and method == "memsteer" and not anchored and not steer_by_yield
        )
        if small_lm_default:
            anchored, steer_by_yield, yield_power = True, True, 2.0
    if writer_examples is None:
        writer_examples = SMALL_LM_WRITER_EXAMPLES if small_lm_default else 0
    bundle_config, chosen = _bundle_config(
        profile,
        lm_config,
        budget,
        record_token_cap,
        steer_by_yield,
        yield_power,
        anchored,
        seed_kind_power,
        bridge_events,
    )
    check_not_inputs(out, [history.path])
    loaded = history.load()
    examples = _writer_examples(writer_examples, writer_examples_from, history.path, loaded, seed)
    config = GenerationConfig(
        n=n,
        max_candidates=max_candidates,
        time_budget_s=time_budget,
        method=method,
        checks=checks,
        seed=seed,
        threads=threads,
        batch_size=batch_size,
        max_demos=max_demos,
        bundle=bundle_config,
        bounded=bounded,
        lean=lean,
        anchored=anchored,
        own_words=own_words,
        writer_examples=examples,
    )
    lms = {role: lm_config.lm(role) for role in GENERATION_ROLES}
    described = lm_config.describe()
    typer.echo(
        f"generating for {loaded.history.user_id} ({len(loaded.history)} records) into {out}: "
        f"method {method}, profile {chosen}, n {n}, at most {config.candidate_limit} candidates; "
        + _pipeline_name(config),
        err=True,
    )
    summary = generate_supervision(
        loaded.history,
        lms,
        out,
        config,
        lm_description=described,
        restart=restart,
        usage=lm_config.usage_by_role,
    )
    summary["lm_usage_by_role"] = lm_config.usage_by_role()
    report = None
    if steering and summary.get("accepted"):
        say = None if as_json else (lambda line: typer.echo(line, err=True))
        report = _steering(loaded, out, reference, panel, history.format, own_folder=True, say=say)
        if report is not None:
            summary["steering"] = report.headline()
    if as_json:
        echo_json(summary)
    else:
        from memsteer_dspy.supervision.steering import format_steering

        typer.echo(format_summary(summary))
        if report is not None:
            typer.echo(format_steering(report))
        typer.echo(
            f"wrote {out}/train.jsonl, val.jsonl, rejected.jsonl, summary.json, dataset/"
            + (", steering.json" if report is not None else "")
        )


def _writer_examples(k: int, source: Path | None, path: Path | None, loaded, seed: int) -> list:
    """``--writer-examples``: ``k`` demonstrations from ``source`` (default the package's
    fictional examples), never from the history generated for (read from ``path`` as ``loaded``)."""
    from memsteer_dspy.supervision.writer_examples import packaged_examples_path, writer_examples

    if k == 0:
        return []
    return writer_examples(
        source or packaged_examples_path(),
        k,
        seed=seed,
        not_history=path,
        not_records=[r.id for r in loaded.history.records],
    )


def _reference_items(loaded, reference: Path | None) -> tuple[list, str]:
    """The items steering is measured against: ``--reference`` or the format's own QA."""
    from memsteer_dspy.supervision.run import load_qa_jsonl

    if reference is not None:
        return load_qa_jsonl(reference), str(reference)
    return list(loaded.qa_items), "the history's own QA"


def _steering(
    loaded,
    folder: Path,
    reference: Path | None,
    panel: Path | None,
    fmt: str,
    *,
    own_folder: bool,
    say=None,
):
    """Score the steering panel on ``folder``'s accepted items against the reference. In the
    command's own output folder (``own_folder``: generate's ``--out``) also write ``steering.json``
    and ``summary.json`` ``steering`` and log one MLflow run; never into a folder that is only an
    input (``assess``). None when there is no reference to measure against."""
    from memsteer_dspy.cli.evaluate import default_cache_dir
    from memsteer_dspy.supervision.steering import (
        load_panel,
        save_steering,
        steering_of_folder,
        track_steering,
    )
    from memsteer_dspy.tracking import Tracker

    items, source = _reference_items(loaded, reference)
    if not items:
        return None
    report = steering_of_folder(
        loaded.history,
        folder,
        items,
        protocol="as_of" if fmt == "rhelm" else "full",
        panel=load_panel(panel),
        cache_dir=default_cache_dir(),
        reference_source=source,
        progress=say,
    )
    if not own_folder:
        return report
    save_steering(folder, report)
    tracker = Tracker.for_history(folder, loaded.history.user_id, loaded.history.fingerprint)
    track_steering(
        tracker,
        report,
        run_name=f"steering {folder.name}",
        tags={"memsteer.supervision": str(folder)},
    )
    return report


@cli_errors
@history_options
@lm_options
def assess(
    history: HistoryArgs,
    lm_config,
    supervision: Annotated[
        list[Path] | None,
        typer.Option(
            "--supervision",
            "-s",
            help="A folder written by `generate` (repeat for several methods).",
        ),
    ] = None,
    fidelity: Annotated[
        bool,
        typer.Option(
            "--fidelity",
            help="Run the audit and blind read over the format's official QA and corrupted copies.",
        ),
    ] = False,
    steering: Annotated[
        bool,
        typer.Option(
            "--steering",
            help="Score a fixed panel of memory designs (LM-free) on each --supervision folder's "
            "items and on the reference, and report how well the two rankings agree (Kendall tau, "
            "Spearman rho with bootstrap intervals), the headroom over Base-BM25 on each, and how "
            "lexically easy the generated questions are. LM-free; --out writes the report (the "
            "supervision folder is only read).",
        ),
    ] = False,
    reference: ReferenceOption = None,
    panel: PanelOption = None,
    lean: Annotated[
        bool,
        typer.Option(
            "--lean",
            help="With --fidelity: run the checks as the lean pipeline does (compact prompts, the "
            "blind read first, the quoted-facts audit), the ones `generate` uses on the embedded model.",
        ),
    ] = False,
    limit: Annotated[
        int,
        typer.Option(
            "--limit", min=1, help="Items to judge per folder (or official items for --fidelity)."
        ),
    ] = 50,
    seed: Annotated[
        int, typer.Option("--seed", help="Which items are sampled and how they are corrupted.")
    ] = 0,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Also write the report as JSON here.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Judge QA quality per method (premise support, clarity, answer support, evidence support),
    or with --fidelity measure how often the checks accept true items and reject corrupted ones."""
    from memsteer_dspy.supervision.quality import (
        assess_fidelity,
        assess_quality,
        format_fidelity,
        format_quality,
    )

    if not supervision and not fidelity:
        raise InputError(
            "nothing to assess",
            field="--supervision",
            hint="pass --supervision <generate output folder> (repeatable) and/or --fidelity",
        )
    if steering and not supervision:
        raise InputError(
            "--steering needs the generated items",
            field="--supervision",
            hint="pass --supervision <generate output folder>",
        )
    check_not_inputs(out, [history.path, *(supervision or ())])
    loaded = history.load()
    report: dict = {"user": loaded.history.user_id, "lm": lm_config.describe()}
    lines: list[str] = []
    if steering:
        from memsteer_dspy.supervision.steering import format_steering

        if not _reference_items(loaded, reference)[0]:
            raise InputError(
                f"the {history.format} history has no QA to measure steering against",
                field="--reference",
                hint="pass --reference <QA JSONL> (hand-written or official items)",
            )
        say = None if as_json else (lambda line: typer.echo(line, err=True))
        report["steering"] = {}
        for folder in supervision:
            rep = _steering(
                loaded, folder, reference, panel, history.format, own_folder=False, say=say
            )
            report["steering"][str(folder)] = rep.model_dump(mode="json")
            lines.append(f"{folder}:\n{format_steering(rep)}")
        if not fidelity:
            _finish_assess(report, lines, out, as_json)
            return
    if supervision and not steering:
        bounded = lm_config.in_process("quality_judge")
        quality = assess_quality(
            loaded.history,
            supervision,
            lm_config.lm("quality_judge"),
            limit=limit,
            seed=seed,
            bounded=bounded,
        )
        report["quality"] = quality
        lines.append(format_quality(quality))
    if fidelity:
        if not loaded.qa_items:
            raise InputError(
                f"the {history.format} history has no official QA items to check against",
                field="--fidelity",
                hint="use a format with QA (rhelm, locomo) or drop --fidelity",
            )
        lms = {r: lm_config.lm(r) for r in ("auditor", "blind_reader")}
        bounded = lm_config.in_process(*lms)
        fid = assess_fidelity(
            loaded.history,
            loaded.qa_items,
            lms,
            limit=limit,
            seed=seed,
            bounded=bounded,
            progress=True,
            lean=lean,
        )
        report["fidelity"] = fid
        lines.append(format_fidelity(fid))
    report["lm_usage_by_role"] = lm_config.usage_by_role()
    _finish_assess(report, lines, out, as_json)


def _finish_assess(report: dict, lines: list[str], out: Path | None, as_json: bool) -> None:
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    if as_json:
        echo_json(report)
    else:
        typer.echo("\n\n".join(lines))
