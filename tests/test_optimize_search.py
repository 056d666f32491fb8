"""MemSteer-Opt's search strategies, accept rules and held-out reporting: population search with a
scripted proposer (parent choice and pool), its resume, the paired accept rule, the LM-retrieval
margin, single-field screening of a rejected multi-field proposal, random/TPE baselines, and the
held-out test split in summary.json and MLflow."""

from __future__ import annotations

import json
import random

import pytest
from memory_fixtures import field_value, small_history, small_qa
from optimize_fixtures import ProposerLM, changed, proposal

from memsteer_dspy.errors import InputError
from memsteer_dspy.memory import MemoryDesign
from memsteer_dspy.optimize import MemSteerOpt, OptimizeConfig
from memsteer_dspy.optimize.objectives import Score
from memsteer_dspy.optimize.proposer import RevisionEntry, tried_fields
from memsteer_dspy.optimize.search import (
    Candidate,
    ParetoSelector,
    SoftmaxSelector,
    retrieval_lm_calls,
    single_field_variants,
)
from memsteer_dspy.optimize.splits import carve_test

NARROW = MemoryDesign.from_dict({"name": "narrow", "retrieve": {"top_k": 1, "pool": 1}})


def wide(k: int, **more) -> dict:
    return changed(NARROW, retrieve__top_k=k, retrieve__pool=max(k, 1), **more)


def held_out() -> list:
    return [q.model_copy(update={"id": "t-" + q.id}) for q in small_qa()]


def make(tmp_path, replies, *, iterations, name="run", test=None, **config):
    lm = ProposerLM(replies)
    cfg = OptimizeConfig(
        iterations=iterations, objective=config.pop("objective", "recall"), **config
    )
    opt = MemSteerOpt(
        small_history(),
        small_qa(),
        small_qa(),
        tmp_path / name,
        init_design=NARROW,
        config=cfg,
        lms={"proposer": lm},
        test=test,
        test_source="constructed",
    )
    return opt, lm


def cand(i: int, primary: float, items: list[float | None]) -> Candidate:
    return Candidate(
        iteration=i,
        design=NARROW,
        score=Score(delivered_recall=primary),
        item_ids=[str(j) for j in range(len(items))],
        item_scores=items,
    )


# -- parent selection ----------------------------------------------------------------------------


def test_softmax_weights_follow_validation_score():
    pool = [cand(0, 0.5, []), cand(1, 0.6, []), cand(2, 0.6, [])]
    w = SoftmaxSelector("recall", temperature=0.1).weights(pool)
    assert w[1] == pytest.approx(w[2]) and w[1] / w[0] == pytest.approx(2.718281828, rel=1e-6)
    assert sum(w) == pytest.approx(1.0)
    picks = [
        SoftmaxSelector("recall", 0.1).select(pool, pool[1], random.Random(s)).iteration
        for s in range(300)
    ]
    assert 0 in picks and 1 in picks and 2 in picks  # every member can be a parent


def test_pareto_front_keeps_item_leaders_and_drops_dominated():
    pool = [
        cand(0, 0.3, [1.0, 0.0, 0.0, 0.0]),  # leads item 0
        cand(1, 0.5, [0.0, 1.0, 1.0, 0.0]),  # leads items 1 and 2
        cand(2, 0.4, [0.0, 1.0, 0.0, 0.0]),  # ties on item 1 but dominated by member 1
        cand(3, 0.1, [0.0, 0.0, 0.0, None]),  # leads nothing
    ]
    front = ParetoSelector().front(pool)
    assert front == {0: 1, 1: 2}
    picks = {ParetoSelector().select(pool, pool[1], random.Random(s)).iteration for s in range(50)}
    assert picks == {0, 1}


# -- population search ----------------------------------------------------------------------------


def _parent_top_k(user_message: str) -> int:
    # the proposer reads the parent as one-line JSON; its top_k says which design it is
    return json.loads(field_value(user_message, "current_design"))["retrieve"]["top_k"]


POP_REPLIES = [wide(3), wide(2), wide(5), changed(NARROW, context__show_kind=True), wide(4)]


