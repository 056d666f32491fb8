"""`memsteer demo` end to end on the shipped demo history: a scripted-LM run at a tiny size whose
table is checked against independent computation (retrieval recall, what the contexts contain, the
LM calls the scripted engine answered), resumption, the command line, and one integration run
with the embedded model at the smallest size."""

from __future__ import annotations

import importlib.util
import json
import re
import threading

import pytest
from dspy.lm15 import Message, Response, Usage
from memory_fixtures import field_value
from typer.testing import CliRunner

from memsteer_dspy.demo import (
    SIZES,
    DemoSettings,
    accuracy_subset,
    demo_settings,
    run_demo,
)
from memsteer_dspy.demo_data import load_demo
from memsteer_dspy.errors import ConfigError
from memsteer_dspy.evaluation import evaluate_design
from memsteer_dspy.lm import LMConfig
from memsteer_dspy.lm.config import RoleLM
from memsteer_dspy.memory import MemoryDesign, MemorySystem
from memsteer_dspy.normalize import normalize_text
from memsteer_dspy.runfolder import RunMismatchError

TINY = DemoSettings(
    size="tiny",
    n_supervision=4,
    max_candidates=8,
    bundle_profile="small",
    iterations=2,
    objective="recall",
    feedback_tokens=400,
    per_stage=2,
    accuracy_items=5,
    context_budget=300,
    answer_max_tokens=64,
    max_resamples=1,
)

LABEL = re.compile(r"^\[(R\d+\.\d+)\] (.*)$", re.M)
WORD = re.compile(r"[A-Za-z]{5,}")


# ---------------------------------------------------------------------------------------------
# a scripted engine that plays every role, by reading the prompt it is given
# ---------------------------------------------------------------------------------------------


def _contains(text: str, needle: str) -> bool:
    return f" {normalize_text(needle)} " in f" {normalize_text(text)} "


