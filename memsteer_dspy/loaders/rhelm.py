"""RHELM: one persona's conversations, emails and attachments, with the official QA.

RHELM (Realistic, Heterogeneous and Evolving Long-horizon Memory) is one of the two benchmarks of
the MemSteer paper. A persona's history is three sources under ``data/``:

* ``conversations/<Persona>/conversation_YYYY_MM_DD.json`` — one session a file. Each turn (a
  user message and the assistant's reply) is one record, id ``<session date>:<turn>``
  (``2024-08-26:7``), kind ``conversation_turn``, thread ``conversation:<date>``, text
  ``User: ...\\nAssistant: ...``. A turn that uploads a document (``research_document``) refers
  to that document's sections.
* ``emails/<Persona>/NN_email_YYYY_MM_DD.txt`` — emails separated by lines of ``=``, each with
  ``Sender:``, ``Recipient:``, ``Subject:``, ``Summary:`` and an optional body. Each email is one
  record, id ``Emails_<YYYY-MM-DD>:Email <k>`` (``k`` = 1-based position in the file; a second
  file of the same date would continue the numbering), the form the official evidence uses, so
  ``Emails_2024-10-03:Email 1`` resolves as written; the file date is its timestamp. Emails with
  the same subject once ``Re:``/``Fwd:`` prefixes are stripped share a thread
  (``email-thread:<id of the first>``); a reply refers to the email it answers.
* ``attachments/<Persona>/NN_{notes,report}_task_<hash>.{md,html}`` — documents. Each section
  (a Markdown ATX heading, or an HTML ``h1``–``h6``, up to the next heading of any level) is one
  record, id ``<file name>:<heading text>`` as the official evidence writes it; text before the
  first heading is the section ``<file name>:(preamble)``; a repeated heading in one file gets
  `` (2)``, `` (3)``... Attachments have no date of their own: a document is dated with the email
  file of the same ``NN`` and refers to those emails; where that email file is missing, with the
  conversation that uploads it, else the ``NN``-th conversation session.

Every record's ``metadata["source"]`` says where it came from, relative to ``data/``
(``emails/<Persona>/01_email_2024_01_01.txt:8``, ``attachments/<Persona>/<file>:<line>``, the
session file for a turn). ``external=False`` loads conversations only (RHELM's "without external
sources" setting).

The official QA (``data/QA_final/low_score_qa_<Persona>_all_validated.jsonl``) become
:class:`~memsteer_dspy.records.QAItem` s. Their ``supporting_evidence`` strings are normalized to
record ids (:class:`EvidenceResolver`); how each one resolved is kept in
``metadata["evidence_resolution"]`` and anything that does not resolve is reported in
``Loaded.unresolved``. Under ``external=False``, evidence in emails or attachments is reported
there with the reason :data:`EXTERNAL_NOT_LOADED`; the QA item is kept (the official protocol
evaluates every item in both settings).
"""

from __future__ import annotations

import difflib
import html
import json
import math
import os
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from memsteer_dspy.errors import ConfigError, InputError
from memsteer_dspy.loaders.base import Loaded, SkippedInput, UnresolvedEvidence
from memsteer_dspy.records import AnswerType, History, QAItem, Record, RecordKind

__all__ = [
    "EXTERNAL_NOT_LOADED",
    "FUZZY_HEADING_THRESHOLD",
    "EvidenceResolution",
    "EvidenceResolver",
    "default_rhelm_root",
    "infer_answer_type",
    "list_personas",
    "load_rhelm",
]

#: ``UnresolvedEvidence.reason`` for email/attachment evidence when ``external=False``: the
#: evidence is valid, its source is just not part of the loaded history.
EXTERNAL_NOT_LOADED = "external source not loaded (external=False)"
#: Lowest ``difflib`` similarity (0–1, on normalized heading text) at which an evidence heading
#: is taken to mean a heading of the same file that it does not match exactly.
FUZZY_HEADING_THRESHOLD = 0.8
PREAMBLE = "(preamble)"

