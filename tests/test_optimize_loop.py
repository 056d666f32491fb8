"""The MemSteer-Opt loop: the accept rule, invalid and duplicate proposals, resumption, outputs,
and a scripted-proposer run on a RHELM persona tracked in a sqlite MLflow store."""

from __future__ import annotations

import json

import pytest
from memory_fixtures import ScriptedLM, field_value, signature_of, small_history
from optimize_fixtures import ProposerLM, changed, proposal, small_opt

from memsteer_dspy.memory import MemoryDesign
from memsteer_dspy.optimize import MemSteerOpt, OptimizeConfig, split_official
from memsteer_dspy.optimize.loop import TrajectoryEntry
from memsteer_dspy.runfolder import RunMismatchError

NARROW = MemoryDesign.from_dict({"name": "narrow", "retrieve": {"top_k": 1, "pool": 1}})


def wide(k: int) -> dict:
    return changed(NARROW, retrieve__top_k=k, retrieve__pool=max(k, 1))


def run(
    tmp_path,
    replies,
    *,
    iterations,
    objective="recall",
    lms=None,
    max_build_calls=None,
    stop_at_max=False,
    **kw,
):
    lm = ProposerLM(replies)
    config = OptimizeConfig(
        iterations=iterations,
        objective=objective,
        max_build_calls=max_build_calls,
        stop_at_max=stop_at_max,
    )
    opt = small_opt(tmp_path, NARROW, config, {"proposer": lm, **(lms or {})}, **kw)
    return opt, lm


def lines(path) -> list[TrajectoryEntry]:
    return [TrajectoryEntry.model_validate_json(x) for x in path.read_text().splitlines()]


def test_accept_rule_invalid_and_every_proposal_kept(tmp_path):
    events = []
    replies = [
        proposal(
            changed(NARROW, context__show_kind=True), "show kinds"
        ),  # same recall: a tie, rejected
        proposal(wide(3), "more units"),  # better: accepted
        proposal(changed(NARROW, store__unit="paragraph")),
        "not json",  # invalid twice
        proposal(wide(2), "fewer units"),  # worse than the accepted one
    ]
    opt, lm = run(tmp_path, replies, iterations=4, on_event=events.append)
    res = opt.run()
    out = tmp_path / "run"
    assert [e.status for e in res.entries] == [
        "baseline",
        "rejected",
        "accepted",
        "invalid",
        "rejected",
    ]
    assert res.accepted_path == [0, 2]
    assert (
        res.best_design.retrieve.top_k == 3
        and res.best_score.delivered_recall > res.baseline_score.delivered_recall
    )
    tie = res.entries[1]
    assert tie.score.delivered_recall == res.baseline_score.delivered_recall and not tie.accepted
    assert "not better" in tie.reason and tie.changes == ["context.show_kind: false -> true"]
    assert (
        res.entries[2].selected_by.startswith("delivered recall")
        and res.entries[2].train_failures is not None
    )
    assert res.entries[3].design is None and "store.unit" in res.entries[3].attempts[0].error
    # files: every proposal kept; the accepted design re-ran the training set
    assert [e.iteration for e in lines(out / "trajectory.jsonl")] == [0, 1, 2, 3, 4]
    for t in range(1, 5):
        assert (out / "iterations" / f"{t:03d}" / "proposal.json").exists()
        assert (out / "iterations" / f"{t:03d}" / "feedback.md").exists()
    assert (out / "iterations/002/train/items.jsonl").exists() and (
        out / "iterations/002/diagnosis.jsonl"
    ).exists()
    assert not (out / "iterations/001/train").exists()
    assert MemoryDesign.load(out / "best_design.json").key() == res.best_design.key()
    summary = (out / "summary.md").read_text()
    assert (
        "| 2 | 0 | accepted |" in summary
        and "## Accepted path" in summary
        and "iteration 2" in summary
    )
    assert [e["iteration"] for e in events] == [0, 1, 2, 3, 4] and events[2]["status"] == "accepted"
    # the proposer saw the feedback and, later, the revision history with the rejected tie
    second = lm.calls[1]["user"]
    assert "retrieval failure" in field_value(second, "feedback")
    assert "iteration 1: REJECTED" in field_value(second, "revision_history")
    assert res.entries[-1].cost_total.calls == len(lm.calls) == 5


