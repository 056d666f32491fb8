"""`generate_supervision` end to end with scripted LMs: outputs, split, near-duplicates, resumption
after an interruption, and the `memsteer generate` command."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest
from script_helpers import argv
from supervision_helpers import audit_reply, endless, plan_reply

from memsteer_dspy.bundles import BundleConfig
from memsteer_dspy.errors import InputError
from memsteer_dspy.records import History, QAItem, Record
from memsteer_dspy.runfolder import RunMismatchError
from memsteer_dspy.supervision.run import (
    GenerationConfig,
    SupervisionSet,
    format_kept,
    format_summary,
    generate_supervision,
    kept_by_task,
    load_qa_jsonl,
    read_log,
    split_by_bundle,
)

PLACES = [
    "Lisbon",
    "Porto",
    "Madrid",
    "Seville",
    "Valencia",
    "Bilbao",
    "Granada",
    "Malaga",
    "Cadiz",
    "Toledo",
]
TOPICS = [
    "budget",
    "garden",
    "library",
    "printer",
    "workshop",
    "picnic",
    "concert",
    "recital",
    "museum",
    "harbor",
]


def laptop_history(n_threads: int = 6) -> History:
    """Threads of three turns; every turn's first sentence names the MacBook Air."""
    records = []
    t0 = datetime(2024, 1, 1)
    for t in range(n_threads):
        for p in range(3):
            i = t * 3 + p
            records.append(
                Record(
                    id=f"s{t}:{p}",
                    kind="conversation_turn",
                    thread_id=f"s{t}",
                    position=p,
                    timestamp=t0 + timedelta(days=t, minutes=p),
                    text=(
                        f"User: I packed my MacBook Air for the {PLACES[i % 10]} trip with Ana on day {i}. "
                        f"We talked about the {TOPICS[i % 10]} plan and {TOPICS[(i + 3) % 10]} ideas. "
                        # the scripted questions name any of these cities (question:unknown_name otherwise)
                        f"Ana's map marks {', '.join(PLACES)}."
                    ),
                )
            )
    return History("laptop-user", records)


def accepting_lms(repeat_question: bool = False, offset: int = 0):
    """Scripted LMs that accept every candidate (distinct questions unless ``repeat_question``;
    ``offset`` continues the questions of an earlier run)."""

    def question(i):
        i += offset
        if repeat_question:
            return {"question": "Which laptop did I pack for the trip with Ana?"}
        return {
            "question": f"Which laptop did I bring to the {PLACES[i % 10]} meeting about {TOPICS[(i * 7) % 10]}?"
        }

    return {
        "planner": endless(lambda i: plan_reply(answer="MacBook Air")),
        "question_writer": endless(question),
        "auditor": endless(lambda i: audit_reply()),
        "blind_reader": endless(
            lambda i: {
                "cited_ids": ["R1.1", "R2.1", "R3.1"],
                "answer": "MacBook Air",
                "answerable": True,
            }
        ),
    }


def config(**kw) -> GenerationConfig:
    values = {
        "n": 100,
        "max_candidates": 6,
        "batch_size": 3,
        "bundle": BundleConfig(evidence_weights={1: 1.0}, min_records=3, max_records=3),
    }
    values.update(kw)
    return GenerationConfig(**values)


