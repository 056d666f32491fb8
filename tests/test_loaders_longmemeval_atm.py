"""LongMemEval and ATM-Bench loaders on small files of the real shape; session-level recall;
ATM-Bench's list scoring; `memsteer ingest` / `evaluate` on both formats."""

import json

import pytest
from script_helpers import argv
from typer.testing import CliRunner

from memsteer_dspy.cli import app
from memsteer_dspy.errors import InputError
from memsteer_dspy.evaluation import any_all_recall, recall_any_all
from memsteer_dspy.loaders import load_history
from memsteer_dspy.loaders.longmemeval import iter_longmemeval
from memsteer_dspy.normalize import list_jaccard
from memsteer_dspy.records import AnswerType

runner = CliRunner()


def lme_instance(qid="e47becba", answer="Business Administration"):
    """One instance shaped like longmemeval_s: three sessions, evidence in the second."""
    return {
        "question_id": qid,
        "question_type": "single-session-user",
        "question": "What degree did I graduate with?",
        "answer": answer,
        "question_date": "2023/05/30 (Tue) 23:40",
        "haystack_session_ids": ["sharegpt_yywfJrO_0", "answer_280352e9", "ultrachat_1"],
        "haystack_dates": [
            "2023/05/20 (Sat) 02:21",
            "2023/05/21 (Sun) 11:02",
            "2023/05/22 (Mon) 09:00",
        ],
        "haystack_sessions": [
            [
                {"role": "user", "content": "Can you recommend a pasta recipe?"},
                {"role": "assistant", "content": "Try cacio e pepe: pecorino, pepper, spaghetti."},
            ],
            [
                {
                    "role": "user",
                    "content": "I graduated with a degree in Business Administration.",
                    "has_answer": True,
                },
                {
                    "role": "assistant",
                    "content": "Congratulations on your Business Administration degree!",
                },
                {
                    "role": "user",
                    "content": "Thanks, I now work in marketing.",
                    "has_answer": False,
                },
            ],
            [
                {"role": "user", "content": "What is the capital of Peru?"},
                {"role": "assistant", "content": "Lima."},
            ],
        ],
        "answer_session_ids": ["answer_280352e9"],
    }


@pytest.fixture
def lme_file(tmp_path):
    second = lme_instance("gpt4_2655b836_abs", 3)
    second["question"] = "How many kids do I have?"
    path = tmp_path / "longmemeval_s.json"
    path.write_text(json.dumps([lme_instance(), second]), encoding="utf-8")
    return path


def test_longmemeval_instance_turns_sessions_and_qa(lme_file):
    loaded = load_history("longmemeval", lme_file, user="e47becba")
    h = loaded.history
    assert h.user_id == "e47becba" and len(h) == 7
    r = h["answer_280352e9:1"]
    assert r.text == "User: I graduated with a degree in Business Administration."
    assert (r.author, r.thread_id, r.position, r.kind) == (
        "user",
        "answer_280352e9",
        1,
        "conversation_turn",
    )
    assert r.timestamp.isoformat() == "2023-05-21T11:02:00"
    assert h["answer_280352e9:2"].text.startswith("Assistant: Congratulations")
    assert [t.id for t in h][:2] == ["sharegpt_yywfJrO_0:1", "sharegpt_yywfJrO_0:2"]  # time order
    (q,) = loaded.qa_items
    assert q.id == "e47becba" and q.answer == "Business Administration"
    assert q.evidence_ids == ["answer_280352e9:1"]  # has_answer: true turns only
    assert q.question_date.isoformat() == "2023-05-30" and q.question_type == "single-session-user"
    assert (
        q.metadata["answer_session_ids"] == ["answer_280352e9"]
        and q.metadata["abstention"] is False
    )
    assert loaded.unresolved == [] and loaded.evidence_resolved_fraction == 1.0