def _population(tmp_path, iterations, name, replies=None, **kw):
    seen_parents: list[int] = []

    def reply(design):
        def answer(msg):
            seen_parents.append(_parent_top_k(msg))
            return proposal(design)

        return answer

    return (
        *make(
            tmp_path,
            [reply(d) for d in (replies or POP_REPLIES)],
            iterations=iterations,
            name=name,
            search="population",
            parents="softmax",
            softmax_temperature=0.5,
            **kw,
        ),
        seen_parents,
    )


def test_population_run_picks_parents_by_softmax_and_keeps_every_scored_design(tmp_path):
    opt, lm, parents_seen = _population(tmp_path, 5, "pop")
    res = opt.run()
    entries = res.entries
    pool = opt.pool(entries)
    assert [c.iteration for c in pool] == [e.iteration for e in entries if e.score is not None]
    assert len(pool) == 6  # every proposal was scored and stays in the pool, accepted or not
    # each iteration's parent is the softmax draw over the pool as it stood, with the run's seeded rng
    for t in range(1, 6):
        before = entries[:t]
        best = opt.candidate(next(e for e in reversed(before) if e.accepted))
        expect = opt.selector.select(opt.pool(before), best, random.Random(f"parent:0:{t}"))
        assert entries[t].parent_iteration == expect.iteration
        assert (
            entries[t].parent_key == MemoryDesign.from_dict(entries[expect.iteration].design).key()
        )
    # the proposer was shown that parent's design
    tops = [
        MemoryDesign.from_dict(entries[e.parent_iteration].design).retrieve.top_k
        for e in entries[1:]
    ]
    assert parents_seen == tops
    assert len({e.parent_iteration for e in entries[1:]}) > 1  # not a single path
    # the result is the best pool member
    best_primary = max(c.score.delivered_recall for c in pool)
    assert res.best_score.delivered_recall == best_primary
    summary = json.loads((tmp_path / "pop" / "summary.json").read_text())
    assert summary["search"] == "population" and summary["parents"] == "softmax"
    assert [c["parent_iteration"] for c in summary["candidates"]] == [
        e.parent_iteration for e in entries
    ]


def test_population_resume_continues_with_the_same_parents(tmp_path):
    whole, _, _ = _population(tmp_path, 5, "whole")
    full = whole.run()
    first, lm1, _ = _population(tmp_path, 2, "split")
    first.run()
    assert len(lm1.calls) == 2
    again, lm2, _ = _population(tmp_path, 5, "split", replies=POP_REPLIES[2:])
    resumed = again.run()
    assert len(lm2.calls) == 3  # only the new iterations asked the proposer
    assert [e.parent_iteration for e in resumed.entries] == [
        e.parent_iteration for e in full.entries
    ]
    assert [e.status for e in resumed.entries] == [e.status for e in full.entries]
    assert resumed.best_design.key() == full.best_design.key()


def test_population_and_hill_refuse_to_resume_each_other(tmp_path):
    make(tmp_path, [proposal(wide(2))], iterations=1)[0].run()
    opt, _ = make(tmp_path, [], iterations=1, search="population")
    with pytest.raises(Exception, match="search"):
        opt.run()


# -- accept rules -----------------------------------------------------------------------------------


def test_paired_accept_rejects_a_gain_that_is_not_significant(tmp_path):
    strict, _ = make(tmp_path, [proposal(wide(2))], iterations=1, name="strict")
    s = strict.run().entries[1]
    assert s.status == "accepted"
    paired, _ = make(
        tmp_path,
        [proposal(wide(2))],
        iterations=1,
        name="paired",
        accept="paired",
        accept_test="sign",
    )
    p = paired.run().entries[1]
    assert p.status == "rejected" and p.score.delivered_recall == s.score.delivered_recall
    st = p.accept_stats
    assert (
        st["test"] == "sign"
        and st["gain"] > 0
        and st["p"] >= 0.1
        and st["wins"] >= 1
        and st["losses"] == 0
    )
    assert st["p"] == pytest.approx(0.5 ** st["wins"])
    assert "not a significant improvement" in p.reason
    line = json.loads((tmp_path / "paired" / "trajectory.jsonl").read_text().splitlines()[1])
    assert line["accept_stats"]["p"] == st["p"]  # the statistic is in the trajectory