def test_duplicates_are_not_evaluated_again(tmp_path):
    opt, lm = run(tmp_path, [proposal(NARROW), proposal(wide(2))], iterations=1)
    res = opt.run()
    e = res.entries[1]
    assert e.status == "accepted" and [a.kind for a in e.attempts] == ["duplicate", "ok"]
    assert e.attempts[0].duplicate_of == "iteration 0 (baseline)"
    assert (
        lm.calls[1]["kwargs"]["temperature"] > 0 and lm.calls[1]["kwargs"]["rollout_id"] is not None
    )


def test_resume_continues_from_the_last_finished_iteration(tmp_path):
    opt, _ = run(tmp_path, [proposal(wide(2)), proposal(wide(4))], iterations=2)
    first = opt.run()
    assert [e.status for e in first.entries] == ["baseline", "accepted", "accepted"]
    # a torn line from an interrupted write is dropped, not kept
    path = tmp_path / "run" / "trajectory.jsonl"
    with open(path, "a") as f:
        f.write('{"iteration": 3, "status": "acc')
    opt2, lm2 = run(tmp_path, [proposal(wide(3)), proposal(wide(5))], iterations=4)
    second = opt2.run()
    assert [e.iteration for e in second.entries] == [0, 1, 2, 3, 4]
    assert len(lm2.calls) == 2  # only the new iterations asked the proposer
    assert [e.iteration for e in lines(path)] == [0, 1, 2, 3, 4]
    assert (
        second.entries[3].status == "rejected"
        and second.entries[3].parent_key == first.best_design.key()
    )
    # nothing left to do: a third run returns the same result without asking anything
    opt3, lm3 = run(tmp_path, [], iterations=4)
    assert opt3.run().best_design.key() == second.best_design.key() and lm3.calls == []


def test_an_interrupted_iteration_reuses_its_saved_proposal(tmp_path, monkeypatch):
    opt, lm = run(tmp_path, [proposal(wide(2))], iterations=1)
    real = MemSteerOpt.evaluate
    state = {"raised": False}

    def evaluate(self, design, items, metrics, folder):
        if folder.parent.name == "001" and not state["raised"]:
            state["raised"] = True
            raise KeyboardInterrupt
        return real(self, design, items, metrics, folder)

    monkeypatch.setattr(MemSteerOpt, "evaluate", evaluate)
    with pytest.raises(KeyboardInterrupt):
        opt.run()
    assert len(lines(tmp_path / "run" / "trajectory.jsonl")) == 1
    opt2, lm2 = run(tmp_path, [], iterations=1)
    res = opt2.run()
    assert res.entries[1].status == "accepted" and lm2.calls == []


def test_changed_settings_refuse_to_resume(tmp_path):
    run(tmp_path, [proposal(wide(2))], iterations=1)[0].run()
    opt, _ = run(tmp_path, [], iterations=1, objective="recall-then-accuracy")
    with pytest.raises(RunMismatchError, match="options.objective") as err:
        opt.run()
    assert err.value.field == "options.objective" and err.value.file.endswith("run.json")


def test_a_candidate_that_cannot_be_built_is_recorded_failed(tmp_path):
    needs_lm = changed(NARROW, retrieve__query="rewrite")  # no answerer LM given: cannot build
    opt, _ = run(tmp_path, [proposal(needs_lm), proposal(wide(2))], iterations=2)
    res = opt.run()
    assert [e.status for e in res.entries] == ["baseline", "failed", "accepted"]
    assert "could not build" in res.entries[1].reason


ANSWERS = {"colour": "red", "conference": "Lisbon", "pay": "90", "people": "Anna, Tom"}


def answerer_and_judge():
    """An answerer that answers right exactly when the answer is in its context; a judge that
    rejects everything not matched exactly."""

    def handler(system, user):
        sig = signature_of(system)
        if sig == "judge":
            return {"correct": False}
        question, context = field_value(user, "question"), field_value(user, "context")
        for word, answer in ANSWERS.items():
            if word in question:
                found = all(part in context for part in answer.split(", "))
                return {"answer": answer if found else "I don't know"}
        return {"answer": "I don't know"}

    return ScriptedLM(handler)