def test_outputs_split_and_summary(tmp_path):
    history = laptop_history()
    summary = generate_supervision(history, accepting_lms(), tmp_path, config(), progress=False)
    assert (
        summary["candidates"] == 6 and summary["accepted"] == 6 and summary["kept_fraction"] == 1.0
    )
    for key in ("rejected_by_stage", "lm_calls", "tokens_per_accepted", "wall_seconds"):
        assert key in summary
    assert summary["lm_calls"] == {
        "planner": 6,
        "question_writer": 6,
        "auditor": 6,
        "blind_reader": 6,
    }
    assert json.loads((tmp_path / "summary.json").read_text())["accepted"] == 6

    lines = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    lines += [json.loads(x) for x in (tmp_path / "val.jsonl").read_text().splitlines()]
    assert len(lines) == 6
    for obj in lines:
        for key in ("id", "question", "answer", "answer_type", "evidence_ids", "facts"):
            assert key in obj
        assert obj["facts"][0]["span_id"].endswith("#1")
        assert obj["source"] == "generated"
        prov = obj["metadata"]["provenance"]
        assert {"seed", "bundle_record_ids", "lm", "usage", "bundle_id"} <= set(prov)
        assert obj["metadata"]["audit"]["answer_support"] == "supported"
        assert obj["metadata"]["blind"]["answer"] == "MacBook Air"
        # asked the day after its latest evidence record
        ev_day = max(history[r].timestamp for r in obj["evidence_ids"]).date()
        assert obj["question_date"] == (ev_day + timedelta(days=1)).isoformat()

    sup = SupervisionSet.load(tmp_path)
    assert len(sup) == 6 and all(isinstance(i, QAItem) for i in sup.train + sup.val)
    # the split is by bundle: no bundle on both sides, about 60/40
    train_b = {i.metadata["provenance"]["bundle_id"] for i in sup.train}
    val_b = {i.metadata["provenance"]["bundle_id"] for i in sup.val}
    assert not train_b & val_b
    assert len(sup.train) == 4 and len(sup.val) == 2

    from datasets import load_from_disk

    ds = load_from_disk(str(tmp_path / "dataset"))
    assert ds["train"].num_rows == 4 and ds["validation"].num_rows == 2
    assert ds["train"][0]["facts"][0]["span_id"]
    assert "accepted 6 of 6 candidates" in format_summary(summary)


def test_rejected_lines_have_stage_and_reason(tmp_path):
    lms = accepting_lms()
    lms["blind_reader"] = endless(
        lambda i: {"cited_ids": [], "answer": "iPad", "answerable": i % 2 == 0}
    )
    summary = generate_supervision(
        laptop_history(), lms, tmp_path, config(max_candidates=4), progress=False
    )
    assert summary["accepted"] == 0
    rejected = [json.loads(x) for x in (tmp_path / "rejected.jsonl").read_text().splitlines()]
    assert len(rejected) == 4
    assert {r["stage"] for r in rejected} == {"blind"}
    assert {r["reason"] for r in rejected} == {"blind:mismatch", "blind:unanswerable"}
    assert summary["rejected_by_stage"] == {"blind": 4}


def test_near_duplicate_questions_are_removed(tmp_path):
    # no demos: an accepted question as a demo would reject its copies earlier (question:copies_demo)
    cfg = config(max_candidates=4, max_demos=0)
    summary = generate_supervision(
        laptop_history(), accepting_lms(repeat_question=True), tmp_path, cfg, progress=False
    )
    assert summary["accepted"] == 1
    assert summary["rejected_by_reason"] == {"dedup:near_duplicate": 3}
    # the task left the answer type to the planner: one kind, "any" answer from one record
    assert summary["kept_by_task"] == {"any/1": {"tried": 4, "accepted": 1}}
    assert "kept by task (accepted/tried): any/1 1/4" in format_summary(summary)


def test_kept_by_task_counts_tried_and_accepted_per_kind_and_skips_skipped():
    from supervision_helpers import logged as rec

    log = [
        rec(0, "rejected", "entity", 2),
        rec(1, "accepted", "date", 1),
        rec(2, "rejected", "entity", 2),
        rec(3, "skipped", "entity", 2),
        rec(4, "accepted", "entity", 2),
        rec(5, "rejected", "date", 1),
        rec(6, "rejected", "date", 1),
        rec(7, "rejected", "number", 1),
    ]
    kept = kept_by_task(log)
    assert kept == {
        "entity/2": {"tried": 3, "accepted": 1},
        "date/1": {"tried": 3, "accepted": 1},
        "number/1": {"tried": 1, "accepted": 0},
    }
    assert list(kept)[-1] == "number/1"  # most tried first
    assert format_kept(kept) == "entity/2 1/3, date/1 1/3, number/1 0/1"


def test_copies_of_an_accepted_demo_question_are_rejected_before_the_audit(tmp_path):
    cfg = config(max_candidates=6, batch_size=1)
    summary = generate_supervision(
        laptop_history(), accepting_lms(repeat_question=True), tmp_path, cfg, progress=False
    )
    assert summary["accepted"] == 1
    assert summary["rejected_by_reason"] == {"question:copies_demo": 5}


def test_stops_when_n_items_are_accepted(tmp_path):
    summary = generate_supervision(
        laptop_history(),
        accepting_lms(),
        tmp_path,
        config(n=2, max_candidates=10, batch_size=8),
        progress=False,
    )
    # batches are sized to what is still needed (2 x missing), so the run stops early
    assert summary["accepted"] >= 2 and summary["candidates"] <= 4