class DemoEngine:
    """Answers each role's signature from the request itself:

    * planner — the first word of five or more letters in R1 that no other sentence of the bundle
      contains, with one fact per evidence record;
    * question writer — a question naming words of a bundle record that is *not* evidence (often
      the evidence's neighbour in its thread), so raw-question BM25 misses the evidence and
      delivering neighbouring records finds it;
    * auditor — every fact and record supported; blind reader — the planned answer, citing the
      planned fact sentences (found again by their text, as the records come shuffled);
    * answerer — the reference answer if the context contains it, else "I don't know";
    * judge — never correct (only asked when exact agreement failed);
    * proposer — the next scripted design change.

    ``log`` keeps (role, prompt tokens, completion tokens) of every call."""

    supports_response_schema = True
    supported_params = frozenset({"temperature", "max_tokens", "response_format", "seed"})

    def __init__(self, references: dict[str, str], proposals: list[dict]):
        self.references = references
        self.proposals = list(proposals)
        self.planned: dict[str, tuple[str, list[str]]] = {}
        self.hints: dict[str, str] = {}
        self.log: list[tuple[str, int, int]] = []
        self.max_tokens: list[tuple[str, int | None]] = []
        self._lock = threading.Lock()

    def complete(self, request):
        system = (
            request.system
            if isinstance(request.system, str)
            else "".join(p.text for p in request.system)
        )
        user = request.messages[-1].text
        role, outputs = self.reply(system, user)
        chat = "[[ ## completed ## ]]" in system
        if chat:
            text = (
                "".join(f"[[ ## {k} ## ]]\n{v}\n\n" for k, v in outputs.items())
                + "[[ ## completed ## ]]"
            )
        else:
            text = json.dumps(outputs)
        prompt, completion = len(system + user) // 4, len(text) // 4
        with self._lock:
            self.log.append((role, prompt, completion))
            self.max_tokens.append((role, request.config.max_tokens))
        return Response(
            id=None,
            model="scripted",
            message=Message.assistant(text),
            finish_reason="stop",
            usage=Usage(
                input_tokens=prompt, output_tokens=completion, total_tokens=prompt + completion
            ),
        )

    def reply(self, system: str, user: str) -> tuple[str, dict]:
        if "`fact_span_ids`" in system:
            return "planner", self.plan(
                field_value(user, "records"), int(field_value(user, "evidence_count"))
            )
        if "`fact_checks`" in system:
            facts = re.findall(r"R\d+\.\d+", field_value(user, "facts"))
            records = sorted(set(re.findall(r"\bR\d+\b", field_value(user, "evidence"))))
            return "auditor", {
                "fact_checks": [
                    {"span_id": f, "rationale": "stated", "verdict": "supported"} for f in facts
                ],
                "record_checks": [
                    {"record_id": r, "rationale": "used", "verdict": "supported"} for r in records
                ],
                "answer_rationale": "stated",
                "answer_support": "supported",
                "consistency_rationale": "as planned",
                "consistency": "supported",
            }
        if "`cited_ids`" in system:
            answer, sentences = self.planned[field_value(user, "question")]
            lines = dict(
                (text, label) for label, text in LABEL.findall(field_value(user, "records"))
            )
            return "blind_reader", {
                "cited_ids": [lines[s] for s in sentences if s in lines],
                "answer": answer,
                "answerable": True,
            }
        if "`design_space`" in system:
            change = self.proposals.pop(0)
            design = json.loads(field_value(user, "current_design"))
            for path, value in change.items():
                node = design
                *parents, last = path.split(".")
                for p in parents:
                    node = node.setdefault(p, {})
                node[last] = value
            return "proposer", {"rationale": f"scripted: {change}", "design": design}
        if "`ask`" in system:
            return "question_writer", self.question(user)
        if "`correct`" in system:
            return "judge", {"correct": False}
        if "`context`" in system:
            reference = self.references[field_value(user, "question")]
            context = field_value(user, "context")
            return "answerer", {
                "answer": reference if _contains(context, reference) else "I don't know"
            }
        raise AssertionError(f"unknown signature: {system[:200]}")

    def plan(self, records: str, count: int) -> dict:
        spans = LABEL.findall(records)
        by_record: dict[str, list[tuple[str, str]]] = {}
        for label, text in spans:
            by_record.setdefault(label.split(".")[0], []).append((label, text))
        chosen = list(by_record)[:count]
        answer, answer_label = "nothing", spans[0][0]
        for label, text in by_record[chosen[0]]:
            words = [w for w in WORD.findall(text) if sum(_contains(t, w) for _, t in spans) == 1]
            if words:
                answer, answer_label = words[0], label
                break
        facts = [answer_label] + [by_record[r][0][0] for r in chosen[1:]]
        others = [text for r in list(by_record)[count:] for _, text in by_record[r]]
        self.hints[answer] = (others or [""])[0]
        return {
            "fact_span_ids": facts,
            "answer_span_id": answer_label,
            "answer": answer,
            "answer_type": "entity",
            "evidence": [{"record_id": r, "contribution": "states a fact"} for r in chosen],
            "operations": ["lookup"],
            "ask": "which word the sentence holds",
        }

    def question(self, user: str) -> dict:
        answer = field_value(user, "answer")
        texts = dict((label, text) for label, text in LABEL.findall(field_value(user, "records")))
        fact_labels = re.findall(r"R\d+\.\d+", field_value(user, "facts"))
        holder = next((t for t in texts.values() if _contains(t, answer)), "")
        hint = [w for w in WORD.findall(self.hints.get(answer, "")) if not _contains(w, answer)][:4]
        question = f"Which word did I note around the time of '{' '.join(hint)}'?"
        sentences = [holder] + [texts[f] for f in fact_labels if f in texts and texts[f] != holder]
        self.planned[question] = (answer, sentences)
        return {"question": question}