def test_accuracy_objective_answers_judges_and_diagnoses(tmp_path):
    lm = answerer_and_judge()
    opt, _ = run(
        tmp_path,
        [proposal(wide(4))],
        iterations=1,
        objective="accuracy",
        lms={"answerer": lm, "judge": lm},
    )
    res = opt.run()
    base, best = res.baseline_score, res.best_score
    assert base.accuracy < best.accuracy == 1.0 and res.entries[1].selected_by == "accuracy"
    diag = [
        json.loads(x)
        for x in (tmp_path / "run/iterations/000/diagnosis.jsonl").read_text().splitlines()
    ]
    assert diag and {d["stage"] for d in diag} <= {"retrieval", "storage", "answering"}
    items = [
        json.loads(x)
        for x in (tmp_path / "run/iterations/001/val/items.jsonl").read_text().splitlines()
    ]
    assert all(i["correct"] for i in items)


def test_rhelm_persona_end_to_end_with_recall_objective_and_mlflow(tmp_path, rhelm_root):
    """Scripted proposer, recall objective (no answering LM), tracked in a tmp sqlite store."""
    from mlflow import MlflowClient

    from memsteer_dspy.loaders.rhelm import load_rhelm
    from memsteer_dspy.tracking import Tracker

    loaded = load_rhelm(rhelm_root, "Elena_Morales", external=True)
    train, val = split_official(loaded.qa_items, seed=0)
    base = MemoryDesign.base_bm25()
    replies = [
        proposal(changed(base, store__unit="window"), "windows keep neighbouring turns together"),
        proposal(changed(base, retrieve__bm25__k1=1.2), "milder term saturation"),
        proposal(changed(base, retrieve__expand_neighbors=1)),
    ]
    lm = ProposerLM(replies)
    out = tmp_path / "opt"
    tracker = Tracker.for_history(out, loaded.history.user_id, loaded.history.fingerprint)
    opt = MemSteerOpt(
        loaded.history,
        train,
        val,
        out,
        config=OptimizeConfig(iterations=3, objective="recall", protocol="as_of"),
        lms={"proposer": lm},
        tracker=tracker,
        cache_dir=tmp_path / "cache",
        run_params={"supervision": "official"},
    )
    res = opt.run()
    assert len(train) == 35 and len(val) == 17
    assert [e.iteration for e in res.entries] == [0, 1, 2, 3]
    assert res.entries[0].train_failures["retrieval"] > 0
    assert all(e.status in ("accepted", "rejected") for e in res.entries[1:])
    best = res.best_score
    assert best.delivered_recall >= res.baseline_score.delivered_recall and best.accuracy is None
    feedback = (out / "iterations/001/feedback.md").read_text()
    assert "Retrieval failures" in feedback and "lookup " in feedback

    client = MlflowClient(tracking_uri=res.tracking_uri)
    exp = client.get_experiment_by_name(f"memsteer/Elena_Morales/{loaded.history.fingerprint}")
    runs = client.search_runs([exp.experiment_id])
    parent = next(r for r in runs if r.info.run_id == res.parent_run_id)
    children = sorted(
        (r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id),
        key=lambda r: r.info.run_name,
    )
    assert [r.info.run_name for r in children] == ["iter-000", "iter-001", "iter-002", "iter-003"]
    assert (
        parent.data.params["objective"] == "recall"
        and parent.data.params["supervision"] == "official"
    )
    assert parent.data.params["n_train"] == "35"
    assert [m.step for m in client.get_metric_history(parent.info.run_id, "best_score")] == [
        0,
        1,
        2,
        3,
    ]
    for entry, child in zip(res.entries, children, strict=True):
        assert child.data.tags["accepted"] == ("true" if entry.accepted else "false")
        assert child.data.params["design.retrieve.top_k"] == "20"
        assert child.data.metrics["val_delivered_recall"] == pytest.approx(
            entry.score.delivered_recall
        )
        assert "val_recall_at_10" in child.data.metrics and "wall_seconds" in child.data.metrics
        arts = {a.path for a in client.list_artifacts(child.info.run_id)}
        assert {"design.json", "rationale.md", "val_items.json"} <= arts
        if entry.iteration:
            assert {"feedback.md", "feedback.json", "diagnosis.json"} <= arts
    assert children[1].data.params["design.store.unit"] == "window"
    parent_arts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"best_design.json", "trajectory.jsonl", "summary.md"} <= parent_arts
    table = json.loads(
        open(
            client.download_artifacts(children[0].info.run_id, "val_items.json", str(tmp_path))
        ).read()
    )
    assert len(table["data"]) == 17 and "delivered_recall" in table["columns"]