_CONVERSATION_FILE = re.compile(r"conversation_(\d{4})_(\d{2})_(\d{2})\.json$")
_EMAIL_FILE = re.compile(r"(\d+)_email_(\d{4})_(\d{2})_(\d{2})\.txt$")
_ATTACHMENT_FILE = re.compile(r"(\d+)_[A-Za-z]+_task_[^.]+\.(md|html?)$", re.IGNORECASE)
_SEPARATOR = re.compile(r"^\s*={3,}\s*$")
_EMAIL_FIELD = re.compile(r"^(Sender|Recipient|Subject|Summary|From|To|Cc|Date)\s*:\s?(.*)$", re.I)
_FIELD_ALIASES = {"from": "sender", "to": "recipient"}
_REPLY_PREFIX = re.compile(r"^\s*(re|fwd?|aw|wg)\s*(\[\d+\])?\s*:\s*", re.IGNORECASE)
_ADDRESS = re.compile(r"<\s*([^<>\s]+@[^<>\s]+)\s*>")
_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_CONV_EVIDENCE = re.compile(r"^(\d{4}-\d{2}-\d{2})\s*:\s*(\d+)$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_EMAIL_EVIDENCE = re.compile(r"^Emails?_(\d{4}-\d{2}-\d{2})\s*(?::\s*(.*))?$", re.DOTALL)


# --------------------------------------------------------------------------------------------
# Where the data is
# --------------------------------------------------------------------------------------------


def default_rhelm_root() -> Path | None:
    """The RHELM folder: ``$MEMSTEER_RHELM_ROOT``, else ``../shared/benchmarks/rhelm`` relative
    to the current directory, else relative to the repository root. None where none exists."""
    candidates: list[Path] = []
    env = os.environ.get("MEMSTEER_RHELM_ROOT")
    if env:
        candidates.append(Path(env))
    candidates.append(Path.cwd().parent / "shared" / "benchmarks" / "rhelm")
    repo_root = Path(__file__).resolve().parent.parent.parent
    candidates.append(repo_root.parent / "shared" / "benchmarks" / "rhelm")
    for c in candidates:
        if _find_data_dir(c) is not None:
            return c
    return None


def _find_data_dir(root: Path) -> Path | None:
    for d in (root / "data", root):
        if (d / "conversations").is_dir():
            return d
    return None


def _data_dir(root: str | Path) -> Path:
    root = Path(root)
    data = _find_data_dir(root)
    if data is None:
        raise InputError(
            "not a RHELM folder: no 'data/conversations' (or 'conversations') inside",
            file=root,
            hint="pass the RHELM root (the folder holding 'data/') or its 'data' folder, "
            "or set MEMSTEER_RHELM_ROOT",
        )
    return data


def list_personas(root: str | Path) -> list[str]:
    """The persona names of a RHELM folder (``root`` may be the RHELM root or its ``data``)."""
    data = _data_dir(root)
    return sorted(p.name for p in (data / "conversations").iterdir() if p.is_dir())


# --------------------------------------------------------------------------------------------
# Reading files
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Conversations
# --------------------------------------------------------------------------------------------


def _conversation_turns(path: Path, data: Path, persona: str, errors: _Errors) -> list[Record]:
    """The turns of one session file as records (an unusable file or turn goes to ``errors``)."""
    rel = _rel(path, data)
    try:
        text = _read_text(path)
    except InputError as exc:
        errors(exc)
        return []
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        errors(
            InputError(
                f"invalid JSON: {exc.msg}",
                file=path,
                line=exc.lineno,
                hint="fix the JSON, or load with on_error='skip' to leave the session out",
            )
        )
        return []
    if not isinstance(obj, dict):
        errors(
            InputError(
                f"expected a JSON object, got {type(obj).__name__}",
                file=path,
                hint="a session file is {character, date, conversation: [turns]}",
            )
        )
        return []
    session = obj.get("date")
    if not isinstance(session, str) or not _DATE.match(session.strip()):
        errors(
            InputError(
                f"missing or malformed session date {session!r}",
                file=path,
                field="date",
                hint="a session needs 'date': 'YYYY-MM-DD'",
            )
        )
        return []
    session = session.strip()
    turns = obj.get("conversation")
    if not isinstance(turns, list):
        errors(
            InputError(
                "missing 'conversation' list of turns",
                file=path,
                field="conversation",
                hint="a session file is {character, date, conversation: [turns]}",
            )
        )
        return []
    author = _display_name(str(obj.get("character") or persona))
    records: list[Record] = []
    for i, turn in enumerate(turns):
        where = f"conversation[{i}]"
        if not isinstance(turn, dict):
            errors(
                InputError(
                    f"turn is a {type(turn).__name__}, not an object", file=path, field=where
                )
            )
            continue
        missing = [k for k in ("turn", "timestamp", "user", "assistant") if k not in turn]
        if missing:
            errors(
                InputError(
                    f"turn lacks {', '.join(repr(m) for m in missing)}",
                    file=path,
                    field=f"{where}.{missing[0]}",
                    hint="each turn needs turn, timestamp, user and assistant",
                )
            )
            continue
        try:
            number = int(turn["turn"])
        except (TypeError, ValueError):
            errors(
                InputError(
                    f"turn number {turn['turn']!r} is not an integer",
                    file=path,
                    field=f"{where}.turn",
                )
            )
            continue
        try:
            timestamp = datetime.fromisoformat(str(turn["timestamp"]))
        except ValueError:
            errors(
                InputError(
                    f"timestamp {turn['timestamp']!r} is not ISO 8601",
                    file=path,
                    field=f"{where}.timestamp",
                    hint="write it as YYYY-MM-DDTHH:MM:SS",
                )
            )
            continue
        metadata: dict[str, Any] = {"source": rel, "session_date": session, "turn": number}
        if turn.get("message_type"):
            metadata["message_type"] = turn["message_type"]
        if turn.get("research_document"):
            metadata["research_document"] = str(turn["research_document"])
        records.append(
            Record(
                id=f"{session}:{number}",
                kind=RecordKind.CONVERSATION_TURN,
                text=f"User: {str(turn['user']).strip()}\nAssistant: {str(turn['assistant']).strip()}",
                timestamp=timestamp,
                author=author,
                thread_id=f"conversation:{session}",
                position=number,
                metadata=metadata,
            )
        )
    return records


# --------------------------------------------------------------------------------------------
# Emails
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Attachments
# --------------------------------------------------------------------------------------------


@dataclass
class _Section:
    heading: str | None  # None: text before the first heading
    level: int
    line: int
    text: str


def _markdown_sections(text: str) -> list[_Section]:
    """ATX headings (``#``..``######``) outside fenced code start sections; the section's text is
    its Markdown, heading line included."""
    sections: list[_Section] = []
    current: list[str] = []
    heading: str | None = None
    level, start = 0, 1
    fence: str | None = None

    def flush() -> None:
        body = "\n".join(current).strip()
        if heading is not None or body:
            sections.append(_Section(heading, level, start, body))

    for n, line in enumerate(text.splitlines(), start=1):
        f = _FENCE.match(line)
        if f:
            mark = f.group(1)[0]
            if fence is None:
                fence = mark
            elif fence == mark:
                fence = None
        m = _ATX.match(line) if fence is None and not f else None
        if m:
            flush()
            heading, level, start = (m.group(2) or "").strip(), len(m.group(1)), n
            current = [line.rstrip()]
        else:
            current.append(line.rstrip())
    flush()
    return sections


_BLOCK_TAGS = {
    "p",
    "div",
    "section",
    "article",
    "header",
    "footer",
    "ul",
    "ol",
    "table",
    "thead",
    "tbody",
    "tr",
    "blockquote",
    "pre",
    "hr",
    "dl",
    "dt",
    "dd",
    "figure",
    "figcaption",
    "main",
    "nav",
}
_SKIP_TAGS = {"head", "style", "script", "title", "noscript", "template"}
_HEADINGS = {"h1", "h2", "h3", "h4", "h5", "h6"}


class _HTMLSections(HTMLParser):
    """Splits an HTML document into heading sections of plain text (stdlib parser)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.sections: list[_Section] = []
        self._heading: str | None = None
        self._level = 0
        self._line = 1
        self._parts: list[str] = []
        self._in_heading: list[str] | None = None
        self._skip = 0

    def _flush(self) -> None:
        lines = [
            re.sub(r"[ \t\r\f\v]+", " ", ln).strip() for ln in "".join(self._parts).split("\n")
        ]
        body = "\n".join(ln for ln in lines if ln and ln != "|")
        if self._heading is not None:
            body = f"{self._heading}\n{body}".strip()
        if self._heading is not None or body:
            self.sections.append(_Section(self._heading, self._level, self._line, body))
        self._parts = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIP_TAGS:
            self._skip += 1
        elif self._skip:
            return
        elif tag in _HEADINGS:
            self._flush()
            self._in_heading, self._level, self._line = [], int(tag[1]), self.getpos()[0]
        elif tag == "br":
            self._emit("\n")
        elif tag == "li":
            self._emit("\n- ")
        elif tag in ("td", "th"):
            self._emit(" | ")
        elif tag in _BLOCK_TAGS:
            self._emit("\n")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("br", "hr") and not self._skip:
            self._emit("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP_TAGS:
            self._skip = max(0, self._skip - 1)
        elif self._skip:
            return
        elif tag in _HEADINGS and self._in_heading is not None:
            self._heading = re.sub(r"\s+", " ", "".join(self._in_heading)).strip()
            self._in_heading = None
        elif tag in _BLOCK_TAGS or tag == "li":
            self._emit("\n")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self._emit(data)

    def _emit(self, text: str) -> None:
        if self._in_heading is not None:
            self._in_heading.append(text.replace("\n", " "))
        else:
            self._parts.append(text)

    def close(self) -> None:
        super().close()
        if self._in_heading is not None:  # unclosed heading at the end
            self._heading = re.sub(r"\s+", " ", "".join(self._in_heading)).strip()
            self._in_heading = None
        self._flush()


def _html_sections(text: str) -> list[_Section]:
    parser = _HTMLSections()
    parser.feed(text)
    parser.close()
    return parser.sections


def _document_records(
    path: Path,
    data: Path,
    day: date | None,
    date_source: str,
    email_ids: list[str],
    errors: _Errors,
) -> list[Record]:
    rel = _rel(path, data)
    try:
        text = _read_text(path)
    except InputError as exc:
        errors(exc)
        return []
    is_html = path.suffix.lower() in (".html", ".htm")
    sections = _html_sections(text) if is_html else _markdown_sections(text)
    titled = [s for s in sections if s.heading]
    title = _plain_heading(titled[0].heading) if titled else None
    records: list[Record] = []
    seen: dict[str, int] = {}
    path_stack: list[tuple[int, str]] = []
    for position, s in enumerate(sections, start=1):
        label = PREAMBLE if s.heading is None else (s.heading or "(untitled)")
        base = f"{path.name}:{label}"
        seen[base] = seen.get(base, 0) + 1
        rid = base if seen[base] == 1 else f"{base} ({seen[base]})"
        while rid in seen and rid != base:  # "(2)" collides with a real heading
            seen[base] += 1
            rid = f"{base} ({seen[base]})"
        seen.setdefault(rid, 1)
        if s.heading is not None:
            path_stack = [(lv, h) for lv, h in path_stack if lv < s.level]
            path_stack.append((s.level, _plain_heading(s.heading)))
        metadata: dict[str, Any] = {
            "source": f"{rel}:{s.line}",
            "document": path.name,
            "attachment_index": int(path.name.split("_", 1)[0]),
            "heading": _plain_heading(s.heading) if s.heading is not None else PREAMBLE,
            "heading_level": s.level,
            "heading_path": [h for _, h in path_stack] if s.heading is not None else [],
            "title": title,
            "date_source": date_source,
        }
        records.append(
            Record(
                id=rid,
                kind=RecordKind.DOCUMENT_SECTION,
                text=s.text,
                timestamp=datetime(day.year, day.month, day.day) if day else None,
                thread_id=path.name,
                position=position,
                references=list(email_ids),
                metadata=metadata,
            )
        )
    return records


def _plain_heading(heading: str) -> str:
    """Heading text without Markdown emphasis/link syntax (``**A** [b](u)`` → ``A b``)."""
    h = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    h = re.sub(r"(\*\*|__|\*|`)", "", h)
    return re.sub(r"\s+", " ", h).strip()


# --------------------------------------------------------------------------------------------
# Evidence resolution
# --------------------------------------------------------------------------------------------

_STOP = set(
    "the a an and or of to in on at for with by from as is are was were be been it its this that "
    "these those my me i you your we our they their he she his her what which who whom when where "
    "how did do does have has had not no yes any all about after before during between into than "
    "then there so if but also can could would should will just email emails".split()
)


def _tokens(text: str) -> set[str]:
    return {
        t
        for t in re.findall(r"[a-z0-9]+", _fold(text))
        if (len(t) > 2 or t.isdigit()) and t not in _STOP
    }


def _fold(text: str) -> str:
    """Casefold, NFKC, ASCII quotes/dashes, collapsed whitespace."""
    t = unicodedata.normalize("NFKC", html.unescape(text))
    t = t.translate(
        str.maketrans({"‘": "'", "’": "'", "“": '"', "”": '"', "–": "-", "—": "-", "\xa0": " "})
    )
    return re.sub(r"\s+", " ", t).strip().casefold()


def _norm_heading(text: str) -> str:
    """Heading text for matching: no leading ``#``s, Markdown syntax, case or punctuation noise."""
    t = _fold(_plain_heading(re.sub(r"^\s*#+\s*", "", text)))
    t = re.sub(r"[\"'*_`]", "", t)
    return re.sub(r"\s+", " ", t).strip(" .:;-")


def _strip_numbering(text: str) -> str:
    """``4. structured shopping list`` / ``ii. methods`` / ``section 2: x`` → the words only."""
    return re.sub(
        r"^((section|part|step|day)\s+)?([0-9]+(\.[0-9]+)*|[ivxlc]+|[a-z])[.):]\s*", "", text
    ).strip()


@dataclass(frozen=True)
class EvidenceResolution:
    """How one official evidence string mapped to record ids."""

    raw: str
    #: The record ids it names (empty when it did not resolve).
    ids: list[str]
    #: How: ``exact``, ``turn_list``, ``email_index``, ``email_recipient``, ``email_header``,
    #: ``email_ranked``, ``document_header``, ``document_ranked``, ``heading_normalized``,
    #: ``heading_unnumbered``, ``heading_number``, ``heading_prefix``, ``heading_fuzzy``,
    #: ``heading_in_text`` (``+ranked`` where several candidates were ranked, ``file_stem+``
    #: where the file name needed its extension fixed), or ``external`` (not loaded).
    method: str
    #: Ranking score or fuzzy similarity, where the method used one.
    score: float | None = None
    #: Why it (or part of a turn list) did not resolve.
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"raw": self.raw, "ids": self.ids, "method": self.method}
        if self.score is not None:
            d["score"] = round(self.score, 3)
        if self.reason:
            d["reason"] = self.reason
        return d


