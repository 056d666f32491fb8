"""The run-folder layer (atomic writes, the torn-line policy, the same-run key) and the resumes
built on it: a resume never reuses results computed under other settings (issue #13, failure 2)."""

from __future__ import annotations

import contextlib
import json
import os
import signal

import pytest
from memory_fixtures import rec, small_history, small_qa
from script_helpers import argv

from memsteer_dspy.errors import InputError
from memsteer_dspy.evaluation import evaluate_design
from memsteer_dspy.memory import MemoryDesign, MemorySystem
from memsteer_dspy.records import History
from memsteer_dspy.runfolder import (
    JsonlLog,
    RunFolder,
    RunMismatchError,
    run_key,
    sigterm_raises,
    write_atomic,
)

# --------------------------------------------------------------------------------------------
# the layer
# --------------------------------------------------------------------------------------------


def test_torn_last_line_is_cut_and_the_log_continues(tmp_path):
    log = JsonlLog(tmp_path / "log.jsonl")
    log.append({"i": 1})
    log.append({"i": 2})
    with open(log.path, "ab") as fh:
        fh.write(b'{"i": 3, "half')  # killed mid-write
    assert log.read() == [{"i": 1}, {"i": 2}]
    assert log.path.read_bytes().endswith(b'{"i": 2}\n')  # repaired: the next append is whole
    log.append({"i": 3})
    assert [o["i"] for o in log.read()] == [1, 2, 3]


def test_a_whole_but_unparseable_last_line_is_torn_too_a_middle_one_is_an_error(tmp_path):
    log = JsonlLog(tmp_path / "log.jsonl")
    log.path.write_bytes(b'{"i": 1}\n{"i": 2, garbage\n')
    assert log.read() == [{"i": 1}]
    log.path.write_bytes(b'{"i": 1}\n{"i": 2, garbage\n{"i": 3}\n')
    with pytest.raises(InputError) as exc:
        log.read()
    assert exc.value.line == 2 and "not the last line" in exc.value.message


