"""A memory system that is not a :class:`~memsteer_dspy.memory.MemoryDesign`, measured like one.

:class:`ExternalSystem` is what every adapter (a third-party memory package, the gold-evidence
oracle) subclasses. It answers the three things evaluation asks of a memory system —
``retrieve(question, question_date, as_of)`` returning a :class:`~memsteer_dspy.memory.MemoryTrace`,
``system(question, ...)`` answering with the project's fixed answerer, and a ``design``-like
identity (:class:`SystemCard`) — so :func:`~memsteer_dspy.evaluation.evaluate_design` scores it
exactly as it scores our designs: R@k over the ranked record ids, delivered recall over the records
whose content reached the answerer.

A subclass implements one method, :meth:`ExternalSystem.search`: ranked groups of record ids
(one group per hit of the system: a drawer, a memory, a chunk) for a question. The hard cut-off of
the evaluation protocol (``as_of``) is applied here, after the system ranked: a hit whose records
are all dated on or after the cut-off is dropped, so no system sees the future, whether or not its
package can filter by date. By default the hits' records are written into the answerer's context
by the same :class:`~memsteer_dspy.memory.context.ContextBuilder` our designs use (record headers,
de-duplication, the token budget); a system that builds its own context (Mem0's memories)
overrides :meth:`ExternalSystem.build_context`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dspy
from pydantic import BaseModel, ConfigDict, Field

from memsteer_dspy.errors import ConfigError
from memsteer_dspy.memory.answer import MemoryAnswerer
from memsteer_dspy.memory.context import BuiltContext, ContextBuilder
from memsteer_dspy.memory.design import ContextSpec, MemoryDesign, _digest
from memsteer_dspy.memory.retriever import as_day, date_text
from memsteer_dspy.memory.store import MemoryStore
from memsteer_dspy.memory.system import MemorySystem, MemoryTrace
from memsteer_dspy.records import History


class SystemCard(BaseModel):
    """The identity of a system that is not a design: what evaluation keys its results by.

    Duck-types the parts of :class:`~memsteer_dspy.memory.MemoryDesign` evaluation reads
    (``name``, ``key()``, ``lm_uses()``, ``to_json()``), so run folders and per-item results of an
    external system never collide with a design's."""

    model_config = ConfigDict(frozen=True)

    name: str
    system: str = Field(description="Which system: 'oracle', 'mempalace', 'mem0', ...")
    params: dict[str, Any] = Field(
        default_factory=dict, description="Everything that changes its results."
    )
    lm_parts: list[str] = Field(
        default_factory=list, description="What of the system, besides answering, calls an LM."
    )

    def key(self) -> str:
        return _digest({"system": self.system, "params": self.params})

    def lm_uses(self, *, answering: bool = True) -> list[str]:
        return [*self.lm_parts, *(["answer"] if answering else [])]

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)


@dataclass
class Hit:
    """One result of a system's own search: the records behind it, best first, and its score."""

    record_ids: list[str]
    score: float = 0.0
    text: str | None = None  # the system's own text for the hit (a memory), when it has one


def record_store(history: History, cache_dir: str | Path | None = None) -> MemoryStore:
    """Base-BM25's record units of ``history`` (one unit per record), loaded from or saved to the
    index cache: what the default context builder renders an external system's hits with."""
    info: dict[str, Any] = {}
    return MemorySystem._open_store(MemoryDesign.base_bm25(), history, cache_dir, None, 1, info)


class ExternalSystem(dspy.Module):
    """A memory system scored like a design; subclasses implement :meth:`search`."""

    #: how many hits to ask the system for before the cut-off drops later ones
    pool: int = 50

    def __init__(
        self,
        card: SystemCard,
        history: History,
        *,
        store: MemoryStore | None = None,
        context: ContextSpec | None = None,
        top_k: int = 20,
        answerer_lm: Any = None,
        cache_dir: str | Path | None = None,
    ):
        super().__init__()
        self.design = card  # what evaluation reads as the system's identity
        self.user_history = history
        self.top_k = top_k
        self.context_spec = context or ContextSpec()
        self.store = store or record_store(history, cache_dir)
        self.context_builder = ContextBuilder(self.context_spec, self.store)
        self.answerer = MemoryAnswerer(answerer_lm)
        self.build_info: dict[str, Any] = {"system": card.system}

    # -- the one method an adapter writes -----------------------------------------------------
    def search(self, question: str, question_date: Any, n: int) -> list[Hit]:
        """The system's own ranking for ``question``: up to ``n`` hits, best first."""
        raise NotImplementedError

    # -- shared -------------------------------------------------------------------------------
    def _visible(self, rid: str, cutoff: int | None) -> bool:
        rec = self.user_history.get(rid)
        if rec is None:
            return False
        if cutoff is None or rec.timestamp is None:
            return True
        return as_day(rec.timestamp) < cutoff

    def build_context(self, hits: list[Hit], cutoff: int | None) -> BuiltContext:
        """The answerer's context from the hits (default: their records, as our designs render
        them, in the hits' order, under the context budget)."""
        units: list[int] = []
        for h in hits:
            for rid in h.record_ids:
                for i in self.store.units_of_record.get(rid, [])[:1]:
                    if i not in units:
                        units.append(i)
        return self.context_builder(units, cutoff)

    def retrieve(self, question: str, question_date=None, as_of=None) -> MemoryTrace:
        cutoff = as_day(as_of)
        hits: list[Hit] = []
        seen: set[str] = set()
        for h in self.search(question, question_date, max(self.pool, self.top_k)):
            ids = [r for r in dict.fromkeys(h.record_ids) if self._visible(r, cutoff)]
            if not ids or (h.text is None and seen.issuperset(ids)):
                continue  # a later chunk of a record already ranked adds nothing
            hits.append(Hit(ids, h.score, h.text))
            seen.update(ids)
            if len(hits) >= self.top_k:
                break
        built = self.build_context(hits, cutoff)
        from datetime import date

        return MemoryTrace(
            question=question,
            question_date=date_text(question_date) if question_date is not None else None,
            cutoff=date.fromordinal(cutoff).isoformat() if cutoff is not None else None,
            queries=[question],
            ranked_unit_ids=[f"hit-{i}" for i in range(len(hits))],
            ranked_record_ids=[h.record_ids for h in hits],
            scores=[float(h.score) for h in hits],
            delivered_unit_ids=built.delivered_unit_ids,
            delivered_record_ids=built.delivered_record_ids,
            context=built.text,
            context_tokens=built.tokens,
            context_truncated=built.truncated,
            empty_context=built.empty,
        )

    def forward(self, question: str, question_date=None, as_of=None) -> dspy.Prediction:
        """Answer from the system's context with the project's fixed answerer."""
        if self.answerer.lm is None:
            raise ConfigError(
                "answering needs an LM for the answerer role: pass answerer_lm=<dspy LM>, "
                "or evaluate with metrics='recall'"
            )
        trace = self.retrieve(question, question_date=question_date, as_of=as_of)
        out = self.answerer(
            question=question, question_date=date_text(question_date), context=trace.context
        )
        trace.draft_answer = trace.answer = out.answer
        return dspy.Prediction(answer=out.answer, trace=trace)
