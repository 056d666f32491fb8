"""RHELM emails: one record an email of ``emails/<Persona>/NN_email_YYYY_MM_DD.txt``, threaded.

Ids ``Emails_<YYYY-MM-DD>:Email <k>`` as the official evidence writes them; emails with one subject
(``Re:``/``Fwd:`` stripped) share a thread and a reply refers to the email it answers.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

from memsteer_dspy.errors import InputError
from memsteer_dspy.loaders.rhelm.reading import (
    _address_of,
    _Errors,
    _name_of,
    _read_text,
    _rel,
)
from memsteer_dspy.records import Record, RecordKind

_EMAIL_FILE = re.compile(r"(\d+)_email_(\d{4})_(\d{2})_(\d{2})\.txt$")
_SEPARATOR = re.compile(r"^\s*={3,}\s*$")
_EMAIL_FIELD = re.compile(r"^(Sender|Recipient|Subject|Summary|From|To|Cc|Date)\s*:\s?(.*)$", re.I)
_FIELD_ALIASES = {"from": "sender", "to": "recipient"}
_REPLY_PREFIX = re.compile(r"^\s*(re|fwd?|aw|wg)\s*(\[\d+\])?\s*:\s*", re.IGNORECASE)


@dataclass
class _EmailFile:
    index: int  # the leading NN
    day: date
    rel: str
    records: list[Record] = field(default_factory=list)
    blocks: int = 0  # emails in the file, the unusable ones included


def _email_blocks(text: str) -> Iterable[tuple[int, int, list[str]]]:
    """``(position, first line number, lines)`` of each non-empty block between separators."""
    block: list[str] = []
    start = 1
    position = 0
    lines = text.splitlines()
    for n, line in enumerate([*lines, "===="], start=1):
        if _SEPARATOR.match(line):
            while block and not block[0].strip():
                block.pop(0)
                start += 1
            while block and not block[-1].strip():
                block.pop()
            if block:
                position += 1
                yield position, start, block
            block, start = [], n + 1
        else:
            block.append(line)


def _parse_email(lines: list[str]) -> tuple[dict[str, str], str]:
    """Header fields (lower-case keys; ``From``/``To`` read as sender/recipient) and body."""
    fields: dict[str, str] = {}
    last: str | None = None
    body_start = len(lines)
    for i, line in enumerate(lines):
        m = _EMAIL_FIELD.match(line)
        key = _FIELD_ALIASES.get(m.group(1).lower(), m.group(1).lower()) if m else None
        if key is not None and key not in fields:
            fields[key] = m.group(2).strip()
            last = key
        elif line.strip() and last is not None and i > 0 and lines[i - 1].strip():
            fields[last] = f"{fields[last]} {line.strip()}".strip()  # continuation line
        elif not line.strip():
            continue
        else:
            body_start = i
            break
    return fields, "\n".join(lines[body_start:]).strip()


def _email_file(
    path: Path, data: Path, errors: _Errors, *, numbered_from: int = 0
) -> _EmailFile | None:
    """The emails of one ``NN_email_YYYY_MM_DD.txt`` file. Ids number the emails of a date from
    1; ``numbered_from`` continues the numbering where an earlier file has the same date."""
    m = _EMAIL_FILE.search(path.name)
    if m is None:
        return None
    day = date(int(m.group(2)), int(m.group(3)), int(m.group(4)))
    rel = _rel(path, data)
    out = _EmailFile(index=int(m.group(1)), day=day, rel=rel)
    try:
        text = _read_text(path)
    except InputError as exc:
        errors(exc)
        return out
    for k, line_no, lines in _email_blocks(text):
        out.blocks = k
        fields, body = _parse_email(lines)
        missing = [f for f in ("sender", "recipient", "subject") if not fields.get(f)]
        if missing:
            errors(
                InputError(
                    f"email {k} lacks a {missing[0].capitalize()}: line",
                    file=path,
                    line=line_no,
                    field=missing[0].capitalize(),
                    hint="each email starts with 'Sender:', 'Recipient:', 'Subject:' and "
                    "'Summary:' lines; emails are separated by a line of '='",
                )
            )
            continue
        sender, recipient = fields["sender"], fields["recipient"]
        metadata: dict[str, Any] = {
            "source": f"{rel}:{line_no}",
            "email_file_index": out.index,
            "index_in_file": k,
            "sender": sender,
            "sender_name": _name_of(sender),
            "sender_address": _address_of(sender),
            "recipient": recipient,
            "recipient_name": _name_of(recipient),
            "recipient_address": _address_of(recipient),
            "subject": fields["subject"],
            "summary": fields.get("summary", ""),
        }
        if fields.get("cc"):
            metadata["cc"] = fields["cc"]
        if body:
            metadata["body"] = body
        out.records.append(
            Record(
                id=f"Emails_{day.isoformat()}:Email {numbered_from + k}",
                kind=RecordKind.EMAIL,
                text="\n".join(lines).strip(),
                timestamp=datetime(day.year, day.month, day.day),
                author=_name_of(sender),
                metadata=metadata,
            )
        )
    return out


def _normalized_subject(subject: str) -> str:
    s = subject
    while True:
        stripped = _REPLY_PREFIX.sub("", s, count=1)
        if stripped == s:
            break
        s = stripped
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", s)).strip().casefold()


def _thread_emails(emails: Sequence[Record]) -> list[Record]:
    """Set thread_id, position and references: same normalized subject → one thread; an email
    whose subject starts with Re:/Fwd: refers to the latest earlier email of its thread, preferring
    one sent by its recipient."""
    threads: dict[str, list[Record]] = {}
    out: list[Record] = []
    for r in emails:  # already in time (file, position) order
        key = _normalized_subject(r.metadata["subject"])
        earlier = threads.setdefault(key, [])
        thread_id = f"email-thread:{earlier[0].id}" if earlier else f"email-thread:{r.id}"
        references: list[str] = []
        if earlier and _REPLY_PREFIX.match(r.metadata["subject"]):
            mine = r.metadata.get("recipient_address") or r.metadata["recipient_name"].casefold()
            answered = [
                e
                for e in earlier
                if (e.metadata.get("sender_address") or e.metadata["sender_name"].casefold())
                == mine
            ]
            references = [(answered or earlier)[-1].id]
        rec = r.model_copy(
            update={"thread_id": thread_id, "position": len(earlier) + 1, "references": references}
        )
        earlier.append(rec)
        out.append(rec)
    return out
