"""The memory M_d = Store_s(H): the user's records organised into memory units.

A :class:`MemoryUnit` is what the index ranks. It is made of :class:`UnitPart` s, each the content
of one record (or, for extracted facts, one fact with its source records), so that

* recall@k can walk a unit's records in order,
* the context builder knows which records' content it actually delivers, and
* a time filter can drop the parts of records dated on or after the question date without
  rebuilding anything (each part carries its day).

The store is a pure function of (history, store parameters, fact extractor) and saves to a folder
(``units.jsonl`` + ``meta.json``) keyed by the History fingerprint and the store key.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

import numpy as np

from memsteer_dspy.memory.design import StoreSpec
from memsteer_dspy.records import History, Record, utc_naive
from memsteer_dspy.tokens import count_tokens

# The day of an undated part: always visible under a time filter (as History.as_of keeps them).
UNDATED = np.iinfo(np.int64).min

FactExtractor = Callable[[list[Record]], list[tuple[str, list[str]]]]


@dataclass(frozen=True, slots=True)
class UnitPart:
    """The content of one record inside a unit (or one fact with its source records)."""

    record_ids: tuple[str, ...]
    text: str
    day: int | None  # date.toordinal() of the latest source record; None when undated

    def to_dict(self) -> dict[str, Any]:
        return {"record_ids": list(self.record_ids), "text": self.text, "day": self.day}


@dataclass(frozen=True, slots=True)
class MemoryUnit:
    """One memory unit: what the index ranks and the context builder delivers."""

    id: str
    kind: str
    parts: tuple[UnitPart, ...]
    index_text: str
    thread_id: str | None = None

    @property
    def record_ids(self) -> list[str]:
        """The unit's records, in order, each once."""
        seen: dict[str, None] = {}
        for p in self.parts:
            for rid in p.record_ids:
                seen.setdefault(rid, None)
        return list(seen)

    @property
    def first_day(self) -> int:
        days = [p.day for p in self.parts]
        return UNDATED if any(d is None for d in days) else min(days)  # type: ignore[type-var]

    def visible_parts(self, cutoff_day: int | None) -> list[UnitPart]:
        """Parts whose records are dated strictly before ``cutoff_day`` (all when None)."""
        if cutoff_day is None:
            return list(self.parts)
        return [p for p in self.parts if p.day is None or p.day < cutoff_day]

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "thread_id": self.thread_id,
            "index_text": self.index_text,
            "parts": [p.to_dict() for p in self.parts],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemoryUnit:
        parts = tuple(UnitPart(tuple(p["record_ids"]), p["text"], p["day"]) for p in d["parts"])
        return cls(d["id"], d["kind"], parts, d["index_text"], d.get("thread_id"))


@dataclass
class StoreReport:
    """What building the store did: units made, records not stored, extraction failures."""

    units: int = 0
    records: int = 0
    records_stored: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)
    built_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "units": self.units,
            "records": self.records,
            "records_stored": self.records_stored,
            "failures": self.failures,
            "built_seconds": round(self.built_seconds, 3),
        }


# --------------------------------------------------------------------------------------------
# rendering records into indexed text
# --------------------------------------------------------------------------------------------


def record_day(record: Record) -> int | None:
    # the day History.as_of compares (records.utc_naive: naive = UTC, offsets converted)
    return utc_naive(record.timestamp).date().toordinal() if record.timestamp is not None else None


def render_date(ts: datetime | date | None, fmt: str) -> str | None:
    if ts is None or fmt == "none":
        return None
    if fmt == "long":
        return f"{ts:%A} {ts.day} {ts:%B %Y}"
    return ts.date().isoformat() if isinstance(ts, datetime) else ts.isoformat()


def thread_title(record: Record) -> str | None:
    """The title of the record's thread or document, where the source gives one."""
    for key in ("thread_title", "document_title", "document", "file"):
        if record.metadata.get(key):
            return str(record.metadata[key])
    return record.thread_id


