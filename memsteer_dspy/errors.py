"""Errors that name the place at fault and say what to do.

Every error a user can cause by giving bad input is an :class:`InputError` (or a subclass): it
carries the file, line, field and record id it concerns, and a hint. The CLI prints it as one
readable block and exits with status 2; library callers can inspect the attributes.
"""

from __future__ import annotations

from pathlib import Path


class MemsteerError(Exception):
    """Base class for every error memsteer-dspy raises on purpose."""


class InputError(MemsteerError, ValueError):
    """Bad input: a malformed file, line, field or record."""

    def __init__(
        self,
        message: str,
        *,
        file: str | Path | None = None,
        line: int | None = None,
        field: str | None = None,
        record: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.message = message
        self.file = str(file) if file is not None else None
        self.line = line
        self.field = field
        self.record = record
        self.hint = hint
        super().__init__(self.render())

    @property
    def location(self) -> str:
        where = []
        if self.file:
            where.append(f"{self.file}:{self.line}" if self.line is not None else self.file)
        if self.record:
            where.append(f"record {self.record!r}")
        if self.field:
            where.append(f"field {self.field!r}")
        return ", ".join(where)

    def render(self) -> str:
        text = f"{self.location}: {self.message}" if self.location else self.message
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


class DuplicateRecordError(InputError):
    """Two records of one history share an id."""


class EmptyHistoryError(InputError):
    """A history with no records."""


class ConfigError(MemsteerError, ValueError):
    """A configuration (LM strings, TOML config, flags) that cannot be used."""


class MissingExtraError(MemsteerError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""

    def __init__(self, package: str, extra: str, purpose: str) -> None:
        self.package = package
        self.extra = extra
        super().__init__(
            f"{purpose} needs the optional package {package!r}, which is not installed.\n"
            f"  install it with: pip install 'memsteer-dspy[{extra}]'"
            f"  (from a checkout: pip install -e '.[{extra}]')"
        )


class ModelIntegrityError(MemsteerError):
    """A model file whose size or checksum does not match what it should be."""
