"""What an ``optimize`` resume checks (issue #13, on the run-folder layer): a folder resumes only
under the same run key. Another ``--objective``, another ``--accept`` rule or supervision whose
content changed (same ids, an edited answer) is refused with the differing field named and
nothing touched; ``--restart`` starts over; more ``--iterations`` continue the run, and the usage
ledger in ``run.json`` holds each session's LM calls. Scripted LMs, in-process CLI (~20 s)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from memory_fixtures import small_qa
from optimize_fixtures import ProposerLM, changed, proposal, small_opt, write_optimize_inputs
from script_helpers import argv
from scripted_roles import NARROW, invoke

from memsteer_dspy.memory import MemoryDesign
from memsteer_dspy.optimize import OptimizeConfig


@pytest.fixture()
def inputs(tmp_path):
    items = [q.model_copy(update={"id": f"{q.id}-{c}"}) for c in range(2) for q in small_qa()]
    return write_optimize_inputs(tmp_path, items[:4], items[4:], NARROW)


def optimize_argv(inputs, out: Path, *extra: str, iterations: int = 1) -> list[str]:
    hist, sup, design = inputs
    return [
        *argv("optimize --format jsonl --path {} --supervision {}", hist, sup),
        *argv("--out {} --objective recall --init-design {} --no-cache", out, design),
        *argv("--no-tracking --test-fraction 0 --iterations {}", iterations),
        *extra,
    ]


def _override(args: list[str], flag: str, value: str) -> list[str]:
    args = list(args)
    args[args.index(flag) + 1] = value
    return args


def _snapshot(out: Path) -> dict[str, str]:
    return {str(p.relative_to(out)): p.read_text() for p in sorted(out.rglob("*")) if p.is_file()}


def test_optimize_resume_refuses_other_settings_names_the_field_and_restart_starts_over(
    inputs, tmp_path
):
    out = tmp_path / "run"
    first = invoke(optimize_argv(inputs, out), "optimize")
    assert first.exit_code == 0, first.output[-3000:]
    state = json.loads((out / "run.json").read_text())
    key = state["key"]
    assert key["stage"] == "optimize" and key["options"]["objective"] == "recall"
    assert set(key["qa_hash"]) == {"train", "val", "test"} and key["lms"]["proposer"].startswith(
        "scripted/proposer"
    )
    assert (
        state["objective"] == "recall" and state["n_train"] == 4
    )  # the settings report reads are kept
    before = _snapshot(out)

    refused = {
        "options.objective": _override(optimize_argv(inputs, out), "--objective", "accuracy"),
        "options.accept": optimize_argv(inputs, out, "--accept", "paired"),
        "options.seed": optimize_argv(inputs, out, "--seed", "7"),
    }
    for fld, args in refused.items():
        res = invoke(args, "optimize")
        assert res.exit_code == 2, (fld, res.output[-2000:])
        assert fld in res.output and "--restart" in res.output, (fld, res.output[-2000:])
        assert _snapshot(out) == before, f"a refused resume ({fld}) changed the folder"

    # the same ids with one edited answer: the content hash differs, not the ids
    val = inputs[1] / "val.jsonl"
    rows = [json.loads(x) for x in val.read_text().splitlines()]
    rows[0]["answer"] = rows[0]["answer"] + " (edited)"
    val.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = invoke(optimize_argv(inputs, out), "optimize")
    assert res.exit_code == 2 and "qa_hash.val" in res.output, res.output[-2000:]
    assert "qa_hash.train" not in res.output and _snapshot(out) == before

    # --restart starts over under the new content: one session, a fresh trajectory
    res = invoke(optimize_argv(inputs, out, "--restart"), "optimize")
    assert res.exit_code == 0, res.output[-3000:]
    state = json.loads((out / "run.json").read_text())
    assert state["key"]["qa_hash"]["val"] != key["qa_hash"]["val"]
    assert state["key"]["qa_hash"]["train"] == key["qa_hash"]["train"]
    assert len(state["sessions"]) == 1
    assert [
        json.loads(x)["iteration"] for x in (out / "trajectory.jsonl").read_text().splitlines()
    ] == [0, 1]


def test_more_iterations_continue_and_the_ledger_adds_up_sessions(tmp_path):
    def opt(iterations: int, widths: list[int]):
        lm = ProposerLM(
            [proposal(changed(base, retrieve__top_k=k, retrieve__pool=k)) for k in widths]
        )
        cfg = OptimizeConfig(iterations=iterations, objective="recall")
        return small_opt(tmp_path, base, cfg, {"proposer": lm}), lm

    base = MemoryDesign.from_dict(NARROW)
    first, lm1 = opt(1, [2])
    first.run()
    second, lm2 = opt(3, [3, 4])
    res = second.run()
    assert [e.iteration for e in res.entries] == [0, 1, 2, 3] and len(lm2.calls) == 2
    state = json.loads((tmp_path / "run" / "run.json").read_text())
    assert state["iterations"] == 3 and len(state["sessions"]) == 2
    # each session's ledger entry is what that session's proposer LM was asked (15 tokens a call)
    ledger = [s["usage"]["proposer"] for s in state["sessions"]]
    assert [u["calls"] for u in ledger] == [len(lm1.calls), len(lm2.calls)] == [1, 2]
    assert [u["total_tokens"] for u in ledger] == [15, 30]
    assert (
        sum(u["calls"] for u in ledger) == res.entries[-1].cost_total.by_role["proposer"]["calls"]
    )


def test_a_resumed_run_missing_its_lm_free_validation_results_scores_them_again(tmp_path):
    """A run folder copied without its bulky per-item results (``--state`` of the studies) resumes:
    validation needed no LM, so the same design is scored again on the same items."""

    def opt(iterations: int, widths: list[int]):
        lm = ProposerLM(
            [proposal(changed(base, retrieve__top_k=k, retrieve__pool=k)) for k in widths]
        )
        cfg = OptimizeConfig(iterations=iterations, objective="recall", accept="paired")
        return small_opt(tmp_path, base, cfg, {"proposer": lm}), lm

    base = MemoryDesign.from_dict(NARROW)
    opt(1, [2])[0].run()
    missing = tmp_path / "run" / "iterations" / "000" / "val" / "items.jsonl"
    before = [json.loads(line) for line in missing.read_text().splitlines()]
    missing.unlink()
    second, lm = opt(2, [3])
    res = second.run()
    assert [e.iteration for e in res.entries] == [0, 1, 2] and len(lm.calls) == 1
    again = [json.loads(line) for line in missing.read_text().splitlines()]
    key = ("qa_id", "recall_at_10", "delivered_recall")
    assert [{k: r[k] for k in key} for r in again] == [{k: r[k] for k in key} for r in before]


def test_validation_results_that_cost_lm_calls_and_are_gone_stop_the_resume_naming_the_file(
    tmp_path,
):
    from memsteer_dspy.errors import InputError
    from memsteer_dspy.optimize.state import RunState

    state = RunState(tmp_path / "run")
    with pytest.raises(InputError, match="per-item validation results are missing") as err:
        state.val_items(3)
    assert str(tmp_path / "run" / "iterations" / "003" / "val" / "items.jsonl") in str(err.value)
