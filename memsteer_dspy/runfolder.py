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
  another run's results. ``restart=True`` (CLI ``--restart``) empties the folder and starts over;
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

import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from memsteer_dspy.errors import InputError

__all__ = [
    "KEY_FILE",
    "JsonlLog",
    "RunFolder",
    "RunMismatchError",
    "lm_identity",
    "qa_content_hash",
    "run_key",
    "write_atomic",
    "write_json",
]

KEY_FILE = "run.json"


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
                        "not the last line, so it is not a torn write", file=self.path, line=pending_error[0],
                        hint="rerun with --restart to start this run over, or use a new --out folder",
                    )  # fmt: skip
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
        key["lms"] = {r: (v if isinstance(v, str) or v is None else lm_identity(v))
                      for r, v in sorted(lms.items())}  # fmt: skip
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
            file=folder / KEY_FILE, field=differences[0][0] if differences else None,
            hint="rerun with the folder's settings to resume it, pass --restart to start over "
            "in this folder, or use a new --out folder",
        )  # fmt: skip


def _differences(old: Any, new: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            out += _differences(
                old.get(k), new.get(k), f"{prefix}{k}" if not prefix else f"{prefix}.{k}"
            )
        return out
    return [] if old == new else [(prefix or "key", old, new)]


class RunFolder:
    """One resumable run's output folder, checked against its same-run key (see module doc)."""

    def __init__(self, path: Path, key: dict[str, Any], state: dict[str, Any]):
        self.path = path
        self.key = key
        self.state = state
        self.session: dict[str, Any] = {
            "started": datetime.now(UTC).isoformat(timespec="seconds"), "wall_seconds": 0.0,
        }  # fmt: skip
        self.state.setdefault("sessions", []).append(self.session)
        self._t0 = time.perf_counter()
        self._logs: dict[str, JsonlLog] = {}

    @classmethod
    def open(
        cls,
        path: str | Path,
        key: Mapping[str, Any],
        *,
        restart: bool = False,
        legacy_files: Iterable[str] = (),
        extra: Mapping[str, Any] | None = None,
    ) -> RunFolder:
        """Open (creating) the run folder for ``key``.

        An existing folder resumes only if its ``run.json`` key equals ``key``; otherwise
        :class:`RunMismatchError`. ``legacy_files``: files that mean "a run was here" even without
        ``run.json`` (folders from before the key existed) — they cannot be checked, so they are an
        error too. ``restart`` deletes the folder's contents first. ``extra`` is stored in
        ``run.json`` beside the key (descriptive, not compared)."""
        path = Path(path)
        key = json.loads(json.dumps(dict(key), sort_keys=True, default=str))
        if restart and path.exists():
            for child in path.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        path.mkdir(parents=True, exist_ok=True)
        key_path = path / KEY_FILE
        if key_path.exists():
            try:
                state = json.loads(key_path.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise InputError(f"run.json is not valid JSON ({exc})", file=key_path,
                                 hint="pass --restart to start this run over, or use a new --out folder") from None  # fmt: skip
            old = state.get("key")
            if old is None:
                raise RunMismatchError(path, [("key", None, "(this run)")])
            diffs = _differences(old, key)
            if diffs:
                raise RunMismatchError(path, diffs)
        else:
            present = [n for n in legacy_files if (path / n).exists()]
            if present:
                raise InputError(
                    f"{path} holds results ({', '.join(present)}) but no run.json, so it cannot be "
                    "checked to be the same run", file=path,
                    hint="pass --restart to start over in this folder, or use a new --out folder",
                )  # fmt: skip
            state = {"key": key}
        if extra:
            state.update({k: v for k, v in extra.items() if k not in ("key", "sessions")})
        folder = cls(path, key, state)
        folder.save()
        return folder

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.save()

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