def scripted_config(engine: DemoEngine) -> LMConfig:
    """Every role on the scripted engine, booking usage under its role like a real LM."""
    cfg = LMConfig.uniform("openai/scripted-demo")
    for role in cfg.roles:
        lm = RoleLM(
            "scripted/demo", role=role, meter=cfg.meter, engine=engine, num_retries=0, cache=False
        )
        cfg.set_lm(role, lm)
    return cfg


def engine_for_demo() -> DemoEngine:
    refs = {q.question: q.answer for q in load_demo().qa_items}
    proposals = [
        {"store.unit": "section", "store.section_max_tokens": 64},
        {"retrieve.expand_neighbors": 1},
    ]
    return DemoEngine(refs, proposals)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "run"
    engine = engine_for_demo()
    cfg = scripted_config(engine)
    lines: list[str] = []
    result = run_demo(out, cfg, settings=TINY, progress=lines.append)
    return result, out, engine, cfg, lines


def quiet_demo(out, engine, settings):
    """``run_demo`` on a scripted config over ``engine``: no tracking, steering or progress."""
    cfg = scripted_config(engine)
    return run_demo(out, cfg, settings=settings, tracking=False, steering=False, progress=False)


# ---------------------------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------------------------


def test_sizes_and_the_stratified_subset():
    small, full = SIZES["small"], SIZES["full"]
    assert full.accuracy_items is None and full.iterations == 20 and full.context_budget == 4000
    said = "\n".join(small.sized_down())
    assert small.accuracy_items == 0 and "accuracy and QS: not measured" in said
    assert "from at most 40 candidates within 10 min" in said  # the small size's time budget
    assert accuracy_subset(load_demo().qa_items, 0) == []
    assert "answer context" in said and "iterations" in said and "objective: recall" in said
    assert full.sized_down() == []
    items = load_demo().qa_items
    subset = accuracy_subset(items, 6)
    assert len(subset) == 6 and len({q.question_type for q in subset}) == 6  # one of each type
    assert [q.id for q in subset] == sorted(q.id for q in subset)  # file order
    assert accuracy_subset(items, None) == list(items)
    assert demo_settings("small", threads=4).size == "small"
    assert demo_settings("small", iterations=1).size == "small-custom"
    with pytest.raises(ConfigError, match="unknown demo size"):
        demo_settings("medium")


def test_every_stage_runs_and_is_reported(demo_run):
    result, out, engine, _, lines = demo_run
    assert [s.name for s in result.stages] == [
        "supervision",
        "steering",
        "optimization",
        "eval Base-BM25",
        "eval MemSteer-Opt",
    ]
    assert all(s.status == "ran" for s in result.stages)
    sup = result.supervision
    assert sup["accepted"] >= 2 and sup["train"] >= 1 and sup["val"] >= 1
    # the steering panel ran on the accepted items and the hand-written ones (a diagnosis only)
    steer = json.loads((out / "supervision" / "steering.json").read_text())
    assert len(steer["panel"]) >= 12 and steer["n_reference"] == 34
    assert sup["steering"]["separated_in"]["validation"] >= 1
    assert "Steering (LM-free panel" in result.render()
    assert sup["pipeline"] == "v1"  # an LM that is not in-process gets the paper's prompts
    assert (out / "supervision" / "train.jsonl").exists() and (
        out / "supervision" / "val.jsonl"
    ).exists()
    opt = result.optimization
    assert opt["ran"] and opt["iterations"] == 2 and opt["objective"] == "recall"
    assert opt["stopped"] is None  # validation never at its maximum before the last iteration
    # the scripted proposer's first revision does not help, the second (neighbours) does
    assert opt["statuses"] == ["baseline", "rejected", "accepted"] and opt["accepted_path"] == [
        0,
        2,
    ]
    assert opt["changes"] == ["retrieve.expand_neighbors: 0 -> 1"]
    assert (out / "optimize" / "best_design.json").exists() and (
        out / "optimize" / "trajectory.jsonl"
    ).exists()
    # progress lines name each stage
    for tag in ("[1/4] supervision", "[2/4] optimization", "[3/4] evaluation", "[4/4] evaluation"):
        assert any(line.startswith(tag) for line in lines), tag
    assert any(line.startswith("  iteration 2/2") for line in lines)
    # the optimizer's LM-dependent options, resolved once at the start (an API proposer: the paper's)
    resolved = "  MemSteer-Opt resolved: paper setting, --proposer-output design"
    assert any(line.startswith(resolved) for line in lines)
    assert result.optimization["resolved"].startswith(
        resolved.strip().removeprefix("MemSteer-Opt ")
    )


