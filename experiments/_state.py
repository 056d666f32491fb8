"""Carry a study's paid-for work from one machine to the next (``--state DIR``).

A study that runs for many sessions (``main.py --preset cpu``: days of LM calls on two cores) may
find its machine replaced between sessions, and its output folder with it. ``--state DIR`` keeps a
copy of what cost LM time — the generation folders (``train.jsonl``, ``val.jsonl``,
``rejected.jsonl``, their run keys), the optimization folders (iterations, proposals, designs),
the evaluation items, ``run.json`` and ``log.txt`` — in ``DIR``, a folder small enough to commit:

* before the study starts, every file of ``DIR`` that the output folder lacks is copied into it
  (a file the output folder already has is kept as it is: it is the newer one);
* after every stage, after each persona's generation, every ten minutes while a stage runs and
  when the study stops (finished, failed, Ctrl-C or SIGTERM), every carried file of the output
  folder that ``DIR`` lacks or holds in another version is copied into ``DIR``.

What is rebuilt without the LM is not carried: ``cache/`` (indexes), run folders whose key names
no LM and per-item results scored without one (retrieval-only evaluations, recomputed in seconds
when a resume needs them: an optimization scores a finished iteration's design again, LM-free,
when its ``val/items.jsonl`` is gone), the MLflow store (a restored study opens a new MLflow run),
lock files, and any file over :data:`MAX_BYTES` (listed in the marker file). A restored folder is
then an ordinary run folder: each stage checks its own run key, so a resume never reuses what
other settings computed. Nothing outside ``DIR`` is changed, and ``DIR`` must be empty or written
by this module for the same study (its marker file says so).
"""

from __future__ import annotations

import json
import lzma
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from memsteer_dspy.errors import InputError
from memsteer_dspy.runfolder import differences_between, write_atomic

MARKER = "memsteer-state.json"
MAX_BYTES = 8 * 1024 * 1024  # after compression
#: Files larger than this are kept xz-compressed in the state (``<name>.xz``; per-item results
#: with their contexts compress about sixfold) and restored as they were.
COMPRESS_BYTES = 256 * 1024
#: Folders rebuilt without the LM (or private to one machine): never carried.
SKIP_DIRS = frozenset({"cache", "__pycache__", "mlruns", "mlartifacts"})
SKIP_SUFFIXES = (".lock", ".tmp", ".db", ".db-journal", ".db-wal", ".db-shm")


@dataclass
class StateCopy:
    """What one save or restore copied, and what it left and why."""

    copied: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # restore: the output folder's own version
    too_big: list[tuple[str, int]] = field(default_factory=list)


def settings_of(cfg: Any) -> dict[str, Any]:
    """A study config as a state records it: every setting but where the data sits on this
    machine (``dataset.rhelm_root``), which may differ from one machine to the next."""
    settings = cfg.model_dump(mode="json")
    settings.get("dataset", {}).pop("rhelm_root", None)
    return settings


def _lm_free(folder: Path) -> bool:
    """A run folder whose key names no LM (a retrieval-only evaluation): recomputed in seconds
    when missing, so not carried."""
    try:
        key = json.loads((folder / "run.json").read_text(encoding="utf-8")).get("key")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(key, dict) and key.get("lms") == {}


def _lm_free_results(path: Path) -> bool:
    """Per-item results scored without an LM (``items.jsonl`` whose lines say ``"metrics":
    "recall"``): retrieval is recomputed in seconds when they are missing."""
    if path.name != "items.jsonl":
        return False
    try:
        with open(path, encoding="utf-8") as fh:
            first = json.loads(fh.readline() or "null")
    except (OSError, ValueError):
        return False
    return isinstance(first, dict) and first.get("metrics") == "recall"


def _carried(root: Path) -> Iterator[tuple[str, Path]]:
    """(relative posix path, path) of every file under ``root`` that a state carries, in one walk
    that never enters a skipped folder (indexes, MLflow) or a run folder whose key names no LM."""
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        if here != root and "run.json" in files and _lm_free(here):
            dirs.clear()
            continue
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            path = here / name
            rel = path.relative_to(root).as_posix()
            if rel == MARKER or path.is_symlink() or not path.is_file():
                continue
            if name.endswith(SKIP_SUFFIXES) or name.startswith(".nfs") or _lm_free_results(path):
                continue
            yield rel, path


def _check_places(state: Path, out: Path) -> None:
    s, o = state.resolve(), out.resolve()
    if s == o or s.is_relative_to(o) or o.is_relative_to(s):
        raise InputError(
            f"--state {state}: the state folder and the output folder {out} must not contain each "
            "other (choose a folder beside it, e.g. experiments/results/state/<study>)"
        )


def _check_marker(state: Path, study: str) -> dict:
    """The state folder's marker; refuses a folder this module did not write or another
    study's state."""
    marker = state / MARKER
    if not marker.exists():
        if state.exists() and any(state.iterdir()):
            raise InputError(
                f"--state {state}: the folder holds files that no study state wrote (no {MARKER}); "
                "give an empty or new folder — nothing was copied"
            )
        return {}
    try:
        info = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"--state {state}: {marker} cannot be read: {exc}") from exc
    if not isinstance(info, dict) or info.get("study") != study:
        found = info.get("study") if isinstance(info, dict) else None
        raise InputError(
            f"--state {state}: {MARKER} is the state of study {found!r}, not {study!r}; "
            "give each study its own state folder"
        )
    return info


