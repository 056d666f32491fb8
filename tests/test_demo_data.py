"""The bundled demo history and its hand-written evaluation set: it loads, it is well formed, and
every QA item is supported by its evidence records (and not by its near-miss distractors)."""

from __future__ import annotations

import re
import tomllib
from collections import Counter, defaultdict
from datetime import date
from importlib import resources
from pathlib import Path

import pytest

from memsteer_dspy.demo_data import DEMO_USER, demo_path, load_demo
from memsteer_dspy.records import AnswerType, QAItem, Record, RecordKind

try:  # the project's answer normalization, where present
    from memsteer_dspy.normalize import list_items, normalize_text, parse_answer
except ImportError:  # pragma: no cover - only before normalize.py existed
    parse_answer = None

    def normalize_text(text: str) -> str:
        return " ".join(re.sub(r"[^\w\s]", " ", text.casefold()).split())

    def list_items(text: str) -> list[str]:
        return [normalize_text(p) for p in re.split(r"[;,\n]", text) if p.strip()]


REPO_ROOT = Path(__file__).resolve().parent.parent
QUESTION_TYPES = {"fact", "multi-hop", "knowledge-update", "temporal", "aggregation", "distractor"}
# Answer types whose reference answer is written as in an evidence record.
EXTRACTIVE = {AnswerType.TEXT, AnswerType.ENTITY, AnswerType.DATE, AnswerType.NUMBER}


@pytest.fixture(scope="module")
def demo():
    return load_demo()


@pytest.fixture(scope="module")
def records(demo) -> dict[str, Record]:
    return {r.id: r for r in demo.history.records}


@pytest.fixture(scope="module")
def qa(demo) -> list[QAItem]:
    return demo.qa_items


def _day(r: Record) -> date:
    assert r.timestamp is not None, f"record {r.id!r} has no timestamp"
    return r.timestamp.date()


def _occurs(needle: str, haystack: str) -> bool:
    """``needle`` occurs in ``haystack`` as whole words, after text normalization."""
    n, h = normalize_text(needle), normalize_text(haystack)
    return bool(n) and f" {n} " in f" {h} "


# --------------------------------------------------------------------------------------------
# packaging and loading
# --------------------------------------------------------------------------------------------


def test_package_data_is_declared_and_found():
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "data/**/*" in pyproject["tool"]["setuptools"]["package-data"]["memsteer_dspy"]
    folder = resources.files("memsteer_dspy") / "data" / "demo"
    for name in ("records.jsonl", "qa.jsonl", "README.md"):
        assert (folder / name).is_file(), f"{name} not found through importlib.resources"
    assert demo_path() == folder


def test_demo_loads_cleanly(demo):
    assert demo.history.user_id == DEMO_USER
    assert demo.unresolved == [], demo.unresolved
    assert demo.skipped == []
    assert len(demo.history) >= 100
    kinds = Counter(r.kind for r in demo.history.records)
    for kind in (RecordKind.CONVERSATION_TURN, RecordKind.EMAIL, RecordKind.DOCUMENT_SECTION):
        assert kinds[kind] > 0, f"no {kind} records"
    assert set(kinds) <= {k.value for k in RecordKind}


def test_records_are_dated_within_the_demo_period(records):
    for r in records.values():
        assert date(2025, 2, 1) <= _day(r) <= date(2025, 6, 30), r.id
        assert r.text.strip() and r.spans, r.id


# --------------------------------------------------------------------------------------------
# record shapes, per kind
# --------------------------------------------------------------------------------------------


def test_conversation_turns(demo):
    turns = [r for r in demo.history.records if r.kind == RecordKind.CONVERSATION_TURN]
    sessions: dict[str, list[Record]] = defaultdict(list)
    for r in turns:
        assert r.id == f"{r.thread_id}:{r.position}", r.id
        assert r.thread_id == f"chat-{_day(r).isoformat()}", r.id
        assert r.text.startswith("User: ") and "\nAssistant: " in r.text, r.id
        sessions[r.thread_id].append(r)
    assert len(sessions) >= 15
    for thread, recs in sessions.items():
        recs.sort(key=lambda r: r.position)
        assert [r.position for r in recs] == list(range(1, len(recs) + 1)), thread
        assert [r.timestamp for r in recs] == sorted(r.timestamp for r in recs), thread
        assert 4 <= len(recs) <= 8, thread


def test_emails_and_replies(demo, records):
    emails = [r for r in demo.history.records if r.kind == RecordKind.EMAIL]
    threads: dict[str, list[Record]] = defaultdict(list)
    replies = 0
    for r in emails:
        head = r.text.split("\n")
        assert head[0] == f"From: {r.metadata['sender']}", r.id
        assert head[1] == f"To: {r.metadata['recipient']}", r.id
        assert head[2] == f"Subject: {r.metadata['subject']}", r.id
        assert head[3] == "" and any(line.strip() for line in head[4:]), r.id
        threads[r.thread_id].append(r)
        for ref in r.references:
            replies += 1
            assert ref in records, f"{r.id} references unknown {ref!r}"
            earlier = records[ref]
            assert earlier.kind == RecordKind.EMAIL and earlier.thread_id == r.thread_id, r.id
            assert earlier.timestamp < r.timestamp, f"{r.id} answers a later email {ref}"
        if re.match(r"(Re|Fwd): ", r.metadata["subject"]):
            assert r.references, f"{r.id} is a reply but references no email"
    assert replies >= 15
    assert sum(len(t) > 1 for t in threads.values()) >= 10
    for thread, recs in threads.items():
        recs.sort(key=lambda r: r.position)
        assert [r.position for r in recs] == list(range(1, len(recs) + 1)), thread
        assert [r.timestamp for r in recs] == sorted(r.timestamp for r in recs), thread