def test_paired_accept_with_a_margin_rejects_ties(tmp_path):
    opt, _ = make(
        tmp_path,
        [proposal(changed(NARROW, context__show_kind=True))],
        iterations=1,
        accept="paired",
        accept_alpha=0.3,
        accept_margin=0.01,
    )
    e = opt.run().entries[1]
    assert e.status == "rejected" and e.accept_stats["gain"] == 0 and e.accept_stats["p"] == 1.0


def test_lm_retrieval_calls_are_counted_and_an_lm_design_must_beat_the_lm_free_best():
    base = MemoryDesign.base_bm25()
    assert retrieval_lm_calls(base) == 0
    assert retrieval_lm_calls(MemoryDesign.from_dict(changed(base, retrieve__query="hyde"))) == 1
    both = MemoryDesign.from_dict(changed(base, retrieve__query="rewrite", retrieve__rerank="llm"))
    assert retrieval_lm_calls(both) == 2
    from memsteer_dspy.optimize.search import lm_margin_decision

    free = Candidate(iteration=2, design=base, score=Score(delivered_recall=0.50))
    lm = Candidate(
        iteration=3, design=both, score=Score(delivered_recall=0.51), retrieval_lm_calls=2
    )
    veto = lm_margin_decision(lm, free, "recall", 0.02)
    assert veto is not None and not veto.accepted and "LM-free" in veto.reason
    lm.score = Score(delivered_recall=0.53)
    assert lm_margin_decision(lm, free, "recall", 0.02) is None
    assert (
        lm_margin_decision(free, free, "recall", 0.02) is None
    )  # an LM-free design is never vetoed


# -- single-field screening -------------------------------------------------------------------------


def test_single_field_variants_split_a_multi_field_proposal():
    proposed = MemoryDesign.from_dict(
        changed(NARROW, store__unit="window", store__window_size=4, context__order="chronological")
    )
    variants = dict(single_field_variants(NARROW, proposed))
    assert set(variants) == {"store.unit", "context.order"}
    assert (
        variants["store.unit"].store.window_size == 4
        and variants["store.unit"].context.order == "rank"
    )
    assert variants["context.order"].store.unit == "record"
    assert (
        single_field_variants(NARROW, MemoryDesign.from_dict(wide(3))) == []
    )  # top-k and pool move together


def test_a_rejected_multi_field_proposal_has_its_good_field_screened_alone(tmp_path):
    # wider retrieval (good) together with an LM query rewrite (no LM here: the build fails)
    bad_and_good = changed(NARROW, retrieve__top_k=5, retrieve__pool=5, retrieve__query="rewrite")
    opt, _ = make(tmp_path, [proposal(bad_and_good)], iterations=1)
    e = opt.run().entries[1]
    assert e.status == "accepted" and "sub-change" in e.reason
    assert e.screen_score is None or e.screen_score != e.score
    by_field = {s["field"]: s for s in e.sub_screens}
    assert by_field["retrieve.query"]["status"] == "failed"
    assert MemoryDesign.from_dict(e.design).retrieve.query == "raw"
    assert set(e.tried_alone) == {"retrieve.query", "retrieve.top_k", "retrieve.pool"}
    assert (
        set(by_field) == {"retrieve.query", "retrieve.top_k"}
        and by_field["retrieve.top_k"]["status"] == "accepted"
    )
    # the revision history blocks only the fields tried on their own
    assert tried_fields(
        [
            RevisionEntry(
                iteration=1,
                status="rejected",
                changes=["a.b: 1 -> 2", "c.d: 1 -> 2"],
                tried_alone=["a.b"],
            )
        ]
    ) == {"a.b"}
    assert tried_fields(
        [RevisionEntry(iteration=1, status="rejected", changes=["a.b: 1 -> 2", "c.d: 1 -> 2"])]
    ) == {"a.b", "c.d"}


