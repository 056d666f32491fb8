"""The RHELM loader: records, ids, dates and evidence resolution, on the real benchmark data
(skipped where ../shared is absent) and on tiny RHELM-shaped folders written to tmp_path."""

from __future__ import annotations

import json
from datetime import date, datetime
from pathlib import Path

import pytest

from memsteer_dspy.errors import ConfigError, InputError
from memsteer_dspy.loaders.rhelm import (
    EXTERNAL_NOT_LOADED,
    default_rhelm_root,
    infer_answer_type,
    list_personas,
    load_rhelm,
)
from memsteer_dspy.records import AnswerType, RecordKind

# --------------------------------------------------------------------------------------------
# Real data
# --------------------------------------------------------------------------------------------

PERSONAS = (
    "David_R._Ellis David_Reyes Dr._Alastair_McEwan Dr._Elena_Markovic Dr._Elias_Romero"
    " Dr._Marcus_Ellison Elena_Morales Jonas_Richter Justice_Arvind_Prakash_Mehra Martin_Keller"
).split()

_CACHE: dict[tuple[str, bool], object] = {}


def _load(root: Path, persona: str, external: bool = True):
    key = (persona, external)
    if key not in _CACHE:
        _CACHE[key] = load_rhelm(root, persona, external=external)
    return _CACHE[key]


def _item(loaded, qa_id: str):
    return next(q for q in loaded.qa_items if q.id == qa_id)


def test_personas_are_the_ten_of_the_release(rhelm_root):
    assert list_personas(rhelm_root) == PERSONAS
    assert list_personas(rhelm_root / "data") == PERSONAS  # the data folder works too


def test_record_counts_per_kind(rhelm_root):
    loaded = _load(rhelm_root, "David_R._Ellis")
    kinds = loaded.history.stats()["records_by_kind"]
    # 75 sessions, 75 email files (178 emails), 150 attachments split at their headings
    assert kinds == {"document_section": 1890, "conversation_turn": 1486, "email": 178}
    assert len(loaded.qa_items) == 158
    assert loaded.history.user_id == "David_R._Ellis"
    assert Path(loaded.history.source) == rhelm_root
    assert not loaded.skipped


def test_conversation_turn_records(rhelm_root):
    h = _load(rhelm_root, "Martin_Keller").history
    turn = h["2024-08-26:7"]
    assert turn.kind == RecordKind.CONVERSATION_TURN
    assert turn.text.startswith("User: ") and "\nAssistant: " in turn.text
    assert turn.thread_id == "conversation:2024-08-26" and turn.position == 7
    assert turn.timestamp.date() == date(2024, 8, 26)
    assert turn.author == "Martin Keller"
    assert turn.metadata["source"] == "conversations/Martin_Keller/conversation_2024_08_26.json"
    assert turn.metadata["message_type"]


def test_upload_turn_refers_to_the_document(rhelm_root):
    h = _load(rhelm_root, "David_R._Ellis").history
    turn = h["2024-01-01:7"]
    assert turn.metadata["research_document"] == "01_notes_task_870da080"
    assert turn.references and all(
        r.startswith("01_notes_task_870da080.md:") for r in turn.references
    )
    assert all(r in h for r in turn.references)


def test_email_records(rhelm_root):
    h = _load(rhelm_root, "David_R._Ellis").history
    email = h["Emails_2024-01-01:Email 2"]
    assert email.kind == RecordKind.EMAIL
    assert email.author == "David R. Ellis"
    assert email.metadata["recipient_name"] == "Monica Ellis"
    assert email.metadata["subject"] == "Breakfast Plan for New Year's Morning"
    assert email.metadata["summary"].startswith("David shares a quick email with Monica")
    assert email.metadata["source"] == "emails/David_R._Ellis/01_email_2024_01_01.txt:8"
    assert email.timestamp == datetime(2024, 1, 1)
    assert email.thread_id and email.thread_id.startswith("email-thread:")


def test_email_replies_share_a_thread_and_refer_back(rhelm_root):
    h = _load(rhelm_root, "Martin_Keller").history
    reply = next(
        r
        for r in h.records
        if r.kind == RecordKind.EMAIL
        and r.metadata["subject"] == "Re: Apology and Request to Reschedule Missed Viewing"
    )
    (original_id,) = reply.references
    original = h[original_id]
    assert original.metadata["subject"] == "Apology and Request to Reschedule Missed Viewing"
    assert original.thread_id == reply.thread_id
    assert original.metadata["sender_name"] == reply.metadata["recipient_name"] == "Martin Keller"
    assert reply.position == original.position + 1


