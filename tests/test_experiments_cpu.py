"""main.py's ``cpu`` preset and its test protocol (issue #47): the official items neither
optimization used, retrieval on every item (and on all items, †), accuracy on one stratified
sample for every row, paired 95% intervals; with the scripted LM world of test_experiments.py."""

from __future__ import annotations

import importlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from test_experiments import (  # experiments/_common.py, as test_experiments imports it
    World,
    _common,
    load_script,
    no_stage_failed,
    official_answers,
    results_of,
    tiny,
    world_config,
)

from memsteer_dspy.evaluation import evaluate_design
from memsteer_dspy.loaders.rhelm import list_personas, load_rhelm
from memsteer_dspy.memory import MemoryDesign, MemorySystem
from memsteer_dspy.optimize.splits import official_test
from memsteer_dspy.stats import paired_bootstrap_ci

protocol = importlib.import_module("_protocol")  # experiments/, on sys.path by test_experiments

PERSONAS = ["Dr._Alastair_McEwan", "Elena_Morales"]


def tagged(rhelm_root: Path, personas: list[str]) -> list[Any]:
    return [
        q
        for p in personas
        for q in _common.with_persona(load_rhelm(rhelm_root, p, external=True).qa_items, p)
    ]


def test_cpu_preset_values():
    cfg = _common.load_config(None, "cpu")
    d, b = cfg.dataset, cfg.budgets
    assert "cpu" in _common.PRESETS and cfg.preset == "cpu"
    assert d.personas is None and d.settings == ["with"] and d.eval_items is None
    assert d.test_on == "unused" and d.accuracy_items == 150
    assert b.iterations >= 15 and b.context_tokens == 2000 and b.threads == 1
    assert b.supervision == 40 and b.max_candidates == 300
    assert b.train_fraction == pytest.approx(2 / 3)
    # the 40/20 official split uncapped; the LM-dependent options resolved by the embedded LMs
    assert b.official_train is None and b.official_val is None
    assert b.objective is None and b.feedback_tokens is None and not b.paper
    args = _common.parse_args("main", None, ["--preset", "cpu"])
    assert args.preset == "cpu"
    # the other presets keep testing on all (or eval_items of the) official items
    assert all(_common.load_config(None, p).dataset.test_on == "all" for p in ("tiny", "full"))


def test_unused_items_are_what_the_official_split_leaves(rhelm_root):
    personas = list_personas(rhelm_root)
    items = tagged(rhelm_root, personas)
    budgets = _common.load_config(None, "cpu").budgets
    train, val = _common.official_split(items, budgets, 0)
    unused = _common.unused_items(items, budgets, 0)
    key = lambda qs: {(q.metadata["persona"], q.id) for q in qs}  # noqa: E731
    assert not key(unused) & (key(train) | key(val)) and not key(train) & key(val)
    assert key(unused) | key(train) | key(val) == key(items)
    # 40% / 20% / 40% per persona, rounded per persona (the "524 / 264" does not add
    # up to 1,305 with its 522), and exactly systems.py's held-out split
    assert (len(items), len(train), len(val), len(unused)) == (1305, 522, 261, 522)
    held_out = [
        (p, q.id)
        for p in personas
        for q in official_test([q for q in items if q.metadata["persona"] == p], seed=0)
    ]
    assert key(unused) == set(held_out)
    # a capped split leaves the capped-out items unused too
    capped = _common.Budgets(official_train=3, official_val=2)
    assert len(_common.unused_items(items, capped, 0)) == len(items) - 5 * len(personas)


def test_accuracy_sample_is_stratified_seeded_and_unused(rhelm_root):
    items = tagged(rhelm_root, list_personas(rhelm_root))
    unused = _common.unused_items(items, _common.Budgets(), 0)
    sample = _common.accuracy_sample(unused, 150, 0)
    ids = [(q.metadata["persona"], q.id) for q in sample]
    assert len(set(ids)) == 150 and set(ids) <= {(q.metadata["persona"], q.id) for q in unused}
    assert sample == _common.accuracy_sample(unused, 150, 0)  # seeded
    assert sample != _common.accuracy_sample(unused, 150, 1)
    assert sample == [q for q in unused if (q.metadata["persona"], q.id) in set(ids)]  # in order
    # every question type gets its proportional share (largest remainders: within one item) ...
    have, total = Counter(q.question_type for q in sample), Counter(q.question_type for q in unused)
    assert set(have) == set(total)
    assert all(abs(have[t] - 150 * total[t] / len(unused)) < 1 for t in total), have
    # ... and within a type, every persona its share of the type's
    for t in total:
        mine = Counter(q.metadata["persona"] for q in sample if q.question_type == t)
        pool = Counter(q.metadata["persona"] for q in unused if q.question_type == t)
        assert all(abs(mine[p] - have[t] * pool[p] / total[t]) < 1 for p in pool), (t, mine)
    assert _common.accuracy_sample(unused, None, 0) == unused
    assert _common.accuracy_sample(unused, 10_000, 0) == unused


