"""The native JSONL, LoCoMo and Hugging Face loaders, the dispatcher, and `memsteer ingest`."""

import json

import pytest
from typer.testing import CliRunner

from memsteer_dspy.cli import app
from memsteer_dspy.errors import DuplicateRecordError, EmptyHistoryError, InputError
from memsteer_dspy.loaders import load_history
from memsteer_dspy.loaders.locomo import normalize_dia_ids

runner = CliRunner()


def write_jsonl(path, objs):
    path.write_text(
        "\n".join(o if isinstance(o, str) else json.dumps(o) for o in objs) + "\n", encoding="utf-8"
    )
    return path


GOOD = [
    {
        "id": "m1",
        "kind": "conversation_turn",
        "text": "User: I booked the Lisbon trip. It costs 900 EUR.",
        "timestamp": "2024-03-01T10:00:00",
        "author": "Maya",
        "thread_id": "chat1",
        "position": 1,
    },
    {
        "id": "m2",
        "kind": "email",
        "text": "Subject: Trip moved\nThe trip moves to May 4.",
        "timestamp": "2024-03-05T08:00:00",
        "references": ["m1"],
    },
]


# -- native JSONL -------------------------------------------------------------------------------


def test_jsonl_loads_records_and_qa(tmp_path):
    write_jsonl(tmp_path / "records.jsonl", GOOD)
    write_jsonl(
        tmp_path / "qa.jsonl",
        [
            {
                "id": "q1",
                "question": "When is the trip?",
                "answer": "May 4",
                "answer_type": "date",
                "evidence_ids": ["m1", "m2"],
                "facts": [{"span_id": "m2#2"}],
            },
            {"id": "q2", "question": "Cost?", "answer": "900 EUR", "evidence_ids": ["m9"]},
        ],
    )
    loaded = load_history("jsonl", tmp_path, user="maya")
    assert loaded.history.user_id == "maya" and len(loaded.history) == 2
    assert loaded.history["m2"].references == ["m1"]
    assert loaded.history["m1"].metadata["source"].endswith("records.jsonl:1")
    assert loaded.qa_items[0].metadata["facts"] == [
        {"span_id": "m2#2"}
    ]  # extra keys kept in metadata
    assert [(u.qa_id, u.raw) for u in loaded.unresolved] == [("q2", "m9")]
    assert loaded.evidence_resolved_fraction == 0.5


def test_jsonl_malformed_line_names_file_line_and_field(tmp_path):
    p = write_jsonl(tmp_path / "h.jsonl", [GOOD[0], '{"id": "m2", "kind": "note"', GOOD[1]])
    with pytest.raises(InputError) as e:
        load_history("jsonl", p)
    assert e.value.file == str(p) and e.value.line == 2 and "invalid JSON" in str(e.value)

    p = write_jsonl(tmp_path / "h2.jsonl", [GOOD[0], {"id": "m2", "kind": "note", "text": 5}])
    with pytest.raises(InputError) as e:
        load_history("jsonl", p)
    assert (e.value.line, e.value.field, e.value.record) == (2, "text", "m2")
    assert f"{p}:2" in str(e.value)


def test_jsonl_skip_mode_reports_skipped_lines(tmp_path):
    p = write_jsonl(
        tmp_path / "h.jsonl", [GOOD[0], "not json", {"id": "x", "kind": "note"}, GOOD[1]]
    )
    loaded = load_history("jsonl", p, on_error="skip")
    assert [r.id for r in loaded.history.records] == ["m1", "m2"]
    assert [(s.line, s.reason.split(":")[0]) for s in loaded.skipped] == [
        (2, "invalid JSON"),
        (3, "Field required (field 'text')"),
    ]


def test_jsonl_duplicates_empty_and_encoding(tmp_path):
    p = write_jsonl(tmp_path / "dup.jsonl", [GOOD[0], GOOD[1], GOOD[0]])
    with pytest.raises(DuplicateRecordError, match=r"'m1'.*dup.jsonl:1.*dup.jsonl:3"):
        load_history("jsonl", p)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(EmptyHistoryError, match="no records"):
        load_history("jsonl", empty)
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(
        json.dumps(GOOD[0]).encode() + b'\n{"id": "z", "kind": "note", "text": "caf\xe9"}\n'
    )
    with pytest.raises(InputError) as e:
        load_history("jsonl", latin)
    assert "not UTF-8" in str(e.value) and e.value.line == 2 and e.value.file == str(latin)


# -- LoCoMo -------------------------------------------------------------------------------------


def locomo_file(tmp_path):
    sample = {
        "sample_id": "conv-1",
        "conversation": {
            "speaker_a": "Caroline",
            "speaker_b": "Melanie",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {
                    "speaker": "Caroline",
                    "dia_id": "D1:1",
                    "text": "I went to a support group yesterday.",
                },
                {
                    "speaker": "Melanie",
                    "dia_id": "D1:2",
                    "text": "Look at this!",
                    "img_url": ["http://x/y.jpg"],
                    "blip_caption": "a photo of a sunset over a lake",
                },
            ],
            "session_2_date_time": "10:37 am on 27 June, 2023",
            "session_2": [
                {
                    "speaker": "Caroline",
                    "dia_id": "D2:5",
                    "text": "I'm researching adoption agencies.",
                }
            ],
        },
        "qa": [
            {
                "question": "When did Caroline go to the group?",
                "answer": "7 May 2023",
                "evidence": ["D1:1"],
                "category": 2,
            },
            {
                "question": "What is Caroline researching?",
                "answer": "Adoption agencies",
                "evidence": ["D1:1; D2:05"],
                "category": 1,
            },
            {
                "question": "What did Melanie paint?",
                "adversarial_answer": "a sunset",
                "evidence": ["D:1:2", "D9:9", "garbage"],
                "category": 5,
            },
        ],
    }
    p = tmp_path / "locomo10.json"
    p.write_text(json.dumps([sample, {**sample, "sample_id": "conv-2"}]))
    return p