def test_recall_then_accuracy_screens_before_answering(tmp_path):
    lm = answerer_and_judge()
    start = changed(NARROW, retrieve__top_k=2, retrieve__pool=2)
    replies = [
        proposal(changed(NARROW, retrieve__top_k=1, retrieve__pool=1, context__show_kind=True)),
        proposal(changed(NARROW, retrieve__top_k=4, retrieve__pool=4)),
    ]
    config = OptimizeConfig(iterations=2, objective="recall-then-accuracy")
    lms = {"proposer": ProposerLM(replies), "answerer": lm, "judge": lm}
    opt = small_opt(tmp_path, MemoryDesign.from_dict(start), config, lms)
    res = opt.run()
    screened, accepted = res.entries[1], res.entries[2]
    assert (
        screened.status == "rejected"
        and screened.score is None
        and "screened out by recall" in screened.reason
    )
    assert (
        not (tmp_path / "run/iterations/001/val").exists()
        and (tmp_path / "run/iterations/001/val-recall").exists()
    )
    assert accepted.status == "accepted" and accepted.selected_by == "recall screen + accuracy"
    assert (
        accepted.score.accuracy > res.baseline_score.accuracy
        and accepted.screen_score.delivered_recall is not None
    )


def test_changes_proposer_output_runs_the_same_loop(tmp_path):
    reply = {
        "rationale": "wider",
        "changes": [
            {"field": "retrieve.top_k", "value": "3"},
            {"field": "retrieve.pool", "value": "3"},
        ],
    }
    lm = ProposerLM([reply])
    config = OptimizeConfig(iterations=1, objective="recall", proposer_output="changes")
    opt = small_opt(tmp_path, NARROW, config, {"proposer": lm})
    res = opt.run()
    assert res.entries[1].status == "accepted" and res.best_design.retrieve.top_k == 3
    assert (
        "[[ ## changes ## ]]" not in lm.calls[0]["user"]
        and "changes" in lm.history[0]["messages"][0]["content"]
    )


def test_a_store_over_the_build_call_budget_is_sent_back_to_the_proposer(tmp_path):
    # measured on the embedded proposer: store.unit "facts" over Elena_Morales' 1,341 records needs
    # ~336 extraction calls (hours on a CPU) for one recall screening
    from memsteer_dspy.memory.design import store_build_calls

    facts = changed(NARROW, store__unit="facts")
    assert store_build_calls(MemoryDesign.from_dict(facts), 10) == 3  # facts_batch 4
    assert store_build_calls(NARROW, 10_000) == 0
    opt, lm = run(tmp_path, [proposal(facts), proposal(wide(2))], iterations=1, max_build_calls=0)
    res = opt.run()
    assert [e.status for e in res.entries] == ["baseline", "accepted"]
    attempts = res.entries[1].attempts
    assert attempts[0].kind == "invalid" and "store.unit" in attempts[0].error
    assert "needs about" in field_value(lm.calls[1]["user"], "revision_history")