def cpu_like(rhelm_root: Path, **dataset: Any) -> _common.ExperimentConfig:
    """The tiny preset's sizes under the cpu preset's protocol, two personas sharing a design."""
    return tiny(
        rhelm_root,
        dataset={
            "personas": PERSONAS,
            "settings": ["with"],
            "test_on": "unused",
            "accuracy_items": 6,
            **dataset,
        },
    )


def folders(out: Path) -> set[Path]:
    return {p for p in (out / "eval").glob("*/*/*") if p.is_dir()}


def test_main_on_unused_items_with_paired_intervals_and_resume(rhelm_root, tmp_path):
    world = World(official_answers(rhelm_root, PERSONAS))
    cfg = cpu_like(rhelm_root)
    out = tmp_path / "main-cpu"
    main = load_script("main")
    main.run(cfg, out, lm_config=world_config(world), progress=False)
    md, data, rows = results_of(out)
    no_stage_failed(data)

    items = tagged(rhelm_root, PERSONAS)
    unused = {(q.metadata["persona"], q.id) for q in _common.unused_items(items, cfg.budgets, 0)}
    sample = _common.accuracy_sample(
        [q for q in items if (q.metadata["persona"], q.id) in unused], 6, 0
    )
    sampled = {(q.metadata["persona"], q.id) for q in sample}
    conds = data["settings"]["with"]
    assert set(conds) == {"base", "official", "memsteer"}
    for name, cond in conds.items():
        assert cond["n"] == len(unused) and cond["n_accuracy"] == 6, name
        assert cond["all_items"]["n"] == len(items) and cond["all_items"]["accuracy"] is None
        assert sum(c["n_accuracy"] for c in cond["per_persona"].values()) == 6
        assert cond["accuracy"] is not None and cond["recall_at_10"] is not None
        mine = [r for r in rows if r["condition"] == name]
        # one line per official item; answered exactly on the sample, the same for every row
        assert len(mine) == len(items)
        assert {(r["persona"], r["qa_id"]) for r in mine if r["unused"]} == unused
        assert {(r["persona"], r["qa_id"]) for r in mine if r["sampled"]} == sampled
        assert {(r["persona"], r["qa_id"]) for r in mine if r["correct"] is not None} == sampled

    # the Base-BM25 accuracy is what an independent evaluation of the sample computes
    lm = world_config(World(official_answers(rhelm_root, PERSONAS)))
    correct = []
    for p in PERSONAS:
        loaded = load_rhelm(rhelm_root, p, external=True)
        system = MemorySystem.from_design(
            _common.base_design(800), loaded.history, lms={"answerer": lm.lm("answerer")}
        )
        mine = [q for q in loaded.qa_items if (p, q.id) in sampled]
        rep = evaluate_design(system, mine, judge_lm=lm.lm("judge"), protocol="as_of")
        correct += [bool(r.correct) for r in rep.items]
    assert conds["base"]["accuracy"] == pytest.approx(sum(correct) / len(correct))

    # paired intervals of each optimized row against Base-BM25 and between the two, item by item
    cmp = data["comparisons"]["with"]
    assert set(cmp) == {"official-base", "memsteer-base", "memsteer-official"}
    for c in cmp.values():
        assert (
            c["unused"]["accuracy"]["n"] == 6 and len(c["unused"]["delivered_recall"]["ci95"]) == 2
        )
        assert c["all"]["recall_at_10"]["n"] > c["unused"]["recall_at_10"]["n"] > 0
    assert "ΔDeliv. [95% CI]" in md and f"the {len(unused)} official items" in md
    assert f"All {len(items)} official items †" in md and "+ MemSteer against + Official-QA" in md
    assert "Per-persona delivered recall" in md and "Table 8 — accuracy" in md

    # a rerun resumes: no LM call is made again, the same numbers come out
    before, evals = dict(world.calls), folders(out)
    main.run(cfg, out, lm_config=world_config(world), progress=False)
    assert world.calls == before and folders(out) == evals
    assert results_of(out)[1]["comparisons"] == data["comparisons"]

    # a rerun under another sample answers in new folders: nothing answered before is reused,
    # and what does not depend on the sample (supervision, optimizations, retrieval) resumes
    main.run(
        cpu_like(rhelm_root, accuracy_items=8), out, lm_config=world_config(world), progress=False
    )
    _, again, _ = results_of(out)
    no_stage_failed(again)
    assert all(c["n_accuracy"] == 8 for c in again["settings"]["with"].values())
    new = folders(out) - evals
    assert new and all(p.name.split("-")[1] == "all" for p in new)
    designs = {p.name.split("-")[0] for p in new}
    assert len(new) == len(designs) * len(PERSONAS)
    answered = sum(len((p / "items.jsonl").read_text().splitlines()) for p in new)
    assert answered == 8 * len(designs) and world.calls["answer"] >= before["answer"] + answered
    assert all(world.calls[r] == before[r] for r in ("plan", "audit", "proposer"))