# -- proposer-free baselines ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["random", "tpe"])
def test_random_and_tpe_search_sample_valid_designs_and_resume(tmp_path, kind):
    pytest.importorskip("optuna")
    opt, lm = make(tmp_path, [], iterations=4, search=kind)
    res = opt.run()
    assert lm.calls == []  # no proposer LM, no feedback
    assert all(e.search_params and e.search_params["params"] for e in res.entries[1:])
    assert not (tmp_path / "run" / "iterations" / "001" / "feedback.md").exists()
    keys = [e.design_key for e in res.entries]
    assert len(set(keys)) == len(keys)
    assert all(e.retrieval_lm_calls == 0 for e in res.entries)  # the LM-free space
    assert all(not e.sub_screens for e in res.entries)  # a baseline keeps its evaluation budget
    again, _ = make(tmp_path, [], iterations=6, search=kind)
    more = again.run()
    assert [e.iteration for e in more.entries] == list(range(7))
    assert [e.design_key for e in more.entries[:5]] == keys
    assert len(again.search_proposer.study.trials) >= 6  # the study was rebuilt from the trajectory


# -- held-out test split ------------------------------------------------------------------------------


def test_held_out_comparison_is_written_to_summary_json_and_md(tmp_path):
    opt, _ = make(tmp_path, [proposal(wide(3))], iterations=1, test=held_out())
    res = opt.run()
    t = res.test
    assert (
        t is not None and t.n == 4 and t.source == "constructed" and t.primary == "delivered_recall"
    )
    data = json.loads((tmp_path / "run" / "summary.json").read_text())["test"]
    assert {"n", "source", "initial", "best", "diff", "ci95", "verdict"} <= set(data)
    assert set(data["initial"]) == {"recall_at_10", "delivered_recall"}
    assert data["verdict"] in ("better", "worse", "inconclusive")
    assert data["diff"]["delivered_recall"] == pytest.approx(
        res.test.best["delivered_recall"] - res.test.initial["delivered_recall"]
    )
    assert (tmp_path / "run" / "test" / "initial" / "items.jsonl").exists()
    assert "## Held-out test" in (tmp_path / "run" / "summary.md").read_text()
    # resume: scored again from the saved per-item results, same numbers
    again, _ = make(tmp_path, [], iterations=1, test=held_out())
    assert again.run().test == t


def test_held_out_follows_a_best_design_that_changed_on_resume(tmp_path):
    """Resumed with more iterations, a run that accepts a new best scores *that* design on the test
    items; it used to open the earlier best's folder and stop with a run mismatch."""
    opt, _ = make(tmp_path, [proposal(wide(2))], iterations=1, test=held_out())
    first = opt.run()
    assert first.best_iteration == 1
    again, _ = make(tmp_path, [proposal(wide(8))], iterations=2, test=held_out())
    res = again.run()
    assert res.best_iteration == 2 and res.best_design.key() != first.best_design.key()
    tests = tmp_path / "run" / "test"
    assert (tests / f"best-{first.best_design.key()}" / "items.jsonl").exists()
    assert (tests / f"best-{res.best_design.key()}" / "items.jsonl").exists()
    assert res.test.best["delivered_recall"] >= first.test.best["delivered_recall"]
    assert res.test.best != first.test.best  # scored anew for the new best, not read from the old


def test_test_items_must_be_held_out(tmp_path):
    with pytest.raises(InputError, match="test item"):
        make(tmp_path, [], iterations=0, test=small_qa())


def test_carve_test_takes_whole_bundles():
    def item(i, bundle):
        return small_qa()[0].model_copy(
            update={"id": f"g{i}", "metadata": {"provenance": {"bundle_id": bundle}}}
        )

    train = [item(i, f"b{i // 2}") for i in range(10)]
    val = [item(i, f"b{i // 2}") for i in range(10, 16)]
    tr, va, te = carve_test(train, val, fraction=0.3, seed=1)
    assert len(tr) + len(va) + len(te) == 16 and 4 <= len(te) <= 6
    test_bundles = {q.metadata["provenance"]["bundle_id"] for q in te}
    assert not test_bundles & {q.metadata["provenance"]["bundle_id"] for q in tr + va}
    assert carve_test(train, val, fraction=0.3, seed=1) == (tr, va, te)
    with pytest.raises(InputError, match="leaves"):
        carve_test(train[:1], val[:1], fraction=0.5)


