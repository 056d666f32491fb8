"""The Oracle row: each question's gold evidence records as the answerer's context.

An **upper bound**, not a memory system: it reads the answer key (the QA items' evidence ids) to
decide what to deliver, so its recall is 1 wherever the evidence resolves to records visible at the
question date, and its accuracy is what the fixed answerer reaches when retrieval is perfect (the
paper's "Oracle (gold evidence)" row). The evidence is delivered oldest first with the project's
record headers, under a budget that does not bind (:data:`ORACLE_BUDGET`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from memsteer_dspy.errors import InputError
from memsteer_dspy.memory.design import ContextSpec
from memsteer_dspy.memory.retriever import date_text
from memsteer_dspy.memory.store import MemoryStore
from memsteer_dspy.records import History, QAItem
from memsteer_dspy.systems.base import ExternalSystem, Hit, SystemCard

ORACLE_BUDGET = 1_000_000


def _key(question: str, question_date: Any) -> tuple[str, str]:
    return question.strip(), date_text(question_date)


class OracleSystem(ExternalSystem):
    """Gold evidence as the context (an upper bound; reads the items' evidence ids)."""

    def __init__(
        self,
        history: History,
        items: Iterable[QAItem],
        *,
        store: MemoryStore | None = None,
        cache_dir: str | Path | None = None,
        answerer_lm: Any = None,
        budget: int = ORACLE_BUDGET,
    ):
        card = SystemCard(
            name="oracle", system="oracle", params={"budget": budget, "order": "chronological"}
        )
        super().__init__(
            card,
            history,
            store=store,
            cache_dir=cache_dir,
            answerer_lm=answerer_lm,
            top_k=10_000,
            context=ContextSpec(order="chronological", budget_tokens=budget),
        )
        self.evidence: dict[tuple[str, str], list[str]] = {}
        merged = 0
        for q in items:
            key = _key(q.question, q.question_date)
            if key in self.evidence and self.evidence[key] != list(q.evidence_ids):
                merged += (
                    1  # the same question asked twice on one day: deliver both answers' evidence
                )
            ids = self.evidence.setdefault(key, [])
            ids.extend(e for e in q.evidence_ids if e not in ids)
        self.build_info["questions"] = len(self.evidence)
        self.build_info["merged_duplicates"] = merged

    def search(self, question: str, question_date: Any, n: int) -> list[Hit]:
        key = _key(question, question_date)
        if key not in self.evidence:
            raise InputError(
                f"the oracle has no evidence for the question {question[:80]!r} asked "
                f"{key[1]}: build OracleSystem with the QA items it is evaluated on"
            )
        return [Hit([rid], 1.0) for rid in self.evidence[key] if rid in self.user_history]