def test_table_comes_from_real_computation(demo_run):
    result, out, engine, _, _ = demo_run
    loaded = load_demo()
    items = list(loaded.qa_items)
    answered = accuracy_subset(items, TINY.accuracy_items)
    base = MemoryDesign.base_bm25()
    base = base.model_copy(
        update={"context": base.context.model_copy(update={"budget_tokens": TINY.context_budget})}
    )
    best = MemoryDesign.load(out / "optimize" / "best_design.json")
    assert best.context.budget_tokens == TINY.context_budget  # the budget is held fixed
    rows = {r.label: r for r in result.rows}
    for label, design in (("Base-BM25", base), ("MemSteer-Opt", best)):
        row = rows[label]
        assert row.design_key == design.key()
        system = MemorySystem.from_design(design, loaded.history)
        # R@10 and delivered recall: an independent retrieval-only evaluation on every item
        rep = evaluate_design(system, items, metrics="recall")
        assert row.n_recall == len(items) == 34
        assert row.recall_at_10 == pytest.approx(rep.summary.recall_at_10)
        assert row.delivered_recall == pytest.approx(rep.summary.delivered_recall)
        # accuracy: the scripted answerer is right exactly when the delivered context holds the answer
        hits = [
            _contains(system.retrieve(q.question, question_date=q.question_date).context, q.answer)
            for q in answered
        ]
        assert row.n_answered == len(answered)
        assert row.accuracy == pytest.approx(sum(hits) / len(hits))
        # LM calls: one answer per item, plus one judge call per item not matched exactly
        assert row.lm_calls == len(answered) + (len(hits) - sum(hits))
        assert row.tokens > 0 and row.seconds >= 0
    # every answer of both designs was asked with the same length cap
    assert {m for role, m in engine.max_tokens if role == "answerer"} == {TINY.answer_max_tokens}
    # the evaluation calls are exactly the answerer and judge calls the engine served
    served = [(p, c) for role, p, c in engine.log if role in ("answerer", "judge")]
    assert sum(r.lm_calls for r in result.rows) == len(served)
    assert sum(r.tokens for r in result.rows) == sum(p + c for p, c in served)
    # the printed table shows these numbers
    table = result.table()
    for row in result.rows:
        assert f"{100 * row.recall_at_10:.1f}" in table and f"{100 * row.accuracy:.1f}" in table
        assert f"{row.tokens:,}" in table
    assert (out / "results.md").read_text().count("| MemSteer-Opt") == 1
    saved = json.loads((out / "demo.json").read_text())["result"]
    assert saved["rows"] == [r.model_dump(mode="json") for r in result.rows]
    # the held-out comparison pairs the two rows' per-item scores on the hand-written items
    h = result.heldout
    assert h is not None and h["n"] == 34 and set(h["ci95"]) >= {"recall_at_10", "delivered_recall"}
    assert h["initial"]["recall_at_10"] == pytest.approx(rows["Base-BM25"].recall_at_10)
    assert h["best"]["delivered_recall"] == pytest.approx(rows["MemSteer-Opt"].delivered_recall)
    assert h["initial"]["accuracy"] == pytest.approx(rows["Base-BM25"].accuracy)
    diff = rows["MemSteer-Opt"].delivered_recall - rows["Base-BM25"].delivered_recall
    assert h["diff"]["delivered_recall"] == pytest.approx(diff)
    assert h["verdict"] in ("better", "worse", "inconclusive") and "Held-out (34" in result.render()


