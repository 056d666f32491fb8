"""RHELM files as text, the ``on_error`` policy, and the parts of a persona's name and addresses.

Shared by the conversation, email, document and QA readers of :mod:`memsteer_dspy.loaders.rhelm`.
"""

from __future__ import annotations

import re
from pathlib import Path

from memsteer_dspy.errors import ConfigError, InputError
from memsteer_dspy.loaders.base import SkippedInput

_ADDRESS = re.compile(r"<\s*([^<>\s]+@[^<>\s]+)\s*>")


class _Errors:
    """``on_error`` policy: raise the InputError, or record it as SkippedInput and go on."""

    def __init__(self, on_error: str) -> None:
        if on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        self.skip = on_error == "skip"
        self.skipped: list[SkippedInput] = []

    def __call__(self, error: InputError) -> None:
        if not self.skip:
            raise error
        self.skipped.append(
            SkippedInput(file=error.file or "", line=error.line, reason=error.message)
        )


def _read_text(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise InputError(
            f"not valid UTF-8 text (byte {exc.start}: {raw[exc.start : exc.start + 1]!r})",
            file=path,
            line=line,
            hint="re-save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8), or load with on_error='skip'",
        ) from None


def _rel(path: Path, data: Path) -> str:
    """A file's path relative to the data folder: stable across machines, so record content
    (and the history fingerprint) does not depend on where the data lives."""
    try:
        return path.relative_to(data).as_posix()
    except ValueError:
        return path.as_posix()


def _display_name(persona: str) -> str:
    """``David_R._Ellis`` → ``David R. Ellis`` (the name the persona's emails use)."""
    return persona.replace("_", " ").strip()


def _name_of(address: str) -> str:
    """``David R. Ellis <david.ellis@email.com>`` → ``David R. Ellis``."""
    name = _ADDRESS.sub("", address).strip().strip('"').strip()
    return name or address.strip()


def _address_of(address: str) -> str | None:
    m = _ADDRESS.search(address)
    if m:
        return m.group(1).lower()
    bare = address.strip()
    return bare.lower() if re.fullmatch(r"[^\s@]+@[^\s@]+", bare) else None