def render_indexed(record: Record, spec: StoreSpec, text: str | None = None) -> str:
    """The indexed text of one record: the chosen metadata fields, then the text."""
    lines = []
    fields = set(spec.fields)
    if "date" in fields and (d := render_date(record.timestamp, spec.date_format)):
        lines.append(d)
    if "kind" in fields:
        lines.append(record.kind.replace("_", " "))
    if "author" in fields and record.author:
        lines.append(record.author)
    if "thread_title" in fields and (t := thread_title(record)):
        lines.append(t)
    if "subject" in fields and record.title:
        lines.append(record.title)
    lines.append(record.text if text is None else text)
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# building units
# --------------------------------------------------------------------------------------------


def _record_part(r: Record) -> UnitPart:
    return UnitPart((r.id,), r.text, record_day(r))


def _sequences(history: History) -> list[tuple[str | None, list[Record]]]:
    """Threads in time order of their first record, each in position order; records without a
    thread are each a sequence of their own."""
    threads = history.threads()
    seen_threads: set[str] = set()
    out: list[tuple[str | None, list[Record]]] = []
    for r in history:  # time order
        if r.thread_id is None:
            out.append((None, [r]))
        elif r.thread_id not in seen_threads:
            seen_threads.add(r.thread_id)
            out.append((r.thread_id, threads[r.thread_id]))
    return out


def _window_units(history: History, spec: StoreSpec) -> list[MemoryUnit]:
    units = []
    size, stride = spec.window_size, spec.window_stride
    for thread_id, recs in _sequences(history):
        if thread_id is None or len(recs) <= size:
            starts = [0]
        else:
            starts = list(range(0, len(recs) - size + 1, stride))
            if starts[-1] + size < len(recs):
                starts.append(len(recs) - size)
        for s in starts:
            chunk = recs[s : s + size]
            uid = chunk[0].id if thread_id is None else f"{thread_id}[{s}:{s + len(chunk)}]"
            units.append(
                MemoryUnit(
                    uid,
                    "window",
                    tuple(_record_part(r) for r in chunk),
                    "\n\n".join(render_indexed(r, spec) for r in chunk),
                    thread_id,
                )
            )
    return units


def _thread_units(history: History, spec: StoreSpec) -> list[MemoryUnit]:
    units = []
    for thread_id, recs in _sequences(history):
        uid = recs[0].id if thread_id is None else f"thread:{thread_id}"
        units.append(
            MemoryUnit(
                uid,
                "thread",
                tuple(_record_part(r) for r in recs),
                "\n\n".join(render_indexed(r, spec) for r in recs),
                thread_id,
            )
        )
    return units


def _section_starts(tokens: Sequence[int], headings: Sequence[bool], max_tokens: int) -> list[int]:
    """The span indices where :func:`split_sections` starts a piece (always 0): at a markdown
    heading, and wherever a piece would pass ``max_tokens``."""
    starts = [0]
    used = tokens[0]
    for i in range(1, len(tokens)):
        if headings[i] or used + tokens[i] > max_tokens:
            starts.append(i)
            used = 0
        used += tokens[i]
    return starts


def split_sections(record: Record, max_tokens: int) -> list[str]:
    """Cut a record at markdown headings and wherever a piece would pass ``max_tokens``; pieces
    are runs of whole spans (lines/sentences) of the record text."""
    spans = record.spans
    if not spans:
        return [record.text] if record.text.strip() else []
    starts = _section_starts(
        [count_tokens(s.text) for s in spans], [s.text.startswith("#") for s in spans], max_tokens
    )
    ends = [*starts[1:], len(spans)]
    return [
        record.text[spans[a].start : spans[b - 1].end] for a, b in zip(starts, ends, strict=True)
    ]


# span token counts and heading flags per record, by history fingerprint (the last few histories)
_SPAN_STATS: dict[str, list[tuple[list[int], list[bool]] | None]] = {}


