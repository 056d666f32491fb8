"""Records, spans, histories and QA items."""

from datetime import date, datetime

import pytest

from memsteer_dspy.errors import DuplicateRecordError, EmptyHistoryError
from memsteer_dspy.records import History, QAItem, Record, span_record_id, split_spans


def rec(id, text="x.", ts=None, **kw):
    return Record(id=id, kind="note", text=text, timestamp=ts, **kw)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("One. Two! Three?", ["One.", "Two!", "Three?"]),
        (
            "Met Dr. Liu and J. Smith at 5 p.m. today. Then left.",
            ["Met Dr. Liu and J. Smith at 5 p.m. today.", "Then left."],
        ),
        (
            "Subject: Re: Lunch\nSummary: fine\n\n\nBody here.",
            ["Subject: Re: Lunch", "Summary: fine", "Body here."],
        ),
        ('She said "we go." Then we went.', ['She said "we go."', "Then we went."]),
        ("version 3.5 costs $12.50 total", ["version 3.5 costs $12.50 total"]),
        ("   \n\n", []),
    ],
)
def test_split_spans_sentences_and_lines(text, expected):
    assert [s.text for s in split_spans("r", text)] == expected


def test_span_ids_offsets_and_stability():
    text = "  First line.\r\nSecond sentence here. Third one!\n- item four"
    spans = split_spans("2024-05-20:7", text)
    assert [s.id for s in spans] == [f"2024-05-20:7#{i}" for i in range(1, 5)]
    for s in spans:
        assert text[s.start : s.end] == s.text
        assert span_record_id(s.id) == "2024-05-20:7"
    # same text, same ids, whatever record object or loader produced it
    assert split_spans("2024-05-20:7", text) == spans
    assert Record(id="2024-05-20:7", kind="email", text=text).spans == spans


def test_long_sentence_is_cut_at_whitespace():
    text = " ".join(["word"] * 400)
    spans = split_spans("r", text)
    assert len(spans) > 1 and all(len(s.text) <= 600 for s in spans)
    assert " ".join(s.text for s in spans) == text


def test_span_record_id_rejects_non_span():
    with pytest.raises(ValueError, match="not a span id"):
        span_record_id("record-without-hash")
    assert span_record_id("doc.md:Intro #2#3") == "doc.md:Intro #2"


def test_history_lookup_order_and_threads():
    h = History(
        "u",
        [
            rec("c", ts=datetime(2024, 3, 3), thread_id="t", position=2),
            rec("a", ts=datetime(2024, 3, 1), thread_id="t", position=1),
            rec("undated"),
            rec("b", ts=datetime(2024, 3, 2)),
        ],
    )
    assert [r.id for r in h] == ["a", "b", "c", "undated"]
    assert h["b"].id == "b" and "zzz" not in h and h.get("zzz") is None
    with pytest.raises(KeyError, match="no record 'zzz'"):
        h["zzz"]
    assert [r.id for r in h.threads()["t"]] == ["a", "c"]
    assert h.span("a#1").text == "x."


def test_as_of_by_day_and_exclusive():
    h = History(
        "u",
        [rec("a", ts=datetime(2024, 3, 1, 9)), rec("b", ts=datetime(2024, 3, 2, 23)), rec("doc")],
    )
    assert {r.id for r in h.as_of(date(2024, 3, 2))} == {"a", "b", "doc"}
    assert {r.id for r in h.as_of("2024-03-02", inclusive=False)} == {"a", "doc"}
    assert {r.id for r in h.as_of("2024-03-02", inclusive=False, keep_undated=False)} == {"a"}
    assert {r.id for r in h.as_of(datetime(2024, 3, 2, 12))} == {"a", "doc"}
    with pytest.raises(EmptyHistoryError):
        h.as_of("2024-01-01", keep_undated=False)


def test_fingerprint_is_content_based_and_order_free():
    a, b = rec("a", "alpha."), rec("b", "beta.")
    assert History("u", [a, b]).fingerprint == History("u", [b, a]).fingerprint
    assert History("u", [a, b]).fingerprint != History("u", [a, rec("b", "beta!")]).fingerprint
    # the file a record was read from is provenance, not content
    moved = [
        rec("a", "alpha.", metadata={"source": "/x/h.jsonl:1"}),
        rec("b", "beta.", metadata={"source": "/y/h.jsonl:2"}),
    ]
    assert History("u", moved).fingerprint == History("u", [a, b]).fingerprint
    assert (
        History("u", [rec("a", "alpha.", metadata={"topic": "t"}), b]).fingerprint
        != History("u", [a, b]).fingerprint
    )


def test_duplicate_and_empty_history_errors():
    with pytest.raises(
        DuplicateRecordError, match=r"duplicate record id 'a' \(first at f:1, again at f:2\)"
    ):
        History("u", [rec("a", metadata={"source": "f:1"}), rec("a", metadata={"source": "f:2"})])
    with pytest.raises(EmptyHistoryError, match="has no records"):
        History("u", [])


def test_record_rejects_unknown_fields_and_blank_ids():
    with pytest.raises(ValueError):
        Record(id="a", kind="note", text="t", colour="red")
    with pytest.raises(ValueError):
        Record(id=" a", kind="note", text="t")


def test_qaitem_roundtrip():
    q = QAItem(
        id="q1",
        question="Who?",
        answer="Lila",
        answer_type="entity",
        evidence_ids=["a"],
        question_date=date(2024, 1, 2),
        question_type="fact",
    )
    assert QAItem.model_validate_json(q.to_json()) == q


def test_a_copy_with_a_new_text_splits_its_own_spans():
    rec = Record(
        id="c:1",
        kind="conversation_turn",
        thread_id="c",
        position=1,
        timestamp=datetime(2024, 3, 2),
        text="User: First sentence here. Second one there.",
    )
    assert len(rec.spans) == 2  # cached on the original
    copy = rec.model_copy(update={"id": "d:1", "text": "User: Only one sentence."})
    assert [s.text for s in copy.spans] == ["User: Only one sentence."]
    assert all(s.id.startswith("d:1#") for s in copy.spans)
    assert len(rec.spans) == 2
