"""``run_batch``: one single-user command per user, on an executor, with a progress bar over users
and ``batch_summary.json`` / ``batch_summary.md`` at the end (see :mod:`memsteer_dspy.batch`)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memsteer_dspy.batch.summary import collect, markdown
from memsteer_dspy.batch.task import EXIT, USAGE, UserTask, cli_group, finished
from memsteer_dspy.batch.users import BATCH_DIR, history_argv
from memsteer_dspy.errors import ConfigError

COMMANDS = ("ingest", "generate", "evaluate", "optimize")


def build_tasks(
    command: str,
    users: Sequence[str],
    out: str | Path,
    *,
    format: str = "rhelm",
    path: str | Path | None = None,
    external: bool = True,
    on_error: str = "raise",
    extra: Sequence[str] = (),
    experiment: str | None = None,
) -> list[UserTask]:
    """The single-user command line of every user: history options, ``--out <out>/<user>`` and
    ``extra`` (the command's own options; ``{user}`` in them becomes the user)."""
    if command not in COMMANDS:
        raise ConfigError(f"unknown batch command {command!r}; choose one of {', '.join(COMMANDS)}")
    out = Path(out).resolve()
    tasks = []
    for user in users:
        argv = [command, *history_argv(format, path, user, external=external, on_error=on_error)]
        argv += ["--json"] if command == "ingest" else ["--out", str(out / user)]
        argv += [a.replace("{user}", user) for a in extra]
        tasks.append(
            UserTask(
                command=command, user=user, argv=tuple(argv), out=str(out), experiment=experiment
            )
        )
    return tasks


def check_command_line(task: UserTask) -> None:
    """Parse one user's command line without running it: a wrong option fails the batch before
    any user starts (it is the batch's fault, not a user's)."""
    group = cli_group()
    try:
        with group.make_context("memsteer", list(task.argv), resilient_parsing=False) as ctx:
            sub = group.get_command(ctx, task.command)
            sub.make_context(task.command, list(task.argv[1:]), parent=ctx)
    except EXIT:  # --help among the options
        raise ConfigError(
            f"the options given for `memsteer {task.command}` ask for help; run it alone"
        ) from None
    except USAGE as exc:
        raise ConfigError(
            f"the options for `memsteer {task.command}` do not parse: {exc.format_message()}",
        ) from None


def _progress(total: int, done: int):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(file=sys.__stderr__ or sys.stderr)
    bar = Progress(
        TextColumn("[bold]users"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=console,
        transient=False,
    )
    return bar, bar.add_task("", total=total, completed=done)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def run_batch(tasks: Sequence[UserTask], executor: Any, *, progress: bool = True) -> dict[str, Any]:
    """Run every task not finished under the same settings; write and return the batch summary."""
    if not tasks:
        raise ConfigError("a batch needs at least one user")
    command, out = tasks[0].command, Path(tasks[0].out)
    (out / BATCH_DIR).mkdir(parents=True, exist_ok=True)
    check_command_line(tasks[0])
    outcomes: dict[str, dict[str, Any]] = {}
    todo = []
    for t in tasks:
        done = finished(t)
        if done is not None:
            outcomes[t.user] = {**done, "status": "skipped"}
        else:
            todo.append(t)
    t0 = time.perf_counter()
    bar, bar_task = _progress(len(tasks), len(outcomes)) if progress else (None, None)
    log = open(out / BATCH_DIR / "outcomes.jsonl", "a", encoding="utf-8")
    try:
        if bar is not None:
            bar.start()
        for outcome in executor.run(todo):
            outcomes[outcome["user"]] = outcome
            log.write(json.dumps(outcome) + "\n")
            log.flush()
            if bar is not None:
                bar.update(
                    bar_task, advance=1, description=f"{outcome['user']}: {outcome['status']}"
                )
    finally:
        if bar is not None:
            bar.stop()
        log.close()
    ordered = {t.user: outcomes[t.user] for t in tasks if t.user in outcomes}
    summary = collect(command, out, ordered)
    summary["executor"] = getattr(executor, "name", type(executor).__name__)
    summary["wall_seconds"] = round(time.perf_counter() - t0, 3)
    _write_atomic(
        out / "batch_summary.json", json.dumps(summary, indent=2, ensure_ascii=False) + "\n"
    )
    _write_atomic(out / "batch_summary.md", markdown(summary))
    return summary
