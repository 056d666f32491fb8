"""Memory lookup for failure diagnosis: is a record's content in the memory, and can it be found?

MemSteer-Opt labels a failure a *storage* failure when a missing evidence record cannot be
recovered from the memory, and a *retrieval* failure when it can but was not delivered (paper,
Section 3.3). :func:`lookup_record` answers the two questions for one record id:

* **stored** — which memory units hold the record's content (under a ``facts`` store, the facts
  that cite it; a record the extractor produced no fact for is not stored);
* **retrievable** — whether one of those units ranks within the design's candidate pool when the
  index is searched with the record's own text (its first ``PROBE_TOKENS`` tokens, no LM), under
  the same time cut-off; and, given the question, the rank its best unit gets for that question.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, Field

from memsteer_dspy.tokens import truncate_to_tokens

PROBE_TOKENS = 64


class RecordLookup(BaseModel):
    """Where one record stands in a memory system."""

    record_id: str
    in_history: bool
    stored: bool = Field(description="Some memory unit holds the record's content.")
    unit_ids: list[str] = Field(default_factory=list, description="Units that hold it.")
    visible: bool = Field(
        True, description="Dated before the cut-off, so retrievable under the time filter."
    )
    retrievable: bool = Field(
        description="A unit holding it ranks within the candidate pool for its own text."
    )
    self_rank: int | None = Field(
        None, description="Best rank (from 1) of its units for its own text."
    )
    question_rank: int | None = Field(
        None, description="Best rank of its units for the question, if given."
    )
    pool: int = 0

    def summary(self) -> str:
        if not self.in_history:
            return f"{self.record_id}: not in the history"
        if not self.stored:
            return f"{self.record_id}: not stored in any memory unit"
        if not self.visible:
            return f"{self.record_id}: stored in {len(self.unit_ids)} unit(s) but dated on/after the cut-off"
        where = (
            f"rank {self.self_rank} for its own text"
            if self.self_rank
            else "not found by its own text"
        )
        q = f"; rank {self.question_rank} for the question" if self.question_rank else ""
        return f"{self.record_id}: stored in {len(self.unit_ids)} unit(s), {where} (pool {self.pool}){q}"


def _best_rank(ranked: list[int], targets: set[int]) -> int | None:
    for r, i in enumerate(ranked, start=1):
        if i in targets:
            return r
    return None


class Searchable(Protocol):
    """What a lookup reads of a memory system (a :class:`~memsteer_dspy.memory.system.MemorySystem`):
    its store, its retriever and the history it was built from. A protocol, so that the system can
    import this module and not the other way round."""

    store: Any
    retriever: Any
    user_history: Any


def lookup_record(
    system: Searchable,
    record_id: str,
    *,
    question: str | None = None,
    question_date=None,
    as_of=None,
) -> RecordLookup:
    """Where ``record_id`` stands in ``system``'s memory (see the module docstring)."""
    store = system.store
    retriever = system.retriever
    pool = retriever.spec.pool
    record = system.user_history.get(record_id)
    units = store.units_of_record.get(record_id, [])
    base = {
        "record_id": record_id,
        "in_history": record is not None,
        "pool": pool,
        "unit_ids": [store.units[i].id for i in units],
        "stored": bool(units),
    }
    if record is None or not units:
        return RecordLookup(**base, retrievable=False)
    cutoff = retriever.cutoff_day(question_date, as_of)
    mask = store.mask(cutoff)
    visible_units = {
        i
        for i in units
        if any(record_id in p.record_ids for p in store.units[i].visible_parts(cutoff))
    }
    if not visible_units:
        return RecordLookup(**base, visible=False, retrievable=False)
    probe = truncate_to_tokens(record.text, PROBE_TOKENS) or record.text
    ranked, _ = retriever.index.search(probe, pool, mask)
    self_rank = _best_rank(ranked, visible_units)
    question_rank = None
    if question:
        ranked_q, _ = retriever.index.search(question, pool, mask)
        question_rank = _best_rank(ranked_q, visible_units)
    return RecordLookup(
        **base, retrievable=self_rank is not None, self_rank=self_rank, question_rank=question_rank
    )