def test_document_sections_ids_and_metadata(rhelm_root):
    h = _load(rhelm_root, "David_R._Ellis").history
    sections = h.threads()["03_report_task_6d979e33.html"]
    assert [s.id for s in sections[:3]] == [
        "03_report_task_6d979e33.html:Interview Summary: Asheville Arts Education Programs",
        "03_report_task_6d979e33.html:Introduction",
        "03_report_task_6d979e33.html:Key Discussion Topics",
    ]
    intro = sections[1]
    assert intro.kind == RecordKind.DOCUMENT_SECTION
    assert intro.metadata["title"] == "Interview Summary: Asheville Arts Education Programs"
    assert intro.metadata["heading"] == "Introduction" and intro.metadata["heading_level"] == 2
    assert intro.text.startswith("Introduction\nOn January 5, 2024, I met with the owner")
    assert "<p>" not in intro.text and "border-bottom" not in sections[0].text  # no HTML, no CSS
    assert [s.position for s in sections] == list(range(1, len(sections) + 1))
    md = h["01_notes_task_870da080.md:Introduction"]
    assert md.text.startswith("## Introduction\n\nEvery January 1st")


def test_attachments_carry_the_date_of_their_nn_email(rhelm_root):
    h = _load(rhelm_root, "David_R._Ellis").history
    section = h["03_report_task_6d979e33.html:Introduction"]
    assert section.timestamp == datetime(2024, 1, 5)  # 03_email_2024_01_05.txt
    assert section.metadata["date_source"] == "email"
    assert section.references == [f"Emails_2024-01-05:Email {k}" for k in (1, 2, 3)]
    # Elena_Morales has no email file 38: the session that uploads the document dates it
    e = _load(rhelm_root, "Elena_Morales").history
    doc = e["38_notes_task_2fca3910.md:Reflection"]
    assert doc.timestamp == datetime(2024, 10, 14)
    assert doc.metadata["date_source"] == "uploading_conversation" and doc.references == []


@pytest.mark.parametrize(
    ("persona", "qa_id", "raw", "expected"),
    [
        # conversation turns, single and in lists
        ("Martin_Keller", "fact_b530ec", "2024-08-26:7", ["2024-08-26:7"]),
        (
            "David_Reyes",
            "aggregation_8888d3",
            "2024-06-26:13,17,18",
            ["2024-06-26:13", "2024-06-26:17", "2024-06-26:18"],
        ),
        (
            "David_R._Ellis",
            "aggregation_5139b8",
            "2024-05-28:9,2024-05-28:10,2024-05-28:11,2024-05-28:13",
            ["2024-05-28:9", "2024-05-28:10", "2024-05-28:11", "2024-05-28:13"],
        ),
        # emails: numbered, bare, header, header with From/To, to a recipient
        (
            "David_R._Ellis",
            "email_174911",
            "Emails_2024-01-15:Email 3",
            ["Emails_2024-01-15:Email 3"],
        ),
        (
            "David_R._Ellis",
            "email_3705fc",
            "Emails_2024-04-14:Email",
            ["Emails_2024-04-14:Email 2"],
        ),
        (
            "David_R._Ellis",
            "email_fc7bf9",
            "Emails_2024-04-17:Header",
            ["Emails_2024-04-17:Email 1"],
        ),
        (
            "David_R._Ellis",
            "email_d02bf9",
            "Emails_2024-07-11:Header: ## Email:From: Alicia Torres <alicia.torres@email.com>To: David R. Ellis <david.ellis@email.com>",
            ["Emails_2024-07-11:Email 3"],
        ),
        (
            "Martin_Keller",
            "email_98cb34",
            "Emails_2024-11-01:Email to Lukas Weber",
            ["Emails_2024-11-01:Email 2"],
        ),
        (
            "Martin_Keller",
            "email_98cb34",
            "Emails_2024-11-01:Email to Freiburg Property Manager",
            ["Emails_2024-11-01:Email 3"],
        ),
        # document sections: exact, unnumbered, label only, prefix, header, markdown, bold label
        (
            "Dr._Elias_Romero",
            "mixed_2f5929",
            "38_notes_task_ae25d187.md:Advancing Public Health Through Innovative Communication",
            ["38_notes_task_ae25d187.md:Advancing Public Health Through Innovative Communication"],
        ),
        (
            "David_R._Ellis",
            "mixed_fcafac",
            "60_notes_task_1876871b.md:Exercise Routine Table",
            ["60_notes_task_1876871b.md:1. Exercise Routine Table"],
        ),
        (
            "Dr._Elias_Romero",
            "mixed_e76f55",
            "39_notes_task_29a768f5.md:Section 5",
            ["39_notes_task_29a768f5.md:Section 5: Academic Table of Recipe Updates"],
        ),
        (
            "Dr._Marcus_Ellison",
            "mixed_db4673",
            "55_notes_task_26403a8e.md:II",
            [
                "55_notes_task_26403a8e.md:II. Live Jazz Trio: A Night of Music, Memory, and Urban Renewal"
            ],
        ),
        (
            "Dr._Alastair_McEwan",
            "mixed_1f1740",
            "35_notes_task_e3601074.md:Required Permissions",
            ["35_notes_task_e3601074.md:Required Permissions (Advance Arrangements Confirmed)"],
        ),
        (
            "Dr._Marcus_Ellison",
            "mixed_6c84d0",
            "52_notes_task_f4a077ab.md:Header",
            ["52_notes_task_f4a077ab.md:Spicy Lentil Soup Collaborative Recipe Update Log"],
        ),
        (
            "Martin_Keller",
            "mixed_5836a4",
            "47_notes_task_cf44e0de.md:Header: ## Spicy Chickpea Stew",
            ["47_notes_task_cf44e0de.md:Spicy Chickpea Stew"],
        ),
        (
            "Martin_Keller",
            "attachment_f8a3da",
            "30_notes_task_3d4efda4.md:Eggplants (Aubergines)",
            ["30_notes_task_3d4efda4.md:Core Ingredients & Step-by-Step Preparation"],
        ),
    ],
)
def test_official_evidence_quirks_resolve_to_the_right_record(
    rhelm_root, persona, qa_id, raw, expected
):
    loaded = _load(rhelm_root, persona)
    item = _item(loaded, qa_id)
    (resolution,) = [r for r in item.metadata["evidence_resolution"] if r["raw"] == raw]
    assert resolution["ids"] == expected
    assert all(i in item.evidence_ids and i in loaded.history for i in expected)
    assert raw in item.metadata["raw_evidence"]