def test_longmemeval_every_instance_round_trips(lme_file):
    """Each instance's every turn and its QA item survive loading unchanged."""
    raw = json.loads(lme_file.read_text())
    loaded = list(iter_longmemeval(lme_file))
    assert [x.history.user_id for x in loaded] == [i["question_id"] for i in raw]
    for inst, got in zip(raw, loaded, strict=True):
        turns = [
            (sid, t)
            for sid, sess in zip(
                inst["haystack_session_ids"], inst["haystack_sessions"], strict=True
            )
            for t in sess
        ]
        assert len(got.history) == len(turns)
        for rec, (sid, t) in zip(got.history.records, turns, strict=True):
            assert rec.thread_id == sid and rec.author == t["role"]
            assert rec.text == f"{t['role'].capitalize()}: {t['content']}"
            assert rec.metadata["has_answer"] == bool(t.get("has_answer"))
        (q,) = got.qa_items
        assert (q.question, q.answer) == (inst["question"], str(inst["answer"]))
    abstention = loaded[1].qa_items[0]
    assert abstention.metadata["abstention"] is True and abstention.answer_type is AnswerType.NUMBER


def test_longmemeval_bad_input_names_the_place(tmp_path, lme_file):
    with pytest.raises(InputError, match="choose one with --user") as e:
        load_history("longmemeval", lme_file)
    assert "e47becba" in str(e.value) and "--all" in str(e.value)
    with pytest.raises(InputError, match="no instance 'nope'"):
        load_history("longmemeval", lme_file, user="nope")
    bad = lme_instance()
    bad["haystack_dates"] = bad["haystack_dates"][:2]
    (tmp_path / "b.json").write_text(json.dumps([bad]))
    with pytest.raises(InputError, match="3 session ids, 3 sessions and 2 dates") as e:
        load_history("longmemeval", tmp_path / "b.json")
    assert e.value.record == "e47becba"
    bad = lme_instance()
    bad["haystack_sessions"][1][0] = {"role": "user"}
    (tmp_path / "c.json").write_text(json.dumps([bad]))
    with pytest.raises(InputError) as e:
        load_history("longmemeval", tmp_path / "c.json")
    assert e.value.field == "haystack_sessions[1][0]" and e.value.record == "e47becba"
    skipped = load_history("longmemeval", tmp_path / "c.json", on_error="skip")
    assert len(skipped.history) == 6 and "haystack_sessions[1][0]" in skipped.skipped[0].reason
    bad = lme_instance()
    bad["haystack_dates"][0] = "yesterday"
    (tmp_path / "d.json").write_text(json.dumps([bad]))
    with pytest.raises(InputError, match="unreadable date 'yesterday'") as e:
        load_history("longmemeval", tmp_path / "d.json")
    assert e.value.field == "haystack_dates[0]"
    bad = lme_instance()
    del bad["haystack_sessions"]
    (tmp_path / "e.json").write_text(json.dumps([bad]))
    with pytest.raises(InputError, match="lacks haystack_sessions"):
        load_history("longmemeval", tmp_path / "e.json")
    bad = lme_instance()
    bad["answer_session_ids"] = ["answer_gone"]
    (tmp_path / "f.json").write_text(json.dumps(bad))  # a single object is one instance
    loaded = load_history("longmemeval", tmp_path / "f.json")
    assert [(u.raw, u.reason) for u in loaded.unresolved] == [
        ("answer_gone", "answer session not in the haystack")
    ]


# -- recall_any / recall_all (LongMemEval's retrieval metrics) -------------------------------------


def test_recall_any_all_follows_longmemeval_definitions():
    assert recall_any_all(["a", "b", "c"], ["b", "z"], 2) == (1.0, 0.0)
    assert recall_any_all(["a", "b", "c"], ["a", "b"], 2) == (1.0, 1.0)
    assert recall_any_all(["a", "b", "c"], ["c"], 2) == (0.0, 0.0)
    assert recall_any_all(["a"], [], 5) is None
    session = {"s1:1": "s1", "s1:2": "s1", "s2:1": "s2", "s3:4": "s3"}.get
    # ranked units of turns; sessions are counted as the first k *distinct* sessions (LongMemEval's
    # turn-to-session evaluation grows k until it covers k sessions)
    ranked = [["s1:1"], ["s1:2"], ["s3:4"], ["s2:1"]]
    got = any_all_recall(ranked, ["s2:1"], ["s2", "s1"], session, ks=(1, 2, 3))
    assert got["turn_any@1"] == 0.0 and got["turn_any@3"] == 0.0
    assert (got["session_any@1"], got["session_all@1"]) == (1.0, 0.0)
    assert (got["session_any@2"], got["session_all@2"]) == (1.0, 0.0)  # s1, s3
    assert (got["session_any@3"], got["session_all@3"]) == (1.0, 1.0)  # s1, s3, s2
    assert "turn_any@1" in any_all_recall(ranked, ["s1:1"], [], session, ks=(1,))
    assert "session_any@1" not in any_all_recall(ranked, ["s1:1"], [], session, ks=(1,))