def test_mlflow_holds_the_optimization_and_both_evaluations(demo_run):
    result, out, _, _, _ = demo_run
    assert result.tracking_uri == f"sqlite:///{(out / 'mlflow.db').resolve()}"
    assert result.mlflow_ui == f"mlflow ui --backend-store-uri {result.tracking_uri}"
    assert result.mlflow_ui in result.render()
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=result.tracking_uri)
    exps = client.search_experiments()
    runs = client.search_runs([e.experiment_id for e in exps])
    by_name = {r.info.run_name: r for r in runs}
    assert "optimize-nora-whitfield" in by_name and "iter-002" in by_name
    for row in result.rows:
        run = by_name[f"demo-eval-{row.label.lower()}"]
        assert run.data.metrics["recall_at_10"] == pytest.approx(row.recall_at_10)
        assert run.data.params["design_key"] == row.design_key


def test_rerun_reuses_every_stage_without_lm_calls(demo_run):
    result, out, engine, cfg, _ = demo_run
    served = len(engine.log)
    again = run_demo(out, cfg, settings=TINY, progress=False)
    assert len(engine.log) == served  # nothing asked twice
    assert [s.status for s in again.stages] == ["reused"] * 5  # steering's report too
    assert again.rows == result.rows
    assert again.table() == result.table()


def test_other_settings_in_the_same_folder_are_refused(demo_run):
    _, out, engine, cfg, _ = demo_run
    other = TINY.model_copy(update={"iterations": 3})
    with pytest.raises(RunMismatchError, match="iterations"):
        run_demo(out, cfg, settings=other, progress=False)