def test_held_out_verdict_goes_to_the_mlflow_parent_run(tmp_path):
    from mlflow import MlflowClient

    from memsteer_dspy.tracking import Tracker

    history = small_history()
    tracker = Tracker.for_history(tmp_path / "run", history.user_id, history.fingerprint)
    opt = MemSteerOpt(
        history,
        small_qa(),
        small_qa(),
        tmp_path / "run",
        init_design=NARROW,
        config=OptimizeConfig(iterations=1, objective="recall"),
        lms={"proposer": ProposerLM([proposal(wide(3))])},
        tracker=tracker,
        test=held_out(),
        test_source="constructed",
    )
    res = opt.run()
    run = MlflowClient(tracking_uri=res.tracking_uri).get_run(res.parent_run_id)
    assert (
        run.data.tags["test_verdict"] == res.test.verdict
        and run.data.tags["test_primary"] == "delivered_recall"
    )
    m = run.data.metrics
    assert m["test_n"] == 4 and m["test_best_delivered_recall"] == pytest.approx(
        res.test.best["delivered_recall"]
    )
    assert (
        m["test_ci_low_recall_at_10"]
        <= m["test_diff_recall_at_10"]
        <= m["test_ci_high_recall_at_10"]
    )
    assert run.data.params["search"] == "hill" and run.data.params["accept"] == "strict"


def test_k_proposals_are_screened_by_recall_and_the_best_goes_on(tmp_path):
    replies = [
        proposal(wide(2)),
        proposal(wide(5)),
        proposal(changed(NARROW, context__show_kind=True)),
    ]
    opt, lm = make(tmp_path, replies, iterations=1, proposals=3)
    e = opt.run().entries[1]
    assert len(lm.calls) == 3 and e.status == "accepted"
    assert MemoryDesign.from_dict(e.design).retrieve.top_k == 5  # the widest screened best
    assert (
        "best of 3 proposals" in e.rationale
        and (tmp_path / "run/iterations/001/screen-3/items.jsonl").exists()
    )
    again, lm2 = make(tmp_path, [], iterations=1, proposals=3)
    assert again.run().entries[1].design_key == e.design_key and lm2.calls == []
    with pytest.raises(Exception, match="proposals"):
        make(tmp_path, [], iterations=1, name="x", proposals=2, search="random")


# -- non-inferiority guard and --val-from ------------------------------------------------------------


def guarded(i: int, primary: float, r10: list[float | None]) -> Candidate:
    c = cand(i, primary, [primary] * len(r10))
    c.item_metrics = {"recall_at_10": r10}
    return c


def test_guard_rejects_a_candidate_significantly_below_in_r10():
    from memsteer_dspy.optimize.search import NonInferiorityGuard

    current = guarded(0, 0.4, [1.0] * 10)
    worse = guarded(1, 0.6, [0.0] * 8 + [1.0] * 2)  # loses 8 of 10 items, wins none
    d = NonInferiorityGuard(["recall_at_10"], alpha=0.1, test="sign").check(worse, current)
    assert not d.accepted and "significantly below" in d.reason and "recall_at_10" in d.reason
    st = d.stats["guard_recall_at_10"]
    assert st["diff"] == pytest.approx(-0.8) and st["n"] == 10
    assert st["p"] == pytest.approx(0.5**8, abs=5e-5)  # exact sign test: 8 losses, no win
    boot = NonInferiorityGuard(["recall_at_10"], alpha=0.1).check(worse, current)
    assert not boot.accepted and boot.stats["guard_recall_at_10"]["p"] < 0.01