def test_a_time_budget_stops_new_candidates_and_a_resume_keeps_it(tmp_path, monkeypatch):
    import types

    import memsteer_dspy.runfolder as runfolder_module
    import memsteer_dspy.supervision.run as run_module

    # a clock that moves 10 s per candidate, for the run and for its folder's session times
    clock = [0.0]
    fake_time = types.SimpleNamespace(perf_counter=lambda: clock[0])
    monkeypatch.setattr(run_module, "time", fake_time)
    monkeypatch.setattr(runfolder_module, "time", fake_time)
    lms = accepting_lms()

    def blind_reply(i: int) -> dict:
        clock[0] += 10.0  # consumed when the blind reader is called, once per candidate
        return {"cited_ids": ["R1.1", "R2.1", "R3.1"], "answer": "MacBook Air", "answerable": True}

    lms["blind_reader"] = endless(blind_reply)
    cfg = config(n=100, max_candidates=6, batch_size=1, time_budget_s=25.0)
    summary = generate_supervision(laptop_history(), lms, tmp_path, cfg, progress=False)
    # 0 s, 10 s and 20 s are under the budget, so three candidates start; at 30 s none does
    assert summary["candidates"] == 3 and summary["stopped_by"] == "time_budget"
    assert json.loads((tmp_path / "summary.json").read_text())["stopped_by"] == "time_budget"
    # the budget counts every session of the run: a resume starts nothing more
    again = generate_supervision(laptop_history(), lms, tmp_path, cfg, progress=False)
    assert again["candidates"] == 3 and again["stopped_by"] == "time_budget"
    # without the budget the same run goes on to its candidate limit
    rest = generate_supervision(
        laptop_history(),
        lms,
        tmp_path,
        config(n=100, max_candidates=6, batch_size=1),
        progress=False,
    )
    assert rest["candidates"] == 6 and rest["stopped_by"] == "candidates"


def test_resume_after_interrupt_never_duplicates_or_loses(tmp_path):
    history = laptop_history()
    seen = []

    def stop_after_three(record, counts):
        seen.append(record.index)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        generate_supervision(
            history, accepting_lms(), tmp_path, config(batch_size=2), progress=stop_after_three
        )
    # the folder is consistent: 3 finished candidates, derived files written
    log = read_log(tmp_path)
    assert [r.index for r in log] == [0, 1, 2]
    first_ids = {r.item["id"] for r in log if r.status == "accepted"}
    assert (
        len(load_qa_jsonl(tmp_path / "train.jsonl")) + len(load_qa_jsonl(tmp_path / "val.jsonl"))
        == 3
    )
    assert json.loads((tmp_path / "summary.json").read_text())["candidates"] == 3

    # a torn line from a kill mid-write is cut off on resume
    with (tmp_path / "candidates.jsonl").open("a") as fh:
        fh.write('{"index": 3, "status": "acc')
    summary = generate_supervision(
        history, accepting_lms(offset=3), tmp_path, config(batch_size=2), progress=False
    )
    log = read_log(tmp_path)
    assert [r.index for r in log] == [0, 1, 2, 3, 4, 5]
    items = load_qa_jsonl(tmp_path / "train.jsonl") + load_qa_jsonl(tmp_path / "val.jsonl")
    ids = [i.id for i in items]
    assert len(ids) == len(set(ids)) == 6
    assert first_ids <= set(ids)
    assert summary["candidates"] == 6
    run = json.loads((tmp_path / "run.json").read_text())
    assert len(run["sessions"]) == 2

    # a third run has nothing left to do
    again = generate_supervision(
        history, accepting_lms(), tmp_path, config(batch_size=2), progress=False
    )
    assert again["candidates"] == 6 and len(read_log(tmp_path)) == 6


def test_resume_refuses_other_settings(tmp_path):
    history = laptop_history()
    generate_supervision(
        history, accepting_lms(), tmp_path, config(max_candidates=1), progress=False
    )
    with pytest.raises(RunMismatchError, match="options.seed: folder has 0, this run has 9"):
        generate_supervision(
            history, accepting_lms(), tmp_path, config(max_candidates=1, seed=9), progress=False
        )
    other = History("laptop-user", list(history.records)[:-1])
    with pytest.raises(RunMismatchError, match="history_fingerprint"):
        generate_supervision(
            other, accepting_lms(), tmp_path, config(max_candidates=1), progress=False
        )


