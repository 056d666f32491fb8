"""What a bundle is: its records (:class:`BundleRecord`), the bundle itself (:class:`Bundle`) and
its rendering as quoted data, span labels resolved by :class:`BundleView`, and a planned
:class:`Candidate`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

from memsteer_dspy.bundles.config import Task
from memsteer_dspy.records import Span
from memsteer_dspy.tokens import count_tokens


class BundleRecord(BaseModel):
    """One record of a bundle: its identity, provenance fields and the spans it shows."""

    id: str
    kind: str
    date: str | None = None
    author: str | None = None
    thread_id: str | None = None
    title: str | None = None
    spans: list[Span]
    truncated: bool = False

    def render(self, label: str | None = None) -> str:
        """The record as quoted lines: a header, then ``[<label>.<n>] text`` per span (with no
        ``label``, the full span ids)."""
        head = [self.kind]
        if self.date:
            head.append(self.date)
        if self.author:
            head.append(f"by {self.author}")
        if self.title:
            head.append(f"title: {self.title}")
        name = label or self.id
        lines = [f"### {name} ({'; '.join(head)})"]
        lines += [f"[{f'{label}.{s.index}' if label else s.id}] {s.text}" for s in self.spans]
        if self.truncated:
            lines.append("[…]")
        return "\n".join(lines)


_LABEL = re.compile(r"^\[?\s*R\s*(\d+)\s*(?:[.#:]\s*(?:S\s*)?(\d+))?\s*\]?$", re.I)


@dataclass(frozen=True)
class BundleView:
    """A bundle rendered for an LLM role: records in a given order, labelled ``R1``, ``R2``, …
    and spans ``R1.1``, ``R1.2``, … (short labels a small LM copies reliably), with the maps back
    to record and span ids."""

    text: str
    record_labels: dict[str, str]  # label -> record id
    span_ids: frozenset[str]

    def label_of(self, record_id: str) -> str | None:
        return next((lab for lab, rid in self.record_labels.items() if rid == record_id), None)

    def span_label(self, span_id: str) -> str:
        record_id, _, n = span_id.rpartition("#")
        label = self.label_of(record_id)
        return f"{label}.{n}" if label else span_id

    def resolve_span(self, ref: str) -> str | None:
        """The span id a label (``R2.3``) or a full span id names; None if it names none."""
        ref = str(ref).strip().strip("[]").strip()
        if ref in self.span_ids:
            return ref
        m = _LABEL.match(ref)
        if m and m.group(2) and f"R{m.group(1)}" in self.record_labels:
            span_id = f"{self.record_labels[f'R{m.group(1)}']}#{int(m.group(2))}"
            return span_id if span_id in self.span_ids else None
        return None

    def resolve_record(self, ref: str) -> str | None:
        """The record id a label (``R2``, or a span label ``R2.3``) or a full id names."""
        ref = str(ref).strip().strip("[]").strip()
        if ref in self.record_labels.values():
            return ref
        m = _LABEL.match(ref)
        if m and f"R{m.group(1)}" in self.record_labels:
            return self.record_labels[f"R{m.group(1)}"]
        span = self.resolve_span(ref)
        return span.rpartition("#")[0] if span else None


class Bundle(BaseModel):
    """A context-budgeted material bundle: connected records with span ids."""

    id: str
    seed_id: str
    method: Literal["graph", "random", "given"] = "graph"
    records: list[BundleRecord]
    path: list[tuple[str, str, str]] = Field(
        default_factory=list, description="(from, to, edge type) walked."
    )
    tokens: int = 0

    @property
    def record_ids(self) -> list[str]:
        return [r.id for r in self.records]

    def record(self, record_id: str) -> BundleRecord | None:
        return next((r for r in self.records if r.id == record_id), None)

    def spans(self) -> list[Span]:
        return [s for r in self.records for s in r.spans]

    def span(self, span_id: str) -> Span | None:
        return next((s for s in self.spans() if s.id == span_id), None)

    def render(self, order: Sequence[str] | None = None) -> str:
        """The records as quoted data with full span ids, in ``order`` (record ids) or bundle order."""
        recs = self.records if order is None else [self.record(i) for i in order if self.record(i)]
        return "\n\n".join(r.render() for r in recs)

    def view(self, order: Sequence[str] | None = None) -> BundleView:
        """The records labelled ``R1``… in ``order`` (record ids; default bundle order)."""
        recs = self.records if order is None else [r for i in order if (r := self.record(i))]
        labels = {f"R{i}": r.id for i, r in enumerate(recs, 1)}
        text = "\n\n".join(r.render(f"R{i}") for i, r in enumerate(recs, 1))
        return BundleView(
            text=text, record_labels=labels, span_ids=frozenset(s.id for r in recs for s in r.spans)
        )

    def subset(self, record_ids: Iterable[str]) -> Bundle:
        keep = set(record_ids)
        recs = [r for r in self.records if r.id in keep]
        return self.model_copy(update={"records": recs, "tokens": _render_tokens(recs)})


class Candidate(BaseModel):
    """One planned candidate of a run: its index, seed, task and bundle (or why it was skipped)."""

    index: int
    seed_id: str
    task: Task
    bundle: Bundle | None = None
    skip_reason: str | None = None


def _render_tokens(records: Sequence[BundleRecord]) -> int:
    """Tokens of the records as an LLM role reads them (labelled ``R1``, ``R2``, …)."""
    return count_tokens("\n\n".join(r.render(f"R{i}") for i, r in enumerate(records, 1)))
