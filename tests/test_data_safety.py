"""Nothing a user owns is ever lost (issue #46): run folders that refuse to destroy, one writer
per folder, and a clear error (never a traceback) for every bad input the issue lists.

Every test here is LM-free (``--metrics recall`` on the packaged demo history or a small one).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from memory_fixtures import small_history, small_qa
from script_helpers import argv
from typer.testing import CliRunner

from memsteer_dspy.cli import app
from memsteer_dspy.errors import InputError
from memsteer_dspy.records import QAItem
from memsteer_dspy.runfolder import LOCK_FILE, FolderBusyError, RunFolder, run_key

DEMO = Path(__file__).resolve().parents[1] / "memsteer_dspy" / "data" / "demo"


def _cli(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def _history_folder(tmp_path: Path, name: str = "hist") -> Path:
    """A copy of a small history with its official QA (records.jsonl + qa.jsonl)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "records.jsonl").write_text(
        "".join(r.model_dump_json() + "\n" for r in small_history().records)
    )
    (folder / "qa.jsonl").write_text("".join(q.to_json() + "\n" for q in small_qa()))
    return folder


def _evaluate(path: Path, out: Path, *extra: str):
    return _cli(
        *argv("evaluate --format jsonl --path {} --metrics recall --out {} --no-cache", path, out),
        *extra,
    )


def _export(hist: Path, out: Path):
    """``memsteer export --to mstar`` of ``hist`` and its official QA items into ``out``."""
    line = "export --to mstar --format jsonl --path {} --supervision official --out {}"
    return _cli(*argv(line, hist, out))


def _tree(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


# --------------------------------------------------------------------------------------------
# data loss 1: --restart empties only a run folder, never one holding the inputs
# --------------------------------------------------------------------------------------------


def test_restart_refuses_a_folder_that_is_not_a_run_folder(tmp_path):
    precious = tmp_path / "precious"
    (precious / "sub").mkdir(parents=True)
    (precious / "thesis.txt").write_text("three years of work\n")
    (precious / "sub" / "data.csv").write_text("a,b\n1,2\n")
    before = _tree(precious)
    res = _evaluate(DEMO, precious, "--restart")
    assert res.exit_code == 2, res.output
    assert "not a memsteer run folder" in res.output and "thesis.txt" in res.output
    assert "Traceback" not in res.output
    assert _tree(precious) == before  # nothing deleted, nothing written (not even the lock file)
    # without --restart: refused too, since the run would write over the user's files
    res = _evaluate(DEMO, precious)
    assert res.exit_code == 2 and _tree(precious) == before


def test_out_that_is_or_holds_or_lies_in_the_history_is_refused(tmp_path):
    hist = _history_folder(tmp_path)
    before = _tree(hist)
    for out in (hist, hist / "runs" / "x", tmp_path):
        for extra in ((), ("--restart",)):
            res = _evaluate(hist, out, *extra)
            assert res.exit_code == 2, res.output
            assert "input" in res.output and "Traceback" not in res.output
    assert _tree(hist) == before
    assert not (hist / "runs").exists()


def test_restart_of_a_run_folder_still_starts_over(tmp_path):
    hist = _history_folder(tmp_path)
    out = tmp_path / "run"
    assert _evaluate(hist, out).exit_code == 0
    (out / "items.jsonl").write_text("")  # a restart rewrites it from scratch
    res = _evaluate(hist, out, "--restart")
    assert res.exit_code == 0, res.output
    assert len((out / "items.jsonl").read_text().splitlines()) == len(small_qa())
    assert not (out / LOCK_FILE).exists() or (out / LOCK_FILE).stat().st_size >= 0  # released


# --------------------------------------------------------------------------------------------
# data loss 2: a smaller rerun never truncates the finished results
# --------------------------------------------------------------------------------------------


def test_a_smaller_rerun_is_refused_and_deletes_nothing(tmp_path):
    out = tmp_path / "eval"
    res = _evaluate(DEMO, out)
    assert res.exit_code == 0, res.output
    n = len((out / "items.jsonl").read_text().splitlines())
    assert n == 34
    before = _tree(out)
    res = _evaluate(DEMO, out, "--limit", "5")
    assert res.exit_code == 2, res.output
    assert "qa_items" in res.output and "smaller --limit" in res.output
    results = lambda tree: {k: v for k, v in tree.items() if k not in ("run.json", LOCK_FILE)}  # noqa: E731
    assert results(_tree(out)) == results(before)  # the session ledger and the lock holder aside
    # a QA file cut to fewer items: the same
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join((DEMO / "qa.jsonl").read_text().splitlines(keepends=True)[:5]))
    res = _evaluate(DEMO, out, "--qa", cut)
    assert res.exit_code == 2 and len((out / "items.jsonl").read_text().splitlines()) == 34


