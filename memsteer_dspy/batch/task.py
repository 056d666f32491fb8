"""One user's task of a batch: the single-user ``memsteer`` command, run in this process.

A task is the very command a user would type (``memsteer generate --user U --out DIR/U ...``),
parsed and invoked through the CLI's own click command, so a batch writes exactly the per-user
folder the single-user command writes and resumes it the same way. What the command prints goes to
``DIR/_batch/<user>.log`` (per thread or worker, so parallel users do not interleave); every start
is appended to ``DIR/_batch/<user>.attempts.jsonl``; a finished user gets
``DIR/_batch/<user>.done.json`` holding the settings key, and a rerun with the same settings skips
it. A rerun under other settings runs the command again, which resumes or refuses by its own rules.

A task never raises for the user's own failure: it returns an outcome whose ``status`` is ``ok``,
``skipped`` (finished before), ``bad_input`` (the user's history or QA is malformed: an
``InputError``, reported per user) or ``failed`` (anything else: a configuration error, a crash).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import importlib
import io
import json
import os
import socket
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from memsteer_dspy.batch.users import BATCH_DIR
from memsteer_dspy.tracking import shared_experiment

STATUSES = ("ok", "skipped", "bad_input", "failed")


@dataclass(frozen=True)
class UserTask:
    """One user's single-user command: ``argv`` is what follows ``memsteer``."""

    command: str
    user: str
    argv: tuple[str, ...]
    out: str  # the batch folder; the user's folder is out/user
    experiment: str | None = None  # the one MLflow experiment of a batch's optimize runs

    @property
    def user_dir(self) -> Path:
        return Path(self.out) / self.user

    @property
    def key(self) -> str:
        """The settings: the command line, which names every input and option."""
        return hashlib.sha256(json.dumps(self.argv).encode()).hexdigest()[:16]

    def batch_file(self, suffix: str) -> Path:
        return Path(self.out) / BATCH_DIR / f"{self.user}.{suffix}"


@dataclass
class UserOutcome:
    user: str
    status: str
    exit_code: int = 0
    error: str | None = None
    seconds: float = 0.0
    attempt: int = 0
    pid: int = 0
    host: str = ""
    key: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# per-task output: sys.stdout / sys.stderr routed by a context variable
# ---------------------------------------------------------------------------------------------

_TARGET: contextvars.ContextVar[Any] = contextvars.ContextVar("memsteer_batch_output", default=None)
_ROUTING_LOCK = threading.Lock()
_ROUTING_USERS = 0


class _RoutedStream(io.TextIOBase):
    """Writes to the stream the current context names, else to the stream it replaced."""

    def __init__(self, default: Any, which: str) -> None:
        self._default = default
        self._which = which

    def _target(self) -> Any:
        streams = _TARGET.get()
        return self._default if streams is None else streams[self._which]

    @property
    def encoding(self) -> str:  # click writes to a stream as is when it declares an encoding
        return getattr(self._default, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str:
        return getattr(self._default, "errors", None) or "strict"

    def write(self, text: str) -> int:
        return self._target().write(text)

    def flush(self) -> None:
        self._target().flush()

    def isatty(self) -> bool:
        return _TARGET.get() is None and self._default.isatty()

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._default.fileno()


@contextlib.contextmanager
def routed_output(stdout: Any, stderr: Any):
    """While inside, this context's (and its copies') writes to sys.stdout/sys.stderr go to
    ``stdout``/``stderr``; other threads keep theirs."""
    global _ROUTING_USERS
    with _ROUTING_LOCK:
        if _ROUTING_USERS == 0:
            sys.stdout = _RoutedStream(sys.stdout, "stdout")
            sys.stderr = _RoutedStream(sys.stderr, "stderr")
        _ROUTING_USERS += 1
    token = _TARGET.set({"stdout": stdout, "stderr": stderr})
    try:
        yield
    finally:
        _TARGET.reset(token)
        with _ROUTING_LOCK:
            _ROUTING_USERS -= 1
            if _ROUTING_USERS == 0:
                if isinstance(sys.stdout, _RoutedStream):
                    sys.stdout = sys.stdout._default
                if isinstance(sys.stderr, _RoutedStream):
                    sys.stderr = sys.stderr._default


# ---------------------------------------------------------------------------------------------
# running one task
# ---------------------------------------------------------------------------------------------


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def finished(task: UserTask) -> dict[str, Any] | None:
    """The done marker of ``task`` when the user finished under the same settings."""
    marker = task.batch_file("done.json")
    try:
        done = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return done if done.get("key") == task.key else None


def attempts(task: UserTask) -> list[dict[str, Any]]:
    path = task.batch_file("attempts.jsonl")
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]


