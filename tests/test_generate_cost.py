"""`benchmarks/generate_cost.py`: its configurations, and the per-role costs and ratios it reports,
run end to end on scripted LMs (the real model is measured by hand; see its docstring)."""

from __future__ import annotations

import pytest
from script_helpers import load_script
from test_supervision_run import accepting_lms, laptop_history

from memsteer_dspy.supervision.program import GENERATION_ROLES
from memsteer_dspy.supervision.run import read_log

gc = load_script("benchmarks/generate_cost.py")


@pytest.mark.parametrize(
    ("name", "lean", "steered", "by_yield", "power"),
    [
        ("v1", False, False, False, 1.0),
        ("lean", True, True, False, 1.0),
        ("lean-unsteered", True, False, False, 1.0),
        ("v1-steered", False, True, False, 1.0),
        ("lean-yield", True, True, True, 1.0),
        ("lean-yield2", True, True, True, 2.0),
    ],
)
def test_configurations_cross_pipeline_and_sampler(name, lean, steered, by_yield, power):
    c = gc.generation_config(name, 12, 3)
    assert (c.lean, c.seed, c.n, c.max_candidates, c.bounded) == (lean, 3, 12, 12, True)
    # the steered sampler is the one with answer-type targets
    assert (c.bundle.answer_type_weights is not None) == steered
    assert c.bundle.steer_by_yield == by_yield
    assert c.bundle.yield_power == power
    assert c.checks


def test_run_configs_reports_each_configuration_from_its_own_log(tmp_path):
    names = ["v1", "lean-unsteered"]
    lms = {name: accepting_lms() for name in names}  # each configuration's own LMs (KV slots)
    results, stopped = gc.run_configs(
        laptop_history(),
        lms,
        names,
        tmp_path,
        candidates=4,
        seed=0,
        chunk=3,
        progress=False,
    )
    assert not stopped and list(results) == names
    for name in names:
        cost = results[name]
        log = [r for r in read_log(tmp_path / name) if r.status != "skipped"]
        accepted = sum(r.status == "accepted" for r in log)
        # both turns ran (3 then 4 candidates), resumed in the same folder
        assert cost["candidates"] == len(log) == 4
        assert cost["accepted"] == accepted > 0
        assert cost["kept_fraction"] == round(accepted / 4, 4)
        calls = sum(c.calls for r in log for c in r.usage.values())
        assert cost["total"]["calls"] == calls == sum(t["calls"] for t in cost["roles"].values())
        # every call of a configuration went to its own LMs, none to the other's
        assert calls == sum(len(lm.history) for lm in lms[name].values())
        assert set(cost["roles"]) <= set(GENERATION_ROLES)
        assert cost["per_accepted"]["calls"] == pytest.approx(calls / accepted)
        kept = cost["kept_by_task"]  # both configurations leave the answer type to the planner
        assert sum(k["tried"] for k in kept.values()) == 4
        assert sum(k["accepted"] for k in kept.values()) == accepted
        assert all(kind.startswith("any/") for kind in kept)
    lean, v1 = results["lean-unsteered"], results["v1"]
    r = gc.ratios(lean, v1)
    assert r["calls_per_accepted"] == round(
        lean["per_accepted"]["calls"] / v1["per_accepted"]["calls"], 3
    )
    assert r["kept_fraction"] == round(lean["kept_fraction"] / v1["kept_fraction"], 3)


def test_ratios_without_an_accepted_item_are_empty():
    none = {"per_accepted": None, "kept_fraction": 0.0}
    some = {"per_accepted": {"tokens": 10.0, "calls": 2.0}, "kept_fraction": 0.5}
    assert gc.ratios(none, some) == {} and gc.ratios(some, none) == {}
    same = {"tokens_per_accepted": 1.0, "calls_per_accepted": 1.0, "kept_fraction": 1.0}
    assert gc.ratios(some, some) == same


def test_main_refuses_an_unknown_configuration_before_loading_anything(tmp_path, capsys):
    with pytest.raises(SystemExit):
        gc.main(["--configs", "v1,fast", "--out", str(tmp_path / "x")])
    assert "unknown configuration(s) ['fast']" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_lean_anchor_is_the_configuration_a_small_in_process_lm_gets():
    """The benchmark's lean-anchor is supervision.run.small_lm_generation_config's pipeline (the
    demo's without the question-writer examples; ``default`` adds them, below)."""
    from memsteer_dspy.supervision.run import small_lm_generation_config

    bench = gc.generation_config("lean-anchor", 12, 3)
    shared = small_lm_generation_config(n=12, max_candidates=12, seed=3, bounded=True)
    assert bench.identity() == shared.identity()
    assert (shared.lean, shared.anchored, shared.bundle.steer_to_options) == (True, True, True)
    assert (shared.bundle.steer_by_yield, shared.bundle.yield_power) == (True, 2.0)


def test_default_is_what_demo_and_generate_run_on_the_embedded_model():
    """``default`` = lean-anchor with the question writer's packaged examples: the demo's
    supervision config and `generate`'s default on an in-process small LM."""
    from memsteer_dspy.demo_data import load_demo
    from memsteer_dspy.supervision.run import small_lm_generation_config
    from memsteer_dspy.supervision.writer_examples import default_writer_examples

    history = load_demo().history
    bench = gc.generation_config("default", 12, 3, history)
    examples = default_writer_examples(history, 3)
    shared = small_lm_generation_config(
        n=12, max_candidates=12, seed=3, bounded=True, writer_examples=examples
    )
    assert bench.identity() == shared.identity() and len(bench.writer_examples) == 4
    assert gc.generation_config("lean-anchor", 12, 3).writer_examples == []
    with pytest.raises(ValueError, match="needs the history"):
        gc.generation_config("default", 12, 3)