# --------------------------------------------------------------------------------------------
# data loss 3: export never writes over its input
# --------------------------------------------------------------------------------------------


def test_export_over_its_own_history_is_refused(tmp_path):
    hist = _history_folder(tmp_path)
    before = _tree(hist)
    res = _export(hist, hist)
    assert res.exit_code == 2, res.output
    assert _tree(hist) == before
    # and into a folder of the user's that is not an earlier export
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "README.md").write_text("my notes\n")
    res = _export(hist, mine)
    assert res.exit_code == 2 and "not an earlier export" in res.output
    assert (mine / "README.md").read_text() == "my notes\n"
    # a fresh folder, then the same folder again (an earlier export is replaced)
    out = tmp_path / "export"
    for _ in range(2):
        res = _export(hist, out)
        assert res.exit_code == 0, res.output


def test_export_warns_about_evidence_not_in_the_history(tmp_path):
    hist = _history_folder(tmp_path)
    items = small_qa()
    items[0] = items[0].model_copy(update={"evidence_ids": ["no-such-record"]})
    (hist / "qa.jsonl").write_text("".join(q.to_json() + "\n" for q in items))
    res = _export(hist, tmp_path / "export")
    assert res.exit_code == 0, res.output
    assert "warning: 1 evidence id(s)" in res.output and "no-such-record" in res.output


# --------------------------------------------------------------------------------------------
# data loss 4: one writer per run folder
# --------------------------------------------------------------------------------------------