def test_eval_folders_differ_by_items_metrics_and_budget(rhelm_root, tmp_path):
    cfg = cpu_like(rhelm_root)
    study = _common.Study(
        "main", cfg, tmp_path, lm_config=world_config(World()), tracking=False, progress=False
    )
    items = load_rhelm(rhelm_root, "Elena_Morales").qa_items
    d = study.base_design()
    here = study.eval_folder("with", "Elena_Morales", d, items[:5])
    assert here == study.eval_folder("with", "Elena_Morales", d, items[:5])
    others = {
        study.eval_folder("with", "Elena_Morales", d, items[:6]),
        study.eval_folder("with", "Elena_Morales", d, items[:5], "recall"),
        study.eval_folder("with", "Elena_Morales", _common.base_design(900), items[:5]),
        study.eval_folder("without", "Elena_Morales", d, items[:5]),
    }
    assert here not in others and len(others) == 4
    # the sample each row is answered on: the persona's share, the same for every call
    mine = study.test_items("Elena_Morales", True, PERSONAS)
    theirs = study.test_items("Dr._Alastair_McEwan", True, PERSONAS)
    assert len(mine) + len(theirs) == 6 and mine == study.test_items("Elena_Morales", True)
    assert json.dumps([q.id for q in mine]) == json.dumps(
        [q.id for q in study.test_items("Elena_Morales", True, list(reversed(PERSONAS)))]
    )


def test_paired_intervals_are_over_the_same_items_in_one_order(rhelm_root, tmp_path):
    """Three rows with different designs (so the differences are not all zero): every interval is
    the paired bootstrap of the rows' per-item scores in items.jsonl, in the same item order."""
    world = World(official_answers(rhelm_root, PERSONAS))
    study = _common.Study(
        "main",
        cpu_like(rhelm_root),
        tmp_path,
        lm_config=world_config(world),
        tracking=False,
        progress=False,
    )
    base = _common.base_design(800)
    narrow = base.model_copy(update={"retrieve": base.retrieve.model_copy(update={"top_k": 3})})
    designs = {"base": base, "official": _common.base_design(1600), "memsteer": narrow}
    per_item = {}
    for cond, design in designs.items():
        _, per_item[cond] = protocol.test_row(
            study, design, PERSONAS, external=True, condition=cond, setting="with"
        )
    cmp = protocol.comparisons(per_item)
    by = {(r["condition"], r["persona"], r["qa_id"]): r for r in study.rows}
    order = [(r["persona"], r["qa_id"]) for r in study.rows if r["condition"] == "base"]
    unused = [k for k in order if by[("base", *k)]["unused"]]
    sampled = [k for k in order if by[("base", *k)]["sampled"]]
    assert len(sampled) == 6 and set(sampled) <= set(unused) and len(unused) < len(order)
    moved = 0
    for name, (ref, row) in protocol.PAIRS.items():
        for items_of, keys, metric in (
            ("unused", unused, "delivered_recall"),
            ("unused", unused, "recall_at_10"),
            ("all", order, "delivered_recall"),
            ("unused", sampled, "accuracy"),
        ):

            def vec(cond: str, keys=keys, metric=metric) -> list[float | None]:
                if metric == "accuracy":
                    return [float(by[(cond, *k)]["correct"]) for k in keys]
                return [by[(cond, *k)][metric] for k in keys]

            a, b = vec(ref), vec(row)
            pairs = [(x, y) for x, y in zip(a, b, strict=True) if x is not None and y is not None]
            got = cmp[name][items_of][metric]
            assert got["n"] == len(pairs) > 0, (name, items_of, metric)
            assert got["diff"] == pytest.approx(sum(y - x for x, y in pairs) / len(pairs))
            assert got["ci95"] == pytest.approx(list(paired_bootstrap_ci(a, b)))
            moved += got["diff"] != 0
    assert moved >= 4  # a wider budget delivers more, a narrower top-k retrieves less