def test_ranked_email_is_the_one_the_answer_names(rhelm_root):
    h = _load(rhelm_root, "David_R._Ellis").history
    # "Missing Items in Jasper's Gardening Tool Set Order" is email 2 of 2024-04-14
    assert "Missing Items" in h["Emails_2024-04-14:Email 2"].metadata["subject"]
    assert h["Emails_2024-04-17:Email 1"].metadata["recipient_name"] == "Ms. Ramirez"


def test_unresolvable_evidence_is_reported_not_dropped(rhelm_root):
    loaded = _load(rhelm_root, "Martin_Keller")
    bad = [u for u in loaded.unresolved if u.qa_id == "fact_171365"]
    assert [(u.raw, u.reason) for u in bad] == [
        ("2024-01-07:18", "no conversation turn 2024-01-07:18")
    ]
    item = _item(loaded, "fact_171365")
    assert item.evidence_ids == ["2024-01-07:7"]  # the part that exists is kept
    assert loaded.evidence_resolved_fraction < 1.0


def test_official_items_fields(rhelm_root):
    item = _item(_load(rhelm_root, "Martin_Keller"), "fact_3ce40e")
    assert item.source == "official" and item.question_type == "fact"
    assert item.answer == "Dorfromantik" and item.answer_type == AnswerType.ENTITY
    assert item.question_date == date(2024, 11, 12)
    assert item.metadata["characteristics"] == ["State-Dependent Attribute"]
    assert item.metadata["raw_evidence"] == ["2024-09-30:7"]


def test_at_least_98_percent_of_all_items_fully_resolve(rhelm_root):
    items = resolved = 0
    for persona in list_personas(rhelm_root):
        loaded = _load(rhelm_root, persona)
        bad = {u.qa_id for u in loaded.unresolved}
        items += len(loaded.qa_items)
        resolved += sum(q.id not in bad and bool(q.evidence_ids) for q in loaded.qa_items)
    assert items == 1305
    assert resolved / items >= 0.98


