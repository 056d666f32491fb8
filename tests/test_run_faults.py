"""Faults injected and survived (issue #13): a seeded LM that raises, times out or returns
unparseable output on ~20% of calls, run through ``generate``, ``evaluate`` (with answers) and
``optimize`` (proposer, answerer, judge); the tracking store failing; the disk filling up.

Every run completes, every failure is recorded with its reason where it belongs, and no item is
lost or counted twice: checked by ids against a fault-free run with the same seed. Each test
prints one ``FAULTS`` line with its counts (faults injected, items compared, lost, duplicated).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from fault_helpers import FaultyLM, HandlerLM
from memory_fixtures import small_history, small_qa
from optimize_fixtures import write_optimize_inputs
from script_helpers import argv
from scripted_roles import NARROW, _answer, _judge, config_loader, invoke, role_lms
from test_supervision_run import laptop_history

from memsteer_dspy.bundles import BundleConfig
from memsteer_dspy.evaluation import evaluate_design
from memsteer_dspy.memory import MemoryDesign, MemorySystem
from memsteer_dspy.records import QAItem
from memsteer_dspy.supervision.run import GenerationConfig, generate_supervision, read_log

pytestmark = pytest.mark.faults
# A seed under which some candidate exhausts its retries (checked below), so the test sees both kinds.
GEN_FAULT_SEED = 1
TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def _report(name: str, **counts) -> None:
    print(f"FAULTS {name}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


def gen_config(**kw) -> GenerationConfig:
    values = {
        "n": 1000,
        "max_candidates": 24,
        "batch_size": 4,
        "max_demos": 0,
        "seed": 3,
        "bundle": BundleConfig(evidence_weights={1: 1.0}, min_records=3, max_records=3),
    }
    values.update(kw)
    return GenerationConfig(**values)


def _comparable(rec) -> tuple:
    item = rec.item or {}
    return (
        rec.status,
        rec.stage,
        rec.reason,
        item.get("id"),
        item.get("question"),
        item.get("answer"),
        tuple(item.get("evidence_ids", ())),
    )


# --------------------------------------------------------------------------------------------
# generate
# --------------------------------------------------------------------------------------------


def test_generate_survives_injected_faults(tmp_path):
    history = laptop_history(10)
    clean = generate_supervision(
        history, role_lms("generate"), tmp_path / "clean", gen_config(), progress=False
    )
    lms = role_lms("generate", fault_seed=GEN_FAULT_SEED)
    faulty = generate_supervision(history, lms, tmp_path / "faulty", gen_config(), progress=False)
    injected = sum(len(lm.faults) for lm in lms.values())
    kinds = Counter(k for lm in lms.values() for k, _ in lm.faults)
    assert injected >= 10 and set(kinds) == {"raise", "timeout", "unparseable"}

    clean_log, faulty_log = read_log(tmp_path / "clean"), read_log(tmp_path / "faulty")
    raw = [
        json.loads(x)["index"]
        for x in (tmp_path / "faulty" / "candidates.jsonl").read_text().splitlines()
    ]
    assert sorted(raw) == list(range(24)), "each candidate is logged exactly once"
    assert [r.index for r in faulty_log] == [r.index for r in clean_log] == list(range(24))
    failed = [r for r in faulty_log if r.reason == "lm_error"]
    assert failed, "with 20% faults and 2 retries some candidate exhausts its retries"
    for r in failed:
        assert r.status == "rejected" and r.stage and r.detail  # recorded with the stage and why
    rejected = [
        json.loads(x) for x in (tmp_path / "faulty" / "rejected.jsonl").read_text().splitlines()
    ]
    assert {r["index"] for r in rejected if r["reason"] == "lm_error"} == {r.index for r in failed}
    # a candidate no fault stopped ends exactly as without faults (retries reproduce the reply);
    # only near-duplicate verdicts may move, since they depend on which earlier items were kept
    differ = [
        (c, f)
        for c, f in zip(clean_log, faulty_log, strict=True)
        if _comparable(c) != _comparable(f)
    ]
    for c, f in differ:
        assert (
            f.reason == "lm_error" or "dedup" in (c.reason or "") or "dedup" in (f.reason or "")
        ), (c, f)
    ids = [
        json.loads(x)["id"]
        for n in ("train.jsonl", "val.jsonl")
        for x in (tmp_path / "faulty" / n).read_text().splitlines()
    ]
    assert len(ids) == len(set(ids)) == faulty["accepted"]
    assert faulty["candidates"] == clean["candidates"] == 24
    _report(
        "generate",
        faults_injected=injected,
        candidates_compared=24,
        failed_items=len(failed),
        lost=0,
        duplicated=len(raw) - len(set(raw)),
    )


# --------------------------------------------------------------------------------------------
# evaluate with answers
# --------------------------------------------------------------------------------------------


def _many_items(copies: int = 8) -> list[QAItem]:
    items = []
    for c in range(copies):
        for q in small_qa():
            items.append(
                q.model_copy(update={"id": f"{q.id}-{c}", "question": f"{q.question} (asked {c})"})
            )
    return items


def _evaluate(lms, out, items):
    system = MemorySystem.from_design(
        MemoryDesign.base_bm25(), small_history(), lms={"answerer": lms["answerer"]}
    )
    return evaluate_design(
        system, items, metrics="all", judge_lm=lms["judge"], protocol="as_of", out_dir=out
    )


def test_evaluate_with_answers_survives_injected_faults(tmp_path):
    items = _many_items()
    clean_lms = {
        "answerer": HandlerLM(_answer, model="scripted/answerer"),
        "judge": HandlerLM(_judge, model="scripted/judge"),
    }
    faulty_lms = {
        "answerer": FaultyLM(_answer, seed=11, model="scripted/answerer"),
        "judge": FaultyLM(_judge, seed=12, model="scripted/judge"),
    }
    clean = _evaluate(clean_lms, tmp_path / "clean", items)
    faulty = _evaluate(faulty_lms, tmp_path / "faulty", items)
    injected = sum(len(lm.faults) for lm in faulty_lms.values())
    assert injected >= 5
    assert clean.summary.errors == 0
    lines = [json.loads(x) for x in (tmp_path / "faulty" / "items.jsonl").read_text().splitlines()]
    ids = [r["qa_id"] for r in lines]
    assert ids == [q.id for q in items], "every item once, in order"
    errors = [r for r in lines if r["error"]]
    assert errors and faulty.summary.errors == len(errors) <= injected
    for r in errors:  # recorded with the stage and the reason, scored 0
        assert r["error_stage"] in ("answer", "judge") and r["correct"] is False and r["qs"] == 0.0
    by_id = {r.qa_id: r for r in clean.items}
    for r in faulty.items:
        if r.error is None:
            assert (r.prediction, r.correct, r.qs, r.recall_at_10) == (
                by_id[r.qa_id].prediction,
                by_id[r.qa_id].correct,
                by_id[r.qa_id].qs,
                by_id[r.qa_id].recall_at_10,
            )
    # resuming with a healthy LM retries exactly the failed items and matches the clean run
    calls_before = clean_lms["answerer"].calls
    resumed = _evaluate(clean_lms, tmp_path / "faulty", items)
    assert clean_lms["answerer"].calls - calls_before == len(errors)
    assert [(r.qa_id, r.correct, r.qs) for r in resumed.items] == [
        (r.qa_id, r.correct, r.qs) for r in clean.items
    ]
    assert resumed.summary.accuracy == clean.summary.accuracy
    _report(
        "evaluate",
        faults_injected=injected,
        items_compared=len(items),
        failed_items=len(errors),
        lost=0,
        duplicated=len(ids) - len(set(ids)),
    )


# --------------------------------------------------------------------------------------------
# optimize (through its CLI: proposer, answerer and judge all faulty)
# --------------------------------------------------------------------------------------------


@pytest.fixture
def opt_inputs(tmp_path):
    items = _many_items(6)
    return write_optimize_inputs(tmp_path, items[:16], items[16:], NARROW)


def optimize_argv(inputs, out, *extra) -> list[str]:
    folder, sup, design = inputs
    return [
        *argv("optimize --format jsonl --path {} --supervision {} --out {}", folder, sup, out),
        *argv("--objective accuracy --init-design {} --no-cache --iterations 3", design),
        *extra,
    ]


def _patch_lms(monkeypatch, lms):
    import memsteer_dspy.lm as lm_pkg

    monkeypatch.setattr(lm_pkg, "load_lm_config", config_loader(lms))


def _item_files(out: Path) -> dict[str, list[str]]:
    return {
        str(p.relative_to(out)): [json.loads(x)["qa_id"] for x in p.read_text().splitlines()]
        for p in sorted(out.rglob("items.jsonl"))
    }


def test_optimize_survives_injected_faults(opt_inputs, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from memsteer_dspy.cli import app

    _patch_lms(monkeypatch, role_lms("optimize"))
    res = CliRunner().invoke(app, optimize_argv(opt_inputs, tmp_path / "clean", "--no-tracking"))
    assert res.exit_code == 0, res.output
    # The faults are drawn from the request content, so whether the few proposer calls (one per
    # iteration) draw one depends on the prompts; take the first seed under which every role sees
    # a fault (each seed's run must complete either way).
    for seed in range(5, 13):
        lms = role_lms("optimize", fault_seed=seed)
        _patch_lms(monkeypatch, lms)
        res = CliRunner().invoke(
            app, optimize_argv(opt_inputs, tmp_path / "faulty", "--no-tracking", "--restart")
        )
        assert res.exit_code == 0, (seed, res.output)
        if all(lm.faults for lm in lms.values()):
            break
    injected = sum(len(lm.faults) for lm in lms.values())
    assert injected >= 5 and all(lm.faults for lm in lms.values()), {
        r: len(lm.faults) for r, lm in lms.items()
    }
    traj = [
        json.loads(x) for x in (tmp_path / "faulty" / "trajectory.jsonl").read_text().splitlines()
    ]
    assert [t["iteration"] for t in traj] == [0, 1, 2, 3], (
        "one entry per iteration, none lost or repeated"
    )
    for t in traj:
        if t["status"] == "failed":
            assert t.get("reason"), t  # a failed proposal says why
    clean_files, faulty_files = _item_files(tmp_path / "clean"), _item_files(tmp_path / "faulty")
    compared = 0
    for name, ids in faulty_files.items():
        assert len(ids) == len(set(ids)), f"{name}: an item counted twice"
        if name in clean_files:
            assert sorted(ids) == sorted(clean_files[name]), f"{name}: items lost"
            compared += len(ids)
    errors = sum(
        1
        for p in (tmp_path / "faulty").rglob("items.jsonl")
        for x in p.read_text().splitlines()
        if json.loads(x)["error"]
    )
    assert compared and errors
    _report(
        "optimize",
        faults_injected=injected,
        items_compared=compared,
        failed_items=errors,
        lost=0,
        duplicated=0,
    )


# --------------------------------------------------------------------------------------------
# the tracking store failing, the disk filling up
# --------------------------------------------------------------------------------------------


def test_a_broken_tracking_store_is_reported_once_and_the_run_completes(
    opt_inputs, tmp_path, monkeypatch
):
    from typer.testing import CliRunner

    from memsteer_dspy.cli import app

    broken = tmp_path / "broken.db"
    broken.write_bytes(b"this is not an sqlite database\n" * 100)
    _patch_lms(monkeypatch, role_lms("optimize"))
    import warnings

    from memsteer_dspy.tracking import TrackingWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = CliRunner().invoke(
            app,
            optimize_argv(opt_inputs, tmp_path / "run", "--tracking-uri", f"sqlite:///{broken}"),
        )
    assert res.exit_code == 0, res.output
    tracking_warnings = [w for w in caught if issubclass(w.category, TrackingWarning)]
    assert len(tracking_warnings) == 1, [str(w.message) for w in tracking_warnings]
    assert "file is not a database" in str(tracking_warnings[0].message)
    out = res.output
    assert out.lower().count("tracking") >= 1
    warnings = [
        line
        for line in out.splitlines()
        if "tracking" in line.lower() and ("fail" in line.lower() or "warn" in line.lower())
    ]
    assert len(warnings) == 1, out
    traj = (tmp_path / "run" / "trajectory.jsonl").read_text().splitlines()
    assert len(traj) == 4 and (tmp_path / "run" / "best_design.json").exists()
    for name, ids in _item_files(tmp_path / "run").items():
        assert len(ids) == len(set(ids)), name


_DISK_FULL = r"""
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past the limit fails with EFBIG
limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
sys.argv = [sys.argv[0], sys.argv[1]]
import run_driver
sys.exit(run_driver.main(sys.argv[1]))
"""


def _driver_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(REPO), env.get("PYTHONPATH", "")])
    return env


def test_disk_full_is_reported_once_and_the_folder_stays_consistent(tmp_path):
    """A file-size limit (RLIMIT_FSIZE) stands in for a full disk: the write that crosses it fails
    with EFBIG. The run stops with one message; the log holds whole lines only; a rerun without
    the limit resumes and ends exactly as an uninterrupted run."""
    hist = tmp_path / "hist.jsonl"
    hist.write_text("".join(r.model_dump_json() + "\n" for r in laptop_history(10).records))

    def generate_argv(out):
        return [
            *argv("generate --format jsonl --path {} --out {} --n 1000", hist, out),
            *argv("--max-candidates 16 --seed 3 --batch-size 4 --max-demos 0 --json"),
        ]

    scen = tmp_path / "scen.json"
    scen.write_text(json.dumps({"argv": generate_argv(tmp_path / "full"), "lms": "generate"}))
    script = tmp_path / "disk_full.py"
    script.write_text(_DISK_FULL)
    proc = subprocess.run(
        [sys.executable, str(script), str(scen), "40000"],
        env=_driver_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.count("error") == 1 and "rerun the same command" in proc.stderr, proc.stderr[
        -3000:
    ]
    assert "Traceback" not in proc.stderr
    raw = (tmp_path / "full" / "candidates.jsonl").read_bytes()
    kept = read_log(tmp_path / "full")  # whole lines only (a torn last line is cut)
    assert 0 < len(kept) < 16
    assert all(line.endswith(b"}") for line in raw.splitlines()[: len(kept)])
    # resume without the limit (same command, in this process); compare with an uninterrupted run
    res = invoke(generate_argv(tmp_path / "full"), "generate")
    assert res.exit_code == 0, res.output[-3000:]
    res = invoke(generate_argv(tmp_path / "clean"), "generate")
    assert res.exit_code == 0, res.output[-3000:]
    a, b = read_log(tmp_path / "full"), read_log(tmp_path / "clean")
    assert [_comparable(r) for r in a] == [_comparable(r) for r in b]
    _report("disk-full", faults_injected=1, candidates_compared=len(b), lost=0, duplicated=0)
