"""Options shared by the ``memsteer`` commands.

Two decorators add the same option groups to every command that needs them, so ``ingest``,
``generate``, ``evaluate`` and ``optimize`` read a history and configure LMs the same way:

* ``@history_options`` adds ``--format/--path/--user/--external/--on-error/--columns/--split``
  and passes the command a :class:`HistoryArgs` (call ``.load()`` to get a ``Loaded``).
* ``@lm_options`` adds ``--config``, ``--lm`` and one ``--lm-<role>`` per role and passes the
  command an ``LMConfig`` (``lm_config``).

``@cli_errors`` turns the project's own errors into a readable message and exit status 2.
"""

from __future__ import annotations

import errno
import functools
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

import memsteer_dspy.lm as lm_package
from memsteer_dspy.errors import MemsteerError
from memsteer_dspy.loaders import load_history

FORMATS = ("jsonl", "rhelm", "locomo", "hf", "longmemeval", "atm")
ROLE_NAMES = (
    "planner",
    "question_writer",
    "auditor",
    "blind_reader",
    "answerer",
    "judge",
    "quality_judge",
    "proposer",
)


@dataclass(frozen=True)
class HistoryArgs:
    """Where and how to read a history; ``load()`` dispatches to the format's loader."""

    format: str
    path: Path | None
    user: str | None = None
    external: bool = True
    on_error: str = "raise"
    columns: str | None = None
    split: str | None = None

    def load(self):
        return load_history(
            self.format,
            self.path,
            user=self.user,
            external=self.external,
            on_error=self.on_error,
            columns=self.columns,
            split=self.split,
        )


def _with_params(func, params: list[inspect.Parameter], target: str, build):
    """Replace ``func``'s parameter ``target`` by ``params`` (for typer), building ``target``
    from their values at call time."""
    sig = inspect.signature(func)
    if target not in sig.parameters:
        raise TypeError(f"{func.__name__} must take a parameter named {target!r}")
    kept = [p for p in sig.parameters.values() if p.name != target]
    names = [p.name for p in params]

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        extracted = {n: kwargs.pop(n) for n in names if n in kwargs}
        kwargs[target] = build(**extracted)
        return func(*args, **kwargs)

    new_sig = sig.replace(parameters=[*kept, *params])
    wrapper.__signature__ = new_sig
    # typer reads annotations through typing.get_type_hints: keep them in step with the signature
    wrapper.__annotations__ = {
        p.name: p.annotation
        for p in new_sig.parameters.values()
        if p.annotation is not inspect.Parameter.empty
    }
    return wrapper


def _kw(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
    )


def history_options(func):
    """Add the history options; the command receives ``history: HistoryArgs``."""
    params = [
        _kw(
            "format",
            Annotated[
                str, typer.Option("--format", "-f", help=f"History format: {', '.join(FORMATS)}.")
            ],
            "rhelm",
        ),
        _kw(
            "path",
            Annotated[
                Path | None,
                typer.Option(
                    "--path",
                    "-p",
                    help="History file or folder (RHELM: the benchmark root; default ../shared/benchmarks/rhelm).",
                ),
            ],
            None,
        ),
        _kw(
            "user",
            Annotated[
                str | None,
                typer.Option(
                    "--user",
                    "-u",
                    help="User id (RHELM: the persona, e.g. Elena_Morales; LoCoMo: the sample_id; LongMemEval: the question_id; ATM-Bench: the QA file stem, e.g. atm-bench-hard).",
                ),
            ],
            None,
        ),
        _kw(
            "external",
            Annotated[
                bool,
                typer.Option(
                    "--external/--no-external",
                    help="RHELM: include emails and attachments (external sources).",
                ),
            ],
            True,
        ),
        _kw(
            "on_error",
            Annotated[
                str,
                typer.Option(
                    "--on-error",
                    help="On a malformed line or file: 'raise' (stop with an error naming it) or 'skip' (report it and go on).",
                ),
            ],
            "raise",
        ),
        _kw(
            "columns",
            Annotated[
                str | None,
                typer.Option(
                    "--columns",
                    help="hf: column mapping, e.g. 'id=msg_id,text=body,timestamp=date,thread_id=conv'.",
                ),
            ],
            None,
        ),
        _kw(
            "split",
            Annotated[
                str | None,
                typer.Option(
                    "--split",
                    help="hf: dataset split to read (default: the only or 'train' split).",
                ),
            ],
            None,
        ),
    ]

    def build(**kw) -> HistoryArgs:
        if kw["format"] not in FORMATS:
            raise typer.BadParameter(
                f"unknown format {kw['format']!r}; choose one of {', '.join(FORMATS)}",
                param_hint="--format",
            )
        if kw["on_error"] not in ("raise", "skip"):
            raise typer.BadParameter("choose 'raise' or 'skip'", param_hint="--on-error")
        return HistoryArgs(**kw)

    return _with_params(func, params, "history", build)