def unit_count(history: History, spec: StoreSpec) -> int | None:
    """How many memory units ``spec`` makes of ``history``, without rendering them (a dense index
    embeds one vector per unit); None for LM-built fact units, which cannot be counted before."""
    if spec.unit == "facts":
        return None
    if spec.unit == "record":
        return len(history)
    if spec.unit != "section":
        return len(build_units(history, spec))
    fp = history.fingerprint
    if fp not in _SPAN_STATS:
        while len(_SPAN_STATS) >= 4:
            _SPAN_STATS.pop(next(iter(_SPAN_STATS)))
        _SPAN_STATS[fp] = [
            ([count_tokens(s.text) for s in r.spans], [s.text.startswith("#") for s in r.spans])
            if r.spans
            else None
            for r in history
        ]
    n = 0
    for r, stats in zip(history, _SPAN_STATS[fp], strict=True):
        if stats is None:
            n += 1 if r.text.strip() else 0
        else:
            n += len(_section_starts(*stats, spec.section_max_tokens))
    return n


def _section_units(history: History, spec: StoreSpec) -> list[MemoryUnit]:
    units = []
    for r in history:
        pieces = split_sections(r, spec.section_max_tokens)
        for i, piece in enumerate(pieces, start=1):
            uid = r.id if len(pieces) == 1 else f"{r.id}§{i}"
            units.append(
                MemoryUnit(
                    uid,
                    "section",
                    (UnitPart((r.id,), piece, record_day(r)),),
                    render_indexed(r, spec, piece),
                    r.thread_id,
                )
            )
    return units


def _fact_units(
    history: History, spec: StoreSpec, extract: FactExtractor, threads: int, report: StoreReport
) -> list[MemoryUnit]:
    batches: list[list[Record]] = []
    for _thread_id, recs in _sequences(history):
        for i in range(0, len(recs), spec.facts_batch):
            batches.append(recs[i : i + spec.facts_batch])

    def run(
        batch: list[Record],
    ) -> tuple[list[Record], list[tuple[str, list[str]]] | None, str | None]:
        try:
            return batch, extract(batch), None
        except Exception as exc:  # one failed batch never stops the build
            return batch, None, f"{type(exc).__name__}: {exc}"

    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        results = list(pool.map(run, batches))

    units: list[MemoryUnit] = []
    n = 0
    for batch, facts, error in results:
        ids = {r.id for r in batch}
        if facts is None:
            # keep the records' content reachable: they become record units, and the failure is reported
            report.failures.append({"record_ids": [r.id for r in batch], "reason": error})
            for r in batch:
                units.append(
                    MemoryUnit(
                        r.id, "record", (_record_part(r),), render_indexed(r, spec), r.thread_id
                    )
                )
            continue
        per_record: dict[str, int] = {}
        for text, sources in facts:
            src = [s for s in dict.fromkeys(sources) if s in ids]
            text = (text or "").strip()
            if not text or not src:
                continue
            if any(per_record.get(s, 0) >= spec.max_facts_per_record for s in src):
                continue
            for s in src:
                per_record[s] = per_record.get(s, 0) + 1
            recs = [history[s] for s in src]
            days = [d for d in (record_day(r) for r in recs) if d is not None]
            n += 1
            head = recs[0]
            header = render_indexed(head, spec, text)
            units.append(
                MemoryUnit(
                    f"fact:{n}",
                    "facts",
                    (UnitPart(tuple(src), text, max(days) if days else None),),
                    header,
                    head.thread_id,
                )
            )
    return units


def build_units(
    history: History,
    spec: StoreSpec,
    *,
    extract_facts: FactExtractor | None = None,
    threads: int = 1,
    report: StoreReport | None = None,
) -> list[MemoryUnit]:
    """Store_s(H): the memory units of ``history`` under the store parameters ``spec``."""
    report = report if report is not None else StoreReport()
    if spec.unit == "record":
        units = [
            MemoryUnit(r.id, "record", (_record_part(r),), render_indexed(r, spec), r.thread_id)
            for r in history
        ]
    elif spec.unit == "window":
        units = _window_units(history, spec)
    elif spec.unit == "thread":
        units = _thread_units(history, spec)
    elif spec.unit == "section":
        units = _section_units(history, spec)
    elif spec.unit == "facts":
        if extract_facts is None:
            raise ValueError(
                "store.unit 'facts' needs a fact extractor (an LM for the answerer role)"
            )
        units = _fact_units(history, spec, extract_facts, threads, report)
    else:  # pragma: no cover - the design validates the literal
        raise ValueError(f"unknown memory unit {spec.unit!r}")
    return units


