"""Shared fixtures for the supervision tests: a small history with checkable facts, bundles over
it, and scripted LMs (DSPy's DummyLM fed from a script that may also raise)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import dspy
from dspy.utils import DummyLM

from memsteer_dspy.bundles import Bundle, BundleConfig, Task, bundle_from_records
from memsteer_dspy.records import History, Record

RECORDS = [
    Record(
        id="c1:1",
        kind="conversation_turn",
        thread_id="c1",
        position=1,
        timestamp=datetime(2024, 3, 2, 9, 0),
        author="Elena",
        text=(
            "User: This morning I sent a quick note to Lila from my MacBook Air. "
            "Then I walked Oliver to the park on Maple Street."
        ),
    ),
    Record(
        id="c1:2",
        kind="conversation_turn",
        thread_id="c1",
        position=2,
        timestamp=datetime(2024, 3, 2, 9, 5),
        author="Elena",
        text="User: Lila replied that the garden workshop moved to Friday. She will bring 12 seed trays.",
    ),
    Record(
        id="mail:1",
        kind="email",
        thread_id="mail",
        position=1,
        timestamp=datetime(2024, 3, 5),
        author="Elena",
        metadata={"subject": "Garden workshop supplies"},
        text="Subject: Garden workshop supplies\nThe order of compost from GreenLeaf arrived on March 4. It cost 45 dollars.",
    ),
]


def small_history(extra: Iterable[Record] = ()) -> History:
    return History("tester", [*RECORDS, *extra])


def small_bundle(history: History | None = None, ids: list[str] | None = None) -> Bundle:
    history = history or small_history()
    return bundle_from_records(history, ids or ["c1:1", "c1:2", "mail:1"], BundleConfig())


class Script:
    """An iterator of scripted LM replies (any iterable, also endless); an Exception in the script
    is raised instead of answered."""

    def __init__(self, replies: Iterable[dict[str, Any] | BaseException]):
        self.replies = iter(replies)
        self.served = 0

    def __iter__(self):
        return self

    def __next__(self):
        reply = next(self.replies)
        self.served += 1
        if isinstance(reply, BaseException):
            raise reply
        return reply


def scripted(*replies: dict[str, Any] | BaseException) -> DummyLM:
    """A DummyLM answering in JSON (as the JSONAdapter expects) from ``replies`` in order."""
    return DummyLM(Script(replies), adapter=dspy.JSONAdapter())


def endless(make) -> DummyLM:
    """A DummyLM whose i-th reply is ``make(i)`` (a dict, or an Exception to raise)."""
    return DummyLM(Script(make(i) for i in itertools.count()), adapter=dspy.JSONAdapter())


# ---- replies for each role ------------------------------------------------------------------


def plan_reply(**overrides: Any) -> dict[str, Any]:
    reply = {
        "fact_span_ids": ["R1.1"],
        "answer_span_id": "R1.1",
        "answer": "MacBook Air",
        "answer_type": "entity",
        "evidence": [{"record_id": "R1", "contribution": "names the device used for the note"}],
        "operations": ["lookup"],
        "ask": "which device Elena used to send a note to Lila this morning",
    }
    reply.update(overrides)
    return reply


def option_reply(option: int, **overrides: Any) -> dict[str, Any]:
    """An anchored planner's reply choosing answer option ``option`` (a number of its options)."""
    reply = {
        "answer_option": option,
        "evidence": [{"record_id": "R1", "contribution": "names it"}],
        "fact_span_ids": ["R1.1"],
        "operations": ["lookup"],
        "ask": "which laptop I wrote from",
    }
    reply.update(overrides)
    return reply


def question_reply(
    question: str = "Which device did I use to send a quick note to Lila on March 2?",
):
    return {"question": question}


def audit_reply(
    fact="supported",
    record="supported",
    answer="supported",
    consistency="supported",
    facts=("R1.1",),
):
    return {
        "fact_checks": [{"span_id": f, "rationale": "stated", "verdict": fact} for f in facts],
        "record_checks": [{"record_id": "R1", "rationale": "contributes", "verdict": record}],
        "answer_rationale": "the record names it",
        "answer_support": answer,
        "consistency_rationale": "asks what the plan says",
        "consistency": consistency,
    }


def blind_reply(answer="MacBook Air", cited=("c1:1#1",), answerable=True):
    return {"cited_ids": list(cited), "answer": answer, "answerable": answerable}


def role_lms(plan=(), question=(), audit=(), blind=()) -> dict[str, DummyLM]:
    return {
        "planner": scripted(*plan),
        "question_writer": scripted(*question),
        "auditor": scripted(*audit),
        "blind_reader": scripted(*blind),
    }


def logged(index: int, status: str, answer_type: str | None, evidence_count: int):
    """A progress-log line (``CandidateRecord``) for a task of this kind, with no LM work."""
    from memsteer_dspy.supervision.run import CandidateRecord

    task = Task(question_type="fact", evidence_count=evidence_count, answer_type=answer_type)
    return CandidateRecord(
        index=index, status=status, method="memsteer", seed_record="r", task=task
    )
