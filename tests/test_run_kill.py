"""Kill -9 and resume (issue #13): ``memsteer generate`` and ``memsteer optimize`` are SIGKILLed at
several points (inside an LM call, mid-way through a log line, at an atomic rename, at an fsync,
between iterations), rerun to completion, and compared with an uninterrupted run of the same seed
and the same deterministic scripted LMs: 0 lost, 0 duplicated, identical accepted items and
trajectory. Each case prints one ``KILL`` line with its counts.

Each case runs the CLI in a subprocess (``tests/run_driver.py``), so these are marked ``kill``
(a few minutes in all: six killed subprocesses; the clean runs and the resumes run in-process).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from memory_fixtures import small_qa
from optimize_fixtures import write_optimize_inputs
from script_helpers import argv
from scripted_roles import NARROW, invoke
from test_supervision_run import laptop_history

from memsteer_dspy.supervision.run import read_log

pytestmark = pytest.mark.kill
TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(REPO), env.get("PYTHONPATH", "")])
    env["MLFLOW_TRACKING_URI"] = ""
    return env


def drive(
    tmp_path: Path, argv: list[str], lms: str, kill: dict | None = None
) -> subprocess.CompletedProcess:
    scen = tmp_path / f"scenario-{os.urandom(4).hex()}.json"
    scen.write_text(json.dumps({"argv": argv, "lms": lms, "kill": kill}))
    return subprocess.run(
        [sys.executable, str(TESTS / "run_driver.py"), str(scen)],
        env=_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )


def kill_then_resume(tmp_path: Path, argv: list[str], lms: str, kill: dict) -> int:
    """Run killed at ``kill`` in a subprocess (it must die by SIGKILL), then rerun the same command
    (in this process, same scripted LMs) until it finishes; returns the number of kills."""
    proc = drive(tmp_path, argv, lms, kill)
    assert proc.returncode == -signal.SIGKILL, (kill, proc.returncode, proc.stderr[-3000:])
    res = invoke(argv, lms)
    assert res.exit_code == 0, (kill, res.output[-3000:])
    return 1


# --------------------------------------------------------------------------------------------
# generate
# --------------------------------------------------------------------------------------------

N_CANDIDATES = 16


@pytest.fixture(scope="module")
def gen_inputs(tmp_path_factory):
    base = tmp_path_factory.mktemp("gen")
    hist = base / "hist.jsonl"
    hist.write_text("".join(r.model_dump_json() + "\n" for r in laptop_history(10).records))
    return base, hist


def gen_argv(hist: Path, out: Path) -> list[str]:
    return [
        *argv("generate --format jsonl --path {} --out {} --n 1000", hist, out),
        *argv("--max-candidates {} --seed 3 --batch-size 4 --max-demos 0 --json", N_CANDIDATES),
    ]


def _candidates(out: Path) -> list[tuple]:
    rows = []
    for r in read_log(out):
        item = r.item or {}
        rows.append(
            (
                r.index,
                r.status,
                r.stage,
                r.reason,
                item.get("id"),
                item.get("question"),
                item.get("answer"),
                tuple(item.get("evidence_ids", ())),
            )
        )
    return rows


def _items(out: Path) -> dict[str, list[str]]:
    return {
        n: [json.loads(x)["id"] for x in (out / n).read_text().splitlines()]
        for n in ("train.jsonl", "val.jsonl")
    }


@pytest.fixture(scope="module")
def gen_clean(gen_inputs):
    base, hist = gen_inputs
    out = base / "clean"
    res = invoke(gen_argv(hist, out), "generate")
    assert res.exit_code == 0, res.output[-3000:]
    return out


@pytest.mark.parametrize(
    "kill",
    [
        {"at": "lm", "role": "planner", "n": 7},  # inside an LM call, second batch
        {"at": "torn", "n": 6},  # half of candidates.jsonl line 6 written
        {"at": "replace", "n": 4},  # at an atomic rename
    ],
    ids=lambda k: "-".join(str(v) for v in k.values()),
)
def test_generate_killed_and_resumed_equals_uninterrupted(gen_inputs, gen_clean, kill):
    base, hist = gen_inputs
    out = base / ("killed-" + "-".join(str(v) for v in kill.values()))
    kills = kill_then_resume(base, gen_argv(hist, out), "generate", kill)
    raw = [json.loads(x)["index"] for x in (out / "candidates.jsonl").read_text().splitlines()]
    assert sorted(raw) == list(range(N_CANDIDATES)), "each candidate logged exactly once"
    assert _candidates(out) == _candidates(gen_clean)
    assert _items(out) == _items(gen_clean)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["candidates"] == N_CANDIDATES
    assert len(json.loads((out / "run.json").read_text())["sessions"]) == 2
    lost = N_CANDIDATES - len(set(raw))
    print(
        f"KILL generate {kill}: kills {kills}, items compared {N_CANDIDATES}, lost {lost}, "
        f"duplicated {len(raw) - len(set(raw))}"
    )


def test_generate_resume_refuses_another_lm_and_restart_starts_over(
    gen_inputs, gen_clean, tmp_path
):
    import shutil

    base, hist = gen_inputs
    out = tmp_path / "copy"
    shutil.copytree(gen_clean, out)
    key = json.loads((out / "run.json").read_text())
    key["key"]["lms"]["planner"] = "another/model"
    (out / "run.json").write_text(json.dumps(key))
    res = invoke(gen_argv(hist, out), "generate")
    assert res.exit_code == 2 and "lms.planner" in res.output and "--restart" in res.output, (
        res.output
    )
    res = invoke([*gen_argv(hist, out), "--restart"], "generate")
    assert res.exit_code == 0, res.output[-3000:]
    assert _candidates(out) == _candidates(gen_clean)


# --------------------------------------------------------------------------------------------
# optimize
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def opt_inputs(tmp_path_factory):
    base = tmp_path_factory.mktemp("opt")
    items = [
        q.model_copy(update={"id": f"{q.id}-{c}", "question": f"{q.question} (asked {c})"})
        for c in range(3)
        for q in small_qa()
    ]
    return base, *write_optimize_inputs(base, items[:8], items[8:], NARROW)


def opt_argv(inputs, out: Path) -> list[str]:
    _, folder, sup, design = inputs
    return [
        *argv("optimize --format jsonl --path {} --supervision {}", folder, sup),
        *argv("--out {} --objective accuracy --init-design {}", out, design),
        *argv("--no-cache --no-tracking --iterations 3"),
    ]


def _trajectory(out: Path) -> list[tuple]:
    rows = []
    for line in (out / "trajectory.jsonl").read_text().splitlines():
        t = json.loads(line)
        score = {k: v for k, v in (t.get("score") or {}).items() if "second" not in k}
        rows.append(
            (
                t["iteration"],
                t["status"],
                t["accepted"],
                t.get("design_key"),
                t.get("best_key"),
                json.dumps(score, sort_keys=True),
                t.get("reason"),
            )
        )
    return rows


def _item_results(out: Path) -> dict[str, list[tuple]]:
    res = {}
    for p in sorted(out.rglob("items.jsonl")):
        rows = [json.loads(x) for x in p.read_text().splitlines()]
        res[str(p.relative_to(out))] = [
            (r["qa_id"], r["correct"], r["qs"], r["recall_at_10"]) for r in rows
        ]
    return res


@pytest.fixture(scope="module")
def opt_clean(opt_inputs):
    out = opt_inputs[0] / "clean"
    res = invoke(opt_argv(opt_inputs, out), "optimize")
    assert res.exit_code == 0, res.output[-3000:]
    return out


@pytest.mark.parametrize(
    "kill",
    [
        {"at": "lm", "role": "proposer", "n": 2},  # between iterations: asking for revision 2
        {"at": "lm", "role": "answerer", "n": 13},  # inside an answer during an evaluation
        {"at": "fsync", "n": 9},  # between a write and its fsync
    ],
    ids=lambda k: "-".join(str(v) for v in k.values()),
)
def test_optimize_killed_and_resumed_equals_uninterrupted(opt_inputs, opt_clean, kill):
    base = opt_inputs[0]
    out = base / ("killed-" + "-".join(str(v) for v in kill.values()))
    kills = kill_then_resume(base, opt_argv(opt_inputs, out), "optimize", kill)
    assert _trajectory(out) == _trajectory(opt_clean)
    clean_items, items = _item_results(opt_clean), _item_results(out)
    assert items == clean_items
    compared = sum(len(v) for v in items.values())
    dup = sum(len(v) - len({r[0] for r in v}) for v in items.values())
    assert dup == 0
    assert json.loads((out / "best_design.json").read_text()) == json.loads(
        (opt_clean / "best_design.json").read_text()
    )
    print(
        f"KILL optimize {kill}: kills {kills}, trajectory entries {len(_trajectory(out))}, "
        f"items compared {compared}, lost 0, duplicated {dup}"
    )