# --------------------------------------------------------------------------------------------
# the store
# --------------------------------------------------------------------------------------------


class MemoryStore:
    """The memory units of one history under one store design, with the lookups the retriever,
    context builder and failure diagnosis need."""

    def __init__(
        self, history: History, spec: StoreSpec, units: Sequence[MemoryUnit], report: StoreReport
    ):
        self.history = history
        self.spec = spec
        self.units: list[MemoryUnit] = list(units)
        self.report = report
        self.index_of: dict[str, int] = {u.id: i for i, u in enumerate(self.units)}
        self.units_of_record: dict[str, list[int]] = {}
        for i, u in enumerate(self.units):
            for rid in u.record_ids:
                self.units_of_record.setdefault(rid, []).append(i)
        self.first_day = np.array([u.first_day for u in self.units], dtype=np.int64)
        # neighbours in a thread, in the order units were built (thread position order)
        self._thread_units: dict[str, list[int]] = {}
        for i, u in enumerate(self.units):
            if u.thread_id is not None:
                self._thread_units.setdefault(u.thread_id, []).append(i)
        self._pos_in_thread = {
            i: p for idxs in self._thread_units.values() for p, i in enumerate(idxs)
        }
        report.units = len(self.units)
        report.records = len(history)
        report.records_stored = len(self.units_of_record)

    def __len__(self) -> int:
        return len(self.units)

    def texts(self) -> list[str]:
        return [u.index_text for u in self.units]

    def mask(self, cutoff_day: int | None) -> np.ndarray | None:
        """Which units have content dated strictly before ``cutoff_day`` (None: all)."""
        if cutoff_day is None:
            return None
        return self.first_day < cutoff_day

    def neighbours(self, i: int, n: int) -> list[int]:
        """Up to ``n`` units on each side of unit ``i`` in its thread, nearest first."""
        u = self.units[i]
        if n <= 0 or u.thread_id is None:
            return []
        idxs = self._thread_units[u.thread_id]
        p = self._pos_in_thread[i]
        out = []
        for d in range(1, n + 1):
            for q in (p - d, p + d):
                if 0 <= q < len(idxs):
                    out.append(idxs[q])
        return out

    # -- persistence ------------------------------------------------------------------------
    def save(self, folder: str | Path, *, key: str) -> None:
        """Write ``units.jsonl`` and ``meta.json`` atomically into ``folder``."""
        folder = Path(folder)
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=folder.parent))
        with open(tmp / "units.jsonl", "w", encoding="utf-8") as f:
            for u in self.units:
                f.write(json.dumps(u.to_dict(), ensure_ascii=False) + "\n")
        meta = {
            "history_fingerprint": self.history.fingerprint,
            "store_key": key,
            "store": self.spec.model_dump(mode="json"),
            "report": self.report.to_dict(),
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
        _replace_dir(tmp, folder)

    @classmethod
    def load(cls, folder: str | Path, history: History, spec: StoreSpec) -> MemoryStore | None:
        """The saved store in ``folder`` if it is complete and belongs to ``history``; else None."""
        folder = Path(folder)
        try:
            meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
            if meta.get("history_fingerprint") != history.fingerprint:
                return None
            with open(folder / "units.jsonl", encoding="utf-8") as f:
                units = [MemoryUnit.from_dict(json.loads(line)) for line in f if line.strip()]
        except (OSError, ValueError, KeyError):
            return None
        rep = meta.get("report", {})
        report = StoreReport(
            failures=rep.get("failures", []), built_seconds=rep.get("built_seconds", 0.0)
        )
        return cls(history, spec, units, report)


def _replace_dir(tmp: Path, folder: Path) -> None:
    """Move the finished ``tmp`` folder to ``folder`` (another process may have won the race)."""
    try:
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