def test_a_retrieval_that_calls_an_lm_per_question_over_the_budget_is_sent_back(tmp_path):
    """Seen on the shared RHELM run with the embedded proposer: an LM rerank proposal meant one
    embedded-model call per question for each of 783 selecting items before any verdict. With
    ``max_eval_lm_calls`` such a design is sent back with the cost named, never scored, and the
    answerer/reranker LM is never called."""
    rerank = changed(NARROW, retrieve__rerank="llm")
    config = OptimizeConfig(iterations=1, objective="recall", max_eval_lm_calls=0)
    lm = ProposerLM([proposal(rerank), proposal(wide(2))])
    answerer = ProposerLM([])  # would fail the test if called: it has no replies
    opt = small_opt(tmp_path, NARROW, config, {"proposer": lm, "answerer": answerer})
    res = opt.run()
    assert [e.status for e in res.entries] == ["baseline", "accepted"]
    attempts = res.entries[1].attempts
    assert attempts[0].kind == "invalid" and "retrieve.rerank" in attempts[0].error
    assert "LM call(s) per question" in field_value(lm.calls[1]["user"], "revision_history")
    assert answerer.calls == []
    # unset, the option stays out of the same-run key: folders written before it existed resume
    assert "max_eval_lm_calls" not in json.dumps(run(tmp_path / "b", [], iterations=1)[0].run_key())
    assert "max_eval_lm_calls" in json.dumps(opt.run_key())


def test_no_build_call_limit_by_default():
    assert OptimizeConfig().max_build_calls is None


def test_a_saved_proposal_over_the_new_build_budget_is_proposed_again(tmp_path):
    facts = changed(NARROW, store__unit="facts")
    from memsteer_dspy.optimize.proposer import Proposal
    from memsteer_dspy.runfolder import RunFolder

    resumed, lm = run(tmp_path, [proposal(wide(2))], iterations=1, max_build_calls=0)
    # a session of this run that stopped right after saving its proposal
    RunFolder.open(resumed.out, resumed.run_key()).close()
    resumed._iter_dir(1).mkdir(parents=True, exist_ok=True)
    saved = Proposal(status="ok", design=MemoryDesign.from_dict(facts))
    (resumed._iter_dir(1) / "proposal.json").write_text(saved.model_dump_json())
    res = resumed.run()
    assert [e.status for e in res.entries] == ["baseline", "accepted"]
    assert res.entries[1].design["store"]["unit"] == "record" and len(lm.calls) == 1


def test_the_recall_objective_never_offers_the_answer_settings(tmp_path):
    """Under --objective recall nothing answers, so answer.verify changes nothing that is scored
    (seen on the shared RHELM run: an embedded proposal turned verification on and the iteration
    scored an identical system). The loop's changes grammar leaves such fields out; under an
    objective that answers they are offered."""
    from memsteer_dspy.optimize.objectives import unscored_fields

    assert unscored_fields("recall") == {"answer.verify"}
    assert unscored_fields("accuracy") == unscored_fields("recall-then-accuracy") == frozenset()
    for objective, offered in (("recall", False), ("accuracy", True)):
        opt, _ = run(tmp_path / objective, [], iterations=1, objective=objective)
        opt.config.proposer_output = "changes"
        allowed = opt.proposer._allowed_fields(set(), NARROW)
        assert ("answer.verify" in allowed) is offered, objective


def test_a_run_without_retrieval_lm_calls_never_offers_them(tmp_path):
    """With max_eval_lm_calls=0 (what search_compare sets for hill and population) a design that
    calls an LM per question cannot be scored; the loop's check keeps those values out of the
    changes grammar instead of sending each such proposal back (one call and often an iteration)."""
    from memsteer_dspy.optimize.proposer import DESIGN_FIELDS, excluded_values

    opt, _ = run(tmp_path, [], iterations=1)
    opt.config.max_eval_lm_calls = 0
    out = excluded_values(NARROW, DESIGN_FIELDS, {}, check=opt.proposer.check)["unbuildable"]
    assert {"rewrite", "decompose", "hyde", "multi_query"} <= set(out["retrieve.query"])
    assert "llm" in out["retrieve.rerank"]
    opt.config.max_eval_lm_calls = None
    out = excluded_values(NARROW, DESIGN_FIELDS, {}, check=opt.proposer.check)["unbuildable"]
    assert "retrieve.query" not in out and "llm" not in out.get("retrieve.rerank", [])


