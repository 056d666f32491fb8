"""The run-folder layer: what every resumable command (``generate``, ``evaluate``, ``optimize``,
``demo``, ``experiments/``) writes its output through.

It provides, once:

* **atomic writes** (:func:`write_atomic`, :func:`write_json`): a temporary file in the same
  folder, flushed and fsynced, then renamed over the target, so a reader (or a run killed at any
  instant) sees the old file or the new one, never half of one;
* **append-only JSONL logs** (:class:`JsonlLog`): each line is written whole, flushed and fsynced;
  on reading, the one policy for damage is: a *torn last line* (no newline, or not JSON — the run
  was killed mid-write) is cut off and the log continues from the line before it; a bad line
  *before* the last one is not a torn write and is an :class:`~memsteer_dspy.errors.InputError`
  naming the file and line;
* **the same-run check** (:class:`RunFolder`): ``run.json`` holds the run's *key* — every setting
  that changes a result (history fingerprint, protocol, design key, metrics, QA content hash, the
  LM identities of LM-using stages, code-relevant options). Opening a folder whose key differs
  raises :class:`RunMismatchError` naming each differing field with both values; it never reuses
  another run's results. ``restart=True`` (CLI ``--restart``) empties the folder and starts over
  — only a folder that is a run folder (its ``run.json`` holds a run's key: :func:`is_run_folder`);
  a folder holding anything else is refused, never emptied, and so is a run into a non-empty folder
  that is not a run folder;
* **one writer per folder**: :meth:`RunFolder.open` takes an OS lock (``filelock``, ``flock`` on
  POSIX) on ``.memsteer.lock`` in the folder and holds it until :meth:`RunFolder.close` (or the
  process ends, however it ends); a second process opening the folder meanwhile gets a
  :class:`FolderBusyError` naming the holder's PID and command line;
* **inputs are never outputs** (:func:`check_not_inputs`): an output folder that is, holds or lies
  inside one of the command's inputs is refused before anything is written;
* **a clean stop on SIGTERM** (:func:`sigterm_raises`): for the length of a ``with`` block, a
  ``kill`` or a scheduler's stop raises an exception in the main thread, so the block's
  ``finally`` clauses (a server stopped, a state saved) run as they do on Ctrl-C;
* **a usage ledger**: each session (one invocation) is appended to ``run.json`` with its start
  time, wall seconds and LM usage by role, so a resumed run's cost is the sum over its sessions.

Example::

    from memsteer_dspy.runfolder import RunFolder, run_key

    key = run_key("evaluate", history=history, protocol="full", design_key=design.key(),
                  metrics="recall", qa=items, lms={}, options={"limit": 10})
    with RunFolder.open(out_dir, key, restart=False) as run:   # RunMismatchError if the key differs
        log = run.log("items.jsonl")
        done = {r["qa_id"] for r in log.read()}                # torn last line already cut off
        for item in items:
            if item.id not in done:
                log.append({"qa_id": item.id, ...})             # one fsynced line
        run.write_json("summary.json", {...})                  # atomic
        run.session["usage"] = {"answerer": {"calls": 3}}      # saved into run.json on exit
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from memsteer_dspy.errors import InputError

__all__ = [
    "KEY_FILE",
    "LOCK_FILE",
    "FolderBusyError",
    "JsonlLog",
    "RunFolder",
    "RunMismatchError",
    "check_not_inputs",
    "is_run_folder",
    "lm_identity",
    "qa_content_hash",
    "run_key",
    "sigterm_raises",
    "write_atomic",
    "write_json",
]

KEY_FILE = "run.json"
LOCK_FILE = ".memsteer.lock"


# --------------------------------------------------------------------------------------------
# a clean stop
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def sigterm_raises(error: Callable[[int], BaseException]) -> Iterator[None]:
    """SIGTERM raises ``error(signum)`` in the main thread while the block runs; the handler that
    was there before is put back when it ends, however it ends."""

    def handler(signum: int, frame: Any) -> None:  # noqa: ARG001 - the handler's signature
        raise error(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# --------------------------------------------------------------------------------------------
# atomic writes
# --------------------------------------------------------------------------------------------


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # not POSIX, or no permission to open the folder: the rename still holds
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | Path, text: str | bytes) -> None:
    """Replace ``path`` with ``text`` atomically: the file is either the old one or the new one.

    On failure (disk full, permission) the temporary file is removed, the target is untouched and
    the ``OSError`` propagates."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    data = text.encode("utf-8") if isinstance(text, str) else text
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def write_json(path: str | Path, obj: Any) -> None:
    """``obj`` as indented JSON (UTF-8, non-ASCII kept), written atomically."""
    write_atomic(path, json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")


# --------------------------------------------------------------------------------------------
# append-only logs
# --------------------------------------------------------------------------------------------


class JsonlLog:
    """An append-only JSONL file: fsynced appends, and one policy for a torn last line.

    Thread-safe: appends from several threads are serialised, each line whole."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()

    def append(self, obj: Any) -> None:
        """Append one object as one line, flushed and fsynced before returning."""
        line = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, default=str)
        data = (line.rstrip("\n") + "\n").encode("utf-8")
        with self._lock, open(self.path, "ab") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())

    def read(self, *, repair: bool = True) -> list[Any]:
        """Every whole line, parsed. A torn last line is cut off (the file is truncated to the
        last whole line when ``repair``); an unparseable line before it raises an InputError."""
        return list(self.iter(repair=repair))

    def iter(self, *, repair: bool = True) -> Iterator[Any]:
        if not self.path.exists():
            return
        good_end = 0
        pending_error: tuple[int, str] | None = None
        with open(self.path, "rb") as fh:
            for n, raw in enumerate(fh, start=1):
                if pending_error is not None:  # a bad line with more lines after it
                    raise InputError(
                        f"line {pending_error[0]} of the run log is damaged ({pending_error[1]}) and is "
                        "not the last line, so it is not a torn write",
                        file=self.path,
                        line=pending_error[0],
                        hint="rerun with --restart to start this run over, or use a new --out folder",
                    )
                if not raw.endswith(b"\n"):
                    break  # torn: killed mid-write
                if not raw.strip():
                    good_end += len(raw)
                    continue
                try:
                    obj = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    pending_error = (n, str(exc))
                    continue
                good_end += len(raw)
                yield obj
        if repair and good_end < self.path.stat().st_size:
            with open(self.path, "r+b") as fh:
                fh.truncate(good_end)
                fh.flush()
                os.fsync(fh.fileno())


# --------------------------------------------------------------------------------------------
# the same-run key
# --------------------------------------------------------------------------------------------


def _digest(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def qa_content_hash(items: Iterable[Any]) -> str:
    """A hash of the QA items' full content in order (not just their ids): editing an answer or
    an evidence id changes it."""
    h = hashlib.sha256()
    for it in items:
        obj = it.model_dump(mode="json") if hasattr(it, "model_dump") else it
        h.update(json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()[:16]


_LM_SETTINGS = ("temperature", "max_tokens", "top_p", "seed", "n", "response_format")


def lm_identity(lm: Any) -> str | None:
    """What identifies an LM's answers: its model string and the sampling settings it sends.
    None for no LM."""
    if lm is None:
        return None
    model = getattr(lm, "model", None) or type(lm).__name__
    kwargs = getattr(lm, "kwargs", None) or {}
    settings = {k: kwargs[k] for k in _LM_SETTINGS if k in kwargs}
    decoding = (kwargs.get("metadata") or {}).get("decoding")  # an in-process LM's (build_lm)
    if decoding:
        settings["decoding"] = decoding
    return (
        f"{model} {json.dumps(settings, sort_keys=True, default=str)}" if settings else str(model)
    )


def run_key(
    stage: str,
    *,
    history: Any = None,
    protocol: str | None = None,
    design_key: str | None = None,
    metrics: str | None = None,
    qa: Iterable[Any] | None = None,
    lms: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The same-run key of a run: every field that changes its results. ``lms`` maps roles to LM
    objects (or already-described strings); ``options`` holds the code-relevant settings."""
    key: dict[str, Any] = {"stage": stage}
    if history is not None:
        key["history_fingerprint"] = getattr(history, "fingerprint", history)
    if protocol is not None:
        key["protocol"] = protocol
    if design_key is not None:
        key["design_key"] = design_key
    if metrics is not None:
        key["metrics"] = metrics
    if qa is not None:
        key["qa_hash"] = qa_content_hash(qa)
    if lms is not None:
        key["lms"] = {
            r: (v if isinstance(v, str) or v is None else lm_identity(v))
            for r, v in sorted(lms.items())
        }
    if options is not None:
        key["options"] = json.loads(json.dumps(dict(options), sort_keys=True, default=str))
    return key


class RunMismatchError(InputError):
    """The folder holds a run whose key differs from this run's; nothing was reused."""

    def __init__(self, folder: Path, differences: list[tuple[str, Any, Any]]):
        self.differences = differences
        parts = [f"{f}: folder has {a!r}, this run has {b!r}" for f, a, b in differences]
        super().__init__(
            f"{folder} holds a different run ({'; '.join(parts)}); nothing was reused",
            file=folder / KEY_FILE,
            field=differences[0][0] if differences else None,
            hint="rerun with the folder's settings to resume it, pass --restart to start over "
            "in this folder, or use a new --out folder",
        )


def differences_between(old: Any, new: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted field, old, new) for every leaf where two nested dicts differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            out += differences_between(
                old.get(k), new.get(k), f"{prefix}{k}" if not prefix else f"{prefix}.{k}"
            )
        return out
    return [] if old == new else [(prefix or "key", old, new)]


# --------------------------------------------------------------------------------------------
# what may be written, and by whom
# --------------------------------------------------------------------------------------------


class FolderBusyError(InputError):
    """Another process holds the run folder's lock: one writer per run folder."""

    def __init__(self, folder: Path, holder: Mapping[str, Any] | None):
        self.holder = dict(holder or {})
        who = "another process"
        if self.holder.get("pid"):
            who = f"process {self.holder['pid']}"
            if self.holder.get("command"):
                who += f" ({self.holder['command']})"
            if self.holder.get("started"):
                who += f", started {self.holder['started']},"
        super().__init__(
            f"{who} is writing to this run folder; one run writes a folder at a time, so this one "
            "did not start",
            file=folder,
            field="--out",
            hint="wait for that run to finish (rerun this command then to resume or reuse it), or "
            "use a new --out folder",
        )


def _state_of(folder: Path) -> dict[str, Any] | None:
    """The folder's ``run.json`` if it is a run's (a JSON object with a ``key`` naming a stage)."""
    try:
        state = json.loads((folder / KEY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(state, dict) and isinstance(state.get("key"), dict) and state["key"].get("stage"):
        return state
    return None


def is_run_folder(path: str | Path) -> bool:
    """Whether ``path`` is a memsteer run folder: its ``run.json`` holds a run's key (the marker
    :meth:`RunFolder.open` writes first). Only such a folder may be emptied by ``--restart``."""
    return _state_of(Path(path)) is not None


def _contents(folder: Path) -> list[str]:
    """The folder's entries (sorted, folders with a trailing ``/``), the run's lock and the
    temporary files of a write in flight (:func:`write_atomic`) left out."""
    try:
        entries = sorted(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [
        p.name + ("/" if p.is_dir() else "")
        for p in entries
        if p.name != LOCK_FILE and not _ATOMIC_TMP.match(p.name)
    ]


# write_atomic's temporary file: ".<name>.<pid>.<thread>.tmp"
_ATOMIC_TMP = re.compile(r"^\..+\.\d+\.\d+\.tmp$")


def _listing(names: list[str], most: int = 5) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def check_not_inputs(
    out: str | Path | None, inputs: Iterable[str | Path | None], *, option: str = "--out"
) -> None:
    """Refuse an output folder that is one of ``inputs``, lies inside one, or holds one: a command
    never writes inside or over what it reads. Inputs that are not local paths (a dataset name,
    ``official``) are passed over."""
    if out is None:
        return
    target = Path(out).expanduser().resolve()
    for given in inputs:
        if given is None or str(given) in ("", "official", "base-bm25"):
            continue
        src = Path(given).expanduser()
        if not src.exists():
            continue
        src = src.resolve()
        if target == src or target.is_relative_to(src) or src.is_relative_to(target):
            where = (
                "is" if target == src else "lies inside" if target.is_relative_to(src) else "holds"
            )
            raise InputError(
                f"the output folder {where} this command's input {given}; nothing was written, so "
                "the input cannot be overwritten or deleted",
                file=out,
                field=option,
                hint=f"pass an {option} folder apart from the inputs (e.g. runs/<name>)",
            )


_SECRET_FLAG = re.compile(r"key|token|secret|passw", re.I)


def _redacted(arg: str, after: str) -> str:
    """One command-line word as the lock file may show it: a value of a secret-looking flag
    hidden, a URL's ``user:password@`` removed."""
    flag, eq, value = arg.partition("=")
    if eq and flag.startswith("-") and _SECRET_FLAG.search(flag):
        return f"{flag}=***"
    if after.startswith("-") and "=" not in after and _SECRET_FLAG.search(after):
        return "***"
    if "://" in arg and "@" in arg:
        try:
            parts = urlsplit(value if eq else arg)
        except ValueError:
            return "***"
        if parts.username is not None or parts.password is not None:
            host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
            url = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
            return f"{flag}={url}" if eq else url
    return arg


def _command_line() -> str:
    """This process's command line for the lock file and a refused writer's message (no secrets)."""
    args = sys.argv[1:]
    argv = [
        Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python",
        *(_redacted(a, args[i - 1] if i else "") for i, a in enumerate(args)),
    ]
    text = shlex.join(argv)
    return text if len(text) <= 300 else text[:297] + "..."


def _write_holder(fd: int) -> None:
    """Into the lock file, while holding it: who holds it (read by a refused second writer)."""
    info = {
        "pid": os.getpid(),
        "command": _command_line(),
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, (json.dumps(info) + "\n").encode("utf-8"))


def _holder(lock_path: Path) -> dict[str, Any] | None:
    for _ in range(20):  # the holder writes its name just after taking the lock
        try:
            info = json.loads(lock_path.read_text(encoding="utf-8") or "null")
        except (OSError, ValueError):
            info = None
        if isinstance(info, dict):
            return info
        time.sleep(0.01)
    return None


def _refuse_foreign(path: Path, *, restart: bool, legacy_files: Iterable[str]) -> None:
    """Refuse a non-empty folder that is not a run folder (``--restart`` or not): its files are
    the user's, and a run would write over them or, restarted, delete them."""
    if is_run_folder(path):
        return
    if (path / KEY_FILE).exists():
        reason = "its run.json is not a run's (not JSON, or no run key in it)"
    else:
        reason = "it has no run.json"
    present = [n for n in legacy_files if (path / n).exists()]
    if present:
        raise InputError(
            f"{path} holds results ({', '.join(present)}) but {reason.removeprefix('it ')}, so it "
            "cannot be checked to be the same run; it was left as it is",
            file=path,
            field="--out",
            hint="use a new --out folder, or delete the folder yourself if its contents are not needed",
        )
    names = _contents(path)
    if names:
        what = (
            "--restart empties only a run folder"
            if restart
            else "a run starts only in a new or empty folder, or resumes a run folder"
        )
        raise InputError(
            f"{path} is not a memsteer run folder ({reason}) and holds {_listing(names)}; {what}, "
            "so nothing was deleted or written",
            file=path,
            field="--out",
            hint="pass an --out folder that does not exist yet (e.g. runs/<name>)",
        )


def _same_run(path: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The folder's state when it holds this run (None when it holds no run yet); a run under
    another key is a :class:`RunMismatchError`."""
    state = _state_of(path)
    if state is None:
        return None
    diffs = differences_between(state["key"], key)
    if diffs:
        raise RunMismatchError(path, diffs)
    return state


def lock_folder(path: Path) -> Any:
    """Take the folder's writer lock without waiting (:class:`FolderBusyError` if another process
    holds it). Re-entrant within a process; released by ``.release()`` or when the process ends."""
    from filelock import FileLock, Timeout

    lock_path = path.resolve() / LOCK_FILE
    lock = FileLock(lock_path, thread_local=False, is_singleton=True, on_acquired=_write_holder)
    try:
        lock.acquire(blocking=False)
    except Timeout:
        raise FolderBusyError(path, _holder(lock_path)) from None
    return lock


def _refuse_held(path: Path) -> None:
    """:class:`FolderBusyError` when another process holds ``path``'s writer lock; probed with
    ``fcntl.flock`` on the lock file, which :func:`lock_folder`'s ``filelock`` takes too, so the
    probe neither creates nor rewrites anything (a refused run leaves the folder as it was)."""
    from filelock import FileLock

    lock_path = path.resolve() / LOCK_FILE
    if not lock_path.exists():
        return
    mine = FileLock(lock_path, thread_local=False, is_singleton=True, on_acquired=_write_holder)
    if mine.is_locked:  # this process holds it (the lock is re-entrant)
        return
    try:
        import fcntl
    except ImportError:  # not POSIX: the lock taken under _refuse_foreign's second check decides
        return
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise FolderBusyError(path, _holder(lock_path)) from None
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class RunFolder:
    """One resumable run's output folder, checked against its same-run key (see module doc)."""

    def __init__(self, path: Path, key: dict[str, Any], state: dict[str, Any], lock: Any = None):
        self.path = path
        self.key = key
        self.state = state
        self.session: dict[str, Any] = {
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "wall_seconds": 0.0,
        }
        self.state.setdefault("sessions", []).append(self.session)
        self._t0 = time.perf_counter()
        self._logs: dict[str, JsonlLog] = {}
        self._lock = lock

    @classmethod
    def open(
        cls,
        path: str | Path,
        key: Mapping[str, Any],
        *,
        restart: bool = False,
        legacy_files: Iterable[str] = (),
        extra: Mapping[str, Any] | None = None,
        inputs: Iterable[str | Path | None] = (),
    ) -> RunFolder:
        """Open (creating) the run folder for ``key``, holding its writer lock until :meth:`close`.

        An existing folder resumes only if its ``run.json`` key equals ``key``; otherwise
        :class:`RunMismatchError`. ``legacy_files``: files that mean "a run was here" even without
        ``run.json`` (folders from before the key existed) — they cannot be checked, so they are an
        error too, and so is any other non-empty folder that is not a run folder. ``restart``
        deletes a run folder's contents first (never a folder that is not one). ``inputs``: paths
        the run reads, which the folder must not be, hold or lie in (:func:`check_not_inputs`).
        ``extra`` is stored in ``run.json`` beside the key (descriptive, not compared)."""
        path = Path(path)
        key = json.loads(json.dumps(dict(key), sort_keys=True, default=str))
        check_not_inputs(path, inputs)
        if path.exists() and not path.is_dir():
            raise InputError(
                "the output folder is a file",
                file=path,
                field="--out",
                hint="pass an --out folder that does not exist yet, or a run folder to resume",
            )
        # a folder another run holds is busy, whatever it holds yet (the holder may be between
        # creating it and writing run.json)
        _refuse_held(path)

        # checked before anything is written (a refusal leaves the folder as it was), and again
        # under the lock (another run may have changed it meanwhile)
        def look() -> None:
            _refuse_foreign(path, restart=restart, legacy_files=legacy_files)
            if not restart:
                _same_run(path, key)

        try:
            look()
        except InputError:
            # another run may have taken the folder since the look for its lock (its run.json,
            # its files): busy while it holds it; finished, the folder is looked at again
            _refuse_held(path)
            look()
        path.mkdir(parents=True, exist_ok=True)
        lock = lock_folder(path)
        try:
            _refuse_foreign(path, restart=restart, legacy_files=legacy_files)
            if restart:
                for child in path.iterdir():
                    if child.name == LOCK_FILE:
                        continue
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    else:
                        child.unlink()
            state = _same_run(path, key) or {"key": key}
            if extra:
                state.update({k: v for k, v in extra.items() if k not in ("key", "sessions")})
            folder = cls(path, key, state, lock)
            folder.save()
        except BaseException:
            lock.release()
            raise
        return folder

    def close(self) -> None:
        """Save ``run.json`` and let another process write the folder (idempotent)."""
        lock, self._lock = self._lock, None
        if lock is not None:
            try:
                self.save()
            finally:
                lock.release()

    def __del__(self) -> None:
        lock = self.__dict__.get("_lock")
        if lock is not None:
            try:
                lock.release()
            except Exception:  # noqa: BLE001 - a finalizer cannot report; the OS lock dies with the process
                pass

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def resumed(self) -> bool:
        return len(self.state["sessions"]) > 1

    def log(self, name: str) -> JsonlLog:
        if name not in self._logs:
            self._logs[name] = JsonlLog(self.path / name)
        return self._logs[name]

    def write_text(self, name: str, text: str) -> None:
        write_atomic(self.path / name, text)

    def write_json(self, name: str, obj: Any) -> None:
        write_json(self.path / name, obj)

    def add_usage(self, usage: Mapping[str, Any]) -> None:
        """Record this session's LM usage by role in the ledger (replacing what it recorded)."""
        self.session["usage"] = json.loads(json.dumps(dict(usage), default=str))

    def usage_total(self) -> dict[str, dict[str, float]]:
        """The ledger summed over every session: per role, per counter."""
        total: dict[str, dict[str, float]] = {}
        for s in self.state["sessions"]:
            for role, counters in (s.get("usage") or {}).items():
                if isinstance(counters, Mapping):
                    for k, v in counters.items():
                        if isinstance(v, int | float) and not isinstance(v, bool):
                            total.setdefault(role, {}).setdefault(k, 0)
                            total[role][k] += v
        return total

    def save(self) -> None:
        """Write ``run.json`` (key + sessions) atomically."""
        self.session["wall_seconds"] = round(time.perf_counter() - self._t0, 2)
        write_json(self.path / KEY_FILE, self.state)