class EvidenceResolver:
    """Maps RHELM ``supporting_evidence`` strings to record ids of one persona's history.

    Conversation turns: ``2024-08-26:7``; lists ``2024-06-26:13,17,18`` (a bare number keeps the
    previous date) and ``2024-05-28:9,2024-05-28:10``.

    Emails (``Emails_<date>:...``; the date names the email file): ``Email N`` → the N-th email of
    that date (the record id itself); ``Email to <name>`` → the email to that recipient;
    ``Header: ... From: A To: B`` → the email from A to B; a bare ``Email``/``Header``/``Body`` →
    the email of that date that best fits the question and answer (``email_ranked``; a file with
    one email needs no ranking). Where a filter leaves several emails, the best fit wins too.

    Document sections (``<file>:<heading>``), loosest last: the exact id; ``Header``/``Title`` →
    the document's first section; the heading after normalization (case, Markdown, quotes,
    leading ``#``, a ``Header:`` prefix); the same without numbering (``Lemon Bars`` ~ ``4. Lemon
    Bars``); a bare number or label (``1``, ``II``, ``Section 5``, ``Table 1``) → the heading so
    numbered; a heading that starts with the text (``Required Permissions`` ~ ``Required
    Permissions (Advance ...)``); the most similar heading if the similarity reaches
    :data:`FUZZY_HEADING_THRESHOLD` (``heading_fuzzy``, score kept); a bold label, table cell or
    list item inside a section (``heading_in_text``). A file name without or with the wrong
    extension is matched on its stem; a file name alone means the section that best fits the
    question and answer. Where several sections qualify (a repeated heading), the best fit wins.
    """

    def __init__(self, history: History, *, external: bool = True) -> None:
        self.history = history
        self.external = external
        self._emails_by_day: dict[str, list[Record]] = {}
        self._sections_by_file: dict[str, list[Record]] = {}
        for r in history.records:
            if r.kind == RecordKind.EMAIL:
                self._emails_by_day.setdefault(
                    r.id.split(":", 1)[0].removeprefix("Emails_"), []
                ).append(r)
            elif r.kind == RecordKind.DOCUMENT_SECTION:
                self._sections_by_file.setdefault(r.metadata["document"], []).append(r)
        self._by_stem = {Path(f).stem.casefold(): f for f in self._sections_by_file}

    # -- entry point -------------------------------------------------------------------------
    def resolve(self, raw: str, *, question: str = "", answer: str = "") -> EvidenceResolution:
        e = raw.strip()
        context = (question, answer)
        if e.startswith("Email"):
            if not self.external:
                return EvidenceResolution(raw, [], "external", reason=EXTERNAL_NOT_LOADED)
            return self._email(raw, e, context)
        if re.match(r"^\d{4}-\d{2}-\d{2}\s*:", e):
            return self._turns(raw, e)
        if not self.external:
            return EvidenceResolution(raw, [], "external", reason=EXTERNAL_NOT_LOADED)
        return self._document(raw, e, context)

    # -- conversation turns ------------------------------------------------------------------
    def _turns(self, raw: str, e: str) -> EvidenceResolution:
        ids, missing = [], []
        day: str | None = None
        for piece in (p.strip() for p in e.split(",")):
            if not piece:
                continue
            m = _CONV_EVIDENCE.match(piece)
            if m:
                day, turn = m.group(1), int(m.group(2))
            elif piece.isdigit() and day is not None:
                turn = int(piece)
            else:
                missing.append(piece)
                continue
            rid = f"{day}:{turn}"
            (ids if rid in self.history else missing).append(rid)
        reason = f"no conversation turn {', '.join(missing)}" if missing else None
        method = "exact" if ids == [e] else "turn_list"
        return EvidenceResolution(raw, list(dict.fromkeys(ids)), method, reason=reason)

    # -- emails ------------------------------------------------------------------------------
    def _email(self, raw: str, e: str, context: tuple[str, str]) -> EvidenceResolution:
        m = _EMAIL_EVIDENCE.match(e)
        if m is None:
            return EvidenceResolution(
                raw, [], "email", reason="not of the form Emails_<YYYY-MM-DD>:<part>"
            )
        day, part = m.group(1), (m.group(2) or "").strip()
        emails = self._emails_by_day.get(day)
        if not emails:
            return EvidenceResolution(raw, [], "email", reason=f"no email file dated {day}")
        n = re.fullmatch(r"(?:Email|Message)\s*#?\s*(\d+)", part, re.IGNORECASE)
        if n:
            k = int(n.group(1))
            rid = f"Emails_{day}:Email {k}"
            if rid in self.history:
                return EvidenceResolution(raw, [rid], "email_index")
            return EvidenceResolution(
                raw, [], "email_index", reason=f"the email file of {day} has no email {k}"
            )
        candidates, method = list(emails), "email_ranked"
        to = re.fullmatch(r"Email\s+to\s+(.+)", part, re.IGNORECASE)
        header = re.search(r"From:\s*(.*?)\s*(?:To:\s*(.*))?$", part, re.IGNORECASE | re.DOTALL)
        if to:
            candidates = [r for r in emails if _party_matches(to.group(1), r, "recipient")]
            method = "email_recipient"
        elif header:
            candidates = [
                r
                for r in emails
                if _party_matches(header.group(1), r, "sender")
                and (not header.group(2) or _party_matches(header.group(2), r, "recipient"))
            ]
            method = "email_header"
        if not candidates:
            return EvidenceResolution(raw, [], method, reason=f"no email of {day} matches {part!r}")
        if len(candidates) == 1:
            return EvidenceResolution(raw, [candidates[0].id], method)
        best, score = _best_match(candidates, context)
        return EvidenceResolution(raw, [best.id], method, score=score)

    # -- document sections -------------------------------------------------------------------
    def _document(self, raw: str, e: str, context: tuple[str, str]) -> EvidenceResolution:
        name, sep, heading = e.partition(":")
        name = name.strip()
        file = name if name in self._sections_by_file else None
        method_prefix = ""
        if file is None:
            stem = re.sub(r"\.(md|html?)$", "", name, flags=re.IGNORECASE).casefold()
            file = self._by_stem.get(stem)
            method_prefix = "file_stem+"
        if file is None:
            return EvidenceResolution(raw, [], "document", reason=f"no attachment named {name!r}")
        sections = self._sections_by_file[file]
        heading = heading.strip()
        if not sep or not heading:
            best, score = _best_match(sections, context)
            return EvidenceResolution(
                raw, [best.id], method_prefix + "document_ranked", score=score
            )
        exact = f"{file}:{heading}"
        if exact in self.history:
            # a repeated heading ("Notes", "Notes (2)"): the repeat that fits the question best
            repeats = [s for s in sections if s.id == exact or _is_repeat_of(s.id, exact)]
            if len(repeats) > 1:
                best, score = _best_match(repeats, context)
                return EvidenceResolution(
                    raw, [best.id], method_prefix + "exact+ranked", score=score
                )
            return EvidenceResolution(raw, [exact], method_prefix + "exact")
        if _fold(heading) in ("header", "headers", "title", "heading"):
            return EvidenceResolution(raw, [sections[0].id], method_prefix + "document_header")
        found = self._heading(sections, heading, context)
        if found is not None:
            return EvidenceResolution(raw, [found[0].id], method_prefix + found[1], score=found[2])
        return EvidenceResolution(
            raw, [], "document", reason=f"no section of {file} is headed {heading!r}"
        )

    def _heading(
        self, sections: list[Record], heading: str, context: tuple[str, str]
    ) -> tuple[Record, str, float | None] | None:
        """The section of ``file`` that ``heading`` names, trying ever looser readings."""
        want = _norm_heading(re.sub(r"^\s*header\s*:\s*(?=\S)", "", heading, flags=re.IGNORECASE))
        if not want:
            return None
        headed = [s for s in sections if s.metadata["heading"] != PREAMBLE]
        norms = [_norm_heading(s.metadata["heading"]) for s in headed]

        def pick(hits: list[Record], method: str) -> tuple[Record, str, float | None]:
            if len(hits) == 1:
                return hits[0], method, None
            best, score = _best_match(hits, context)
            return best, method + "+ranked", score

        # 1. the same heading once case, Markdown, quotes and spacing are normalized
        hits = [s for s, h in zip(headed, norms, strict=True) if h == want]
        if hits:
            return pick(hits, "heading_normalized")
        # 2. the same words without the numbering ("4. Shopping List" ~ "Shopping List")
        bare = _strip_numbering(want)
        hits = [
            s for s, h in zip(headed, norms, strict=True) if bare and _strip_numbering(h) == bare
        ]
        if hits:
            return pick(hits, "heading_unnumbered")
        # 3. only a number or label ("1", "II", "Section 5"): the heading numbered so
        label = _LABEL_ONLY.fullmatch(want)
        if label:
            word, number = label.group(1), label.group(2)
            hits = [
                s
                for s, h in zip(headed, norms, strict=True)
                if _heading_number(h) == (word, number)
            ]
            hits = hits or [
                s for s, h in zip(headed, norms, strict=True) if _heading_number(h)[1] == number
            ]
            if hits:
                return pick(hits, "heading_number")
        # 4. a heading that starts with the given text ("Table 2" ~ "Table 2: Assigned ...")
        hits = [
            s
            for s, h in zip(headed, norms, strict=True)
            if re.match(re.escape(want) + r"(\W|$)", h)
        ]
        if hits:
            return pick(hits, "heading_prefix")
        # 5. a similar heading (typos, small rewordings), above a threshold
        ratios = [difflib.SequenceMatcher(None, want, h).ratio() for h in norms]
        if ratios and max(ratios) >= FUZZY_HEADING_THRESHOLD:
            best = max(ratios)
            return headed[ratios.index(best)], "heading_fuzzy", best
        # 6. a bold label, table cell or list item inside a section ("**Workflow Rationale:**")
        texts = [_norm_text(s.text) for s in sections]
        line_start = re.compile(r"(^|\n)[\s|>#*+-]*" + re.escape(want) + r"(\W|$)")
        hits = [s for s, t in zip(sections, texts, strict=True) if line_start.search(t)]
        hits = hits or [
            s
            for s, t in zip(sections, texts, strict=True)
            if re.search(r"(^|\W)" + re.escape(want) + r"(\W|$)", t)
        ]
        if hits:
            return pick(hits, "heading_in_text")
        return None


