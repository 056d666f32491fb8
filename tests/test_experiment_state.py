"""``--state DIR``: a study's paid-for work carried from one machine to the next
(experiments/_state.py), never overwriting what another run or a user wrote."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
from pathlib import Path

import pytest

from memsteer_dspy.errors import InputError

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
sys.path.insert(0, str(EXPERIMENTS))

import _common  # noqa: E402
import _state  # noqa: E402


def _study_folder(out: Path) -> dict[str, str]:
    """A study output folder as a long run leaves it: LM-paid logs beside rebuildable caches."""
    paid = {
        "run.json": '{"study": "main"}\n',
        "log.txt": "[10:00:00] main: started\n",
        "with/supervision/Elena_Morales/train.jsonl": '{"question": "q1"}\n',
        "with/supervision/Elena_Morales/rejected.jsonl": '{"stage": "blind"}\n',
        "with/opt-official/iterations.jsonl": '{"iteration": 1}\n',
        "eval/with/Elena_Morales/7b57-all/items.jsonl": '{"qa_id": "1", "metrics": "all"}\n',
        "with/opt-official/run.json": json.dumps({"key": {"lms": {"proposer": "local/qwen"}}}),
    }
    lm_free_key = {"key": {"stage": "evaluate", "metrics": "recall", "lms": {}}}
    rebuilt = {
        "eval/with/Elena_Morales/7b57-recall/run.json": json.dumps(lm_free_key),
        "eval/with/Elena_Morales/7b57-recall/items.jsonl": '{"qa_id": "1"}\n',
        "with/opt-official/iterations/001/val/items.jsonl": '{"qa_id": "1", "metrics": "recall"}\n',
        "cache/indexes/bm25.bin": "index",
        "mlflow.db": "sqlite",
        "with/supervision/Elena_Morales/.lock": "",
        "with/opt-official/run.lock": "",
    }
    for rel, text in {**paid, **rebuilt}.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    return paid


def test_save_carries_the_paid_work_and_restore_rebuilds_the_folder_elsewhere(tmp_path):
    out, state = tmp_path / "runs" / "main-cpu", tmp_path / "state"
    paid = _study_folder(out)
    done = _state.save_state(out, state, study="main")
    carried = {p.relative_to(state).as_posix() for p in state.rglob("*") if p.is_file()} - {
        _state.MARKER
    }
    assert carried == set(paid) and sorted(done.copied) == sorted(paid)
    marker = json.loads((state / _state.MARKER).read_text())
    assert marker["study"] == "main" and marker["output_folder"] == str(out)

    # a second save with nothing new copies nothing; an appended log is copied again
    assert _state.save_state(out, state, study="main").copied == []
    with open(out / "with/opt-official/iterations.jsonl", "a") as f:
        f.write('{"iteration": 2}\n')
    assert _state.save_state(out, state, study="main").copied == [
        "with/opt-official/iterations.jsonl"
    ]

    fresh = tmp_path / "other-machine" / "main-cpu"
    restored = _state.restore_state(state, fresh, study="main")
    assert sorted(restored.copied) == sorted(paid)
    assert (fresh / "with/opt-official/iterations.jsonl").read_text().count("iteration") == 2
    assert not (fresh / "cache").exists() and not (fresh / "mlflow.db").exists()


def test_restore_never_overwrites_the_output_folders_own_files(tmp_path):
    out, state = tmp_path / "out", tmp_path / "state"
    _study_folder(out)
    _state.save_state(out, state, study="main")
    newer = out / "with/supervision/Elena_Morales/train.jsonl"
    newer.write_text('{"question": "q1"}\n{"question": "q2"}\n')
    (out / "log.txt").unlink()
    done = _state.restore_state(state, out, study="main")
    assert done.copied == ["log.txt"]
    assert done.kept == ["with/supervision/Elena_Morales/train.jsonl"]
    assert newer.read_text().count("question") == 2


def test_a_missing_state_is_a_first_run(tmp_path):
    done = _state.restore_state(tmp_path / "none", tmp_path / "out", study="main")
    assert done.copied == [] and not (tmp_path / "none").exists()


def test_large_files_travel_compressed_and_come_back_as_they_were(tmp_path, monkeypatch):
    out, state = tmp_path / "out", tmp_path / "state"
    _study_folder(out)
    monkeypatch.setattr(_state, "COMPRESS_BYTES", 100)
    big = out / "with/opt-official/iterations/000/val/items.jsonl"
    big.parent.mkdir(parents=True)
    text = "".join(
        json.dumps({"qa_id": str(i), "context": "the same words " * 20}) + "\n" for i in range(50)
    )
    big.write_text(text)
    _state.save_state(out, state, study="main")
    packed = state / "with/opt-official/iterations/000/val/items.jsonl.xz"
    assert packed.exists() and packed.stat().st_size < len(text) / 4
    assert not (state / "with/opt-official/iterations/000/val/items.jsonl").exists()
    assert _state.save_state(out, state, study="main").copied == []  # unchanged: not rewritten

    big.write_text('{"qa_id": "1"}\n')  # now small: stored plainly, the packed form gone
    assert _state.save_state(out, state, study="main").copied == [big.relative_to(out).as_posix()]
    assert not packed.exists()
    big.write_text(text)
    _state.save_state(out, state, study="main")

    fresh = tmp_path / "fresh"
    _state.restore_state(state, fresh, study="main")
    assert (fresh / "with/opt-official/iterations/000/val/items.jsonl").read_text() == text
    assert not (fresh / "with/opt-official/iterations/000/val/items.jsonl.xz").exists()


def test_files_too_big_to_commit_are_listed_not_carried(tmp_path, monkeypatch):
    out, state = tmp_path / "out", tmp_path / "state"
    _study_folder(out)
    (out / "eval/items.jsonl").write_bytes(os.urandom(200))  # does not compress
    monkeypatch.setattr(_state, "MAX_BYTES", 100)
    monkeypatch.setattr(_state, "COMPRESS_BYTES", 50)
    done = _state.save_state(out, state, study="main")
    assert done.too_big == [("eval/items.jsonl", 200)]
    assert not (state / "eval/items.jsonl").exists()
    assert not (state / "eval/items.jsonl.xz").exists()
    marker = json.loads((state / _state.MARKER).read_text())
    assert any(
        "eval/items.jsonl" in line for lines in marker["not_carried"].values() for line in lines
    )


def test_refuses_a_folder_it_did_not_write_another_study_and_nested_places(tmp_path):
    out = tmp_path / "out"
    _study_folder(out)
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("a user's file")
    with pytest.raises(InputError, match="no study state wrote"):
        _state.save_state(out, foreign, study="main")
    assert sorted(p.name for p in foreign.iterdir()) == ["mine.txt"]

    state = tmp_path / "state"
    _state.save_state(out, state, study="main")
    with pytest.raises(InputError, match="state of study 'main', not 'transfer'"):
        _state.save_state(out, state, study="transfer")
    with pytest.raises(InputError, match="state of study 'main', not 'transfer'"):
        _state.restore_state(state, tmp_path / "o2", study="transfer")
    with pytest.raises(InputError, match="must not contain each other"):
        _state.save_state(out, out / "state", study="main")
    with pytest.raises(InputError, match="must not contain each other"):
        _state.restore_state(state, state / "out", study="main")


def _fake_run(stop: str):
    """A study's ``run`` that writes paid work, checkpoints, then stops as ``stop`` says."""

    def run(cfg, out, **options):
        study = _common.Study("main", cfg, out, **{**options, "progress": False})
        folder = Path(out) / "with/supervision/Elena_Morales"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "train.jsonl", "a") as f:
            f.write('{"question": "q"}\n')
        study.checkpoint("# partial\n", {})
        with open(folder / "rejected.jsonl", "a") as f:
            f.write('{"stage": "blind"}\n')  # written after the checkpoint: saved on the way out
        if stop == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
        if stop == "ctrl-c":
            raise KeyboardInterrupt
        return Path(out) / "results.md"

    return run