def test_guard_accepts_noise_ties_and_gains():
    from memsteer_dspy.optimize.search import NonInferiorityGuard

    g = NonInferiorityGuard(["recall_at_10"], alpha=0.1, test="sign")
    current = guarded(0, 0.4, [1.0, 0.0, 1.0, 0.5, None])
    one_loss = guarded(1, 0.6, [0.0, 0.0, 1.0, 0.5, 1.0])  # one loss of 4 paired items: p = 1/2
    d = g.check(one_loss, current)
    assert d.accepted and d.stats["guard_recall_at_10"] == {"diff": -0.25, "p": 0.5, "n": 4}
    tie = g.check(guarded(2, 0.6, [1.0, 0.0, 1.0, 0.5, 0.0]), current)
    assert tie.accepted and tie.stats["guard_recall_at_10"]["p"] == 1.0
    better = guarded(3, 0.6, [1.0, 1.0, 1.0, 1.0, 0.0])
    assert g.check(better, current).accepted  # a gain is never vetoed


def test_guard_refuses_unknown_metrics_and_unpaired_items():
    from memsteer_dspy.errors import ConfigError
    from memsteer_dspy.optimize.search import NonInferiorityGuard

    with pytest.raises(ConfigError, match="recall_at_7"):
        NonInferiorityGuard(["recall_at_7"])
    g = NonInferiorityGuard(["recall_at_10"])
    with pytest.raises(ValueError, match="same items"):
        g.check(guarded(1, 0.5, [1.0]), guarded(0, 0.5, [1.0, 1.0]))


def test_guard_vetoes_what_the_accept_rule_took_and_records_its_statistic(tmp_path):
    opt, _ = make(tmp_path, [], iterations=0, guard=["recall_at_10"], accept_test="sign")
    n = len(opt.val)
    ids = [q.id for q in opt.val]

    def candidate(i, delivered, recall, item_recall):
        score = Score(delivered_recall=delivered, recall_at_10=recall)
        metrics = {"recall_at_10": [item_recall] * n}
        return Candidate(i, NARROW, score, ids, [delivered] * n, item_metrics=metrics)

    current = candidate(0, 0.4, 0.9, 1.0)
    trade = candidate(1, 0.6, 0.0, 0.0)
    assert opt.rule.decide(trade, current).accepted  # strict alone takes the delivered-recall gain
    d = opt._decide(trade, current, [])
    assert not d.accepted and "recall_at_10" in d.reason
    assert d.stats["guard_recall_at_10"]["p"] == pytest.approx(0.5**n, abs=5e-5)
    keep = candidate(2, 0.6, 0.9, 1.0)
    ok = opt._decide(keep, current, [])
    assert ok.accepted and ok.stats["guard_recall_at_10"]["diff"] == 0


def test_a_guarded_run_records_guard_metrics_per_candidate_and_in_run_json(tmp_path):
    opt, _ = make(tmp_path, [proposal(wide(2))], iterations=1, guard=["recall_at_10"])
    res = opt.run()
    e = res.entries[1]
    assert e.status == "accepted"  # a wider top-k does not lower R@10
    assert e.accept_stats["guard_recall_at_10"]["diff"] >= 0
    c = opt.candidate(e)
    assert len(c.item_metrics["recall_at_10"]) == len(opt.val)
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["guard"] == ["recall_at_10"] and run["val_from"] == "val"
    other, _ = make(tmp_path, [], iterations=1)  # same folder, no guard: a different run
    with pytest.raises(Exception, match="guard"):
        other.run()