def test_threads(tmp_path):
    summary = generate_supervision(
        laptop_history(), accepting_lms(), tmp_path, config(threads=2), progress=False
    )
    assert summary["candidates"] == 6 and summary["accepted"] == 6
    assert sorted(r.index for r in read_log(tmp_path)) == list(range(6))


def test_naive_and_no_checks_methods(tmp_path):
    lms = accepting_lms()
    lms["planner"] = endless(
        lambda i: {
            "question": f"Which laptop did I bring to the {PLACES[i % 10]} meeting about {TOPICS[(i * 7) % 10]}?",
            "answer": "MacBook Air",
            "answer_type": "entity",
            "evidence_record_ids": ["R1"],
        }
    )
    summary = generate_supervision(
        laptop_history(),
        lms,
        tmp_path / "naive",
        config(method="naive", checks=False),
        progress=False,
    )
    assert summary["accepted"] == 6 and summary["lm_calls"] == {"planner": 6}
    item = load_qa_jsonl(tmp_path / "naive" / "train.jsonl")[0]
    assert item.metadata["provenance"]["method"] == "naive"


def test_split_by_bundle_keeps_bundles_whole():
    items = [
        QAItem(
            id=f"q{i}",
            question="q?",
            answer="a",
            metadata={"provenance": {"bundle_id": f"b{i // 2}"}},
        )
        for i in range(10)
    ]
    train, val = split_by_bundle(items, 0.6, seed=1)
    assert len(train) == 6 and len(val) == 4
    tb = {i.metadata["provenance"]["bundle_id"] for i in train}
    assert not tb & {i.metadata["provenance"]["bundle_id"] for i in val}


def test_load_qa_jsonl_names_the_bad_line(tmp_path):
    path = tmp_path / "qa.jsonl"
    good = {"id": "x", "question": "Where?", "answer": "Lisbon", "facts": [{"span_id": "r#1"}]}
    path.write_text(
        json.dumps(good) + "\n" + json.dumps({"id": "y", "question": "", "answer": "a"}) + "\n"
    )
    with pytest.raises(InputError) as err:
        load_qa_jsonl(path)
    assert err.value.line == 2 and err.value.field == "question"
    path.write_text(json.dumps(good) + "\n")
    (item,) = load_qa_jsonl(path)
    assert item.metadata["facts"] == [{"span_id": "r#1"}]


def scripted_generate_cli(tmp_path, monkeypatch, *, in_process: bool):
    """A history file, and ``memsteer generate``'s LM config replaced by accepting scripted LMs
    (``in_process`` says whether they count as grammar-bounded in-process ones)."""
    import memsteer_dspy.lm

    hist = tmp_path / "history.jsonl"
    hist.write_text(
        "".join(json.dumps(r.model_dump(mode="json")) + "\n" for r in laptop_history().records)
    )
    lms = accepting_lms()

    class FakeConfig:
        def lm(self, role):
            return lms[role]

        def describe(self):
            return dict.fromkeys(lms, "scripted")

        def usage_by_role(self):
            return {}

        def in_process(self, *roles):
            return in_process

    monkeypatch.setattr(memsteer_dspy.lm, "load_lm_config", lambda *a, **k: FakeConfig())
    return hist