def test_generation_on_an_in_process_small_lm_runs_generate_s_small_lm_pipeline(
    rhelm_root, tmp_path, monkeypatch
):
    """The experiments generate as `memsteer generate` and `memsteer demo` do on the embedded
    model (lean prompts, anchored planner, the packaged question-writer examples, bounded outputs),
    not the paper's pipeline; the ablation's other methods and checks-off keep theirs."""
    import memsteer_dspy.supervision.run as run
    from memsteer_dspy.lm import LMConfig

    seen: list[Any] = []

    class Stop(Exception):
        pass

    def capture(history, lms, folder, config, **kw):
        seen.append(config)
        raise Stop

    monkeypatch.setattr(run, "generate_supervision", capture)
    monkeypatch.setattr(LMConfig, "in_process", lambda self, *roles: True)
    cfg = cpu_like(rhelm_root)
    study = _common.Study("main", cfg, tmp_path, lm_config=world_config(World()), tracking=False)
    for method, checks in (("memsteer", True), ("direct", True), ("memsteer", False)):
        with pytest.raises(Stop):
            study.generate(
                tmp_path / method / str(checks), "Elena_Morales", method=method, checks=checks
            )
    small, direct, unchecked = seen
    assert small.lean and small.anchored and small.bounded and len(small.writer_examples) == 4
    assert small.bundle.steer_by_yield and small.bundle.bridges and not small.bundle.pairs
    for other in (direct, unchecked):
        assert not other.lean and not other.anchored and not other.writer_examples
        assert other.bounded  # in-process: length limits, as generate sets them


def test_an_in_process_study_sends_an_lm_built_store_back_as_memsteer_optimize_does(
    rhelm_root, tmp_path, monkeypatch
):
    """The cpu study's first run accepted the embedded proposer's `store.unit: facts` and began
    fact extraction over ten histories (about 6,800 calls); the study's optimizations take the
    CLI's limit, so with an in-process LM such a store is refused, with an API LM it is not."""
    import memsteer_dspy.optimize.loop as loop
    from memsteer_dspy.lm import LMConfig
    from memsteer_dspy.optimize.evaluator import BuildCheck

    seen: list[Any] = []

    class Stop(Exception):
        pass

    def capture(self, *args, **kwargs):
        seen.append(kwargs.get("config"))
        raise Stop

    monkeypatch.setattr(loop.MemSteerOpt, "__init__", capture)
    cfg = cpu_like(rhelm_root)
    for in_process, limit in ((True, 0), (False, None)):
        monkeypatch.setattr(LMConfig, "in_process", lambda self, *roles, v=in_process: v)
        study = _common.Study(
            "main", cfg, tmp_path / str(in_process), lm_config=world_config(World()), tracking=False
        )
        history = study.load("Elena_Morales").history
        with pytest.raises(Stop):
            study.optimize(tmp_path / "opt", {"Elena_Morales": history}, [], [])
        assert seen[-1].max_build_calls == limit
    base = MemoryDesign.base_bm25()
    facts = base.model_copy(update={"store": base.store.model_copy(update={"unit": "facts"})})
    with pytest.raises(Exception, match="store.unit 'facts' needs about"):
        BuildCheck(history, 10, seen[0])(facts)


def test_an_interrupted_stage_is_logged_as_interrupted_not_done(rhelm_root, tmp_path):
    """Ctrl-C or SIGTERM inside a stage stops the study, and the log says so (it said "done")."""
    cfg = cpu_like(rhelm_root)
    study = _common.Study("main", cfg, tmp_path, lm_config=world_config(World()), tracking=False)
    with pytest.raises(KeyboardInterrupt), study.stage("slow stage"):
        raise KeyboardInterrupt
    log = (tmp_path / "log.txt").read_text()
    assert "slow stage interrupted" in log and "slow stage done" not in log
    assert study.stages[-1].error == "interrupted"
    study.book_outside(3, 120)  # a package's own LM calls count toward the stage running them
    with study.stage("outside") as st:
        study.book_outside(2, 50)
    assert (st.calls, st.tokens) == (2, 50)