_LABEL_ONLY = re.compile(r"(?:(section|part|step|chapter|phase|table|day)\s+)?([0-9]+|[ivxlc]+)")


def _heading_number(heading: str) -> tuple[str | None, str | None]:
    """The leading label of a normalized heading: ``section 1: x`` → ("section", "1"), ``ii. x``
    → (None, "ii"), ``4. x`` → (None, "4")."""
    m = re.match(
        r"(?:(section|part|step|chapter|phase|table|day)\s+)?([0-9]+|[ivxlc]+)(?=[.):\s-]|$)",
        heading,
    )
    return (m.group(1), m.group(2)) if m else (None, None)


def _norm_text(text: str) -> str:
    """Section text folded like headings, line by line (for finding a label inside it)."""
    return "\n".join(re.sub(r"[\"'*_`]", "", ln).strip() for ln in _fold_lines(text))


def _fold_lines(text: str) -> list[str]:
    return [_fold(ln) for ln in text.splitlines()]


def _is_repeat_of(record_id: str, first_id: str) -> bool:
    """Is ``record_id`` the id a repeated heading got (``<first_id> (2)``, ``(3)``...)?"""
    return re.fullmatch(re.escape(first_id) + r" \(\d+\)", record_id) is not None


def _party_matches(wanted: str, record: Record, role: str) -> bool:
    """Does ``wanted`` (a name, ``Name <address>`` or address) name the sender/recipient?"""
    address = _address_of(wanted)
    if address and address == record.metadata.get(f"{role}_address"):
        return True
    name = _fold(_name_of(wanted))
    have = _fold(record.metadata.get(f"{role}_name", ""))
    return bool(name) and (name == have or name in have or (len(have) > 3 and have in name))


