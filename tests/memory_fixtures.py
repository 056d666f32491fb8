"""Fixtures shared by the memory and evaluation tests: a small history with known evidence and a
scripted LM that answers each DSPy signature by a handler function (no network)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from dspy.clients.engines.dummy_engine import AsyncDummyEngine, DummyEngine
from dspy.utils.dummies import DummyLM

from memsteer_dspy.records import History, QAItem, Record


class _ScriptedEngine(DummyEngine):
    def _complete_messages(self, messages):
        owner = self.owner
        system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
        user = messages[-1]["content"]
        owner.calls.append({"system": system, "user": user})
        outputs = owner.handler(system, user)
        from dspy.lm15 import Message, Response, TextPart, Usage

        return Response(
            id=None,
            model="scripted",
            message=Message.assistant([TextPart(owner._format_answer_fields(outputs))]),
            finish_reason="stop",
            usage=Usage(input_tokens=0, output_tokens=0, total_tokens=0),
        )


class ScriptedLM(DummyLM):
    """A DSPy LM whose reply is ``handler(system_prompt, user_message) -> {output field: value}``.

    ``calls`` records every request. Handlers tell signatures apart by their output fields, e.g.
    ``"ranked_ids" in system``.
    """

    def __init__(self, handler: Callable[[str, str], dict[str, Any]]):
        super().__init__([])
        self.handler = handler
        self.calls: list[dict[str, str]] = []
        self._engine_spec = _ScriptedEngine(self)
        self._async_engine_spec = AsyncDummyEngine(self._engine_spec)

    def copy(self, **kwargs):  # keep the handler and the call log
        return self


def field_value(user: str, name: str) -> str:
    """The value of input field ``name`` in a ChatAdapter user message."""
    head = f"[[ ## {name} ## ]]\n"
    start = user.index(head) + len(head)
    ends = [
        e for e in (user.find("\n\n[[ ## ", start), user.find("\n\nRespond with", start)) if e >= 0
    ]
    return user[start : min(ends) if ends else None].strip()


def signature_of(system: str) -> str:
    """Which memory signature a system prompt belongs to (by its output fields)."""
    for out, name in (
        ("[[ ## ranked_ids ## ]]", "rerank"),
        ("[[ ## facts ## ]]", "facts"),
        ("[[ ## supported ## ]]", "verify"),
        ("[[ ## correct ## ]]", "judge"),
        ("[[ ## sub_questions ## ]]", "decompose"),
        ("[[ ## records ## ]]", "hyde"),
        ("[[ ## queries ## ]]", "multi_query"),
        ("[[ ## query ## ]]", "rewrite"),
        ("[[ ## answer ## ]]", "answer"),
    ):
        if out in system:
            return name
    raise AssertionError(f"unknown signature: {system[:300]}")


def rec(
    rid: str,
    text: str,
    day: str,
    thread: str | None = None,
    pos: int | None = None,
    kind: str = "conversation_turn",
    author: str | None = "user",
    **meta,
) -> Record:
    return Record(
        id=rid,
        kind=kind,
        text=text,
        timestamp=datetime.fromisoformat(day),
        thread_id=thread,
        position=pos,
        author=author,
        metadata=meta,
    )


def small_history() -> History:
    """Three sessions, a document and an email, with facts a test can ask about."""
    records = [
        rec(
            "s1:1",
            "I bought a red bicycle at the Saturday market for 120 dollars.",
            "2024-01-05",
            "s1",
            1,
        ),
        rec("s1:2", "My sister Anna said the bicycle colour suits me.", "2024-01-05", "s1", 2),
        rec("s1:3", "We had lentil soup for dinner afterwards.", "2024-01-05", "s1", 3),
        rec("s1:4", "Tomorrow I will repaint the garden fence.", "2024-01-05", "s1", 4),
        rec("s2:1", "The dentist appointment moved to Tuesday at 9am.", "2024-02-10", "s2", 1),
        rec(
            "s2:2",
            "Anna is flying to Lisbon for a conference on marine biology.",
            "2024-02-10",
            "s2",
            2,
        ),
        rec(
            "s2:3",
            "I finished reading the novel about the lighthouse keeper.",
            "2024-02-10",
            "s2",
            3,
        ),
        rec("s3:1", "I sold the red bicycle to my neighbour Tom.", "2024-03-20", "s3", 1),
        rec("s3:2", "Tom paid 90 dollars for it.", "2024-03-20", "s3", 2),
        rec(
            "doc.md:Budget",
            "# Budget\nRent is 900 euros a month. Groceries are about 250 euros.\n"
            "Transport costs 60 euros. Savings target is 300 euros a month.\nThe gym membership is 35 euros.\n"
            "Phone and internet together cost 45 euros. Insurance for the flat is 20 euros a month, paid in January.",
            "2024-02-01",
            "doc.md",
            1,
            kind="document_section",
            author=None,
            heading="Budget",
            document="doc.md",
        ),
        rec(
            "doc.md:Travel",
            "# Travel\nPlanned trip to Porto in May with Anna.",
            "2024-02-01",
            "doc.md",
            2,
            kind="document_section",
            author=None,
            heading="Travel",
            document="doc.md",
        ),
        rec(
            "mail:1",
            "Subject: Conference\nDear Anna, the marine biology conference in Lisbon starts on 12 March.",
            "2024-02-15",
            "mail-thread",
            1,
            kind="email",
            author="Elena",
            subject="Conference",
        ),
    ]
    return History("tester", records)


def small_qa() -> list[QAItem]:
    return [
        QAItem(
            id="q1",
            question="What colour was the bicycle I bought at the market?",
            answer="red",
            evidence_ids=["s1:1"],
            question_date="2024-03-01",
            question_type="fact",
        ),
        QAItem(
            id="q2",
            question="Where is Anna's marine biology conference?",
            answer="Lisbon",
            evidence_ids=["s2:2", "mail:1"],
            question_date="2024-03-01",
            question_type="multi",
        ),
        QAItem(
            id="q3",
            question="How much did Tom pay for the bicycle?",
            answer="90",
            answer_type="number",
            evidence_ids=["s3:2"],
            question_date="2024-04-01",
            question_type="fact",
        ),
        QAItem(
            id="q4",
            question="Which people are mentioned with the bicycle?",
            answer="Anna, Tom",
            answer_type="list",
            evidence_ids=["s1:2", "s3:1"],
            question_date="2024-04-01",
            question_type="multi",
        ),
    ]
