"""``memsteer demo``: run the whole MemSteer method once on the demo history shipped in the package.

(No ``from __future__ import annotations`` here: typer must see the real ``Annotated`` options.)
"""

from pathlib import Path
from typing import Annotated

import typer

from memsteer_dspy.cli.common import cli_errors, echo_json, lm_options
from memsteer_dspy.demo import SIZES, demo_settings, run_demo


@cli_errors
@lm_options
def demo(
    lm_config,
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            "-o",
            help="Folder for everything the demo writes (supervision/, optimize/, eval/, mlflow.db, results.md). A rerun resumes.",
        ),
    ] = Path("runs/demo"),
    size: Annotated[
        str,
        typer.Option(
            "--size",
            help="'small' (sized for about 15 minutes on a 2-core CPU with the embedded model; 11-12 min measured on two 2-core AMD EPYCs, 15 on an AMX Xeon, README) or 'full' (the paper's sizes: 100 generated items, 20 iterations, all hand-written QA, 4,000-token context).",
        ),
    ] = "small",
    accuracy_items: Annotated[
        int | None,
        typer.Option(
            "--accuracy-items",
            min=0,
            help="Hand-written items answered and judged for accuracy and QS, stratified by question type (default: the size's, none for 'small', all 34 for 'full'); R@10 and delivered recall are always measured on all.",
        ),
    ] = None,
    threads: Annotated[
        int,
        typer.Option(
            "--threads",
            "-t",
            min=1,
            help="Candidates and QA items run concurrently (useful with API LMs; keep 1 for the embedded model).",
        ),
    ] = 1,
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
    json_out: Annotated[
        bool,
        typer.Option("--json", help="Print the result as one JSON object instead of the report."),
    ] = False,
    restart: Annotated[
        bool,
        typer.Option(
            "--restart",
            help="Empty the --out run folder (never a folder of your own: it is refused) and start over (a rerun otherwise resumes, and only with the same size, LMs and history).",
        ),
    ] = False,
    paper: Annotated[
        bool,
        typer.Option(
            "--paper",
            help="Optimize with the paper's setting (whole-design proposals, strict accept, no guard; "
            "accuracy under --size full) whatever LMs run; by default an in-process proposer gets "
            "the small-proposer setting (`memsteer optimize --help`).",
        ),
    ] = False,
) -> None:
    """The main job out of the box: generate supervision from the demo history, optimize the memory
    design from Base-BM25, and compare Base-BM25 with the best design on the hand-written QA set
    (accuracy, QS, R@10, LM calls, tokens, wall time), tracked in MLflow."""
    if size not in SIZES:
        raise typer.BadParameter(f"choose one of {', '.join(SIZES)}", param_hint="--size")
    overrides = {} if accuracy_items is None else {"accuracy_items": accuracy_items}
    if paper:
        overrides["paper"] = True
    settings = demo_settings(size, threads=threads, **overrides)
    result = run_demo(
        out,
        lm_config,
        settings=settings,
        tracking_uri=tracking_uri,
        tracking=not no_tracking,
        progress=True,
        restart=restart,
    )
    if json_out:
        echo_json(result.model_dump(mode="json"))
        return
    typer.echo(result.render())