@pytest.mark.parametrize("stop", ["sigterm", "ctrl-c", "finished"])
def test_cli_restores_first_and_saves_however_the_study_stops(tmp_path, stop, capsys):
    out, state = tmp_path / "runs" / "main-cpu", tmp_path / "state"
    argv = ["--preset", "tiny", "--out", str(out), "--state", str(state), "--no-tracking"]
    before = signal.getsignal(signal.SIGTERM)  # another test (ray.init) may have set one
    code = _common.cli("main", "Table 2.", _fake_run(stop), argv=argv)
    assert code == (0 if stop == "finished" else 130)
    assert (state / "with/supervision/Elena_Morales/rejected.jsonl").exists()
    assert (state / "results.md").exists() and (state / _state.MARKER).exists()
    assert "state saved to" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is put back

    # the next machine: a fresh output folder carries on from the state
    fresh = tmp_path / "fresh" / "main-cpu"
    argv[3] = str(fresh)
    _common.cli("main", "Table 2.", _fake_run("finished"), argv=argv)
    restored = re.search(r"state restored from \S+: (\d+) file", capsys.readouterr().err)
    assert restored and int(restored.group(1)) >= 4  # run.json, log, results, both logs
    lines = (fresh / "with/supervision/Elena_Morales/train.jsonl").read_text().splitlines()
    assert len(lines) == 2  # the restored line, then the new run's own