def test_demo_command_prints_the_table_and_mlflow_command(demo_run, monkeypatch):
    import memsteer_dspy.lm as lm_pkg
    from memsteer_dspy.cli import app

    result, out, engine, cfg, _ = demo_run
    monkeypatch.setitem(SIZES, "small", TINY)
    monkeypatch.setattr(lm_pkg, "load_lm_config", lambda config=None, lm=None, role_lms=None: cfg)
    res = CliRunner().invoke(app, ["demo", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert result.table() in res.output
    assert "mlflow ui --backend-store-uri sqlite:///" in res.output
    assert "Sized down" in res.output and "reused" in res.output
    res = CliRunner().invoke(app, ["demo", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout[res.stdout.index("{") :])
    assert report["rows"] == [r.model_dump(mode="json") for r in result.rows]
    assert report["heldout"] == result.heldout and "accepted" in report["supervision"]
    assert {"n", "initial", "best", "diff", "ci95", "verdict"} <= set(report["heldout"])
    res = CliRunner().invoke(app, ["demo", "--out", str(out), "--size", "huge"])
    assert res.exit_code != 0 and "--size" in res.output


def test_too_little_supervision_skips_optimization(tmp_path):
    """A planner whose plans all fail the checks leaves no supervision: the demo still evaluates
    Base-BM25, says why optimization was skipped, and never crashes."""
    engine = engine_for_demo()
    engine.plan = lambda records, count: {
        "fact_span_ids": [],
        "answer_span_id": "R9.9",
        "answer": "",
        "answer_type": "entity",
        "evidence": [],
        "operations": [],
        "ask": "",
    }
    settings = TINY.model_copy(update={"max_candidates": 2, "accuracy_items": 2})
    result = quiet_demo(tmp_path / "run", engine, settings)
    assert result.supervision["accepted"] == 0
    assert result.optimization == {"ran": False, "reason": result.optimization["reason"]}
    assert any("optimization skipped" in n for n in result.notes)
    assert (
        result.rows[1].same_as == "Base-BM25"
        and result.rows[1].recall_at_10 == result.rows[0].recall_at_10
    )
    assert [s.status for s in result.stages] == ["ran", "skipped", "ran", "skipped"]
    assert result.tracking_uri is None and "mlflow ui" not in result.render()


def test_the_supervision_time_budget_ends_generation_and_is_reported(tmp_path):
    """A spent time budget starts no candidate: the stage says so, and a rerun reuses it."""
    settings = TINY.model_copy(update={"supervision_seconds": 1e-6, "accuracy_items": 0})
    assert "within 1.66667e-08 min" in "\n".join(settings.sized_down(SIZES["full"]))
    run = tmp_path / "run"
    engine = engine_for_demo()
    result = quiet_demo(run, engine, settings)
    assert result.supervision["accepted"] == 0 and result.supervision["candidates"] == 0
    assert result.supervision["stopped_by"] == "time_budget"
    assert result.stages[0].detail.endswith("stopped by its time budget")
    again = quiet_demo(run, engine, settings)
    assert again.stages[0].status == "reused"


def test_no_answered_items_compares_on_recall_alone(tmp_path):
    """accuracy_items=0 (the small size): no answerer or judge call, accuracy '–' in the table,
    and the held-out verdict on delivered recall over all 34 hand-written items."""
    engine = engine_for_demo()
    settings = TINY.model_copy(update={"accuracy_items": 0})
    assert "accuracy and QS: not measured" in "\n".join(settings.sized_down())
    result = quiet_demo(tmp_path / "run", engine, settings)
    assert not [role for role, _, _ in engine.log if role in ("answerer", "judge")]
    for row in result.rows:
        assert row.n_answered == 0 and row.accuracy is None and row.item_correct == {}
        assert row.n_recall == 34 and row.delivered_recall is not None and row.lm_calls == 0
    assert "| – | – |" in result.table()
    h = result.heldout
    assert h["n"] == 34 and h["primary"] == "delivered_recall" and "accuracy" not in h["diff"]
    assert "(no item answered)" in result.stages[2].detail


# ---------------------------------------------------------------------------------------------
# the embedded model
# ---------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_demo_at_the_smallest_size_with_the_embedded_model(tmp_path):
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (pip install 'memsteer-dspy[local]')")
    from memsteer_dspy.lm.model_files import ensure_embedded_model

    try:
        ensure_embedded_model("qwen2.5-coder-1.5b")
    except Exception as exc:  # the model chunks are not installed
        pytest.skip(f"embedded model unavailable: {exc}")
    cfg = LMConfig.uniform("local/qwen2.5-coder-1.5b")
    smallest = demo_settings(
        "small",
        n_supervision=2,
        max_candidates=3,
        iterations=1,
        accuracy_items=2,
        context_budget=600,
        feedback_tokens=800,
        per_stage=2,
    )
    result = run_demo(tmp_path / "run", cfg, settings=smallest, progress=False)

    assert [r.label for r in result.rows] == ["Base-BM25", "MemSteer-Opt"]
    # the embedded model gets the supervision pipeline measured cheapest on it
    assert result.supervision["pipeline"] == "lean-anchor"
    base = result.rows[0]
    assert base.n_answered == 2 and base.n_recall == 34
    assert base.lm_calls >= 2 and base.tokens > 100  # real calls, real token counts
    assert base.accuracy is not None and base.recall_at_10 is not None
    d0 = MemoryDesign.base_bm25()
    d0 = d0.model_copy(update={"context": d0.context.model_copy(update={"budget_tokens": 600})})
    rep = evaluate_design(
        MemorySystem.from_design(d0, load_demo().history),
        list(load_demo().qa_items),
        metrics="recall",
    )
    assert base.recall_at_10 == pytest.approx(rep.summary.recall_at_10)
    if result.optimization["ran"]:
        assert result.optimization["iterations"] == 1
    else:
        assert any("optimization skipped" in n for n in result.notes)
    assert result.tracking_uri and "mlflow ui --backend-store-uri" in result.render()
    # a rerun reuses everything: no LM call reaches the model
    calls = sum(u["calls"] for u in cfg.usage_by_role().values())
    again = run_demo(tmp_path / "run", cfg, settings=smallest, progress=False)
    assert sum(u["calls"] for u in cfg.usage_by_role().values()) == calls
    assert again.rows == result.rows


def test_heldout_comparison_of_two_rows_gives_the_optimizers_test_object():
    from memsteer_dspy.demo import DesignRow, heldout_comparison

    ids = [f"q{i}" for i in range(20)]
    base = DesignRow(
        label="Base-BM25",
        design_name="b",
        design_key="k0",
        item_recall=dict.fromkeys(ids, 0.0),
        item_delivered=dict.fromkeys(ids, 0.0),
        item_correct={i: 0.0 for i in ids[:10]},
    )
    win = base.model_copy(
        update={"label": "MemSteer-Opt", "item_delivered": dict.fromkeys(ids, 1.0)}
    )
    h = heldout_comparison(base, win, "recall")
    assert h["primary"] == "delivered_recall" and h["verdict"] == "better"
    assert h["diff"]["delivered_recall"] == 1.0 and h["diff"]["recall_at_10"] == 0.0
    assert h["n_pairs"]["accuracy"] == 10
    same = heldout_comparison(base, base, "accuracy")
    assert same["primary"] == "accuracy" and same["verdict"] == "inconclusive"


def test_an_optimization_stopped_at_the_maximum_says_why(demo_run, monkeypatch):
    result, *_ = demo_run
    stopped = result.model_copy(deep=True)
    stopped.optimization["stopped"] = "the initial design already scores the maximum on validation"
    assert "  stopped early: the initial design already scores the maximum" in stopped.render()
    assert "stopped early" not in result.render()
    # the demo asks the loop to stop there (the loop's own tests cover the stop)
    import memsteer_dspy.optimize.loop as loop_mod

    seen = []

    class Capture(loop_mod.MemSteerOpt):
        def __init__(self, *a, config, **k):
            seen.append(config)
            raise RuntimeError("captured")

    monkeypatch.setattr(loop_mod, "MemSteerOpt", Capture)
    with pytest.raises(RuntimeError, match="captured"):
        quiet_demo(result.out_dir + "-capture", engine_for_demo(), TINY)
    assert seen and seen[0].stop_at_max is True


def test_an_in_process_small_lm_gets_the_question_writer_examples_generate_gives_it(
    tmp_path, monkeypatch
):
    """The demo on the embedded model runs `generate`'s small-LM pipeline, writer examples
    included: the packaged fictional history's, never the demo's own questions."""
    import memsteer_dspy.supervision.run as run
    from memsteer_dspy.demo.stages import _supervision
    from memsteer_dspy.supervision.writer_examples import (
        SMALL_LM_WRITER_EXAMPLES,
        default_writer_examples,
    )

    seen = {}

    class Stop(Exception):
        pass

    def capture(history, lms, folder, config, **kw):
        seen["config"] = config
        raise Stop

    monkeypatch.setattr(run, "generate_supervision", capture)
    cfg = scripted_config(engine_for_demo())
    monkeypatch.setattr(type(cfg), "in_process", lambda self, *roles: True)
    say = type("Say", (), {"fn": None, "bars": False, "__call__": lambda self, line: None})()
    demo = load_demo()
    with pytest.raises(Stop):
        _supervision(demo.history, cfg, tmp_path / "sup", TINY, say, None)
    config = seen["config"]
    assert config.anchored and config.lean
    assert len(config.writer_examples) == SMALL_LM_WRITER_EXAMPLES
    assert config.writer_examples == default_writer_examples(demo.history, TINY.seed)
    demo_questions = {q.question for q in demo.qa_items}
    assert not demo_questions & {e.question for e in config.writer_examples}
