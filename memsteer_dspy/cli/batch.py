"""``memsteer batch {ingest,generate,evaluate,optimize}``: one single-user command per user, on a
local pool or a Ray cluster, with one summary over users.

(No ``from __future__ import annotations`` here: typer must see the real ``Annotated`` options.)
"""

from pathlib import Path
from typing import Annotated

import typer

from memsteer_dspy.batch import build_tasks, make_executor, resolve_users, run_batch
from memsteer_dspy.cli.common import FORMATS, cli_errors, echo_json
from memsteer_dspy.tracking import Tracker

batch_app = typer.Typer(
    help=(
        "Run ingest, generate, evaluate or optimize for many users: one task per user, each writing "
        "the folder the single-user command writes (OUT/<user>), on a local pool or a Ray cluster. "
        "Options after the batch's own (or after --) go to the single-user command; {user} in them "
        "becomes each user, e.g. --supervision runs/gen/{user}. A rerun skips finished users and "
        "resumes the others. Writes OUT/batch_summary.json and OUT/batch_summary.md; exits 1 only "
        "when a user failed for a reason other than its own bad input."
    ),
    no_args_is_help=True,
)

_EXTRA = {"allow_extra_args": True, "ignore_unknown_options": True}


def _run(
    ctx: typer.Context,
    command: str,
    *,
    users: str,
    out: Path,
    format: str,
    path: Path | None,
    external: bool,
    on_error: str,
    executor: str,
    workers: int,
    ray_address: str | None,
    ray_retries: int,
    ray_setup_hook: str | None,
    max_concurrent_lm: int | None,
    json_out: bool,
    tracking_uri: str | None = None,
    experiment: str | None = None,
) -> None:
    if format not in FORMATS:
        raise typer.BadParameter(f"choose one of {', '.join(FORMATS)}", param_hint="--format")
    if executor not in ("local", "ray"):
        raise typer.BadParameter("choose 'local' or 'ray'", param_hint="--executor")
    extra = list(ctx.args)
    shared = None
    if command == "optimize" and "--no-tracking" not in extra:
        uri = tracking_uri or f"sqlite:///{out.resolve() / 'mlflow.db'}"
        extra += ["--tracking-uri", uri]
        shared = experiment or f"memsteer-batch/{out.resolve().name}"
        _open_tracking(uri, shared, out)
    names = resolve_users(users, format, path)
    tasks = build_tasks(
        command,
        names,
        out,
        format=format,
        path=path,
        external=external,
        on_error=on_error,
        extra=extra,
        experiment=shared,
    )
    ex = make_executor(
        executor,
        workers=workers,
        ray_address=ray_address,
        max_concurrent_lm=max_concurrent_lm,
        retries=ray_retries,
        setup_hook=ray_setup_hook,
    )
    typer.echo(f"batch {command}: {len(tasks)} user(s) -> {out} on {executor}", err=True)
    try:
        summary = run_batch(tasks, ex, progress=not json_out)
    finally:
        ex.close()
    if json_out:
        echo_json(summary)
    else:
        typer.echo((out / "batch_summary.md").read_text(encoding="utf-8"))
        typer.echo(
            f"wrote {out / 'batch_summary.json'} and {out / 'batch_summary.md'}; per-user logs in {out / '_batch'}"
        )
    if summary["statuses"].get("failed"):
        raise typer.Exit(1)


def _open_tracking(uri: str, experiment: str, out: Path) -> None:
    """Create the store and the experiment once, before the users' runs open it in parallel."""
    out.mkdir(parents=True, exist_ok=True)
    if not Tracker(uri, experiment).connect():
        typer.echo(
            f"warning: MLflow tracking store {uri} could not be opened; users keep their local files",
            err=True,
        )