def test_atomic_write_leaves_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    target = tmp_path / "summary.json"
    write_atomic(target, "old\n")

    def boom(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.fsync", boom)
    with pytest.raises(OSError):
        write_atomic(target, "new\n")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temporary left behind


def test_run_folder_key_mismatch_names_each_field_and_restart_starts_over(tmp_path):
    key = run_key(
        "evaluate",
        history="abc",
        protocol="as_of",
        design_key="d1",
        metrics="recall",
        lms={"judge": None},
        options={"limit": 3},
    )
    with RunFolder.open(tmp_path, key) as run:
        run.log("items.jsonl").append({"qa_id": "q1"})
        run.add_usage({"judge": {"calls": 2}})
    other = {**key, "protocol": "full", "options": {"limit": 4}}
    with pytest.raises(RunMismatchError) as exc:
        RunFolder.open(tmp_path, other)
    fields = [d[0] for d in exc.value.differences]
    assert fields == ["options.limit", "protocol"]
    assert "protocol: folder has 'as_of', this run has 'full'" in str(exc.value)
    assert "--restart" in str(exc.value)
    # the same key resumes, with its sessions and usage summed
    with RunFolder.open(tmp_path, key) as run:
        assert run.resumed and run.log("items.jsonl").read() == [{"qa_id": "q1"}]
        run.add_usage({"judge": {"calls": 1}})
    assert run.usage_total() == {"judge": {"calls": 3}}
    # --restart: the folder is emptied, the new key written
    with RunFolder.open(tmp_path, other, restart=True) as run:
        assert not run.resumed and run.log("items.jsonl").read() == []
    assert json.loads((tmp_path / "run.json").read_text())["key"]["protocol"] == "full"


def test_a_folder_with_results_but_no_key_cannot_be_resumed_nor_emptied(tmp_path):
    (tmp_path / "items.jsonl").write_text('{"qa_id": "q1"}\n')
    for restart in (False, True):  # no run.json: not provably a run folder, so never emptied
        with pytest.raises(InputError) as exc:
            RunFolder.open(
                tmp_path, run_key("evaluate"), legacy_files=("items.jsonl",), restart=restart
            )
        assert "no run.json" in exc.value.message and "new --out folder" in exc.value.hint
    assert [p.name for p in tmp_path.iterdir()] == ["items.jsonl"]


# --------------------------------------------------------------------------------------------
# evaluate: failure 2 (a resume reused another run's results under its own labels)
# --------------------------------------------------------------------------------------------


def _system(history: History | None = None) -> MemorySystem:
    return MemorySystem.from_design(MemoryDesign.base_bm25(), history or small_history())


def test_evaluate_resume_under_another_protocol_is_refused(tmp_path):
    first = evaluate_design(
        _system(), small_qa(), metrics="recall", protocol="as_of", out_dir=tmp_path
    )
    with pytest.raises(RunMismatchError) as exc:
        evaluate_design(_system(), small_qa(), metrics="recall", protocol="full", out_dir=tmp_path)
    assert exc.value.field == "protocol"
    # --restart gives exactly what a fresh folder gives
    restarted = evaluate_design(
        _system(), small_qa(), metrics="recall", protocol="full", out_dir=tmp_path, restart=True
    )
    fresh = evaluate_design(
        _system(), small_qa(), metrics="recall", protocol="full", out_dir=tmp_path / "fresh"
    )
    assert restarted.summary.protocol == "full"
    assert restarted.summary.recall_at_10 == fresh.summary.recall_at_10
    assert [r.recall_at_10 for r in restarted.items] == [r.recall_at_10 for r in fresh.items]
    assert first.summary.protocol == "as_of"


def test_evaluate_resume_over_another_history_is_refused(tmp_path):
    evaluate_design(_system(), small_qa(), metrics="recall", out_dir=tmp_path)
    bigger = History(
        "tester",
        [
            *small_history().records,
            rec("x:1", "A red bicycle poster hangs in the hall.", "2024-01-06"),
        ],
    )
    with pytest.raises(RunMismatchError) as exc:
        evaluate_design(_system(bigger), small_qa(), metrics="recall", out_dir=tmp_path)
    assert exc.value.field == "history_fingerprint"


def test_evaluate_resume_with_changed_qa_content_is_refused_but_more_items_continue(tmp_path):
    items = small_qa()
    evaluate_design(_system(), items[:2], metrics="recall", out_dir=tmp_path)
    # more items (a larger --limit): the two done are reused, the rest computed
    report = evaluate_design(_system(), items, metrics="recall", out_dir=tmp_path)
    assert [r.qa_id for r in report.items] == ["q1", "q2", "q3", "q4"]
    # the same id with other evidence is not the same item
    edited = [items[0].model_copy(update={"evidence_ids": ["s1:2"]}), *items[1:]]
    with pytest.raises(RunMismatchError) as exc:
        evaluate_design(_system(), edited, metrics="recall", out_dir=tmp_path)
    assert exc.value.field == "qa[q1]"


def test_evaluate_cli_resume_mismatch_is_a_clear_error_and_restart_works(tmp_path):
    from typer.testing import CliRunner

    from memsteer_dspy.cli import app

    folder = tmp_path / "hist"
    folder.mkdir()
    (folder / "records.jsonl").write_text(
        "".join(r.model_dump_json() + "\n" for r in small_history().records)
    )
    (folder / "qa.jsonl").write_text("".join(q.to_json() + "\n" for q in small_qa()))
    out = tmp_path / "eval"
    base = [
        *argv("evaluate --format jsonl --path {}", folder),
        *argv("--metrics recall --out {} --no-cache --json", out),
    ]
    res = CliRunner().invoke(app, [*base, "--protocol", "as_of"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, [*base, "--protocol", "full"])
    assert res.exit_code == 2
    assert "protocol: folder has 'as_of', this run has 'full'" in res.output
    res = CliRunner().invoke(app, [*base, "--protocol", "full", "--restart"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["protocol"] == "full"


# --------------------------------------------------------------------------------------------
# evaluate: failure 3 (evidence not in the history counted as a silent miss)
# --------------------------------------------------------------------------------------------


def test_unresolved_evidence_is_reported_and_left_out_of_recall(tmp_path):
    items = small_qa()
    items[0] = items[0].model_copy(update={"evidence_ids": ["no-such-record"]})
    items[1] = items[1].model_copy(update={"evidence_ids": ["s2:2", "ghost"]})
    clean = evaluate_design(_system(), small_qa(), metrics="recall", protocol="as_of")
    report = evaluate_design(_system(), items, metrics="recall", protocol="as_of", out_dir=tmp_path)
    by_id = {r.qa_id: r for r in report.items}
    assert by_id["q1"].recall_at_10 is None  # nothing to find: not a miss
    assert by_id["q1"].unresolved_evidence == ["no-such-record"]
    # q2: recall over its one resolved record only
    assert by_id["q2"].recall_at_10 == (
        1.0 if "s2:2" in by_id["q2"].trace.ranked_records(10) else 0.0
    )
    s = report.summary
    assert s.unresolved_items == 2
    assert {(u["qa_id"], u["evidence_id"]) for u in s.unresolved_evidence} == {
        ("q1", "no-such-record"),
        ("q2", "ghost"),
    }
    assert (
        json.loads((tmp_path / "summary.json").read_text())["unresolved_evidence"]
        == s.unresolved_evidence
    )
    assert clean.summary.unresolved_evidence == [] and clean.summary.unresolved_items == 0


def test_evaluate_cli_says_evidence_is_unresolved(tmp_path):
    from typer.testing import CliRunner

    from memsteer_dspy.cli import app

    folder = tmp_path / "hist"
    folder.mkdir()
    (folder / "records.jsonl").write_text(
        "".join(r.model_dump_json() + "\n" for r in small_history().records)
    )
    items = [q.model_copy(update={"evidence_ids": ["missing-1"]}) for q in small_qa()]
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(q.to_json() + "\n" for q in items))
    args = argv("evaluate --format jsonl --path {} --qa {} --metrics recall --no-cache", folder, qa)
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "4 evidence id(s) of 4 item(s) are not in the history" in res.output
    res = CliRunner().invoke(app, [*args, "--json"])
    report = json.loads(res.stdout)
    assert len(report["unresolved_evidence"]) == 4 and report["recall_at_10"] is None


class _Stopped(Exception):
    pass


@pytest.mark.parametrize("how", ["sigterm", "raises", "ends"])
def test_sigterm_raises_in_the_block_and_puts_the_old_handler_back(how):
    """A ``kill`` inside the block becomes the given exception (so ``finally`` clauses run); the
    handler found before the block is back after it, however the block ended."""

    def earlier(signum, frame):  # a handler someone else set (ray.init sets one)
        raise AssertionError("the earlier handler ran inside the block")

    before = signal.signal(signal.SIGTERM, earlier)
    cleaned = []
    try:
        expected = contextlib.nullcontext() if how == "ends" else pytest.raises(_Stopped)
        with expected as caught:
            with sigterm_raises(lambda signum: _Stopped(signum)):
                try:
                    if how == "sigterm":
                        os.kill(os.getpid(), signal.SIGTERM)
                    if how == "raises":
                        raise _Stopped("raised in the block")
                finally:
                    cleaned.append(how)
        assert cleaned == [how]
        if how == "sigterm":
            assert caught.value.args == (signal.SIGTERM,)
        assert signal.getsignal(signal.SIGTERM) is earlier
    finally:
        signal.signal(signal.SIGTERM, before)