def restore_state(
    state: Path, out: Path, *, study: str, config: dict[str, Any] | None = None
) -> StateCopy:
    """Copy into ``out`` every file of ``state`` that ``out`` lacks (a missing ``state`` is a
    first run: nothing to do). A state saved under another study config (``config``, the study's
    resolved settings) is refused with the fields that differ: nothing is copied."""
    _check_places(state, out)
    done = StateCopy()
    if not state.exists():
        return done
    info = _check_marker(state, study)
    saved = info.get("config")
    if config is not None and saved is not None and saved != config:
        diffs = sorted(differences_between(saved, config), key=lambda d: (d[0].count("."), d[0]))
        shown = "; ".join(f"{f}: state has {a!r}, this run has {b!r}" for f, a, b in diffs[:4])
        raise InputError(
            f"--state {state}: it was saved under other settings ({shown}"
            f"{'; …' if len(diffs) > 4 else ''}); nothing was restored — give this run its own "
            "--state folder, or rerun with the state's settings"
        )
    compressed = set(info.get("compressed", []))
    for stored_rel, _ in _carried(state):
        rel = stored_rel.removesuffix(".xz")
        if rel not in compressed:
            rel = stored_rel  # stored as written (an .xz file the study itself wrote included)
        data = _stored(state, rel, compressed)
        if data is None:
            continue
        target = out / rel
        if target.exists():
            if target.read_bytes() != data:
                done.kept.append(rel)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(target, data)
        done.copied.append(rel)
    return done


def _stored(state: Path, rel: str, compressed: set[str]) -> bytes | None:
    """The content the state holds for ``rel`` (decompressed), or None."""
    path = state / (rel + ".xz" if rel in compressed else rel)
    if not path.exists():
        return None
    data = path.read_bytes()
    return lzma.decompress(data) if rel in compressed else data


def save_state(
    out: Path, state: Path, *, study: str, config: dict[str, Any] | None = None
) -> StateCopy:
    """Copy every carried file of ``out`` that ``state`` lacks or holds in another version into
    ``state``, then rewrite the marker (the study's settings, when, from where, what was too big
    to carry)."""
    _check_places(state, out)
    info = _check_marker(state, study)
    compressed = set(info.get("compressed", []))
    seen: dict[str, list[int]] = info.get("seen", {})  # size and mtime at the last save
    was_big = {rel: size for rel, size in info.get("too_big", [])}
    stamps: dict[str, list[int]] = {}
    done = StateCopy()
    for rel, src in _carried(out):
        st = src.stat()
        stamps[rel] = [st.st_size, st.st_mtime_ns]
        if seen.get(rel) == stamps[rel]:  # unchanged since the last save: nothing to read
            if rel in was_big:
                done.too_big.append((rel, was_big[rel]))
                continue
            if (state / rel).exists() or (state / (rel + ".xz")).exists():
                continue
        data = src.read_bytes()
        if _stored(state, rel, compressed) == data:
            continue
        packed = lzma.compress(data, preset=6) if len(data) > COMPRESS_BYTES else data
        if len(packed) > MAX_BYTES:
            done.too_big.append((rel, len(data)))
            continue
        target = state / (rel + ".xz" if packed is not data else rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(target, packed)
        (compressed.add if packed is not data else compressed.discard)(rel)
        stale = state / (rel if packed is not data else rel + ".xz")
        if stale.exists():  # the other form of this file, written by an earlier save
            stale.unlink()
        done.copied.append(rel)
    if config is not None:
        info["config"] = config
    info.update(
        study=study,
        saved=datetime.now(UTC).isoformat(timespec="seconds"),
        output_folder=str(out),
        compressed=sorted(compressed),
        seen=stamps,
        too_big=done.too_big,
        not_carried={
            "rebuilt without the LM": sorted(SKIP_DIRS)
            + [
                "run folders whose key names no LM",
                "per-item results scored without an LM",
                "MLflow store",
                "lock files",
            ],
            f"over {MAX_BYTES // (1024 * 1024)} MiB": [
                f"{r} ({n:,} bytes)" for r, n in done.too_big
            ],
        },
    )
    state.mkdir(parents=True, exist_ok=True)
    write_atomic(state / MARKER, json.dumps(info, indent=2, ensure_ascii=False) + "\n")
    return done


def say(what: str, done: StateCopy, where: Path) -> None:
    """One line on stderr about a save or restore."""
    parts = [f"{len(done.copied)} file(s) copied"]
    if done.kept:
        parts.append(f"{len(done.kept)} kept as the output folder has them")
    if done.too_big:
        parts.append(f"{len(done.too_big)} too big to carry")
    print(f"state {what} {where}: " + ", ".join(parts), file=sys.stderr, flush=True)