def test_locomo_records_captions_and_qa(tmp_path):
    loaded = load_history("locomo", locomo_file(tmp_path), user="conv-1")
    h = loaded.history
    assert [r.id for r in h] == ["D1:1", "D1:2", "D2:5"]
    assert "[shares an image: a photo of a sunset over a lake]" in h["D1:2"].text
    assert (
        h["D1:1"].timestamp.isoformat() == "2023-05-08T13:56:00"
        and h["D2:5"].thread_id == "session_2"
    )
    q = {item.question_type: item for item in loaded.qa_items}
    assert q["multi-hop"].evidence_ids == ["D1:1", "D2:5"]
    assert q["adversarial"].answer == "a sunset" and q["adversarial"].metadata["adversarial"]
    assert q["adversarial"].evidence_ids == ["D1:2"]
    assert sorted(u.raw for u in loaded.unresolved) == ["D9:9", "garbage"]
    assert loaded.evidence_resolved_fraction == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    ("raw", "ids"),
    [
        ("D8:6; D9:17", ["D8:6", "D9:17"]),
        ("D:11:26", ["D11:26"]),
        ("D30:05", ["D30:5"]),
        ("D1:2 D1:3", ["D1:2", "D1:3"]),
        ("nothing", []),
    ],
)
def test_locomo_evidence_normalization(raw, ids):
    assert normalize_dia_ids(raw) == ids


def test_locomo_needs_a_sample_when_several(tmp_path):
    p = locomo_file(tmp_path)
    with pytest.raises(InputError, match="choose one with --user") as e:
        load_history("locomo", p)
    assert "conv-1, conv-2" in str(e.value)
    with pytest.raises(InputError, match="no sample 'conv-9'"):
        load_history("locomo", p, user="conv-9")


# -- Hugging Face datasets ----------------------------------------------------------------------


def test_hf_loader_with_column_mapping(tmp_path):
    import datasets

    ds = datasets.Dataset.from_dict(
        {
            "msg_id": ["e1", "e2"],
            "body": ["Hello Ana.", "Re: the plan is on."],
            "sent": ["2024-01-02T09:00:00", "2024-01-03T09:00:00"],
            "conv": ["t", "t"],
            "folder": ["inbox", "sent"],
        }
    )
    ds.save_to_disk(str(tmp_path / "ds"))
    loaded = load_history(
        "hf",
        tmp_path / "ds",
        columns="id=msg_id,text=body,timestamp=sent,thread_id=conv",
        user="ana",
    )
    h = loaded.history
    assert [r.id for r in h] == ["e1", "e2"] and h["e2"].thread_id == "t"
    assert h["e1"].metadata["folder"] == "inbox" and h["e1"].kind == "note"
    # a local data file works too, and fields named like Record fields need no mapping
    write_jsonl(tmp_path / "rows.jsonl", [{"id": "r1", "text": "One.", "kind": "email"}])
    assert load_history("hf", tmp_path / "rows.jsonl").history["r1"].kind == "email"


def test_hf_loader_errors_name_the_problem(tmp_path):
    write_jsonl(tmp_path / "rows.jsonl", [{"key": "r1", "body": "One."}])
    with pytest.raises(InputError, match="no column for the required field 'id'") as e:
        load_history("hf", tmp_path / "rows.jsonl")
    assert "columns: key, body" in str(e.value)
    with pytest.raises(InputError, match="not in the dataset"):
        load_history("hf", tmp_path / "rows.jsonl", columns="id=key,text=nope")
    with pytest.raises(InputError, match="bad column mapping"):
        load_history("hf", tmp_path / "rows.jsonl", columns="id")


# -- CLI ------------------------------------------------------------------------------------------


def test_ingest_json_and_text(tmp_path):
    write_jsonl(tmp_path / "records.jsonl", GOOD)
    write_jsonl(
        tmp_path / "qa.jsonl",
        [{"id": "q1", "question": "Q?", "answer": "A", "evidence_ids": ["m1", "zz"]}],
    )
    res = runner.invoke(app, ["ingest", "--format", "jsonl", "--path", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["records"] == 2 and out["records_by_kind"] == {"conversation_turn": 1, "email": 1}
    assert out["spans"] == 4 and out["qa_items"] == 1 and out["evidence_resolved_fraction"] == 0.0
    assert out["unresolved_evidence"] == [
        {"qa_id": "q1", "raw": "zz", "reason": "no record with this id"}
    ]
    res = runner.invoke(app, ["ingest", "--format", "jsonl", "--path", str(tmp_path)])
    assert (
        res.exit_code == 0 and "0/1 items fully resolved" in res.stdout and "q1: 'zz'" in res.stdout
    )


def test_ingest_bad_input_exits_2_with_location(tmp_path):
    p = write_jsonl(tmp_path / "h.jsonl", [GOOD[0], "{broken"])
    res = runner.invoke(app, ["ingest", "--format", "jsonl", "--path", str(p)])
    assert res.exit_code == 2 and f"{p}:2" in res.output and "invalid JSON" in res.output
    res = runner.invoke(app, ["ingest", "--format", "xml", "--path", str(p)])
    assert res.exit_code == 2 and "unknown format" in res.output