def test_generate_command(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from memsteer_dspy.cli import app

    # a scripted LM: no grammar-bounded lengths, the full profile
    hist = scripted_generate_cli(tmp_path, monkeypatch, in_process=False)
    out = tmp_path / "out"
    args = [
        *argv("generate --format jsonl --path {} --out {}", hist, out),
        *argv("--n 3 --max-candidates 4 --profile full --json"),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout[result.stdout.index("{") :])
    assert summary["accepted"] >= 3
    assert (out / "train.jsonl").exists() and (out / "dataset").is_dir()
    bad = CliRunner().invoke(app, [*args[:-1], "--method", "magic"])
    assert bad.exit_code != 0 and "magic" not in (out / "run.json").read_text()


@pytest.mark.parametrize(
    ("extra", "in_process", "lean", "anchored", "examples"),
    [
        # the embedded model: lean-anchor, the measured small-LM pipeline, with writer examples
        ([], True, True, True, 4),
        (["--writer-examples", "0"], True, True, True, 0),  # none, as asked
        (["--no-lean"], True, False, False, 0),  # the paper's prompts on request
        (["--lean"], True, True, False, 0),  # lean alone, as asked
        ([], False, False, False, 0),  # an API LM: the paper's prompts
        (["--writer-examples", "2"], False, False, False, 2),  # examples for any pipeline
    ],
)
def test_generate_picks_the_small_lm_pipeline_for_an_in_process_planner(
    tmp_path, monkeypatch, extra, in_process, lean, anchored, examples
):
    from typer.testing import CliRunner

    from memsteer_dspy.cli import app

    hist = scripted_generate_cli(tmp_path, monkeypatch, in_process=in_process)
    out = tmp_path / "out"
    args = [
        *argv("generate --format jsonl --path {} --out {} --n 1 --max-candidates 1", hist, out),
        *extra,
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    options = json.loads((out / "run.json").read_text())["key"]["options"]
    assert options.get("lean", False) is lean and ("anchored_version" in options) is anchored
    shown = options.get("writer_examples", {}).get("sources", [])
    assert len(shown) == examples and all(s.startswith("writer_examples/") for s in shown)
    if anchored:
        assert options["bundle"]["steer_by_yield"] and options["bundle"]["yield_power"] == 2.0
        assert (
            options["bundle"]["steer_to_options"]
            and "lean prompts, anchored planner" in result.output
        )


def test_bootstrapped_demos_default_off_for_bounded_in_process_lms():
    assert config().demo_limit == 2
    assert config(bounded=True).demo_limit == 0
    assert config(bounded=True, max_demos=3).demo_limit == 3


def test_a_lean_run_resumes_only_under_the_lean_checks_it_was_made_with(tmp_path, monkeypatch):
    from memsteer_dspy.supervision import config as config_module  # GenerationConfig reads it

    assert "lean_version" not in config().identity()
    assert config(lean=True).identity()["lean_version"] == config_module.LEAN_VERSION
    history = laptop_history()
    lean = config(max_candidates=1, lean=True)
    generate_supervision(history, accepting_lms(), tmp_path, lean, progress=False)
    monkeypatch.setattr(config_module, "LEAN_VERSION", config_module.LEAN_VERSION + 1)
    with pytest.raises(RunMismatchError, match="lean_version"):
        generate_supervision(history, accepting_lms(), tmp_path, lean, progress=False)


def test_a_run_resumes_only_under_the_prompts_it_was_made_with(tmp_path, monkeypatch):
    from memsteer_dspy.supervision import config as config_module  # GenerationConfig reads it

    assert config().identity()["prompt_version"] == config_module.PROMPT_VERSION
    history = laptop_history()
    cfg = config(max_candidates=1)
    generate_supervision(history, accepting_lms(), tmp_path, cfg, progress=False)
    # the same prompts: it resumes
    generate_supervision(history, accepting_lms(), tmp_path, cfg, progress=False)
    monkeypatch.setattr(config_module, "PROMPT_VERSION", config_module.PROMPT_VERSION + 1)
    with pytest.raises(RunMismatchError, match="prompt_version"):
        generate_supervision(history, accepting_lms(), tmp_path, cfg, progress=False)


def test_generate_s_small_lm_default_is_small_lm_default_config(tmp_path, monkeypatch):
    """What `memsteer generate` builds for an in-process LM with no pipeline flag is the one small-
    LM default the demo and the experiments use (supervision.small_lm_default_config): the same
    run key options."""
    from typer.testing import CliRunner

    from memsteer_dspy.cli import app
    from memsteer_dspy.loaders.jsonl import load_jsonl
    from memsteer_dspy.supervision.run import small_lm_default_config

    hist = scripted_generate_cli(tmp_path, monkeypatch, in_process=True)
    out = tmp_path / "out"
    args = argv("generate --format jsonl --path {} --out {} --n 1 --max-candidates 1", hist, out)
    result = CliRunner().invoke(app, [*args, "--seed", "3"])
    assert result.exit_code == 0, result.output
    options = json.loads((out / "run.json").read_text())["key"]["options"]
    shared = small_lm_default_config(
        load_jsonl(hist).history, n=1, max_candidates=1, seed=3, bounded=True
    )
    assert options == json.loads(json.dumps(shared.identity()))