def test_evaluate_reports_session_recall_on_longmemeval(lme_file, tmp_path):
    """`evaluate --all --metrics recall` (BM25, no LM): every instance over its own haystack."""
    res = runner.invoke(
        app,
        [
            *argv("evaluate --format longmemeval --path {} --all", lme_file),
            *argv("--metrics recall --no-cache --json --out {}", tmp_path / "ev"),
        ],
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout[res.stdout.index("{") :])
    assert summary["n"] == 2 and summary["user"] == "2 instances"
    a = summary["any_all_recall"]
    # the degree question's evidence turn shares its words: BM25 ranks it, and its session, first
    assert a["turn_any@5"] == 1.0 and a["session_any@5"] == 1.0 and a["session_all@10"] == 1.0
    assert set(a) == {
        f"{lvl}_{m}@{k}" for lvl in ("turn", "session") for m in ("any", "all") for k in (5, 10)
    }
    assert (tmp_path / "ev" / "e47becba" / "items.jsonl").exists() and (
        tmp_path / "ev" / "summary.json"
    ).exists()
    items = [
        json.loads(x)
        for x in (tmp_path / "ev" / "gpt4_2655b836_abs" / "items.jsonl").read_text().splitlines()
    ]
    assert items[0]["any_all_recall"] is None  # abstention items are left out, as LongMemEval does
    one = runner.invoke(
        app,
        [
            *argv("evaluate --format longmemeval --path {}", lme_file),
            *argv("--user e47becba --metrics recall --no-cache"),
        ],
    )
    assert one.exit_code == 0, one.output
    assert "session" in one.output and "any@5" in one.output
    # a failed retrieval scores 0 here too, never leaves the item out
    from memsteer_dspy.evaluation import evaluate_item
    from memsteer_dspy.memory import MemoryDesign, MemorySystem

    loaded = load_history("longmemeval", lme_file, user="e47becba")
    system = MemorySystem.from_design(MemoryDesign.base_bm25(), loaded.history)
    system.retrieve = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("index gone"))
    failed = evaluate_item(system, loaded.qa_items[0], metrics="recall")
    assert failed.error == "RuntimeError: index gone" and set(failed.any_all_recall.values()) == {
        0.0
    }
    both = runner.invoke(
        app,
        ["evaluate", "--format", "longmemeval", "--path", str(lme_file), "--user", "x", "--all"],
    )
    assert both.exit_code != 0 and "not both" in both.output


# -- ATM-Bench ---------------------------------------------------------------------------------------