def test_without_external_sources_only_turns_load(rhelm_root):
    loaded = _load(rhelm_root, "David_R._Ellis", external=False)
    assert {r.kind for r in loaded.history.records} == {RecordKind.CONVERSATION_TURN}
    assert len(loaded.history) == 1486
    assert len(loaded.qa_items) == 158  # every item is kept, as the official protocol evaluates all
    external = [u for u in loaded.unresolved if u.reason == EXTERNAL_NOT_LOADED]
    assert {u.raw.split(":")[0] for u in external if u.qa_id == "email_3705fc"} == {
        "Emails_2024-04-14"
    }
    assert all(u.reason == EXTERNAL_NOT_LOADED for u in loaded.unresolved)
    turns = _item(loaded, "aggregation_5139b8")  # conversation evidence still resolves
    assert turns.evidence_ids == ["2024-05-28:9", "2024-05-28:10", "2024-05-28:11", "2024-05-28:13"]
    assert _item(loaded, "email_3705fc").evidence_ids == []


def test_as_of_the_question_date_excludes_that_day(rhelm_root):
    loaded = _load(rhelm_root, "Martin_Keller")
    day_of = {r.timestamp.date() for r in loaded.history.records if r.timestamp}
    item = next(q for q in loaded.qa_items if q.question_date in day_of)
    before = loaded.history.as_of(item.question_date, inclusive=False)
    assert len(before) < len(loaded.history)
    assert all(
        r.timestamp is None or r.timestamp.date() < item.question_date for r in before.records
    )
    assert any(
        r.timestamp.date() == item.question_date for r in loaded.history.records if r.timestamp
    )