_CONTENDER = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    from memsteer_dspy.runfolder import FolderBusyError, RunFolder, run_key

    folder, go, ready = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    side, other = sys.argv[4], {"a": "b", "b": "a"}[sys.argv[4]]
    tried = lambda s: ready.with_name(ready.name.rsplit("-", 1)[0].replace("ready", "tried") + "-" + s)
    ready.write_text("")
    while not go.exists():
        time.sleep(0.005)
    try:
        run = RunFolder.open(folder, run_key("evaluate", options={"design": side}))
    except FolderBusyError as exc:
        tried(side).write_text("")
        print(json.dumps({"busy": str(exc)}))
        sys.exit(3)
    except Exception as exc:
        tried(side).write_text("")
        print(json.dumps({"other": f"{type(exc).__name__}: {exc}"}))
        sys.exit(4)
    tried(side).write_text("")
    run.log("items.jsonl").append({"writer": os.getpid()})
    deadline = time.monotonic() + 60
    while not tried(other).exists() and time.monotonic() < deadline:
        time.sleep(0.005)  # hold the folder until the other has tried, however slow the machine
    run.close()
    print(json.dumps({"ok": os.getpid()}))
    """
)


def test_twenty_simultaneous_pairs_exactly_one_writes_each_folder(tmp_path):
    script = tmp_path / "contender.py"
    script.write_text(_CONTENDER)
    go = tmp_path / "go"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
        ),
    }
    procs = []
    for pair in range(20):
        for side in ("a", "b"):
            ready = tmp_path / f"ready-{pair}-{side}"
            procs.append(
                (
                    pair,
                    ready,
                    subprocess.Popen(
                        [
                            sys.executable,
                            str(script),
                            str(tmp_path / f"run-{pair}"),
                            str(go),
                            str(ready),
                            side,
                        ],
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        text=True,
                        env=env,
                    ),
                )
            )
    deadline = time.monotonic() + 120
    while not all(r.exists() for _, r, _ in procs) and time.monotonic() < deadline:
        time.sleep(0.02)
    go.write_text("")
    outcomes: dict[int, list[int]] = {}
    for pair, _, p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode in (0, 3), (out, err)
        outcomes.setdefault(pair, []).append(p.returncode)
        if p.returncode == 3:
            message = json.loads(out)["busy"]
            assert "is writing to this run folder" in message and "contender.py" in message
    for pair, codes in outcomes.items():
        assert sorted(codes) == [0, 3], (pair, codes)
        writers = (tmp_path / f"run-{pair}" / "items.jsonl").read_text().splitlines()
        assert len(writers) == 1


def test_two_identical_optimize_runs_one_proceeds_and_the_folder_resumes(tmp_path):
    """The issue's case: both exited 0 with the trajectory interleaved and MLflow's tables created
    twice. The lock is taken before the tracker opens mlflow.db."""
    out = tmp_path / "opt"
    args = [
        *argv("optimize --format jsonl --path {} --supervision official", DEMO),
        *argv("--search random --objective recall --iterations 1 --no-cache --out {}", out),
    ]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    code = "import sys; from memsteer_dspy.cli import app; sys.argv[0] = 'memsteer'; app()"

    def start():
        return subprocess.Popen(
            [sys.executable, "-c", code, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )

    # the first run is paused while it holds the folder, so the second always meets the lock
    # (started together, a loaded machine sometimes let the first finish before the second began)
    first = start()
    deadline = time.monotonic() + 120
    while not (out / ".memsteer.lock").exists() or not (out / "run.json").exists():
        assert first.poll() is None and time.monotonic() < deadline, (
            first.stdout.read() if first.poll() else ""
        )
        time.sleep(0.05)
    os.kill(first.pid, signal.SIGSTOP)
    try:
        second = start()
        results = [(second.wait(timeout=300), second.stdout.read())]
    finally:
        os.kill(first.pid, signal.SIGCONT)
    results.insert(0, (first.wait(timeout=300), first.stdout.read()))
    assert [c for c, _ in results] == [0, 2], results
    refused = next(o for c, o in results if c == 2)
    assert "is writing to this run folder" in refused and "Traceback" not in refused
    assert [
        json.loads(x)["iteration"] for x in (out / "trajectory.jsonl").read_text().splitlines()
    ] == [0, 1]
    res = _cli(*args[:-5], "--iterations", "2", "--no-cache", "--out", out)  # the folder resumes
    assert res.exit_code == 0, res.output
    assert [
        json.loads(x)["iteration"] for x in (out / "trajectory.jsonl").read_text().splitlines()
    ] == [0, 1, 2]


def test_a_busy_folder_names_the_holder_and_frees_on_close(tmp_path):
    run = RunFolder.open(tmp_path / "run", run_key("evaluate"))
    code = (
        "import sys\nfrom memsteer_dspy.runfolder import RunFolder, run_key\n"
        "RunFolder.open(sys.argv[1], run_key('evaluate'))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    res = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "run")], capture_output=True, text=True, env=env
    )
    assert res.returncode != 0 and f"process {os.getpid()}" in res.stderr
    run.close()
    res = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "run")], capture_output=True, text=True, env=env
    )
    assert res.returncode == 0, res.stderr


def test_the_lock_file_holds_no_secret_of_the_command_line(monkeypatch):
    from memsteer_dspy.runfolder import _command_line

    monkeypatch.setattr(
        sys,
        "argv",
        [
            *argv("/venv/bin/memsteer evaluate --api-base http://me:s3cret@host:8080/v1"),
            *argv("--api-key sk-live-123 --token=abc --out runs/x"),
        ],
    )
    line = _command_line()
    assert "s3cret" not in line and "sk-live-123" not in line and "abc" not in line
    assert (
        line.startswith("memsteer evaluate --api-base http://host:8080/v1")
        and "--out runs/x" in line
    )


def test_folder_busy_error_reads_as_one_message():
    exc = FolderBusyError(Path("runs/x"), {"pid": 42, "command": "memsteer optimize --out runs/x"})
    assert isinstance(exc, InputError)
    assert "process 42 (memsteer optimize --out runs/x)" in str(exc) and exc.field == "--out"


# --------------------------------------------------------------------------------------------
# clear errors instead of tracebacks
# --------------------------------------------------------------------------------------------


def test_mixed_offsets_and_naive_timestamps_ingest_as_utc(tmp_path):
    path = tmp_path / "h.jsonl"
    rows = [
        {
            "id": "a",
            "kind": "note",
            "text": "A.",
            "timestamp": "2024-03-01T10:00:00+02:00",
        },  # 08:00 UTC
        {
            "id": "b",
            "kind": "note",
            "text": "B.",
            "timestamp": "2024-03-01T09:00:00",
        },  # naive = UTC
        {
            "id": "c",
            "kind": "note",
            "text": "C.",
            "timestamp": "2024-02-29T23:30:00-01:00",
        },  # 00:30 UTC
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = _cli("ingest", "--format", "jsonl", "--path", path, "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["date_range"] == ["2024-03-01T00:30:00", "2024-03-01T09:00:00"]
    from memsteer_dspy.loaders import load_history

    history = load_history("jsonl", path).history
    assert [r.id for r in history] == ["c", "a", "b"]
    assert [r.id for r in history.as_of("2024-03-01T08:30:00").records] == ["a", "c"]


def test_non_utf8_qa_file_is_located_and_skippable(tmp_path):
    qa = tmp_path / "qa.jsonl"
    lines = (DEMO / "qa.jsonl").read_bytes().splitlines(keepends=True)[:3]
    qa.write_bytes(lines[0] + b'{"id": "x", "question": "caf\xe9?", "answer": "a"}\n' + lines[1])
    res = _evaluate(DEMO, tmp_path / "eval", "--qa", qa)
    assert res.exit_code == 2, res.output
    assert f"{qa}:2" in res.output and "not UTF-8" in res.output and "Traceback" not in res.output
    res = _evaluate(DEMO, tmp_path / "eval", "--qa", qa, "--on-error", "skip")
    assert res.exit_code == 0, res.output
    assert f"skipped {qa}:2" in res.output
    assert len((tmp_path / "eval" / "items.jsonl").read_text().splitlines()) == 2


def test_batch_marks_a_non_utf8_qa_file_bad_input(tmp_path):
    from memsteer_dspy.batch.task import classify, invoke_command

    qa = tmp_path / "qa.jsonl"
    qa.write_bytes(b'{"id": "x", "question": "caf\xe9?", "answer": "a"}\n')
    code, error = invoke_command(
        [
            *argv("evaluate --format jsonl --path {} --metrics recall", DEMO),
            *argv("--qa {} --no-cache --out {}", qa, tmp_path / "out"),
        ]
    )
    assert classify(code, error, tmp_path / "out")[0] == "bad_input"


@pytest.mark.parametrize("command", ["evaluate", "export", "optimize"])
def test_out_that_is_a_file_is_a_clear_error(tmp_path, command):
    out = tmp_path / "results.txt"
    out.write_text("mine\n")
    hist = _history_folder(tmp_path)
    args = {
        "evaluate": ["evaluate", "--metrics", "recall", "--no-cache"],
        "export": ["export", "--to", "mstar", "--supervision", "official"],
        "optimize": [
            *argv("optimize --supervision official --objective recall"),
            *argv("--iterations 0 --no-tracking --no-cache --test-fraction 0"),
        ],
    }[command]
    res = _cli(*args, "--format", "jsonl", "--path", hist, "--out", out)
    assert res.exit_code == 2, res.output
    assert "is a file" in res.output and "Traceback" not in res.output
    assert out.read_text() == "mine\n"


@pytest.mark.parametrize("err", [errno.EACCES, errno.EPERM, errno.EEXIST])
def test_unwritable_output_is_one_line_not_a_traceback(tmp_path, monkeypatch, err):
    def refuse(self, *a, **k):
        raise OSError(err, os.strerror(err), str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    res = _evaluate(DEMO, tmp_path / "nowhere")
    assert res.exit_code == 2, res.output
    assert f"error: {tmp_path / 'nowhere'}: {os.strerror(err)}" in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_train_val_overlap_in_a_supervision_folder_is_refused(tmp_path):
    from memsteer_dspy.optimize.splits import read_supervision

    items = small_qa()
    (tmp_path / "train.jsonl").write_text("".join(q.to_json() + "\n" for q in items[:3]))
    (tmp_path / "val.jsonl").write_text("".join(q.to_json() + "\n" for q in items[1:]))
    with pytest.raises(InputError) as exc:
        read_supervision(tmp_path)
    assert "in both train.jsonl and val.jsonl" in exc.value.message and "'q2'" in exc.value.message


def test_items_without_evidence_are_noted(tmp_path):
    hist = _history_folder(tmp_path)
    items = small_qa()
    items[0] = items[0].model_copy(update={"evidence_ids": []})
    (hist / "qa.jsonl").write_text("".join(q.to_json() + "\n" for q in items))
    res = _cli("evaluate", "--format", "jsonl", "--path", hist, "--metrics", "recall", "--no-cache")
    assert res.exit_code == 0, res.output
    assert f"1 of {len(items)} item(s) have no evidence ids" in res.output


def test_json_errors_read_once_at_column(tmp_path):
    path = tmp_path / "h.jsonl"
    path.write_text('{"id": "a", "kind": "note", "text": "unterminated}')
    res = _cli("ingest", "--format", "jsonl", "--path", path)
    assert res.exit_code == 2
    assert "at at " not in res.output and "Unterminated string starting at column 37" in res.output


def test_summary_markdown_escapes_the_user_id():
    from memsteer_dspy.optimize.summary import md_text

    assert md_text("<img src=x onerror=alert(1)>") == r"\<img src=x onerror=alert\(1\)\>"
    assert md_text("a*b*\n# c") == r"a\*b\* \# c"


# --------------------------------------------------------------------------------------------
# one QA reader: what `generate` writes is what `evaluate --qa` reads
# --------------------------------------------------------------------------------------------


def _generated_lines(items: list[QAItem]) -> str:
    from memsteer_dspy.supervision.run import item_line

    out = []
    for i, q in enumerate(items):
        q = q.model_copy(
            update={
                "source": "generated",
                "metadata": {
                    "facts": [f"fact {i}"],
                    "plan": {"kind": "single"},
                    "audit": {"verdict": "pass"},
                    "provenance": {"bundle_id": f"b{i}", "method": "memsteer"},
                },
            }
        )
        out.append(json.dumps(item_line(q)) + "\n")
    return "".join(out)


def test_evaluate_reads_the_train_jsonl_generate_writes(tmp_path):
    hist = _history_folder(tmp_path)
    train = tmp_path / "gen" / "train.jsonl"
    train.parent.mkdir()
    train.write_text(_generated_lines(small_qa()))
    assert "facts" in json.loads(
        train.read_text().splitlines()[0]
    )  # the top-level field generate writes
    res = _cli(
        *argv("evaluate --format jsonl --path {}", hist),
        *argv("--qa {} --metrics recall --no-cache --json", train),
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["n"] == len(small_qa())


def test_every_qa_reader_is_the_one_reader(tmp_path):
    from memsteer_dspy.evaluation import read_qa_jsonl
    from memsteer_dspy.loaders.jsonl import read_qa_items
    from memsteer_dspy.supervision.run import load_qa_jsonl

    path = tmp_path / "train.jsonl"
    path.write_text(_generated_lines(small_qa()))
    a, b, c = read_qa_jsonl(path), load_qa_jsonl(path), read_qa_items(path)
    assert a == b == c and a[0].metadata["facts"] == ["fact 0"]
    # an unknown top-level key is named, not silently kept (a misspelt evidence_ids)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "q", "question": "Q?", "answer": "A", "evidence_id": ["r1"]}\n')
    for reader in (read_qa_jsonl, load_qa_jsonl, read_qa_items):
        with pytest.raises(InputError) as exc:
            reader(bad)
        assert exc.value.field == "evidence_id" and exc.value.line == 1 and exc.value.record == "q"


def test_a_folder_held_by_a_run_that_has_not_written_run_json_yet_is_busy_not_foreign(tmp_path):
    """The race the twenty pairs hit under load: the first writer holds the lock and is writing
    run.json (its temporary file is in the folder); the second saw a non-run folder with a file
    in it and refused it as the user's (exit 4) instead of reporting it busy."""
    from memsteer_dspy.runfolder import FolderBusyError, RunFolder, _contents, run_key

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / ".run.json.4242.1.tmp").write_text("{")
    assert _contents(folder) == []
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from memsteer_dspy.runfolder import "
            "lock_folder; held = lock_folder(Path(sys.argv[1])); print('held', flush=True); "
            "time.sleep(60)",
            str(folder),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderBusyError):
            RunFolder.open(folder, run_key("evaluate", options={"design": "b"}))
    finally:
        holder.kill()
        holder.wait()
    # once the holder is gone, the folder (a lock and a stale temporary file) is free to use
    RunFolder.open(folder, run_key("evaluate", options={"design": "b"})).close()


def test_a_folder_taken_after_the_look_for_its_lock_is_busy_not_foreign_or_another_run(
    tmp_path, monkeypatch
):
    """The second window the twenty pairs hit: the look for the lock came before the other run
    took the folder, the look at its contents after; that run still holds it: busy, not a foreign
    folder and not "a different run" (exit 4 in the contender)."""
    import memsteer_dspy.runfolder as rf

    folder = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from memsteer_dspy.runfolder import "
            "RunFolder, run_key; held = RunFolder.open(Path(sys.argv[1]), run_key('evaluate', "
            "options={'design': 'a'})); held.log('items.jsonl').append({'x': 1}); "
            "print('held', flush=True); time.sleep(60)",
            str(folder),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    # the look for the other run's lock comes before it took the folder; the look at run.json
    # (another run's: design 'a') after
    probes, real_probe = iter([None]), rf._refuse_held
    monkeypatch.setattr(rf, "_refuse_held", lambda p: next(probes, 0) is None or real_probe(p))
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(rf.FolderBusyError):
            rf.RunFolder.open(folder, rf.run_key("evaluate", options={"design": "b"}))
    finally:
        holder.kill()
        holder.wait()