@pytest.fixture
def atm_root(tmp_path):
    root = tmp_path / "ATM-Bench"
    (root / "data" / "atm-bench" / "niah").mkdir(parents=True)
    (root / "data" / "raw_memory" / "email").mkdir(parents=True)
    (root / "output" / "image" / "qwen3vl2b").mkdir(parents=True)
    (root / "output" / "video" / "qwen3vl2b").mkdir(parents=True)
    emails = [
        {
            "id": "email202401010001",
            "timestamp": "2024-01-01 12:34:56",
            "short_summary": "Train ticket to Oxford",
            "detail": "Your e-ticket: London Marylebone to Oxford, 3 Feb 2024, £12.85 with railcard.",
        },
        {
            "id": "email202402100002",
            "timestamp": "2024-02-10 08:00:00",
            "short_summary": "Dentist appointment",
            "detail": "Reminder: appointment on 14 February at 4:00 PM.",
        },
    ]
    images = [
        {
            "image_path": "data/raw_memory/image/20220430_132212.jpg",
            "timestamp": "2022:04:30 13:22:12",
            "location_name": "Radcliffe Camera, Oxford",
            "short_caption": "A library dome",
            "caption": "A round domed library under a blue sky.",
            "ocr_text": "",
            "tags": ["library", "oxford"],
        },
        {
            "image_path": "data/raw_memory/image/20220502_172850.jpg",
            "timestamp": "2022-05-02 17:28:50",
            "location_name": "Cambridge",
            "short_caption": "Punting",
            "caption": "People punting on a river.",
            "ocr_text": "SCUDAMORE'S PUNTING CO",
            "tags": ["river", "boat"],
        },
    ]
    videos = [
        {
            "video_path": "data/raw_memory/video/20230101_000501.mp4",
            "timestamp": "2023-01-01 00:05:01",
            "location_name": "London",
            "short_caption": "Fireworks",
            "caption": "New Year fireworks over the Thames.",
            "ocr_text": "",
            "tags": ["fireworks"],
        },
    ]
    qas = {
        "qas": [
            {
                "id": "atm_001",
                "question": "How much was my train ticket to Oxford?",
                "answer": "£12.85",
                "evidence_ids": ["email202401010001"],
            },
            {
                "id": "atm_002",
                "question": "Which photos show a river or a library?",
                "answer": "20220430_132212, 20220502_172850",
                "evidence_ids": ["20220430_132212", "20220502_172850"],
            },
            {
                "id": "atm_003",
                "question": "Where did I watch fireworks?",
                "answer": "London",
                "evidence_ids": ["20230101_000501", "20990101_000000"],
            },
        ]
    }
    (root / "data" / "raw_memory" / "email" / "emails.json").write_text(json.dumps(emails))
    (root / "output" / "image" / "qwen3vl2b" / "batch_results.json").write_text(json.dumps(images))
    (root / "output" / "video" / "qwen3vl2b" / "batch_results.json").write_text(json.dumps(videos))
    (root / "data" / "atm-bench" / "atm-bench.json").write_text(json.dumps(qas))
    (root / "data" / "atm-bench" / "atm-bench-hard.json").write_text(
        json.dumps(qas["qas"][:1])
    )  # bare array
    (root / "data" / "atm-bench" / "niah" / "atm-bench-pool25.json").write_text("[]")
    return root


def test_atm_loads_emails_media_and_qa(atm_root):
    loaded = load_history("atm", atm_root)
    h = loaded.history
    assert {r.kind for r in h.records} == {"email", "image", "video"} and len(h) == 5
    e = h["email202401010001"]
    assert (
        e.text.startswith("Subject: Train ticket to Oxford\nYour e-ticket")
        and e.title == "Train ticket to Oxford"
    )
    assert e.timestamp.isoformat() == "2024-01-01T12:34:56"
    img = h["20220502_172850"]  # the evidence id is the media file's stem
    assert "People punting on a river." in img.text and "SCUDAMORE'S PUNTING CO" in img.text
    assert "Tags: river, boat" in img.text and "Place: Cambridge" in img.text
    assert h["20220430_132212"].timestamp.isoformat() == "2022-04-30T13:22:12"  # EXIF-style date
    assert h["20230101_000501"].kind == "video"
    q1, q2, q3 = loaded.qa_items
    assert q1.evidence_ids == ["email202401010001"] and q1.answer_type is AnswerType.TEXT
    assert q2.answer_type is AnswerType.LIST
    assert q3.evidence_ids == ["20230101_000501"]
    assert [(u.qa_id, u.raw) for u in loaded.unresolved] == [("atm_003", "20990101_000000")]
    hard = load_history("atm", atm_root, user="atm-bench-hard")
    assert [q.id for q in hard.qa_items] == ["atm_001"]


def test_atm_round_trips_every_record_and_qa(atm_root):
    loaded = load_history("atm", atm_root)
    raw_emails = json.loads((atm_root / "data/raw_memory/email/emails.json").read_text())
    for e in raw_emails:
        assert e["detail"] in loaded.history[e["id"]].text
    for sub in ("image", "video"):
        for m in json.loads((atm_root / f"output/{sub}/qwen3vl2b/batch_results.json").read_text()):
            path = m.get("image_path") or m.get("video_path")
            rec = loaded.history[path.rsplit("/", 1)[1].rsplit(".", 1)[0]]
            assert (
                m["caption"] in rec.text and rec.metadata["media_path"] == path and rec.kind == sub
            )
    raw_qas = json.loads((atm_root / "data/atm-bench/atm-bench.json").read_text())["qas"]
    assert [(q.id, q.question, q.answer, q.metadata["raw_evidence"]) for q in loaded.qa_items] == [
        (q["id"], q["question"], q["answer"], q["evidence_ids"]) for q in raw_qas
    ]


