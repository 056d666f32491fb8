"""History records, their spans, and QA items: the data every stage of memsteer-dspy shares.

* :class:`Record` is one unit of a user's history as the source gave it (a conversation turn, an
  email, a document section, a note), with its thread, position and explicit references.
* :class:`Span` is one sentence or line of a record, id ``<record_id>#<n>`` (``n`` from 1). Span
  splitting is a pure function of the record text, so span ids are stable across runs and loaders.
* :class:`History` is one user's records, with lookup by id, iteration in time order, ``as_of``
  for point-in-time protocols, and a content fingerprint that keys caches and indexes.
* :class:`QAItem` is a question with its reference answer and evidence record ids; official
  benchmark items and generated supervision share it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, date, datetime
from enum import StrEnum
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from memsteer_dspy.errors import DuplicateRecordError, EmptyHistoryError, InputError


class RecordKind(StrEnum):
    """Kinds the loaders produce. ``Record.kind`` accepts any string; these are the known ones."""

    CONVERSATION_TURN = "conversation_turn"
    EMAIL = "email"
    DOCUMENT_SECTION = "document_section"
    NOTE = "note"


class AnswerType(StrEnum):
    TEXT = "text"
    ENTITY = "entity"
    NUMBER = "number"
    DATE = "date"
    LIST = "list"
    BOOLEAN = "boolean"


# --------------------------------------------------------------------------------------------
# Spans
# --------------------------------------------------------------------------------------------

# Words that end in a period without ending a sentence.
_ABBREVIATIONS = {
    "mr",
    "mrs",
    "ms",
    "dr",
    "prof",
    "sr",
    "jr",
    "st",
    "vs",
    "etc",
    "e.g",
    "i.e",
    "inc",
    "ltd",
    "co",
    "no",
    "fig",
    "approx",
    "dept",
    "est",
    "jan",
    "feb",
    "mar",
    "apr",
    "jun",
    "jul",
    "aug",
    "sep",
    "sept",
    "oct",
    "nov",
    "dec",
    "a.m",
    "p.m",
    "u.s",
    "u.k",
}
# A sentence boundary candidate: end punctuation (optionally closed by quotes/brackets), then
# whitespace, then something that can start a sentence.
_BOUNDARY = re.compile(r"""(?<=[.!?])["')\]]*\s+(?=["'(\[]?[A-Z0-9])""")
_LAST_WORD = re.compile(r"([A-Za-z][A-Za-z.]*)\.$")
_WORD_RUN = re.compile(r"[A-Za-z.]+")
MAX_SPAN_CHARS = 600


_LIST_MARK = re.compile(r"^(?:[-*+•]|\d+[.)])\s+")


def is_heading(text: str) -> bool:
    """Whether a span is a heading or a label rather than a statement: a markdown heading
    ("### Module 1: …"), a label ending in a colon ("- **Key Topics:**", "Attendees:"), or a line
    that is wholly bold ("**Weekly schedule**")."""
    t = text.strip()
    if t.startswith("#"):
        return True
    t = _LIST_MARK.sub("", t).strip()
    if t.strip("*_ ").endswith(":"):
        return True
    return len(t) > 4 and t[:2] in ("**", "__") and t[-2:] == t[:2] and t[:2] not in t[2:-2]


# a letter or a digit: a line without one ("---", "***", "[…]") states nothing
_STATES = re.compile(r"[^\W_]")


def states_nothing(text: str) -> bool:
    """Whether a span states no fact: a heading or label (:func:`is_heading`), or a line without
    a letter or digit ("---", "***")."""
    return is_heading(text) or not _STATES.search(text)


class Span(BaseModel):
    """One sentence or line of a record. ``start``/``end`` are character offsets into the text."""

    model_config = ConfigDict(frozen=True)

    id: str
    record_id: str
    index: int
    text: str
    start: int
    end: int


def _sentence_cuts(line: str) -> list[int]:
    """Offsets inside ``line`` where a new sentence starts.

    Linear in ``len(line)``: the word before a candidate boundary is looked up in the run of
    ``[A-Za-z.]`` characters that ends there (runs are found once per line), never by re-scanning
    the prefix, so a megabyte-long line with no newline splits as fast as many short ones.
    """
    cuts = []
    run_starts: dict[int, int] | None = None
    for m in _BOUNDARY.finditer(line):
        end = m.start()  # just after the [.!?] that ends the candidate sentence
        if line[end - 1] == ".":
            if run_starts is None:
                run_starts = {r.end(): r.start() for r in _WORD_RUN.finditer(line)}
            start = run_starts.get(end)
            word = _LAST_WORD.search(line, start, end) if start is not None else None
            if word and (word.group(1).lower() in _ABBREVIATIONS or len(word.group(1)) == 1):
                continue  # "Dr. Liu", "J. Smith": not a sentence end
        cuts.append(m.end())
    return cuts


def split_spans(record_id: str, text: str) -> list[Span]:
    """Split ``text`` into sentence/line spans, deterministically.

    Lines are split first (so headers, list items and email fields stay separate), then each
    line into sentences; a very long sentence is cut at whitespace near ``MAX_SPAN_CHARS``.
    Blank lines produce no span. Offsets index into ``text`` so ``text[s.start:s.end] == s.text``.
    """
    pieces: list[tuple[int, int]] = []
    pos = 0
    for raw in text.splitlines(keepends=True):
        line = raw.rstrip("\r\n")
        starts = [0, *_sentence_cuts(line), len(line)]
        for a, b in zip(starts, starts[1:], strict=False):
            seg_a, seg_b = a, b
            while seg_b - seg_a > MAX_SPAN_CHARS:
                cut = line.rfind(" ", seg_a, seg_a + MAX_SPAN_CHARS)
                cut = cut if cut > seg_a else seg_a + MAX_SPAN_CHARS
                pieces.append((pos + seg_a, pos + cut))
                seg_a = cut
            pieces.append((pos + seg_a, pos + seg_b))
        pos += len(raw)
    spans = []
    for a, b in pieces:
        segment = text[a:b]
        stripped = segment.strip()
        if not stripped:
            continue
        a += len(segment) - len(segment.lstrip())
        b = a + len(stripped)
        spans.append(
            Span(
                id=f"{record_id}#{len(spans) + 1}",
                record_id=record_id,
                index=len(spans) + 1,
                text=stripped,
                start=a,
                end=b,
            )
        )
    return spans


def span_record_id(span_id: str) -> str:
    """The record id of a span id ``<record_id>#<n>`` (record ids may themselves contain ``#``)."""
    record_id, sep, n = span_id.rpartition("#")
    if not sep or not n.isdigit():
        raise ValueError(f"not a span id (expected '<record_id>#<n>'): {span_id!r}")
    return record_id


# --------------------------------------------------------------------------------------------
# Records and histories
# --------------------------------------------------------------------------------------------


class Record(BaseModel):
    """One unit of a user's history, as the source gave it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1, description="Unique within a history.")
    kind: str = Field(
        min_length=1, description="conversation_turn, email, document_section, note, ..."
    )
    text: str
    timestamp: datetime | None = None
    author: str | None = Field(default=None, description="Author or speaker.")
    thread_id: str | None = Field(
        default=None, description="Conversation, email thread or document."
    )
    position: int | None = Field(default=None, description="Position within the thread.")
    references: list[str] = Field(
        default_factory=list, description="Ids this record explicitly refers to."
    )
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("id")
    @classmethod
    def _id_has_no_surrounding_space(cls, v: str) -> str:
        if v != v.strip():
            raise ValueError("record id has leading or trailing whitespace")
        return v

    @cached_property
    def spans(self) -> list[Span]:
        return split_spans(self.id, self.text)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Record:
        """A copy; its spans are split again from its own id and text (pydantic copies the cached
        ``spans`` of the original along with the fields, so a copy with a new text kept the old
        text's spans)."""
        copy = super().model_copy(update=update, deep=deep)
        copy.__dict__.pop("spans", None)
        return copy

    @property
    def title(self) -> str | None:
        """Subject, heading or document title, where the source has one."""
        for key in ("subject", "heading", "title"):
            if self.metadata.get(key):
                return str(self.metadata[key])
        return None


def utc_naive(ts: datetime) -> datetime:
    """The one rule for comparing times: a naive timestamp is UTC, and one with an offset is
    converted to UTC; both are then compared as naive UTC. A history may mix the two (sorting,
    ``as_of`` cut-offs, date ranges and question dates all go through here); the record keeps its
    timestamp as given."""
    return ts.astimezone(UTC).replace(tzinfo=None) if ts.tzinfo else ts


def _as_datetime(value: date | datetime | str) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if isinstance(value, datetime):
        return utc_naive(value)
    return datetime(value.year, value.month, value.day)


_naive = utc_naive


class History:
    """One user's records. Immutable; build a new one to change it."""

    def __init__(self, user_id: str, records: Iterable[Record], *, source: str | None = None):
        self.user_id = user_id
        self.source = source
        self._records: tuple[Record, ...] = tuple(records)
        if not self._records:
            raise EmptyHistoryError(
                f"history of user {user_id!r} has no records",
                file=source,
                hint="check the path and format; an empty file or folder gives an empty history",
            )
        self._by_id: dict[str, Record] = {}
        for r in self._records:
            if r.id in self._by_id:
                first = self._by_id[r.id].metadata.get("source")
                second = r.metadata.get("source")
                where = f" (first at {first}, again at {second})" if first or second else ""
                raise DuplicateRecordError(
                    f"duplicate record id {r.id!r}{where}",
                    file=source,
                    record=r.id,
                    hint="record ids must be unique within one history",
                )
            self._by_id[r.id] = r
        self._span_index: dict[str, Span] | None = None
        self._fingerprint: str | None = None

    # -- lookup ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, record_id: object) -> bool:
        return record_id in self._by_id

    def __getitem__(self, record_id: str) -> Record:
        try:
            return self._by_id[record_id]
        except KeyError:
            raise KeyError(f"no record {record_id!r} in the history of {self.user_id!r}") from None

    def get(self, record_id: str) -> Record | None:
        return self._by_id.get(record_id)

    @property
    def records(self) -> tuple[Record, ...]:
        """Records in the order the source gave them."""
        return self._records

    def __iter__(self) -> Iterator[Record]:
        """Records in time order; undated records come last, ties keep source order."""
        order = {r.id: i for i, r in enumerate(self._records)}
        return iter(
            sorted(
                self._records,
                key=lambda r: (
                    r.timestamp is None,
                    _naive(r.timestamp) if r.timestamp else datetime.min,
                    order[r.id],
                ),
            )
        )

    def spans(self) -> Iterator[Span]:
        for r in self._records:
            yield from r.spans

    def span(self, span_id: str) -> Span:
        if self._span_index is None:
            self._span_index = {s.id: s for s in self.spans()}
        try:
            return self._span_index[span_id]
        except KeyError:
            raise KeyError(f"no span {span_id!r} in the history of {self.user_id!r}") from None

    def threads(self) -> dict[str, list[Record]]:
        """Records grouped by thread id, each thread in position (then time) order."""
        groups: dict[str, list[Record]] = {}
        for r in self:
            if r.thread_id is not None:
                groups.setdefault(r.thread_id, []).append(r)
        for recs in groups.values():
            recs.sort(key=lambda r: (r.position is None, r.position or 0))
        return groups

    # -- views -------------------------------------------------------------------------------
    def as_of(
        self, when: date | datetime | str, *, inclusive: bool = True, keep_undated: bool = True
    ) -> History:
        """The history as it stood at ``when``.

        A ``date`` compares with each record's calendar date; a ``datetime`` compares exactly.
        ``inclusive=False`` keeps only records strictly before ``when`` (RHELM's protocol).
        Undated records are kept unless ``keep_undated=False``.
        """
        by_day = isinstance(when, date) and not isinstance(when, datetime)
        if isinstance(when, str):
            by_day = len(when) <= 10
        cutoff = _as_datetime(when)

        def keep(r: Record) -> bool:
            if r.timestamp is None:
                return keep_undated
            ts = _naive(r.timestamp)
            ts = datetime(ts.year, ts.month, ts.day) if by_day else ts
            return ts <= cutoff if inclusive else ts < cutoff

        kept = [r for r in self._records if keep(r)]
        if not kept:
            raise EmptyHistoryError(
                f"no records of {self.user_id!r} as of {when}",
                file=self.source,
                hint="the cut-off date is before the first record",
            )
        return History(self.user_id, kept, source=self.source)

    def filter(self, predicate) -> History:
        return History(self.user_id, [r for r in self._records if predicate(r)], source=self.source)

    # -- identity ----------------------------------------------------------------------------
    @property
    def fingerprint(self) -> str:
        """sha256 (hex, 16 chars) of the records' content, independent of source order and of
        where the files lie (``metadata["source"]``, a file location, is left out), so caches
        keyed by it are shared across checkouts and machines."""
        if self._fingerprint is None:
            h = hashlib.sha256()
            for r in sorted(self._records, key=lambda r: r.id):
                content = r.model_dump(mode="json")
                content["metadata"] = {k: v for k, v in r.metadata.items() if k != "source"}
                h.update(json.dumps(content, sort_keys=True, ensure_ascii=False).encode("utf-8"))
                h.update(b"\n")
            self._fingerprint = h.hexdigest()[:16]
        return self._fingerprint

    def stats(self) -> dict[str, Any]:
        dated = [utc_naive(r.timestamp) for r in self._records if r.timestamp is not None]
        return {
            "user": self.user_id,
            "records": len(self._records),
            "records_by_kind": dict(Counter(r.kind for r in self._records).most_common()),
            # counted without caching every Span object (ingest of a large history stays small)
            "spans": sum(
                len(r.__dict__.get("spans") or split_spans(r.id, r.text)) for r in self._records
            ),
            "threads": len({r.thread_id for r in self._records if r.thread_id is not None}),
            "date_range": [min(dated).isoformat(), max(dated).isoformat()] if dated else None,
            "fingerprint": self.fingerprint,
        }

    def __repr__(self) -> str:
        return f"History(user_id={self.user_id!r}, records={len(self)}, fingerprint={self.fingerprint})"


# --------------------------------------------------------------------------------------------
# QA items
# --------------------------------------------------------------------------------------------


class QAItem(BaseModel):
    """A question with its reference answer and evidence. Official and generated items alike."""

    model_config = ConfigDict(extra="forbid")

    id: str
    question: str = Field(min_length=1)
    answer: str
    answer_type: AnswerType = AnswerType.TEXT
    evidence_ids: list[str] = Field(default_factory=list, description="Evidence record ids.")
    span_ids: list[str] = Field(default_factory=list, description="Cited span ids, where known.")
    question_date: date | None = None
    question_type: str | None = Field(default=None, description="Type or category.")
    source: Literal["official", "generated"] = "official"
    metadata: dict[str, Any] = Field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), ensure_ascii=False)


def check_record_dict(obj: Any, *, file: str | None, line: int | None) -> Record:
    """Validate one raw record object, raising an :class:`InputError` that names the field."""
    if not isinstance(obj, dict):
        raise InputError(f"expected a JSON object, got {type(obj).__name__}", file=file, line=line)
    try:
        return Record.model_validate(obj)
    except Exception as exc:  # pydantic.ValidationError
        errors = getattr(exc, "errors", lambda: [])()
        if errors:
            first = errors[0]
            field = ".".join(str(p) for p in first.get("loc", ())) or None
            raise InputError(
                first.get("msg", str(exc)),
                file=file,
                line=line,
                field=field,
                record=obj.get("id") if isinstance(obj.get("id"), str) else None,
                hint="see the README's 'History formats' section for the record schema",
            ) from None
        raise InputError(str(exc), file=file, line=line) from None