def test_document_sections(demo):
    sections = [r for r in demo.history.records if r.kind == RecordKind.DOCUMENT_SECTION]
    docs: dict[str, list[Record]] = defaultdict(list)
    for r in sections:
        assert r.id == f"{r.thread_id}:{r.metadata['heading']}", r.id
        assert re.fullmatch(r"[a-z0-9-]+\.md", r.thread_id), r.id
        assert r.text.startswith(f"## {r.metadata['heading']}\n"), r.id
        docs[r.thread_id].append(r)
    assert 2 <= len(docs) <= 3 + 1
    for doc, recs in docs.items():
        recs.sort(key=lambda r: r.position)
        assert [r.position for r in recs] == list(range(1, len(recs) + 1)), doc
        assert len({r.metadata["title"] for r in recs}) == 1, doc
        assert len({r.timestamp for r in recs}) == 1, f"{doc}: sections dated differently"


# --------------------------------------------------------------------------------------------
# the evaluation set
# --------------------------------------------------------------------------------------------


def test_qa_set_shape_and_mix(qa):
    assert len(qa) >= 25
    assert len({q.id for q in qa}) == len(qa)
    assert len({q.question for q in qa}) == len(qa)
    types = Counter(q.question_type for q in qa)
    assert set(types) <= QUESTION_TYPES, types
    assert types["fact"] >= 6
    assert sum(1 for q in qa if len(q.evidence_ids) >= 2) >= 14
    assert types["knowledge-update"] + types["temporal"] >= 5
    assert types["aggregation"] >= 3
    assert sum(1 for q in qa if q.metadata.get("distractor_ids")) >= 6
    for q in qa:
        assert q.source == "official", q.id
        assert isinstance(q.answer_type, AnswerType), q.id
        assert q.question_date is not None and q.answer.strip(), q.id
        assert q.question.endswith("?"), q.id


def test_qa_evidence_exists_and_predates_the_question(qa, records):
    for q in qa:
        assert q.evidence_ids and len(set(q.evidence_ids)) == len(q.evidence_ids), q.id
        for e in q.evidence_ids:
            assert e in records, f"{q.id}: unknown evidence {e!r}"
            assert _day(records[e]) <= q.question_date, (
                f"{q.id}: evidence {e} is after the question"
            )


def test_qa_answers_parse_as_their_type(qa):
    if parse_answer is None:
        pytest.skip("memsteer_dspy.normalize is not available")
    for q in qa:
        value = parse_answer(q.answer, q.answer_type)
        if q.answer_type is AnswerType.DATE:
            assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", value), (
                f"{q.id}: date answers carry a full date"
            )
        if q.answer_type is AnswerType.LIST:
            assert len(value) >= 2, q.id


def test_extractive_answers_occur_in_their_evidence(qa, records):
    checked = 0
    for q in qa:
        if q.metadata.get("computed"):
            continue
        texts = [records[e].text for e in q.evidence_ids]
        if q.answer_type in EXTRACTIVE:
            assert any(_occurs(q.answer, t) for t in texts), f"{q.id}: {q.answer!r} not in evidence"
            checked += 1
        elif q.answer_type is AnswerType.LIST:
            for item in list_items(q.answer):
                assert any(_occurs(item, t) for t in texts), (
                    f"{q.id}: list item {item!r} not in evidence"
                )
            checked += 1
    assert checked >= 20


def test_computed_answers_are_numbers_or_flags(qa):
    computed = [q for q in qa if q.metadata.get("computed")]
    assert computed, "the set has aggregation items that need computing"
    assert all(q.answer_type in (AnswerType.NUMBER, AnswerType.BOOLEAN) for q in computed)


def test_knowledge_updates_are_answered_by_the_latest_record(qa, records):
    updates = [q for q in qa if q.question_type == "knowledge-update"]
    assert len(updates) >= 5
    for q in updates:
        assert len(q.evidence_ids) >= 2, f"{q.id}: an update needs the old and the new record"
        ordered = sorted((records[e] for e in q.evidence_ids), key=lambda r: r.timestamp)
        assert _occurs(q.answer, ordered[-1].text), (
            f"{q.id}: the latest evidence must give the answer"
        )
        old = q.metadata.get("superseded")
        assert old and normalize_text(old) != normalize_text(q.answer), (
            f"{q.id}: name the old value"
        )
        assert any(_occurs(old, r.text) for r in ordered[:-1]), (
            f"{q.id}: the superseded value {old!r} is in no earlier evidence record"
        )


def test_distractors_are_near_misses_without_the_answer(qa, records):
    for q in qa:
        for d in q.metadata.get("distractor_ids", []):
            assert d in records, f"{q.id}: unknown distractor {d!r}"
            assert d not in q.evidence_ids, q.id
            assert _day(records[d]) <= q.question_date, (
                f"{q.id}: distractor {d} is after the question"
            )
            if q.answer_type is AnswerType.LIST:
                assert not any(_occurs(i, records[d].text) for i in list_items(q.answer)), q.id
            elif q.answer_type is not AnswerType.BOOLEAN:
                assert not _occurs(q.answer, records[d].text), (
                    f"{q.id}: distractor {d} holds the answer"
                )