def _best_match(candidates: Sequence[Record], context: tuple[str, str]) -> tuple[Record, float]:
    """The candidate that best fits a QA item's ``(question, answer)``; ties → the first.

    The score sums, over the words a candidate shares with the question and answer, each word's
    inverse frequency among the candidates (answer words count double), plus a large bonus when
    the answer quotes the candidate's title (an email subject or a section heading).
    """
    question, answer = context
    q_tokens, a_tokens = _tokens(question), _tokens(answer)
    folded_answer = _fold(answer)
    token_sets = [_tokens(c.text) for c in candidates]
    df: dict[str, int] = {}
    for ts in token_sets:
        for t in ts & (q_tokens | a_tokens):
            df[t] = df.get(t, 0) + 1
    n = len(candidates)
    best_i, best = 0, -1.0
    for i, (c, ts) in enumerate(zip(candidates, token_sets, strict=True)):
        score = sum(
            math.log(1 + n / df[t]) * (2 if t in a_tokens else 1)
            for t in ts & (q_tokens | a_tokens)
        )
        title = _fold(c.title or "")
        if len(title) > 3 and title in folded_answer:
            score += 100.0
        if score > best:
            best_i, best = i, score
    return candidates[best_i], best


# --------------------------------------------------------------------------------------------
# Answer types
# --------------------------------------------------------------------------------------------