def test_default_root_follows_the_environment(rhelm_root, monkeypatch, tmp_path):
    monkeypatch.setenv("MEMSTEER_RHELM_ROOT", str(rhelm_root))
    assert default_rhelm_root() == rhelm_root
    # not a RHELM folder, and nothing beside the current directory: the repository's sibling
    monkeypatch.setenv("MEMSTEER_RHELM_ROOT", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    beside_repo = Path(__file__).resolve().parent.parent.parent / "shared" / "benchmarks" / "rhelm"
    assert default_rhelm_root() == (beside_repo if beside_repo.is_dir() else None)


def test_default_root_is_none_without_data(monkeypatch, tmp_path):
    import memsteer_dspy.loaders.rhelm as rhelm

    monkeypatch.setenv("MEMSTEER_RHELM_ROOT", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(rhelm, "__file__", str(tmp_path / "a" / "b" / "rhelm" / "__init__.py"))
    assert default_rhelm_root() is None
    make_rhelm(tmp_path)
    monkeypatch.setenv("MEMSTEER_RHELM_ROOT", str(tmp_path / "rhelm" / "data"))
    assert default_rhelm_root() == tmp_path / "rhelm" / "data"


# --------------------------------------------------------------------------------------------
# Tiny RHELM-shaped folders
# --------------------------------------------------------------------------------------------


def _session(day: str, turns: list[dict]) -> str:
    return json.dumps({"character": "Ada_Lovelace", "date": day, "conversation": turns})


def _turn(n: int, day: str, user: str, assistant: str, **extra) -> dict:
    return {
        "turn": n,
        "timestamp": f"{day}T09:0{n}:00",
        "message_type": "status_update",
        "user": user,
        "assistant": assistant,
        **extra,
    }


EMAILS_1 = """Sender: Ada Lovelace <ada@example.com>
Recipient: Charles Babbage <charles@example.com>
Subject: Notes on the Analytical Engine
Summary: Ada sends Charles her notes on the engine and asks about the punched cards.

============================================================

Sender: Charles Babbage <charles@example.com>
Recipient: Ada Lovelace <ada@example.com>
Subject: Re: Notes on the Analytical Engine
Summary: Charles thanks Ada and answers that the cards arrive on Friday.
"""

EMAILS_2 = """Sender: Ada Lovelace <ada@example.com>
Recipient: Mary Somerville <mary@example.com>
Subject: Tea on Sunday
Summary: Ada invites Mary to tea on Sunday to discuss the Bernoulli numbers.
"""

NOTES_MD = """Drafted on a rainy morning.

# Engine Notes
Prepared by Ada.

## 1. Punched Cards
Cards come from the Jacquard loom.

```bash
# not a heading: a shell comment
echo cards
```

## Notes
First notes: the mill computes.

## Notes
Second notes: the store keeps 1000 numbers.

**Bernoulli Plan:** compute the seventh number.
"""

REPORT_HTML = """<!DOCTYPE html><html><head><title>02_report_task_bbbb2222</title>
<style>h1 { color: red; }</style></head>
<body>
<h1>Engine Report</h1>
<p>Written for <strong>Charles</strong> &amp; friends.</p>
<h2>Costs</h2>
<table><tr><th>Part</th><th>Cost</th></tr><tr><td>Mill</td><td>300 pounds</td></tr></table>
<h3>Open Questions</h3>
<ul><li>Who pays?</li><li>When?</li></ul>
</body></html>
"""


def _qa(
    id_: str, question: str, answer: str, evidence: list[str], qdate: str = "2024-02-01"
) -> str:
    return json.dumps(
        {
            "id": id_,
            "question": question,
            "answer": answer,
            "question_date": qdate,
            "question_type": "fact",
            "supporting_evidence": evidence,
            "characteristics": ["Fact Retrieval"],
        }
    )


def make_rhelm(tmp_path: Path) -> Path:
    """A RHELM folder with personas Ada_Lovelace (everything) and Bob (one session)."""
    data = tmp_path / "rhelm" / "data"
    conv = data / "conversations" / "Ada_Lovelace"
    conv.mkdir(parents=True)
    (conv / "conversation_2024_01_01.json").write_text(
        _session(
            "2024-01-01",
            [
                _turn(1, "2024-01-01", "I started the engine notes.", "Great start."),
                _turn(
                    2,
                    "2024-01-01",
                    "[Upload 01_notes_task_aaaa1111] Please review.",
                    "Done.",
                    research_document="01_notes_task_aaaa1111",
                ),
            ],
        ),
        encoding="utf-8",
    )
    (conv / "conversation_2024_01_03.json").write_text(
        _session(
            "2024-01-03",
            [
                _turn(1, "2024-01-03", "Tea with Mary on Sunday.", "Enjoy."),
                _turn(2, "2024-01-03", "The report is ready.", "Well done."),
                _turn(3, "2024-01-03", "Costs look high.", "Noted."),
            ],
        ),
        encoding="utf-8",
    )
    bob = data / "conversations" / "Bob"
    bob.mkdir(parents=True)
    (bob / "conversation_2024_01_01.json").write_text(
        json.dumps(
            {
                "character": "Bob",
                "date": "2024-01-01",
                "conversation": [
                    {
                        "turn": 1,
                        "timestamp": "2024-01-01T08:00:00",
                        "user": "Hi",
                        "assistant": "Hello",
                    }
                ],
            }
        ),
        encoding="utf-8",
    )
    emails = data / "emails" / "Ada_Lovelace"
    emails.mkdir(parents=True)
    (emails / "01_email_2024_01_01.txt").write_text(EMAILS_1, encoding="utf-8")
    (emails / "02_email_2024_01_03.txt").write_text(EMAILS_2, encoding="utf-8")
    att = data / "attachments" / "Ada_Lovelace"
    att.mkdir(parents=True)
    (att / "01_notes_task_aaaa1111.md").write_text(NOTES_MD, encoding="utf-8")
    (att / "02_report_task_bbbb2222.html").write_text(REPORT_HTML, encoding="utf-8")
    qa = data / "QA_final"
    qa.mkdir(parents=True)
    (qa / "low_score_qa_Ada_Lovelace_all_validated.jsonl").write_text(
        "\n".join(
            [
                _qa("fact_1", "What did I start?", "Engine notes", ["2024-01-01:1"]),
                _qa(
                    "agg_1",
                    "What happened on the 3rd?",
                    "Tea, report and costs",
                    ["2024-01-03:1,2,3"],
                ),
                _qa(
                    "email_1",
                    "When do the punched cards arrive, as Charles told me?",
                    "Friday",
                    ["Emails_2024-01-01:Email"],
                ),
                _qa(
                    "email_2",
                    "Whom did I invite to tea?",
                    "Mary Somerville",
                    ["Emails_2024-01-03:Email 1"],
                ),
                _qa(
                    "email_3",
                    "Who wrote to me?",
                    "Charles Babbage",
                    [
                        "Emails_2024-01-01:Header: Email:From: Charles Babbage <charles@example.com>To: Ada"
                    ],
                ),
                _qa(
                    "email_4",
                    "What were my notes about?",
                    "The engine",
                    ["Emails_2024-01-01:Email to Charles"],
                ),
                _qa(
                    "doc_1",
                    "Where do the cards come from?",
                    "The Jacquard loom",
                    ["01_notes_task_aaaa1111.md:Punched Cards"],
                ),
                _qa(
                    "doc_2",
                    "How many numbers does the store keep?",
                    "1000",
                    ["01_notes_task_aaaa1111.md:Notes"],
                ),
                _qa(
                    "doc_3",
                    "What does the mill cost?",
                    "300 pounds",
                    ["02_report_task_bbbb2222.html:costs"],
                ),
                _qa(
                    "doc_4",
                    "Which number will I compute?",
                    "The seventh Bernoulli number",
                    ["01_notes_task_aaaa1111.md:Bernoulli Plan"],
                ),
                _qa(
                    "doc_5",
                    "Who is the report for?",
                    "Charles",
                    ["02_report_task_bbbb2222:Engine Report"],
                ),
                _qa(
                    "bad_1",
                    "Which turn?",
                    "None",
                    ["2024-01-01:9", "03_notes_task_cccc.md:Nothing"],
                ),
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    return tmp_path / "rhelm"


def test_fixture_records(tmp_path):
    root = make_rhelm(tmp_path)
    loaded = load_rhelm(root, "Ada_Lovelace")
    h = loaded.history
    assert h.stats()["records_by_kind"] == {
        "conversation_turn": 5,
        "email": 3,
        "document_section": 8,
    }
    assert h["2024-01-01:1"].text == "User: I started the engine notes.\nAssistant: Great start."
    assert h["2024-01-01:2"].references[0] == "01_notes_task_aaaa1111.md:(preamble)"
    reply = h["Emails_2024-01-01:Email 2"]
    assert reply.references == ["Emails_2024-01-01:Email 1"]
    assert reply.thread_id == h["Emails_2024-01-01:Email 1"].thread_id
    assert reply.metadata["source"] == "emails/Ada_Lovelace/01_email_2024_01_01.txt:8"
    assert h["Emails_2024-01-03:Email 1"].thread_id != reply.thread_id
    doc = h.threads()["01_notes_task_aaaa1111.md"]
    assert [s.id for s in doc] == [
        "01_notes_task_aaaa1111.md:(preamble)",
        "01_notes_task_aaaa1111.md:Engine Notes",
        "01_notes_task_aaaa1111.md:1. Punched Cards",
        "01_notes_task_aaaa1111.md:Notes",
        "01_notes_task_aaaa1111.md:Notes (2)",
    ]
    assert "# not a heading" in doc[2].text  # fenced code stays inside its section
    assert all(s.metadata["title"] == "Engine Notes" for s in doc)
    assert doc[2].metadata["heading_path"] == ["Engine Notes", "1. Punched Cards"]
    assert doc[2].metadata["source"] == "attachments/Ada_Lovelace/01_notes_task_aaaa1111.md:6"
    assert all(s.timestamp == datetime(2024, 1, 1) for s in doc)
    assert doc[0].references == ["Emails_2024-01-01:Email 1", "Emails_2024-01-01:Email 2"]
    report = h.threads()["02_report_task_bbbb2222.html"]
    assert [s.metadata["heading"] for s in report] == ["Engine Report", "Costs", "Open Questions"]
    assert report[0].text == "Engine Report\nWritten for Charles & friends."
    assert report[1].text == "Costs\n| Part | Cost\n| Mill | 300 pounds"
    assert report[2].text == "Open Questions\n- Who pays?\n- When?"
    assert report[2].metadata["heading_level"] == 3
    assert report[0].timestamp == datetime(2024, 1, 3)


def test_fixture_evidence_resolution(tmp_path):
    loaded = load_rhelm(make_rhelm(tmp_path), "Ada_Lovelace")
    ids = {q.id: q.evidence_ids for q in loaded.qa_items}
    assert ids["fact_1"] == ["2024-01-01:1"]
    assert ids["agg_1"] == ["2024-01-03:1", "2024-01-03:2", "2024-01-03:3"]
    assert ids["email_1"] == ["Emails_2024-01-01:Email 2"]  # the email that says "Friday"
    assert ids["email_2"] == ["Emails_2024-01-03:Email 1"]
    assert ids["email_3"] == ["Emails_2024-01-01:Email 2"]
    assert ids["email_4"] == ["Emails_2024-01-01:Email 1"]
    assert ids["doc_1"] == ["01_notes_task_aaaa1111.md:1. Punched Cards"]
    assert ids["doc_2"] == ["01_notes_task_aaaa1111.md:Notes (2)"]  # the repeat that fits
    assert ids["doc_3"] == ["02_report_task_bbbb2222.html:Costs"]
    assert ids["doc_4"] == ["01_notes_task_aaaa1111.md:Notes (2)"]  # a bold label in the text
    assert ids["doc_5"] == ["02_report_task_bbbb2222.html:Engine Report"]  # no extension
    methods = {q.id: q.metadata["evidence_resolution"][0]["method"] for q in loaded.qa_items}
    assert methods["doc_1"] == "heading_unnumbered" and methods["doc_4"] == "heading_in_text"
    assert methods["doc_5"] == "file_stem+exact"
    unresolved = {(u.qa_id, u.raw) for u in loaded.unresolved}
    assert unresolved == {("bad_1", "2024-01-01:9"), ("bad_1", "03_notes_task_cccc.md:Nothing")}
    assert loaded.evidence_resolved_fraction == pytest.approx(11 / 12)


def test_fixture_without_external_sources(tmp_path):
    loaded = load_rhelm(make_rhelm(tmp_path), "Ada_Lovelace", external=False)
    assert len(loaded.history) == 5
    assert len(loaded.qa_items) == 12
    external = {u.qa_id for u in loaded.unresolved if u.reason == EXTERNAL_NOT_LOADED}
    assert external == {
        "email_1",
        "email_2",
        "email_3",
        "email_4",
        "doc_1",
        "doc_2",
        "doc_3",
        "doc_4",
        "doc_5",
        "bad_1",
    }
    assert "references" not in loaded.history["2024-01-01:2"].model_dump(exclude_defaults=True)


def test_missing_persona_lists_the_available_ones(tmp_path):
    root = make_rhelm(tmp_path)
    with pytest.raises(InputError) as err:
        load_rhelm(root, "Ada")
    assert "Ada_Lovelace, Bob" in str(err.value) and "'Ada'" in str(err.value)
    assert err.value.field == "persona"


def test_not_a_rhelm_folder(tmp_path):
    with pytest.raises(InputError, match="not a RHELM folder"):
        list_personas(tmp_path)


def test_bad_on_error_value(tmp_path):
    with pytest.raises(ConfigError):
        load_rhelm(make_rhelm(tmp_path), "Ada_Lovelace", on_error="ignore")


def test_malformed_conversation_json_names_the_file(tmp_path):
    root = make_rhelm(tmp_path)
    bad = root / "data" / "conversations" / "Ada_Lovelace" / "conversation_2024_01_03.json"
    bad.write_text('{"date": "2024-01-03", "conversation": [', encoding="utf-8")
    with pytest.raises(InputError) as err:
        load_rhelm(root, "Ada_Lovelace")
    assert err.value.file == str(bad) and "invalid JSON" in err.value.message
    loaded = load_rhelm(root, "Ada_Lovelace", on_error="skip")
    assert [(s.file, s.reason[:12]) for s in loaded.skipped] == [(str(bad), "invalid JSON")]
    assert "2024-01-03:1" not in loaded.history and "2024-01-01:1" in loaded.history


def test_conversation_turn_without_a_field_names_file_and_field(tmp_path):
    root = make_rhelm(tmp_path)
    path = root / "data" / "conversations" / "Ada_Lovelace" / "conversation_2024_01_03.json"
    turns = [_turn(1, "2024-01-03", "ok", "ok"), {"turn": 2, "user": "no time", "assistant": "?"}]
    path.write_text(_session("2024-01-03", turns), encoding="utf-8")
    with pytest.raises(InputError) as err:
        load_rhelm(root, "Ada_Lovelace")
    assert err.value.file == str(path) and err.value.field == "conversation[1].timestamp"
    loaded = load_rhelm(root, "Ada_Lovelace", on_error="skip")
    assert "2024-01-03:1" in loaded.history and "2024-01-03:2" not in loaded.history
    assert len(loaded.skipped) == 1 and loaded.skipped[0].file == str(path)
    # the QA item citing the skipped turn reports it instead of losing it
    assert ("agg_1", "2024-01-03:1,2,3") in {(u.qa_id, u.raw) for u in loaded.unresolved}


def test_session_without_date_names_the_field(tmp_path):
    root = make_rhelm(tmp_path)
    path = root / "data" / "conversations" / "Bob" / "conversation_2024_01_01.json"
    path.write_text(json.dumps({"conversation": []}), encoding="utf-8")
    with pytest.raises(InputError) as err:
        load_rhelm(root, "Bob")
    assert err.value.field == "date" and err.value.file == str(path)


def test_non_utf8_email_names_the_file(tmp_path):
    root = make_rhelm(tmp_path)
    path = root / "data" / "emails" / "Ada_Lovelace" / "02_email_2024_01_03.txt"
    path.write_bytes(EMAILS_2.replace("Mary", "M\xe4ry").encode("latin-1"))
    with pytest.raises(InputError) as err:
        load_rhelm(root, "Ada_Lovelace")
    assert err.value.file == str(path) and "UTF-8" in err.value.message and err.value.line == 2
    loaded = load_rhelm(root, "Ada_Lovelace", on_error="skip")
    assert [s.file for s in loaded.skipped] == [str(path)]
    assert "Emails_2024-01-03:Email 1" not in loaded.history
    assert "Emails_2024-01-01:Email 1" in loaded.history
    assert ("email_2", "Emails_2024-01-03:Email 1") in {(u.qa_id, u.raw) for u in loaded.unresolved}


def test_email_without_sender_names_file_line_and_field(tmp_path):
    root = make_rhelm(tmp_path)
    path = root / "data" / "emails" / "Ada_Lovelace" / "01_email_2024_01_01.txt"
    path.write_text(
        EMAILS_1.replace("Sender: Charles Babbage <charles@example.com>\n", ""), encoding="utf-8"
    )
    with pytest.raises(InputError) as err:
        load_rhelm(root, "Ada_Lovelace")
    assert (err.value.file, err.value.line, err.value.field) == (str(path), 8, "Sender")
    loaded = load_rhelm(root, "Ada_Lovelace", on_error="skip")
    assert "Emails_2024-01-01:Email 1" in loaded.history
    assert "Emails_2024-01-01:Email 2" not in loaded.history  # numbering keeps its place


def test_duplicate_turn_numbers_are_an_input_error(tmp_path):
    root = make_rhelm(tmp_path)
    path = root / "data" / "conversations" / "Bob" / "conversation_2024_01_01.json"
    turn = {"turn": 1, "timestamp": "2024-01-01T08:00:00", "user": "Hi", "assistant": "Hello"}
    path.write_text(
        json.dumps({"date": "2024-01-01", "conversation": [turn, turn]}), encoding="utf-8"
    )
    with pytest.raises(InputError, match="duplicate record id '2024-01-01:1'"):
        load_rhelm(root, "Bob")
    assert len(load_rhelm(root, "Bob", on_error="skip").skipped) == 1


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("Yes", AnswerType.BOOLEAN),
        ("No.", AnswerType.BOOLEAN),
        ("2024-04-14", AnswerType.DATE),
        ("April 4, 2024", AnswerType.DATE),
        ("February 10th", AnswerType.DATE),
        ("3", AnswerType.NUMBER),
        ("Two times", AnswerType.NUMBER),
        ("40,000 steps", AnswerType.NUMBER),
        ("Five.", AnswerType.NUMBER),
        ("6/10", AnswerType.NUMBER),
        ("Jana, Lukas, and Sabine", AnswerType.LIST),
        ("Mrs. Fraser, Galloway; Heather Honey", AnswerType.LIST),
        ("Dorfromantik", AnswerType.ENTITY),
        ("Dr. Marta Alvarez", AnswerType.ENTITY),
        (" 'Ambience and Sociological Context'.", AnswerType.ENTITY),
        ("You did not serve steak on August 12; you baked a quiche.", AnswerType.TEXT),
        ("With the additions, the table now has 8 columns.", AnswerType.TEXT),
        ("Date: 2024-04-14, Subject: Missing Items in Jasper's Order", AnswerType.TEXT),
    ],
)
def test_infer_answer_type(answer, expected):
    assert infer_answer_type(answer) == expected


def test_malformed_qa_line_names_file_and_line(tmp_path):
    root = make_rhelm(tmp_path)
    path = root / "data" / "QA_final" / "low_score_qa_Ada_Lovelace_all_validated.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[2] = '{"id": "email_1", "question": "no answer field"}'
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(InputError) as err:
        load_rhelm(root, "Ada_Lovelace")
    assert (err.value.file, err.value.line, err.value.field) == (str(path), 3, "answer")
    loaded = load_rhelm(root, "Ada_Lovelace", on_error="skip")
    assert len(loaded.qa_items) == 11 and [s.line for s in loaded.skipped] == [3]


def test_load_history_dispatches_to_rhelm(tmp_path):
    from memsteer_dspy.loaders import load_history

    root = make_rhelm(tmp_path)
    loaded = load_history("rhelm", root / "data", user="Ada_Lovelace", external=False)
    assert loaded.history.user_id == "Ada_Lovelace" and len(loaded.history) == 5
    assert loaded.history.source == str(root)