def test_a_state_saved_under_other_settings_is_refused_with_the_fields_named(tmp_path):
    out, state = tmp_path / "out", tmp_path / "state"
    _study_folder(out)
    cpu = _common.load_config(None, "cpu")
    _state.save_state(out, state, study="main", config=_state.settings_of(cpu))
    small = _common.load_config(None, "small")
    fresh = tmp_path / "fresh"
    with pytest.raises(InputError, match="saved under other settings.*preset: state has 'cpu'"):
        _state.restore_state(state, fresh, study="main", config=_state.settings_of(small))
    assert not fresh.exists()  # nothing restored
    # where the data sits is not a setting: another machine's path restores the same state
    elsewhere = _common.load_config(None, "cpu", overrides={"dataset": {"rhelm_root": "/data/x"}})
    done = _state.restore_state(state, fresh, study="main", config=_state.settings_of(elsewhere))
    assert "run.json" in done.copied


def test_a_running_study_keeps_its_state_while_a_long_stage_runs(tmp_path):
    out, state = tmp_path / "out", tmp_path / "state"
    cfg = _common.load_config(None, "tiny")
    study = _common.Study("main", cfg, out, tracking=False, progress=False, state=state)
    log = out / "with/supervision/Elena_Morales/train.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text('{"question": "q1"}\n')
    study.keep_state(every_seconds=0.05)
    try:
        copied = state / "with/supervision/Elena_Morales/train.jsonl"
        for _ in range(200):  # liveness, not timing: the keeper copies within a few periods
            if copied.exists():
                break
            threading.Event().wait(0.05)
        assert copied.read_text() == '{"question": "q1"}\n'
    finally:
        study._stop_keeping.set()
        study._keeper.join()


def test_a_state_that_cannot_be_saved_is_logged_and_the_study_goes_on(tmp_path):
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("a user's file")
    cfg = _common.load_config(None, "tiny")
    study = _common.Study(
        "main", cfg, tmp_path / "out", tracking=False, progress=False, state=foreign
    )
    study.checkpoint("# partial\n", {})  # does not raise
    assert "state not saved" in (tmp_path / "out" / "log.txt").read_text()
    assert sorted(p.name for p in foreign.iterdir()) == ["mine.txt"]


def test_a_save_reads_only_the_files_changed_since_the_last_one(tmp_path, monkeypatch):
    out, state = tmp_path / "out", tmp_path / "state"
    _study_folder(out)
    _state.save_state(out, state, study="main")
    read: list[str] = []
    real = Path.read_bytes

    def counting(self):
        read.append(self.name)
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", counting)
    assert _state.save_state(out, state, study="main").copied == []
    assert read == []  # sizes and times unchanged: no file opened
    with open(out / "log.txt", "a") as f:
        f.write("[10:01:00] main: more\n")
    assert _state.save_state(out, state, study="main").copied == ["log.txt"]
    assert set(read) == {"log.txt"}
    (state / "run.json").unlink()  # a file gone from the state is copied again
    assert _state.save_state(out, state, study="main").copied == ["run.json"]