_NUMBER_WORDS = (
    "zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|"
    "fifteen|sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|"
    "eighty|ninety|hundred|once|twice"
)
_NUMBER = re.compile(
    rf"^(about |approximately |around |~|≈)?[$€£]?(\d[\d,]*(\.\d+)?(/\d+)?|({_NUMBER_WORDS})([- ]({_NUMBER_WORDS}))?)"
    r"\s*(%|[a-zA-Z°/]+){0,1}( [a-zA-Z]+)?( \([^)]*\))?$",
    re.IGNORECASE,
)
_MONTHS = "january|february|march|april|may|june|july|august|september|october|november|december"
_MON = rf"({_MONTHS}|jan|feb|mar|apr|jun|jul|aug|sept?|oct|nov|dec)\.?"
_DATE_ANSWER = re.compile(
    rf"^((mon|tues|wednes|thurs|fri|satur|sun)day,? )?("
    rf"\d{{4}}-\d{{2}}-\d{{2}}"
    rf"|{_MON} \d{{1,2}}(st|nd|rd|th)?(,? \d{{4}})?"
    rf"|\d{{1,2}}(st|nd|rd|th)? (of )?{_MON}(,? \d{{4}})?"
    rf"|{_MON},? \d{{4}}"
    rf"|\d{{1,2}}/\d{{1,2}}/\d{{2,4}})$",
    re.IGNORECASE,
)
# A colon or a finite verb makes a comma-separated answer a clause, not a list.
_CLAUSE = re.compile(
    r":|\b(is|are|was|were|has|have|had|did|does|do|covers|titled|includes)\b", re.I
)
QUOTES = "'\"‘’“”"
_SENTENCE_START = re.compile(
    r"^(you|i|it|there|they|he|she|we|this|that|no,|yes,)\b", re.IGNORECASE
)


