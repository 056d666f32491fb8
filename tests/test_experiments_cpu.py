"""main.py's ``cpu`` preset and its test protocol (issue #47): the official items neither
optimization used, retrieval on every item (and on all items, †), accuracy on one stratified
sample for every row, paired 95% intervals; with the scripted LM world of test_experiments.py."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from test_experiments import (  # experiments/_common.py, as test_experiments imports it
    World,
    _common,
    tiny,
    world_config,
)

from memsteer_dspy.loaders.rhelm import list_personas, load_rhelm
from memsteer_dspy.optimize.splits import official_test

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