def lm_options(func):
    """Add ``--config``, ``--lm`` and ``--lm-<role>``; the command receives ``lm_config``."""
    params = [
        _kw(
            "config",
            Annotated[
                Path | None,
                typer.Option("--config", "-c", help="TOML config (see memsteer.example.toml)."),
            ],
            None,
        ),
        _kw(
            "lm",
            Annotated[
                str | None,
                typer.Option(
                    "--lm",
                    help="LM for every role: a LiteLLM model string (openai/gpt-4.1-mini, ollama_chat/qwen2.5, ...), local/qwen2.5-coder-1.5b, or llamacpp/<file.gguf>.",
                ),
            ],
            None,
        ),
    ]
    for role in ROLE_NAMES:
        flag = "--lm-" + role.replace("_", "-")
        params.append(
            _kw(
                f"lm_{role}",
                Annotated[str | None, typer.Option(flag, help=f"LM for the {role} role only.")],
                None,
            )
        )
    params.append(
        _kw(
            "api_base",
            Annotated[
                str | None,
                typer.Option(
                    "--api-base",
                    help="Endpoint of an OpenAI-compatible server (vLLM, llama-server, ...; e.g. http://127.0.0.1:8080/v1) for every openai/<name> LM given by --lm / --lm-<role>.",
                ),
            ],
            None,
        )
    )

    def build(config=None, lm=None, api_base=None, **roles):
        role_lms = {k.removeprefix("lm_"): v for k, v in roles.items() if v}
        extra = {"api_base": api_base} if api_base else {}
        # looked up on the package at call time: tests stand a scripted config in for it there
        return lm_package.load_lm_config(config, lm=lm, role_lms=role_lms, **extra)

    return _with_params(func, params, "lm_config", build)


def cli_errors(func):
    """Print memsteer's own errors (bad input, config, missing extras) readably; exit 2."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except MemsteerError as exc:
            typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            typer.secho(
                "interrupted: finished work is on disk; rerun the same command to resume.", err=True
            )
            raise typer.Exit(130) from None
        except OSError as exc:
            if exc.errno in _WRITE_ERRNOS:
                # disk full, file too large, read-only: one message; every file written so far is whole
                where = f" writing {exc.filename}" if exc.filename else ""
                typer.secho(
                    f"error{where}: {exc.strerror or exc}. Finished work is on disk (whole files and "
                    "log lines only); make room and rerun the same command to resume.",
                    fg=typer.colors.RED,
                    err=True,
                )
                raise typer.Exit(1) from None
            if exc.errno in _PATH_ERRNOS and exc.filename:
                # a path that cannot be used as given (a file where a folder goes, no permission)
                typer.secho(
                    f"error: {exc.filename}: {exc.strerror or exc}\n  hint: {_PATH_HINT}",
                    fg=typer.colors.RED,
                    err=True,
                )
                raise typer.Exit(2) from None
            raise

    return wrapper


_WRITE_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS}
_PATH_ERRNOS = {
    errno.EACCES,
    errno.EPERM,
    errno.EEXIST,
    errno.ENOTDIR,
    errno.EISDIR,
    errno.ENOENT,
    errno.ENAMETOOLONG,
    errno.ELOOP,
}
_PATH_HINT = (
    "check that the path exists where it should, that --out names a folder (not a file) "
    "and that you may read and write there; nothing else was changed"
)


def echo_json(obj: Any) -> None:
    import json

    sys.stdout.write(json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")