def infer_answer_type(answer: str) -> AnswerType:
    """The answer type of an official RHELM answer, from its text alone (RHELM gives none).

    Surrounding quotes, spaces and a final period are ignored. In order: ``boolean`` if it starts
    with yes/no and has at most 8 words; ``date`` if it is only a date (ISO, ``April 4, 2024``,
    ``4 April``, ``March 2024``, optionally a weekday); ``number`` if it is only a count or
    quantity (``3``, ``Two``, ``28 minutes``, ``40,000 steps``, ``6/10``, ``$1,200``, optionally
    with a parenthesis); ``text`` if it reads as a sentence (starts with a pronoun) or is longer
    than 30 words; ``entity`` if it was quoted (a title) and has at most 12 words; ``list`` if it
    splits on ``;``, ``,`` or ``and`` into two or more short parts (at most 6 words each; a comma
    before a year does not split; no colon or verb such as *is*/*has*); ``entity`` if it is a short name or phrase (at most 6 words, no
    sentence punctuation; ``Dr.``/initials are fine); otherwise ``text``.
    """
    a = re.sub(r"\s+", " ", answer).strip()
    quoted = False
    while a and (a[0] in QUOTES or a[-1] in QUOTES or a[-1] in ".!"):
        quoted = quoted or a[0] in QUOTES
        a = a.strip("".join(QUOTES)).rstrip(".!").strip()
    if not a:
        return AnswerType.TEXT
    words = a.split()
    if re.match(r"^(yes|no)\b", a, re.IGNORECASE):
        return AnswerType.BOOLEAN if len(words) <= 8 else AnswerType.TEXT
    if _DATE_ANSWER.match(a):
        return AnswerType.DATE
    if _NUMBER.match(a):
        return AnswerType.NUMBER
    if _SENTENCE_START.match(a) or len(words) > 30:
        return AnswerType.TEXT
    if quoted and len(words) <= 12:
        return AnswerType.ENTITY
    unsplit = re.sub(r",\s*(?=\d{4}\b)", " ", a)
    parts = [p.strip() for p in re.split(r";|,(?: and | & | or )?| and | & ", unsplit) if p.strip()]
    if len(parts) >= 2 and all(len(p.split()) <= 6 for p in parts) and not _CLAUSE.search(a):
        return AnswerType.LIST
    plain = re.sub(r"\b([A-Z][a-z]{0,3}|[A-Z])\.", "", a)  # Dr. / St. / R.
    if len(words) <= 6 and not re.search(r"[.;:!?](\s|$)", plain):
        return AnswerType.ENTITY
    return AnswerType.TEXT


# --------------------------------------------------------------------------------------------
# The loader
# --------------------------------------------------------------------------------------------


def _sorted_files(folder: Path, pattern: re.Pattern[str]) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and pattern.search(p.name))


def load_rhelm(
    root: str | Path, persona: str, *, external: bool = True, on_error: str = "raise"
) -> Loaded:
    """Load one RHELM persona as a History plus its official QA items.

    ``root`` is the RHELM folder or its ``data`` folder. ``external=False`` loads conversations
    only. ``on_error='skip'`` leaves out an unreadable file, turn or email and reports it in
    ``Loaded.skipped`` instead of raising :class:`~memsteer_dspy.errors.InputError`.
    """
    errors = _Errors(on_error)
    data = _data_dir(root)
    rhelm_root = data.parent if data.name == "data" else data
    personas = list_personas(data)
    if persona not in personas:
        close = difflib.get_close_matches(persona, personas, n=1)
        raise InputError(
            f"no RHELM persona {persona!r}" + (f" (did you mean {close[0]!r}?)" if close else ""),
            file=data / "conversations",
            field="persona",
            hint=f"available personas: {', '.join(personas)}",
        )

    sessions = _sorted_files(data / "conversations" / persona, _CONVERSATION_FILE)
    turns: list[Record] = []
    for path in sessions:
        turns.extend(_conversation_turns(path, data, persona, errors))

    emails: list[Record] = []
    sections: list[Record] = []
    if external:
        email_files: dict[int, _EmailFile] = {}
        per_day: dict[date, int] = {}
        for path in _sorted_files(data / "emails" / persona, _EMAIL_FILE):
            m = _EMAIL_FILE.search(path.name)
            day = date(int(m.group(2)), int(m.group(3)), int(m.group(4))) if m else None
            ef = _email_file(path, data, errors, numbered_from=per_day.get(day, 0))
            if ef is not None:
                per_day[ef.day] = per_day.get(ef.day, 0) + ef.blocks
                email_files.setdefault(ef.index, ef)
                emails.extend(ef.records)
        emails = _thread_emails(emails)
        email_ids: dict[int, list[str]] = {}
        for r in emails:
            email_ids.setdefault(r.metadata["email_file_index"], []).append(r.id)
        uploaded: dict[str, date] = {}
        for t in turns:
            doc = t.metadata.get("research_document")
            if doc and t.timestamp is not None:
                uploaded.setdefault(Path(doc).stem, date.fromisoformat(t.metadata["session_date"]))
        session_days = sorted(
            {
                date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
                for p in sessions
                if (m := _CONVERSATION_FILE.search(p.name))
            }
        )
        for path in _sorted_files(data / "attachments" / persona, _ATTACHMENT_FILE):
            nn = int(path.name.split("_", 1)[0])
            if nn in email_files:
                day, source = email_files[nn].day, "email"
            elif path.stem in uploaded:
                day, source = uploaded[path.stem], "uploading_conversation"
            elif 0 < nn <= len(session_days):
                day, source = session_days[nn - 1], "nth_conversation"
            else:
                day, source = None, "none"
            sections.extend(
                _document_records(path, data, day, source, email_ids.get(nn, []), errors)
            )
        # A turn that uploads a document refers to that document's sections.
        by_doc: dict[str, list[str]] = {}
        for s in sections:
            by_doc.setdefault(Path(s.metadata["document"]).stem, []).append(s.id)
        turns = [
            t.model_copy(update={"references": by_doc[Path(t.metadata["research_document"]).stem]})
            if t.metadata.get("research_document")
            and Path(t.metadata["research_document"]).stem in by_doc
            else t
            for t in turns
        ]

    history = History(
        persona, _unique(turns + emails + sections, data, errors), source=str(rhelm_root)
    )
    qa_items, unresolved = _official_qa(data, persona, history, external, errors)
    return Loaded(history=history, qa_items=qa_items, unresolved=unresolved, skipped=errors.skipped)