def test_atm_bad_input_names_the_place(atm_root, tmp_path):
    with pytest.raises(InputError, match="no QA file nope.json") as e:
        load_history("atm", atm_root, user="nope")
    assert "atm-bench-hard" in str(e.value) and "pool25" not in str(
        e.value
    )  # NIAH pools are not QA sets
    (atm_root / "output/video/qwen3vl2b/batch_results.json").write_text(
        json.dumps([{"timestamp": "x"}])
    )
    with pytest.raises(InputError, match="neither 'image_path' nor 'video_path'") as e:
        load_history("atm", atm_root)
    assert e.value.field == "[0]" and e.value.file.endswith("video/qwen3vl2b/batch_results.json")
    assert len(load_history("atm", atm_root, on_error="skip").skipped) == 1
    (atm_root / "data/atm-bench/atm-bench.json").write_text('{"qas": [{"id": "q"')
    with pytest.raises(InputError, match="invalid JSON"):
        load_history("atm", atm_root, on_error="skip")
    with pytest.raises(InputError, match="no emails.json or batch_results.json"):
        load_history("atm", tmp_path / "ATM-Bench" / "data" / "atm-bench")


def test_list_jaccard_matches_atm_bench_scoring():
    """ATM-Bench's list_jaccard (memqa/utils/evaluator/evaluate_qa.py): items split on , ; and /,
    normalized; memory ids in a prose prediction are the prediction's items; Jaccard of the sets."""
    gt = "20220430_132212, 20220502_172850"
    assert list_jaccard("20220430_132212, 20220502_172850", gt) == 1.0
    assert list_jaccard("20220502_172850", gt) == 0.5
    assert list_jaccard("20220502_172850, 20230101_000501", gt) == pytest.approx(1 / 3)
    # prose that names the ids: ATM-Bench extracts the ids, so only the ids count
    assert list_jaccard("The photos are 20220430_132212 and 20220502_172850.", gt) == 1.0
    assert list_jaccard(
        "I found email202401010001 and 20220502_172850", "email202401010001; 20220430_132212"
    ) == pytest.approx(1 / 3)
    # plain items: case, articles-free punctuation and 'and' separators normalize away
    assert list_jaccard("Oxford and Cambridge", "cambridge, oxford") == 1.0
    assert list_jaccard("Oxford / London", "Oxford, Cambridge") == pytest.approx(1 / 3)
    assert list_jaccard("", "Oxford") == 0.0 and list_jaccard("", "") == 1.0


def test_ingest_accepts_both_formats(atm_root, lme_file):
    res = runner.invoke(app, ["ingest", "--format", "atm", "--path", str(atm_root), "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert sorted(report["records_by_kind"].items()) == [("email", 2), ("image", 2), ("video", 1)]
    assert report["qa_items"] == 3 and report["unresolved_evidence"][0]["raw"] == "20990101_000000"
    res = runner.invoke(
        app, ["ingest", "--format", "longmemeval", "--path", str(lme_file), "--user", "e47becba"]
    )
    assert res.exit_code == 0, res.output
    assert "records       7" in res.output and "threads       3" in res.output
    res = runner.invoke(
        app,
        argv("evaluate --format atm --path {} --metrics recall --no-cache --json", atm_root),
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["recall_at_10"] > 0.5


def test_evaluate_all_out_is_a_run_folder_and_restart_reaches_it(lme_file, tmp_path):
    """#46: `evaluate --all` ignored --restart and wrote summary.json into any folder."""
    base = f"evaluate --format longmemeval --path {lme_file} --all --metrics recall --no-cache"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "summary.json").write_text("mine\n")
    res = runner.invoke(app, [*base.split(), "--out", str(mine)])
    assert res.exit_code == 2 and "not a memsteer run folder" in res.output, res.output
    assert (mine / "summary.json").read_text() == "mine\n"
    ev = tmp_path / "ev"
    assert runner.invoke(app, [*base.split(), "--out", str(ev)]).exit_code == 0
    (ev / "e47becba" / "stale.txt").write_text("x")
    res = runner.invoke(app, [*base.split(), "--out", str(ev), "--restart"])
    assert res.exit_code == 0, res.output
    assert not (ev / "e47becba" / "stale.txt").exists() and (ev / "summary.json").exists()
    assert json.loads((ev / "run.json").read_text())["key"]["stage"] == "evaluate_instances"
