"""Context_c(retrieved units): the answerer's context, inside a fixed token budget.

Units are ordered (rank / chronological / grouped by thread), each record's content is written with
a header (id, date, author, kind as the design asks), a record already delivered is not repeated
(``dedupe``), and the text stops at the budget, counted with the real ``cl100k`` tokenizer. The
result says which records' content actually reached the answerer: a record counts as delivered
when its whole content, or at least ``MIN_DELIVERED_TOKENS`` of it, is in the context.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memsteer_dspy.memory.design import ContextSpec
from memsteer_dspy.memory.store import MemoryStore, UnitPart, render_date
from memsteer_dspy.tokens import count_tokens, truncate_to_tokens

MIN_DELIVERED_TOKENS = 32
UNIT_SEPARATOR = "\n\n"


@dataclass
class BuiltContext:
    """The context handed to the answerer and what it holds."""

    text: str
    tokens: int
    delivered_record_ids: list[str] = field(default_factory=list)
    delivered_unit_ids: list[str] = field(default_factory=list)
    truncated: bool = False

    @property
    def empty(self) -> bool:
        return not self.text


class ContextBuilder:
    """Assembles retrieved units into the answerer's context under one design's context settings."""

    def __init__(self, spec: ContextSpec, store: MemoryStore):
        self.spec = spec
        self.store = store

    # -- ordering -----------------------------------------------------------------------------
    def order(self, ranked: list[int], cutoff_day: int | None) -> list[int]:
        units = self.store.units

        def day(i: int) -> float:
            days = [p.day for p in units[i].visible_parts(cutoff_day) if p.day is not None]
            return min(days) if days else float("inf")  # undated after dated ones

        if self.spec.order == "rank":
            return list(ranked)
        if self.spec.order == "chronological":
            return sorted(ranked, key=lambda i: (day(i), ranked.index(i)))
        groups: dict[str | None, list[int]] = {}
        for i in ranked:
            key = units[i].thread_id if units[i].thread_id is not None else f"\0{i}"
            groups.setdefault(key, []).append(i)
        out = []
        for members in groups.values():
            out.extend(sorted(members, key=lambda i: (day(i), i)))
        return out

    # -- formatting ---------------------------------------------------------------------------
    def header(self, part: UnitPart, unit_kind: str) -> str:
        spec = self.spec
        history = self.store.history
        bits = []
        if unit_kind == "facts":
            if spec.show_ids:
                bits.append("fact from " + ", ".join(part.record_ids))
            rec = history.get(part.record_ids[0])
        else:
            rec = history.get(part.record_ids[0])
            if spec.show_ids:
                bits.append(part.record_ids[0])
        if rec is not None:
            if spec.show_dates and (d := render_date(rec.timestamp, "iso")):
                bits.append(d)
            if spec.show_author and rec.author:
                bits.append(rec.author)
            if spec.show_kind:
                bits.append(rec.kind)
        return f"[{' | '.join(bits)}]" if bits else ""

    def render_part(self, part: UnitPart, unit_kind: str) -> tuple[str, str]:
        """(header line, content) of one part."""
        return self.header(part, unit_kind), part.text.strip()

    # -- building -----------------------------------------------------------------------------
    def __call__(self, ranked: list[int], cutoff_day: int | None = None) -> BuiltContext:
        spec = self.spec
        budget = spec.budget_tokens
        used = 0
        blocks: list[str] = []
        delivered: dict[str, None] = {}
        delivered_units: dict[str, None] = {}
        seen_facts: set[str] = set()
        truncated = False
        for i in self.order(ranked, cutoff_day):
            unit = self.store.units[i]
            lines: list[str] = []
            unit_records: list[str] = []
            full = True
            for part in unit.visible_parts(cutoff_day):
                if spec.dedupe:
                    if unit.kind == "facts":
                        if part.text in seen_facts:
                            continue
                        seen_facts.add(part.text)
                    elif all(r in delivered for r in part.record_ids):
                        continue
                head, body = self.render_part(part, unit.kind)
                piece = f"{head}\n{body}" if head else body
                sep = UNIT_SEPARATOR if (blocks or lines) else ""
                n = count_tokens(sep + piece) if sep else count_tokens(piece)
                if used + n <= budget:
                    lines.append(piece)
                    used += n
                    unit_records.extend(part.record_ids)
                    continue
                full = False
                room = (
                    budget - used - count_tokens(sep + head + "\n")
                    if head
                    else budget - used - count_tokens(sep)
                )
                if (
                    spec.truncate_last
                    and room >= min(MIN_DELIVERED_TOKENS, count_tokens(body))
                    and room > 0
                ):
                    cut = truncate_to_tokens(body, room)
                    lines.append(f"{head}\n{cut}" if head else cut)
                    used = budget
                    truncated = True
                    if count_tokens(cut) >= min(MIN_DELIVERED_TOKENS, count_tokens(body)):
                        unit_records.extend(part.record_ids)
                break
            if lines:
                blocks.append(UNIT_SEPARATOR.join(lines))
                delivered_units.setdefault(unit.id, None)
                for r in unit_records:
                    delivered.setdefault(r, None)
            if not full:
                break
        text = UNIT_SEPARATOR.join(blocks)
        tokens = count_tokens(text)
        if tokens > budget:  # token counts are not exactly additive across joins: enforce exactly
            text = truncate_to_tokens(text, budget)
            tokens = count_tokens(text)
            truncated = True
        return BuiltContext(text, tokens, list(delivered), list(delivered_units), truncated)