def _command(name: str, doc: str):
    def command(
        ctx: typer.Context,
        users: Annotated[
            str,
            typer.Option(
                "--users",
                help="'all' (every user of the source), a file with one user per line, or U1,U2.",
            ),
        ],
        out: Annotated[
            Path,
            typer.Option(
                "--out",
                "-o",
                help="Batch folder: OUT/<user> per user, OUT/batch_summary.{json,md}, OUT/_batch/ logs.",
            ),
        ],
        format: Annotated[
            str, typer.Option("--format", "-f", help=f"History format: {', '.join(FORMATS)}.")
        ] = "rhelm",
        path: Annotated[
            Path | None,
            typer.Option(
                "--path",
                "-p",
                help="History source (RHELM root; LoCoMo file; jsonl: a folder with one sub-folder or <user>.jsonl per user).",
            ),
        ] = None,
        external: Annotated[
            bool,
            typer.Option("--external/--no-external", help="RHELM: include emails and attachments."),
        ] = True,
        on_error: Annotated[
            str, typer.Option("--on-error", help="'raise' or 'skip' malformed input lines.")
        ] = "raise",
        executor: Annotated[
            str,
            typer.Option(
                "--executor",
                help="'local' (a bounded pool in this process) or 'ray' (tasks on a Ray cluster).",
            ),
        ] = "local",
        workers: Annotated[
            int, typer.Option("--workers", min=1, help="local: users run at once.")
        ] = 2,
        ray_address: Annotated[
            str | None,
            typer.Option(
                "--ray-address",
                help="ray: the cluster (e.g. ray://head:10001 or auto); default: a local cluster on this machine.",
            ),
        ] = None,
        ray_retries: Annotated[
            int,
            typer.Option("--ray-retries", min=0, help="ray: reruns of a user whose worker died."),
        ] = 3,
        ray_setup_hook: Annotated[
            str | None,
            typer.Option(
                "--ray-setup-hook",
                help="ray: 'module.function' each worker process runs first (Ray's worker_process_setup_hook), e.g. to register custom LMs.",
            ),
        ] = None,
        max_concurrent_lm: Annotated[
            int | None,
            typer.Option(
                "--max-concurrent-lm",
                min=1,
                help="At most this many LM calls in flight per endpoint (model + api_base), across all workers.",
            ),
        ] = None,
        json_out: Annotated[
            bool,
            typer.Option(
                "--json", help="Print batch_summary.json instead of the table (no progress bar)."
            ),
        ] = False,
        tracking_uri: Annotated[
            str | None,
            typer.Option(
                "--tracking-uri",
                help="optimize: the MLflow server (http://host:5000) or store every user logs to (default sqlite:///OUT/mlflow.db).",
            ),
        ] = None,
        experiment: Annotated[
            str | None,
            typer.Option(
                "--experiment",
                help="optimize: the one MLflow experiment of every user's parent run (default memsteer-batch/<OUT name>).",
            ),
        ] = None,
    ) -> None:
        if name != "optimize" and (tracking_uri or experiment):
            raise typer.BadParameter(
                "only for batch optimize", param_hint="--tracking-uri/--experiment"
            )
        _run(
            ctx,
            name,
            users=users,
            out=out,
            format=format,
            path=path,
            external=external,
            on_error=on_error,
            executor=executor,
            workers=workers,
            ray_address=ray_address,
            ray_retries=ray_retries,
            ray_setup_hook=ray_setup_hook,
            max_concurrent_lm=max_concurrent_lm,
            json_out=json_out,
            tracking_uri=tracking_uri,
            experiment=experiment,
        )

    command.__doc__ = doc
    command.__name__ = name
    return cli_errors(command)


batch_app.command("ingest", context_settings=_EXTRA)(
    _command("ingest", "`memsteer ingest --json` per user (OUT/<user>/ingest.json); pooled counts.")
)
batch_app.command("generate", context_settings=_EXTRA)(
    _command(
        "generate", "`memsteer generate` per user; kept fraction and cost per user and pooled."
    )
)
batch_app.command("evaluate", context_settings=_EXTRA)(
    _command(
        "evaluate", "`memsteer evaluate` per user; metrics per user and pooled over all items."
    )
)
batch_app.command("optimize", context_settings=_EXTRA)(
    _command(
        "optimize",
        "`memsteer optimize` per user, every parent run in one MLflow experiment tagged with its user; validation and held-out figures per user and pooled.",
    )
)
