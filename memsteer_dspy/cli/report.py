"""``memsteer report RUN_DIR``: an HTML report with matplotlib figures of one optimize run."""

from pathlib import Path
from typing import Annotated

import typer

from memsteer_dspy.cli.common import cli_errors, echo_json
from memsteer_dspy.report import log_report, write_report


@cli_errors
def report(
    run_dir: Annotated[
        Path,
        typer.Argument(help="The --out folder of a memsteer optimize run.", show_default=False),
    ],
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Folder for report.html and the PNGs (default RUN_DIR/report)."),
    ] = None,
    tracking_uri: Annotated[
        str | None,
        typer.Option(
            "--tracking-uri",
            help="MLflow store of the run's parent run (default: the one in RUN_DIR/run.json).",
        ),
    ] = None,
    no_tracking: Annotated[
        bool, typer.Option("--no-tracking", help="Do not add the report to the MLflow parent run.")
    ] = False,
    json_out: Annotated[
        bool,
        typer.Option("--json", help="Print the written paths and the numbers as one JSON object."),
    ] = False,
) -> None:
    """Write a self-contained HTML report of an optimize run (score per iteration with the accepted
    path, the design diff of each accepted step, training failures by stage, the held-out verdict,
    LM cost by role) with the figures as PNGs beside it, and add them to the run's MLflow parent
    run under report/."""
    rep = write_report(run_dir, out)
    tracked = None if no_tracking else log_report(rep, run_dir, tracking_uri=tracking_uri)
    if json_out:
        echo_json(
            {
                "html": str(rep.html),
                "figures": {k: str(v) for k, v in rep.figures.items()},
                "mlflow_parent_run_id": tracked and tracked["parent_run_id"],
                "mlflow_ui_url": tracked and tracked["ui_url"],
                **rep.data,
            }
        )
        return
    typer.echo(f"wrote {rep.html}")
    for name, path in rep.figures.items():
        typer.echo(f"  {name:<10} {path}")
    if tracked:
        typer.echo(
            f"added to MLflow parent run {tracked['parent_run_id']} (artifacts under report/)"
        )
        typer.echo(f"MLflow runs: {tracked['ui_command']}\n  then open {tracked['ui_url']}")
    elif not no_tracking:
        typer.echo(
            "not added to MLflow: the run has no tracked parent run, or its store could not be opened"
        )