# The command a task runs, named as ``[project.scripts]`` names it and resolved when a task first
# runs (in a Ray worker too): the CLI imports the library, and the library holds no import of the CLI.
COMMAND_APP = "memsteer_dspy.cli:app"


@functools.lru_cache(maxsize=1)
def cli_group():
    """The ``memsteer`` click group (:data:`COMMAND_APP`, built once per process)."""
    import typer

    module, _, name = COMMAND_APP.partition(":")
    return typer.main.get_command(getattr(importlib.import_module(module), name))


def invoke_command(argv: list[str]) -> tuple[int, BaseException | None]:
    """Run ``memsteer <argv>`` in this process: (exit status, the error behind a non-zero one)."""
    command = cli_group()
    try:
        with command.make_context("memsteer", list(argv)) as ctx:
            command.invoke(ctx)
    except EXIT as exc:
        # cli_errors turns the project's own errors into Exit(2) "from None": the error is its context
        return exc.exit_code, exc.__context__ if exc.exit_code else None
    except USAGE as exc:
        return exc.exit_code, exc
    return 0, None


def _cli_exceptions() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """(exit, usage error) classes of typer, which vendors its own click, and of click itself."""
    import click
    import typer

    usage = {c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"} | {
        click.ClickException
    }
    return (typer.Exit, click.exceptions.Exit), tuple(usage)


EXIT, USAGE = _cli_exceptions()


def classify(
    code: int, error: BaseException | None, out: str | Path | None = None
) -> tuple[str, str | None]:
    """(status, message) of a finished command. An ``InputError`` is the user's own bad input,
    unless it is about the batch's output folder (a run there under other settings): that is the
    batch's command line at fault, and fails."""
    from memsteer_dspy.errors import InputError

    if code == 0:
        return "ok", None
    if isinstance(error, InputError):
        about_out = (
            out is not None
            and error.file is not None
            and Path(error.file).resolve().is_relative_to(Path(out).resolve())
        )
        return ("failed" if about_out else "bad_input"), str(error)
    if error is None:
        return "failed", f"exit status {code}"
    message = error.format_message() if hasattr(error, "format_message") else str(error)
    return "failed", f"{type(error).__name__}: {message}"


def run_user(task: UserTask, callbacks: list[Any] | None = None) -> dict[str, Any]:
    """Run one user's command (see the module docstring); returns a ``UserOutcome`` as a dict.

    ``callbacks`` are DSPy callbacks active for the command's LM calls (the LM concurrency gate).
    """
    import dspy

    done = finished(task)
    if done is not None:
        return UserOutcome(
            user=task.user,
            status="skipped",
            key=task.key,
            seconds=0.0,
            attempt=done.get("attempt", 0),
            pid=done.get("pid", 0),
        ).as_dict()
    task.user_dir.parent.joinpath(BATCH_DIR).mkdir(parents=True, exist_ok=True)
    attempt = len(attempts(task)) + 1
    start = {
        "attempt": attempt,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "key": task.key,
        "started": time.time(),
        "argv": list(task.argv),
    }
    with open(task.batch_file("attempts.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps(start) + "\n")
    t0 = time.perf_counter()
    captured = io.StringIO()
    with open(task.batch_file("log"), "a", encoding="utf-8") as log:
        log.write(f"=== attempt {attempt} pid {os.getpid()}: memsteer {' '.join(task.argv)}\n")
        log.flush()
        stdout = captured if task.command == "ingest" else log
        gate = dspy.context(callbacks=[*dspy.settings.callbacks, *(callbacks or [])])
        with routed_output(stdout, log), gate, shared_experiment(task.experiment):
            try:
                code, error = invoke_command(list(task.argv))
            except (
                Exception
            ) as exc:  # a crash inside the command: this user fails, the batch goes on
                traceback.print_exc(file=log)
                code, error = 1, exc
    status, message = classify(code, error, task.out)
    outcome = UserOutcome(
        user=task.user,
        status=status,
        exit_code=code,
        error=message,
        attempt=attempt,
        seconds=round(time.perf_counter() - t0, 3),
        pid=os.getpid(),
        host=start["host"],
        key=task.key,
    )
    if status == "ok":
        if task.command == "ingest":
            text = captured.getvalue()
            task.user_dir.mkdir(parents=True, exist_ok=True)
            _write_atomic(
                task.user_dir / "ingest.json", text[text.index("{") :] if "{" in text else text
            )
        _write_atomic(task.batch_file("done.json"), json.dumps(outcome.as_dict(), indent=2) + "\n")
    return outcome.as_dict()
