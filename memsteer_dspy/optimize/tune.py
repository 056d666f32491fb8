"""MemSteer supervision for DSPy's own optimizers: GEPA and MIPROv2 over a fixed design's prompts.

The paper hands its generated supervision to existing optimizers too (Section 3.3, "Supervision for
existing memory-design optimizers"). Here the design is held fixed and DSPy tunes the prompts of
the two LM roles a memory design has on the question path:

* the **answerer** (always), and
* the **query rewriter** (when the design's ``retrieve.query`` is not ``raw``: rewrite, decompose,
  HyDE or multi-query).

The train/val QA items become ``dspy.Example``s (inputs ``question`` and ``question_date``; labels
``answer``, ``answer_type``, ``evidence_ids``). The metric is correctness — exact agreement after
the answer type's normalization, else the judge's verdict — and, for GEPA, feedback text that uses
the evidence annotation: whether the gold records were retrieved (at which ranks) and delivered
to the answerer, so the reflection LM can tell a reading failure from a retrieval failure.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import dspy
from pydantic import BaseModel, Field

from memsteer_dspy.errors import ConfigError, MissingExtraError
from memsteer_dspy.evaluation import Judge
from memsteer_dspy.memory.answer import MemoryAnswerer
from memsteer_dspy.memory.design import MemoryDesign
from memsteer_dspy.memory.retriever import date_text
from memsteer_dspy.memory.system import MemorySystem
from memsteer_dspy.normalize import answers_match
from memsteer_dspy.records import History, QAItem
from memsteer_dspy.signatures.query import (
    DecomposeQuestion,
    HypotheticalRecords,
    MultiQuery,
    RewriteQuery,
)
from memsteer_dspy.tracking import Tracker

OPTIMIZERS = ("gepa", "mipro")
QUERY_SIGNATURES = {
    "rewrite": RewriteQuery,
    "decompose": DecomposeQuestion,
    "hyde": HypotheticalRecords,
    "multi_query": MultiQuery,
}


class _Shared:
    """Holds the built memory system inside a program: not a ``dspy.Module`` (so its predictors
    are not tuned) and not copied when an optimizer deep-copies the program."""

    def __init__(self, system: Any):
        self.system = system

    def __deepcopy__(self, memo: dict) -> _Shared:
        return self


class MemoryQA(dspy.Module):
    """A fixed memory design as a DSPy program whose answerer and query-rewriter prompts can be
    tuned: retrieve (with the rewriter's queries) → build the context → answer (→ verify)."""

    def __init__(self, system: Any, *, protocol: str = "full"):
        super().__init__()
        self._memory = _Shared(system)
        self.protocol = protocol
        self.answerer = MemoryAnswerer(system.answerer.lm)
        strategy = system.design.retrieve.query
        self.rewriter = None
        if strategy != "raw":
            self.rewriter = dspy.Predict(QUERY_SIGNATURES[strategy])
            self.rewriter.lm = system.retriever.expand_query.lm

    def queries(self, question: str, question_date: str) -> list[str]:
        """The search queries, as :meth:`MemoryRetriever.queries` makes them, with this program's rewriter."""
        spec = self._memory.system.design.retrieve
        if self.rewriter is None:
            return [question]
        if spec.query == "rewrite":
            out = [self.rewriter(question=question, question_date=question_date).query]
        else:
            pred = self.rewriter(question=question, question_date=question_date, n=spec.n_queries)
            out = list(
                {
                    "decompose": pred.get("sub_questions"),
                    "hyde": pred.get("records"),
                    "multi_query": pred.get("queries"),
                }[spec.query]
                or []
            )
        out = [str(q).strip() for q in out if str(q).strip()][
            : 1 if spec.query == "rewrite" else spec.n_queries
        ]
        if spec.keep_original_query:
            out = [question, *out]
        return list(dict.fromkeys(out)) or [question]

    def forward(self, question: str, question_date: str | None = None) -> dspy.Prediction:
        system = self._memory.system
        qd = date_text(question_date)
        as_of = question_date if self.protocol == "as_of" else None
        retrieved = system.retriever(
            question, question_date=question_date, as_of=as_of, queries=self.queries(question, qd)
        )
        built = system.context_builder(retrieved.indices, retrieved.cutoff_day)
        trace = system._trace(question, question_date, retrieved, built)
        answer = self.answerer(question=question, question_date=qd, context=built.text).answer
        trace.draft_answer = answer
        if system.verifier is not None:
            v = system.verifier(
                question=question, question_date=qd, context=built.text, draft_answer=answer
            )
            trace.verified = bool(v.supported)
            answer = (v.answer or "").strip() or answer
        trace.answer = answer
        return dspy.Prediction(answer=answer, trace=trace)


def to_examples(items: list[QAItem]) -> list[dspy.Example]:
    """QA items as ``dspy.Example``s: inputs ``question``, ``question_date``; labels the rest."""
    return [
        dspy.Example(
            question=q.question,
            question_date=q.question_date.isoformat() if q.question_date else None,
            answer=q.answer,
            answer_type=str(q.answer_type),
            evidence_ids=list(q.evidence_ids),
            qa_id=q.id,
        ).with_inputs("question", "question_date")
        for q in items
    ]


class CorrectnessMetric:
    """Binary correctness against the reference answer (exact after normalization, else the judge).

    Called as DSPy's metric ``(gold, pred, trace)`` it returns the score; with ``feedback=True``
    (GEPA's ``(gold, pred, trace, pred_name, pred_trace)``) it returns
    ``dspy.Prediction(score=..., feedback=...)`` whose text uses the evidence annotation. A
    prediction that failed scores 0 with the reason in the feedback; the metric never raises.
    """

    def __init__(self, judge_lm: Any = None, *, feedback: bool = False):
        # the evaluation's judge: it reads the prediction as data (instructions in it withheld)
        self.judge = Judge(judge_lm) if judge_lm is not None else None
        self.feedback = feedback

    def correct(self, gold: dspy.Example, prediction: str) -> tuple[bool, str]:
        if answers_match(prediction, gold.answer, gold.get("answer_type", "text")):
            return True, "exact"
        if self.judge is None:
            return False, "no exact match (no judge LM)"
        return self.judge(gold.question, gold.answer, prediction), "judge"

    def __call__(self, gold, pred, trace=None, pred_name=None, pred_trace=None):
        try:
            answer = str(getattr(pred, "answer", "") or "")
            ok, how = self.correct(gold, answer)
            score = 1.0 if ok else 0.0
            text = self.explain(gold, pred, ok, pred_name)
        except Exception as exc:  # one failed example scores 0, with why
            score, text = 0.0, f"The prediction could not be scored: {type(exc).__name__}: {exc}"
        if not self.feedback:
            return score
        return dspy.Prediction(score=score, feedback=text)

    @staticmethod
    def explain(gold, pred, ok: bool, pred_name: str | None) -> str:
        answer = str(getattr(pred, "answer", "") or "")
        head = (
            f"Correct: the answer {answer!r} agrees with the reference {gold.answer!r}."
            if ok
            else f"Incorrect: the answer was {answer!r}; the reference answer is {gold.answer!r}."
        )
        trace = getattr(pred, "trace", None)
        evidence = list(gold.get("evidence_ids") or [])
        if trace is None or not evidence:
            return head
        delivered = set(trace.delivered_record_ids)
        ranked = trace.ranked_records()
        ranks = {r: ranked.index(r) + 1 for r in evidence if r in ranked}
        missing = [r for r in evidence if r not in delivered]
        if not missing:
            where = "All gold evidence records reached the answerer's context"
            tip = "" if ok else " — the answer should have been read from them."
        else:
            found = (
                ", ".join(f"{r} (rank {ranks[r]})" for r in missing if r in ranks) or "none of them"
            )
            where = (
                f"{len(evidence) - len(missing)} of {len(evidence)} gold evidence records reached the "
                f"answerer; missing: {', '.join(missing)}; of the missing, retrieved but not delivered: {found}"
            )
            tip = "."
            if pred_name == "rewriter":
                tip = f". Queries searched: {trace.queries}. Write queries that would find the missing records."
        return f"{head} {where}{tip}"


class TuneResult(BaseModel):
    """The outcome of ``memsteer tune-prompts``."""

    optimizer: str
    design_key: str
    n_train: int
    n_val: int
    val_before: float = Field(description="Validation accuracy of the untuned prompts.")
    val_after: float = Field(description="Validation accuracy of the tuned prompts.")
    instructions: dict[str, str] = Field(
        default_factory=dict, description="Tuned instruction per predictor."
    )
    seconds: float = 0.0
    out_dir: str = ""
    tracking_uri: str | None = None
    run_id: str | None = None


def _accuracy(
    program: dspy.Module, examples: list[dspy.Example], metric: CorrectnessMetric, threads: int
) -> tuple[float, list]:
    evaluator = dspy.Evaluate(
        devset=examples,
        metric=metric,
        num_threads=threads,
        display_progress=False,
        max_errors=len(examples) + 1,
        failure_score=0.0,
    )
    res = evaluator(program)
    rows = []
    for ex, pred, score in res.results:
        rows.append(
            {
                "qa_id": ex.get("qa_id"),
                "question": ex.question,
                "reference": ex.answer,
                "prediction": str(getattr(pred, "answer", "") or ""),
                "correct": float(score or 0.0),
            }
        )
    return (sum(r["correct"] for r in rows) / len(rows) if rows else 0.0), rows


def tune_prompts(
    history: History,
    train: list[QAItem],
    val: list[QAItem],
    design: MemoryDesign,
    *,
    out_dir: str | Path,
    optimizer: str = "gepa",
    answerer_lm: Any,
    judge_lm: Any = None,
    reflection_lm: Any = None,
    auto: str | None = "light",
    max_metric_calls: int | None = None,
    seed: int = 0,
    threads: int = 1,
    protocol: str = "full",
    cache_dir: str | Path | None = None,
    tracker: Any = None,
    run_params: dict[str, Any] | None = None,
) -> TuneResult:
    """Tune the answerer (and query-rewriter) prompts of ``design`` with GEPA or MIPROv2 on ``train``,
    selecting on ``val``; writes ``tuned_program.json``, ``instructions.json`` and ``result.json``."""
    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tracker = tracker or Tracker.disabled()
    t0 = time.perf_counter()
    system = MemorySystem.from_design(
        design, history, cache_dir=cache_dir, lms={"answerer": answerer_lm}
    )
    student = MemoryQA(system, protocol=protocol)
    trainset, valset = to_examples(train), to_examples(val)
    score_metric = CorrectnessMetric(judge_lm)
    run_id = tracker.start_run(f"tune-prompts-{optimizer}", tags={"memsteer.kind": "tune-prompts"})
    tracker.log_params(
        run_id,
        {
            "optimizer": optimizer,
            "design_key": design.key(),
            "n_train": len(train),
            "n_val": len(val),
            "auto": auto,
            "max_metric_calls": max_metric_calls,
            "seed": seed,
            "protocol": protocol,
            **(run_params or {}),
        },
    )
    before, rows_before = _accuracy(student, valset, score_metric, threads)
    if optimizer == "gepa":
        tuner = dspy.GEPA(
            metric=CorrectnessMetric(judge_lm, feedback=True),
            auto=auto if max_metric_calls is None else None,
            max_metric_calls=max_metric_calls,
            reflection_lm=reflection_lm or answerer_lm,
            num_threads=threads,
            seed=seed,
            log_dir=str(out / "gepa"),
            track_stats=True,
        )
        tuned = tuner.compile(student, trainset=trainset, valset=valset)
    else:
        try:
            import optuna  # noqa: F401
        except ImportError:
            raise MissingExtraError(
                "optuna", "tune", "memsteer tune-prompts --optimizer mipro (MIPROv2)"
            ) from None
        tuner = dspy.MIPROv2(
            metric=score_metric,
            prompt_model=reflection_lm or answerer_lm,
            task_model=answerer_lm,
            auto=auto or "light",
            num_threads=threads,
            seed=seed,
            max_bootstrapped_demos=0,
            max_labeled_demos=0,
            verbose=False,
        )
        tuned = tuner.compile(student, trainset=trainset, valset=valset)
    after, rows_after = _accuracy(tuned, valset, score_metric, threads)
    instructions = {name: p.signature.instructions for name, p in tuned.named_predictors()}
    tuned.save(str(out / "tuned_program.json"))
    (out / "instructions.json").write_text(
        json.dumps(instructions, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    result = TuneResult(
        optimizer=optimizer,
        design_key=design.key(),
        n_train=len(train),
        n_val=len(val),
        val_before=before,
        val_after=after,
        instructions=instructions,
        seconds=round(time.perf_counter() - t0, 3),
        out_dir=str(out),
        tracking_uri=tracker.uri if tracker.active else None,
        run_id=run_id,
    )
    (out / "result.json").write_text(result.model_dump_json(indent=2) + "\n", encoding="utf-8")
    tracker.log_metrics(
        run_id,
        {
            "val_accuracy_before": before,
            "val_accuracy_after": after,
            "wall_seconds": result.seconds,
        },
    )
    tracker.log_dict(run_id, instructions, "instructions.json")
    tracker.log_table(run_id, rows_before, "val_items_before.json")
    tracker.log_table(run_id, rows_after, "val_items_after.json")
    tracker.log_artifact(run_id, out / "tuned_program.json")
    tracker.end_run(run_id)
    result.tracking_uri = tracker.uri if tracker.active else None
    return result


__all__ = [
    "OPTIMIZERS",
    "CorrectnessMetric",
    "MemoryQA",
    "TuneResult",
    "to_examples",
    "tune_prompts",
]