def test_val_from_train_and_val_selects_on_both_and_needs_the_recall_objective(tmp_path):
    from memsteer_dspy.errors import ConfigError

    qa = small_qa()
    train, val = qa[: len(qa) // 2], qa[len(qa) // 2 :]
    cfg = OptimizeConfig(iterations=0, objective="recall", val_from="train+val")
    opt = MemSteerOpt(small_history(), train, val, tmp_path / "tv", init_design=NARROW, config=cfg)
    assert [q.id for q in opt.val] == [q.id for q in [*val, *train]]
    assert [q.id for q in opt.train] == [q.id for q in train]  # feedback still from train only
    res = opt.run()
    assert json.loads((tmp_path / "tv" / "run.json").read_text())["n_val"] == len(qa)
    assert len(opt.candidate(res.entries[0]).item_ids) == len(qa)
    with pytest.raises(ConfigError, match="objective recall"):
        MemSteerOpt(
            small_history(),
            train,
            val,
            tmp_path / "acc",
            init_design=NARROW,
            config=OptimizeConfig(objective="accuracy", val_from="train+val"),
        )


def test_guard_margin_turns_the_burden_of_proof_round():
    from memsteer_dspy.errors import ConfigError
    from memsteer_dspy.optimize.search import NonInferiorityGuard

    current = guarded(0, 0.4, [1.0, 0.0, 1.0, 0.5, 1.0, 1.0])
    one_loss = guarded(1, 0.6, [0.0, 0.0, 1.0, 0.5, 1.0, 1.0])  # -1/6: no significant loss ...
    assert NonInferiorityGuard(["recall_at_10"], alpha=0.1).check(one_loss, current).accepted
    ni = NonInferiorityGuard(["recall_at_10"], alpha=0.1, margin=0.02)
    d = ni.check(one_loss, current)  # ... but not shown to be within 0.02 of the current design
    assert not d.accepted and "non-inferior" in d.reason
    assert (
        d.stats["guard_recall_at_10"]["margin"] == 0.02
        and d.stats["guard_recall_at_10"]["p"] >= 0.1
    )
    same = guarded(2, 0.6, list(current.item_metrics["recall_at_10"]))  # unchanged ranking: 0 > -δ
    ok = ni.check(same, current)
    assert ok.accepted and ok.stats["guard_recall_at_10"]["p"] == pytest.approx(1 / 1001, abs=5e-5)
    with pytest.raises(ConfigError, match="guard-margin"):
        NonInferiorityGuard(["recall_at_10"], margin=1.5)


# -- tabu list ----------------------------------------------------------------------------------


@pytest.mark.parametrize("tabu", [True, False])
def test_a_change_rejected_on_its_own_is_not_proposed_again_on_a_later_parent(tmp_path, tabu):
    """Iteration 1 rejects one change; after iteration 2's accept the proposer repeats it on the
    new parent (a new design, so not a duplicate): with the tabu list it is re-sampled."""
    repeat = wide(3, context__dedupe=False)
    replies = [
        proposal(changed(NARROW, context__dedupe=False)),
        proposal(wide(3)),
        proposal(repeat),
        proposal(wide(3, context__order="chronological")),
    ]
    opt, lm = make(tmp_path, replies, iterations=3, tabu=tabu)
    entries = opt.run().entries
    assert [e.status for e in entries[1:3]] == ["rejected", "accepted"]
    assert entries[1].revision().rejected_alone == [("context.dedupe", False)]
    assert entries[2].revision().rejected_alone == []
    third = entries[3]
    if tabu:
        assert [a.kind for a in third.attempts] == ["duplicate", "ok"]
        assert "context.dedupe = false was rejected on its own" in third.attempts[0].duplicate_of
        assert MemoryDesign.from_dict(third.design).context.order == "chronological"
    else:
        assert [a.kind for a in third.attempts] == ["ok"] and len(lm.calls) == 3
        assert MemoryDesign.from_dict(third.design).context.dedupe is False


def test_rejected_sub_screens_enter_the_tabu_list():
    from memsteer_dspy.optimize.loop import TrajectoryEntry

    e = TrajectoryEntry(
        iteration=5,
        status="accepted",
        accepted=True,
        changes=['context.order: "rank" -> "thread"', 'retrieve.index: "bm25" -> "dense"'],
        sub_screens=[
            {
                "field": "retrieve.index",
                "status": "rejected",
                "changes": ['retrieve.index: "bm25" -> "dense"'],
            },
            {
                "field": "context.order",
                "status": "accepted",
                "changes": ['context.order: "rank" -> "thread"'],
            },
            {
                "field": "context.dedupe",
                "status": "failed",
                "changes": ["context.dedupe: true -> false"],
            },
        ],
    )
    assert e.revision().rejected_alone == [("retrieve.index", "dense")]
    multi = TrajectoryEntry(
        iteration=6, status="rejected", accepted=False, changes=["a.b: 1 -> 2", "c.d: 1 -> 2"]
    )
    assert multi.revision().rejected_alone == []