def _unique(records: list[Record], data: Path, errors: _Errors) -> list[Record]:
    """Records with a new id; a repeated id (a turn number used twice in one session, two session
    files of one date) is an InputError naming both places, or skipped under ``on_error='skip'``."""
    seen: dict[str, Record] = {}
    out = []
    for r in records:
        first = seen.get(r.id)
        if first is None:
            seen[r.id] = r
            out.append(r)
            continue
        where = str(r.metadata.get("source", ""))
        file, _, line = where.rpartition(":") if re.search(r":\d+$", where) else (where, "", "")
        errors(
            InputError(
                f"duplicate record id {r.id!r} (first at {first.metadata.get('source')})",
                file=data / file if file else None,
                line=int(line) if line else None,
                record=r.id,
                hint="record ids must be unique; fix the turn number or remove the duplicate file",
            )
        )
    return out


def _official_qa(
    data: Path, persona: str, history: History, external: bool, errors: _Errors
) -> tuple[list[QAItem], list[UnresolvedEvidence]]:
    path = data / "QA_final" / f"low_score_qa_{persona}_all_validated.jsonl"
    if not path.is_file():
        return [], []
    try:
        text = _read_text(path)
    except InputError as exc:
        errors(exc)
        return [], []
    resolver = EvidenceResolver(history, external=external)
    items: list[QAItem] = []
    unresolved: list[UnresolvedEvidence] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            errors(InputError(f"invalid JSON: {exc.msg}", file=path, line=n))
            continue
        missing = [
            k for k in ("id", "question", "answer") if not isinstance(obj, dict) or k not in obj
        ]
        if missing:
            errors(
                InputError(
                    f"QA item lacks {missing[0]!r}",
                    file=path,
                    line=n,
                    field=missing[0],
                    hint="each line is {id, question, answer, question_date, question_type, "
                    "supporting_evidence, characteristics}",
                )
            )
            continue
        qa_id = str(obj["id"])
        raw_evidence = obj.get("supporting_evidence") or []
        if isinstance(raw_evidence, str):
            raw_evidence = [raw_evidence]
        question, answer = str(obj["question"]), str(obj["answer"])
        question_date = None
        if obj.get("question_date"):
            try:
                question_date = date.fromisoformat(str(obj["question_date"]).strip()[:10])
            except ValueError:
                errors(
                    InputError(
                        f"question_date {obj['question_date']!r} is not YYYY-MM-DD",
                        file=path,
                        line=n,
                        field="question_date",
                        record=qa_id,
                    )
                )
                continue
        evidence_ids: list[str] = []
        resolutions = []
        problems: list[UnresolvedEvidence] = []
        for raw in raw_evidence:
            res = resolver.resolve(str(raw), question=question, answer=answer)
            resolutions.append(res.as_dict())
            evidence_ids.extend(res.ids)
            if res.reason:  # nothing, or only part of a turn list, resolved
                problems.append(UnresolvedEvidence(qa_id=qa_id, raw=str(raw), reason=res.reason))
        try:
            item = QAItem(
                id=qa_id,
                question=question,
                answer=answer,
                answer_type=infer_answer_type(answer),
                evidence_ids=list(dict.fromkeys(evidence_ids)),
                question_date=question_date,
                question_type=obj.get("question_type"),
                source="official",
                metadata={
                    "persona": persona,
                    "characteristics": list(obj.get("characteristics") or []),
                    "raw_evidence": list(raw_evidence),
                    "evidence_resolution": resolutions,
                    "source": f"{_rel(path, data)}:{n}",
                },
            )
        except ValueError as exc:  # pydantic: e.g. an empty question
            errors(InputError(f"unusable QA item: {exc}", file=path, line=n, record=qa_id))
            continue
        items.append(item)
        unresolved.extend(problems)
    return items, unresolved