def test_a_dense_index_over_more_units_than_allowed_is_sent_back_unbuilt(tmp_path, monkeypatch):
    """Seen on the shared RHELM run: under an accepted hybrid index, a proposal of 32-token sections
    meant re-embedding several hundred thousand units with MiniLM on 2 cores (hours) before any
    verdict. With ``max_embed_units`` the design is sent back with the count named, nothing is
    embedded, and the run goes on; unset, the option stays out of the same-run key."""
    import memsteer_dspy.memory.embedders as embedders
    from memsteer_dspy.memory.store import unit_count

    def no_embedding(*a, **k):
        raise AssertionError("nothing may be embedded")

    monkeypatch.setattr(embedders, "load_embedder", no_embedding)
    n = unit_count(small_history(), NARROW.store)
    dense = changed(NARROW, retrieve__index="hybrid")
    config = OptimizeConfig(iterations=1, objective="recall", max_embed_units=n - 1)
    lm = ProposerLM([proposal(dense), proposal(wide(2))])
    opt = small_opt(tmp_path, NARROW, config, {"proposer": lm})
    res = opt.run()
    assert [e.status for e in res.entries] == ["baseline", "accepted"]
    first = res.entries[1].attempts[0]
    assert (
        first.kind == "invalid"
        and f"embeds {n:,} units" in first.error
        and f"allows {n - 1:,}" in first.error
    )
    assert "embeds" in field_value(lm.calls[1]["user"], "revision_history")
    assert "max_embed_units" not in json.dumps(run(tmp_path / "b", [], iterations=1)[0].run_key())
    assert "max_embed_units" in json.dumps(opt.run_key())
    # at the limit the design is fine
    opt.config.max_embed_units = n
    opt.proposer.check(MemoryDesign.from_dict(dense))


def test_the_loop_stops_once_validation_is_at_its_maximum(tmp_path):
    # iteration 1 reaches delivered recall and R@10 1.0 on validation: nothing can be strictly
    # better there, so iterations 2 and 3 are not proposed (no LM time spent on them)
    opt, lm = run(
        tmp_path,
        [proposal(wide(8), "all units"), proposal(wide(2))],
        iterations=3,
        stop_at_max=True,
    )
    res = opt.run()
    assert [e.status for e in res.entries] == ["baseline", "accepted"]
    assert res.best_score.delivered_recall == 1.0 and res.best_score.recall_at_10 == 1.0
    assert len(lm.calls) == 1
    assert "iteration 1 already scores the maximum on validation" in res.stopped
    assert "iterations 2..: not run" in res.stopped
    out = tmp_path / "run"
    assert json.loads((out / "summary.json").read_text())["stopped"] == res.stopped
    assert "- stopped early: the design of iteration 1" in (out / "summary.md").read_text()
    # a resume stops at the same point instead of proposing again
    opt2, lm2 = run(tmp_path, [proposal(wide(2))], iterations=3, stop_at_max=True)
    res2 = opt2.run()
    assert len(res2.entries) == 2 and lm2.calls == [] and res2.stopped == res.stopped


def test_a_loop_below_the_maximum_runs_every_iteration(tmp_path):
    opt, lm = run(tmp_path, [proposal(wide(2)), proposal(wide(3))], iterations=2, stop_at_max=True)
    res = opt.run()
    assert len(res.entries) == 3 and res.stopped is None and len(lm.calls) == 2
    # off (the default), the loop proposes after reaching the maximum, as the paper's T iterations do
    opt, lm = run(tmp_path / "off", [proposal(wide(8)), proposal(wide(2))], iterations=2)
    res = opt.run()
    assert (
        res.entries[1].score.delivered_recall == 1.0 and len(lm.calls) == 2 and res.stopped is None
    )


def test_at_ceiling_per_objective():
    from memsteer_dspy.optimize.objectives import Score, at_ceiling

    full = Score(accuracy=1.0, delivered_recall=1.0, recall_at_10=1.0)
    assert at_ceiling("recall", full) and at_ceiling("accuracy", full)
    assert not at_ceiling(
        "recall", Score(delivered_recall=1.0, recall_at_10=0.9)
    )  # R@10 breaks ties
    assert at_ceiling("recall", Score(delivered_recall=1.0))
    assert not at_ceiling("accuracy", Score(accuracy=0.97, delivered_recall=1.0, recall_at_10=1.0))
    assert at_ceiling("recall-then-accuracy", Score(accuracy=1.0, delivered_recall=0.5))
    assert not at_ceiling("recall", None) and not at_ceiling(
        "accuracy", Score(delivered_recall=1.0)
    )
