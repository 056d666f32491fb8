"""Evaluating a memory design on QA items: accuracy A(d), Question Score, evidence recall.

For each QA item (paper, Section 3.3 and Appendix A.4):

* **prediction** — the memory system's answer, with its :class:`~memsteer_dspy.memory.MemoryTrace`;
* **correct** — exact agreement after the answer type's normalization, otherwise the judge LM's
  binary verdict; ``A(d)`` is the mean over items and is the design-selection score;
* **QS** (Question Score) — exact match for numbers, Jaccard partial credit for lists, the
  correctness verdict for everything else;
* **R@k** (k = 1, 5, 10) — the fraction of gold evidence records among the first k *distinct*
  records, taking ranked units in order and each unit's records in order;
* **delivered recall** — the fraction of gold evidence records whose content reached the answerer
  inside the context budget;
* **recall_any / recall_all at k** (k = 5, 10; LongMemEval's retrieval metrics, where the format
  defines sessions, i.e. the item's metadata has ``answer_session_ids``) — 1 if any / all gold turns
  are among the first k distinct turns, and the same over sessions (the first k distinct sessions of
  the ranking against the answer sessions). Abstention items (``_abs``) are left out, as
  LongMemEval's own scoring does. See :func:`any_all_recall`.

``metrics="recall"`` scores retrieval only and calls no LM unless the design's own retrieval uses
one. Protocols: ``as_of`` (RHELM: each question sees only records strictly before its
``question_date``; one index serves every date) or ``full`` (LoCoMo: the whole history).
One failed item scores 0 with its error recorded; it never stops the run. With ``out_dir`` (a
:class:`~memsteer_dspy.runfolder.RunFolder`), each item's result (with its trace) is appended to
``items.jsonl`` as it finishes; a rerun resumes only under the same key (history, protocol, design,
metrics, LMs; each item's QA content) and otherwise raises naming the differing field; and
``summary.json`` and ``design.json`` are written at the end. Evidence ids that are not in the
history are left out of recall and listed in the summary's ``unresolved_evidence``.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Literal

import dspy
from pydantic import BaseModel, Field

from memsteer_dspy.errors import ConfigError, InputError
from memsteer_dspy.memory.answer import ANSWER_PROGRAM_VERSION
from memsteer_dspy.memory.system import MemorySystem, MemoryTrace
from memsteer_dspy.normalize import answers_match, list_jaccard
from memsteer_dspy.records import AnswerType, QAItem
from memsteer_dspy.runfolder import (
    RunFolder,
    RunMismatchError,
    qa_content_hash,
    run_key,
    write_atomic,
)
from memsteer_dspy.signatures.judge import JudgeAnswer
from memsteer_dspy.untrusted import WITHHOLD_VERSION, withhold

Metrics = Literal["all", "recall"]
Protocol = Literal["as_of", "full"]
RECALL_KS = (1, 5, 10)
ANY_ALL_KS = (5, 10)


# --------------------------------------------------------------------------------------------
# metrics
# --------------------------------------------------------------------------------------------


def recall_at_k(
    ranked_record_ids: list[list[str]], evidence_ids: Iterable[str], k: int
) -> float | None:
    """Fraction of ``evidence_ids`` among the first ``k`` distinct records of the ranking (ranked
    units in order, each unit's records in order). None when there is no evidence."""
    gold = set(evidence_ids)
    if not gold:
        return None
    top: dict[str, None] = {}
    for recs in ranked_record_ids:
        for r in recs:
            if len(top) >= k:
                break
            top.setdefault(r, None)
        if len(top) >= k:
            break
    return len(gold & top.keys()) / len(gold)


def delivered_recall(
    delivered_record_ids: Iterable[str], evidence_ids: Iterable[str]
) -> float | None:
    """Fraction of ``evidence_ids`` whose content reached the answerer. None without evidence."""
    gold = set(evidence_ids)
    if not gold:
        return None
    return len(gold & set(delivered_record_ids)) / len(gold)


def recall_any_all(
    ranked_ids: list[str], gold: Iterable[str], k: int
) -> tuple[float, float] | None:
    """LongMemEval's ``(recall_any@k, recall_all@k)``: 1.0 if any / all of ``gold`` are among the
    first ``k`` of ``ranked_ids`` (distinct ids, best first). None without gold."""
    gold = set(gold)
    if not gold:
        return None
    top = set(ranked_ids[:k])
    return float(bool(gold & top)), float(gold <= top)


def distinct_in_order(
    ranked_record_ids: list[list[str]], key: Callable[[str], str | None] = lambda r: r
) -> list[str]:
    """The distinct ``key(record)`` values in rank order (ranked units in order, each unit's records
    in order); records whose key is None are skipped. With a session key this is the session
    ranking LongMemEval's turn-to-session evaluation scores."""
    seen: dict[str, None] = {}
    for recs in ranked_record_ids:
        for r in recs:
            v = key(r)
            if v is not None:
                seen.setdefault(v, None)
    return list(seen)


def any_all_recall(
    ranked_record_ids: list[list[str]],
    evidence_ids: Iterable[str],
    answer_session_ids: Iterable[str],
    session_of: Callable[[str], str | None],
    ks: Iterable[int] = ANY_ALL_KS,
) -> dict[str, float]:
    """``turn_any@k``, ``turn_all@k`` (gold = the evidence turns) and ``session_any@k``,
    ``session_all@k`` (gold = the answer sessions; the ranking = distinct sessions of the ranked
    turns) for each k; a level without gold is left out."""
    out: dict[str, float] = {}
    turns = distinct_in_order(ranked_record_ids)
    sessions = distinct_in_order(ranked_record_ids, session_of)
    for level, ranking, gold in (
        ("turn", turns, list(evidence_ids)),
        ("session", sessions, list(answer_session_ids)),
    ):
        for k in ks:
            scored = recall_any_all(ranking, gold, k)
            if scored is not None:
                out[f"{level}_any@{k}"], out[f"{level}_all@{k}"] = scored
    return out


def _item_any_all(
    system: MemorySystem, item: QAItem, trace: MemoryTrace | None
) -> dict[str, float] | None:
    """:func:`any_all_recall` for an item of a format with sessions (None otherwise); an item
    whose retrieval failed (no trace) scores 0."""
    sessions = item.metadata.get("answer_session_ids")
    if sessions is None or item.metadata.get("abstention"):
        return None
    history = system.user_history

    def session_of(rid: str) -> str | None:
        r = history.get(rid)
        return None if r is None else (r.metadata.get("session_id") or r.thread_id)

    ranked = trace.ranked_record_ids if trace is not None else []
    return any_all_recall(ranked, item.evidence_ids, sessions, session_of) or None


def question_score(
    prediction: str, reference: str, answer_type: AnswerType | str, correct: bool
) -> float:
    """QS: exact match for numbers, Jaccard partial credit for lists, ``correct`` otherwise."""
    kind = AnswerType(answer_type)
    if kind is AnswerType.NUMBER:
        return float(answers_match(prediction, reference, kind))
    if kind is AnswerType.LIST:
        return (
            1.0
            if answers_match(prediction, reference, kind)
            else list_jaccard(prediction, reference)
        )
    return float(correct)


# --------------------------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------------------------


class ItemResult(BaseModel):
    """One QA item evaluated under one design."""

    qa_id: str
    question: str
    question_type: str | None = None
    answer_type: str = "text"
    question_date: str | None = None
    reference: str = ""
    evidence_ids: list[str] = Field(default_factory=list)
    unresolved_evidence: list[str] = Field(
        default_factory=list,
        description="Evidence ids not in the history: left out of recall (an item with no "
        "resolved evidence has no recall).",
    )
    prediction: str | None = None
    exact: bool | None = Field(
        None, description="Agrees with the reference after type normalization."
    )
    judge_correct: bool | None = Field(
        None, description="The judge's verdict (when exact agreement failed)."
    )
    correct: bool | None = None
    qs: float | None = None
    recall_at_1: float | None = None
    recall_at_5: float | None = None
    recall_at_10: float | None = None
    delivered_recall: float | None = None
    any_all_recall: dict[str, float] | None = Field(
        None, description="recall_any/all@k over turns and sessions, where the format has sessions."
    )
    empty_context: bool | None = None
    error: str | None = None
    error_stage: str | None = None
    seconds: float = 0.0
    design_key: str = ""
    metrics: str = "all"
    qa_hash: str = Field("", description="Content hash of the QA item scored (resume check).")
    trace: MemoryTrace | None = None


class MetricSummary(BaseModel):
    """Means over a set of items; None where the metric was not measured."""

    n: int = 0
    accuracy: float | None = None
    qs: float | None = None
    recall_at_1: float | None = None
    recall_at_5: float | None = None
    recall_at_10: float | None = None
    delivered_recall: float | None = None
    any_all_recall: dict[str, float] = Field(
        default_factory=dict, description="Means of recall_any/all@k over the items that have them."
    )
    empty_contexts: int = 0
    errors: int = 0


class EvaluationSummary(MetricSummary):
    """The evaluation of one design on one QA set: overall and by question type."""

    design_key: str = ""
    design_name: str = ""
    metrics: str = "all"
    protocol: str = "full"
    user: str | None = None
    history_fingerprint: str | None = None
    by_type: dict[str, MetricSummary] = Field(default_factory=dict)
    unresolved_evidence: list[dict[str, str]] = Field(
        default_factory=list,
        description="Evidence ids of the QA items that are not in the history ({qa_id, "
        "evidence_id, reason}); they are left out of recall.",
    )
    unresolved_items: int = Field(
        0, description="Items with at least one unresolved evidence id (recall uses the rest)."
    )
    no_evidence: int = Field(
        0,
        description="Items with no evidence ids: counted in n (and in accuracy), left out of "
        "the recall means, which are over the items with evidence.",
    )
    seconds: float = 0.0


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def summarize_items(items: list[ItemResult], metrics: str) -> MetricSummary:
    answered = metrics == "all"
    return MetricSummary(
        n=len(items),
        accuracy=_mean([float(bool(i.correct)) for i in items]) if answered and items else None,
        qs=_mean([i.qs if i.qs is not None else 0.0 for i in items])
        if answered and items
        else None,
        recall_at_1=_mean([i.recall_at_1 for i in items]),
        recall_at_5=_mean([i.recall_at_5 for i in items]),
        recall_at_10=_mean([i.recall_at_10 for i in items]),
        delivered_recall=_mean([i.delivered_recall for i in items]),
        any_all_recall=mean_any_all([i.any_all_recall for i in items]),
        empty_contexts=sum(bool(i.empty_context) for i in items),
        errors=sum(i.error is not None for i in items),
    )


def mean_any_all(per_item: list[dict[str, float] | None]) -> dict[str, float]:
    """Per-key means of the items' :func:`any_all_recall` dicts (keys in first-seen order)."""
    sums: dict[str, list[float]] = {}
    for d in per_item:
        for key, v in (d or {}).items():
            sums.setdefault(key, []).append(v)
    return {key: sum(vs) / len(vs) for key, vs in sums.items()}


class EvaluationReport(BaseModel):
    summary: EvaluationSummary
    items: list[ItemResult]

    def as_json(self) -> dict[str, Any]:
        """The summary as ``memsteer evaluate --json`` prints it."""
        return self.summary.model_dump(mode="json")


# --------------------------------------------------------------------------------------------
# evaluating
# --------------------------------------------------------------------------------------------


class Judge:
    """The fixed binary judge (one LM) used when exact agreement fails."""

    def __init__(self, lm: Any):
        self.predict = dspy.Predict(JudgeAnswer)
        self.predict.lm = lm

    def __call__(self, question: str, reference: str, prediction: str) -> bool:
        # the prediction is data to grade: a sentence in it addressed to an AI reader (an answer
        # echoing an injected record, a system under test's output) is withheld from the judge
        prediction = withhold(prediction)
        return bool(
            self.predict(question=question, reference=reference, prediction=prediction).correct
        )


def evaluate_item(
    system: MemorySystem,
    item: QAItem,
    *,
    metrics: Metrics = "all",
    judge: Judge | None = None,
    protocol: Protocol = "full",
) -> ItemResult:
    """Evaluate one QA item; never raises — a failure is recorded with its stage and scores 0."""
    t0 = time.perf_counter()
    res = ItemResult(
        qa_id=item.id,
        question=item.question,
        question_type=item.question_type,
        answer_type=str(item.answer_type),
        reference=item.answer,
        evidence_ids=list(item.evidence_ids),
        question_date=item.question_date.isoformat() if item.question_date else None,
        design_key=system.design.key(),
        metrics=metrics,
        qa_hash=qa_content_hash([item]),
    )
    as_of = item.question_date if protocol == "as_of" else None
    history = system.user_history
    gold = [e for e in item.evidence_ids if e in history]
    res.unresolved_evidence = [e for e in item.evidence_ids if e not in history]
    stage = "retrieve"
    try:
        if metrics == "recall":
            trace = system.retrieve(item.question, question_date=item.question_date, as_of=as_of)
        else:
            stage = "answer"
            trace = system(item.question, question_date=item.question_date, as_of=as_of).trace
        res.trace = trace
        res.empty_context = trace.empty_context
        for k in RECALL_KS:
            setattr(res, f"recall_at_{k}", recall_at_k(trace.ranked_record_ids, gold, k))
        res.delivered_recall = delivered_recall(trace.delivered_record_ids, gold)
        res.any_all_recall = _item_any_all(system, item, trace)
        if metrics == "all":
            res.prediction = trace.answer or ""
            res.exact = answers_match(res.prediction, item.answer, item.answer_type)
            correct = res.exact
            if not correct:
                stage = "judge"
                res.judge_correct = judge(item.question, item.answer, res.prediction)
                correct = res.judge_correct
            res.correct = correct
            res.qs = question_score(res.prediction, item.answer, item.answer_type, correct)
    except Exception as exc:  # one failed item scores 0, with why
        res.error = f"{type(exc).__name__}: {exc}"
        res.error_stage = stage
        if metrics == "all":
            res.correct = False
            res.qs = 0.0
        if res.trace is None and gold:
            for k in RECALL_KS:
                setattr(res, f"recall_at_{k}", 0.0)
            res.delivered_recall = 0.0
        if res.trace is None:
            res.any_all_recall = _item_any_all(system, item, None)
    res.seconds = round(time.perf_counter() - t0, 4)
    return res


def evaluation_key(
    system: MemorySystem,
    *,
    metrics: str,
    protocol: str,
    judge_lm: Any = None,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The same-run key of an evaluation (see :mod:`memsteer_dspy.runfolder`): history, protocol,
    design, metrics and the LMs whose answers enter the scores. QA content is checked per item
    (each result carries its item's ``qa_hash``), so a run resumed with more items (a larger
    ``--limit``) continues, one with fewer items is refused (``qa_items``: it would rewrite
    ``items.jsonl`` without the others), and an item whose content changed is an error, never
    reused."""
    design = system.design
    lms: dict[str, Any] = {}
    if design.lm_uses(answering=metrics == "all"):
        lms["answerer"] = getattr(system.answerer, "lm", None)
    if metrics == "all":
        lms["judge"] = judge_lm
    key = run_key(
        "evaluate",
        history=system.user_history,
        protocol=protocol,
        design_key=design.key(),
        metrics=metrics,
        lms=lms,
        options=options or {},
    )
    if metrics == "all":  # the answers come from this version of the answer program
        key["answer_program"] = ANSWER_PROGRAM_VERSION
        key["withhold_version"] = WITHHOLD_VERSION  # what the answerer and the judge read
    return key


def unresolved_evidence(history: Any, items: Iterable[QAItem]) -> list[dict[str, str]]:
    """Evidence ids of ``items`` that are not record ids of ``history``, one entry each."""
    return [
        {"qa_id": q.id, "evidence_id": e, "reason": "no record with this id in the history"}
        for q in items
        for e in q.evidence_ids
        if e not in history
    ]


def evaluate_design(
    system: MemorySystem,
    items: list[QAItem],
    *,
    metrics: Metrics = "all",
    judge_lm: Any = None,
    protocol: Protocol = "full",
    threads: int = 1,
    out_dir: str | Path | None = None,
    resume: bool = True,
    restart: bool = False,
    key_options: dict[str, Any] | None = None,
    usage: Callable[[], dict[str, Any]] | None = None,
    on_item: Callable[[ItemResult], None] | None = None,
) -> EvaluationReport:
    """Evaluate ``system`` on ``items`` (see the module docstring).

    ``judge_lm`` is required for ``metrics="all"``. ``threads`` runs items concurrently (useful
    with API LMs). ``on_item`` is called with each finished result (e.g. a progress bar).

    With ``out_dir`` the folder is a :class:`~memsteer_dspy.runfolder.RunFolder`: a rerun resumes
    only if its same-run key (:func:`evaluation_key`: history fingerprint, protocol, design key,
    metrics, QA content, judge/answerer LMs, ``key_options``) equals the folder's, otherwise a
    :class:`~memsteer_dspy.runfolder.RunMismatchError` names the differing field; ``restart``
    (or ``resume=False``) empties the folder first. Failed items are retried on resume. ``usage``
    (e.g. ``LMConfig.usage_by_role``) feeds the folder's usage ledger: what this session spent.
    """
    if metrics not in ("all", "recall"):
        raise ConfigError(f"metrics must be 'all' or 'recall', not {metrics!r}")
    if protocol not in ("as_of", "full"):
        raise ConfigError(f"protocol must be 'as_of' or 'full', not {protocol!r}")
    if not items:
        raise InputError(
            "no QA items to evaluate",
            hint="check --qa: the QA file or the format's official QA is empty",
        )
    judge = None
    if metrics == "all":
        if judge_lm is None:
            raise ConfigError(
                "metrics='all' needs a judge LM (CLI: --lm or --lm-judge); or use metrics='recall'"
            )
        if system.answerer.lm is None:
            raise ConfigError(
                "metrics='all' needs an answerer LM (CLI: --lm or --lm-answerer); or use metrics='recall'"
            )
        judge = Judge(judge_lm)
    t0 = time.perf_counter()
    key = system.design.key()
    folder = None
    done: dict[str, ItemResult] = {}
    if out_dir is not None:
        folder = RunFolder.open(
            out_dir,
            evaluation_key(
                system, metrics=metrics, protocol=protocol, judge_lm=judge_lm, options=key_options
            ),
            restart=restart or not resume,
            legacy_files=("items.jsonl", "summary.json"),
        )
        try:
            done = _finished_items(folder, items)
        except BaseException:
            folder.close()
            raise
    todo = [q for q in items if q.id not in done]
    lock = threading.Lock()
    results: dict[str, ItemResult] = dict(done)

    def finish(r: ItemResult) -> None:
        with lock:
            results[r.qa_id] = r
            if folder is not None:
                folder.log("items.jsonl").append(r.model_dump_json())
            if on_item is not None:
                on_item(r)

    def run(q: QAItem) -> ItemResult:
        return evaluate_item(system, q, metrics=metrics, judge=judge, protocol=protocol)

    try:
        if threads <= 1:
            for q in todo:
                finish(run(q))
        else:
            with ThreadPoolExecutor(max_workers=threads) as pool:
                futures = [pool.submit(contextvars.copy_context().run, run, q) for q in todo]
                for fut in as_completed(futures):
                    finish(fut.result())
    except BaseException:
        if folder is not None:
            folder.close()
        raise

    ordered = [results[q.id] for q in items]
    overall = summarize_items(ordered, metrics)
    by_type: dict[str, list[ItemResult]] = {}
    for r in ordered:
        by_type.setdefault(r.question_type or "unknown", []).append(r)
    summary = EvaluationSummary(
        **overall.model_dump(),
        design_key=key,
        design_name=system.design.name,
        metrics=metrics,
        protocol=protocol,
        user=system.user_history.user_id,
        history_fingerprint=system.user_history.fingerprint,
        by_type={t: summarize_items(rs, metrics) for t, rs in sorted(by_type.items())},
        unresolved_evidence=unresolved_evidence(system.user_history, items),
        unresolved_items=sum(bool(r.unresolved_evidence) for r in ordered),
        no_evidence=sum(not r.evidence_ids for r in ordered),
        seconds=round(time.perf_counter() - t0, 3),
    )
    report = EvaluationReport(summary=summary, items=ordered)
    if folder is not None:
        folder.write_text("items.jsonl", "".join(r.model_dump_json() + "\n" for r in ordered))
        folder.write_text("summary.json", summary.model_dump_json(indent=2) + "\n")
        folder.write_text("design.json", system.design.to_json() + "\n")
        if usage is not None:
            folder.add_usage(usage())
        folder.close()
    return report


def _finished_items(folder: RunFolder, items: list[QAItem]) -> dict[str, ItemResult]:
    """The folder's finished results for ``items`` (failed ones are retried). A result whose item
    changed is a :class:`RunMismatchError` (``qa[<id>]``); so is a folder holding results for items
    this run does not have (a smaller ``--limit``, a shorter QA file): finishing would rewrite
    ``items.jsonl`` without them, so such a run is a different run, refused with nothing changed."""
    hashes = {q.id: qa_content_hash([q]) for q in items}
    done: dict[str, ItemResult] = {}
    others: dict[str, None] = {}
    for obj in folder.log("items.jsonl").read():
        r = ItemResult.model_validate(obj)
        if r.qa_id not in hashes:
            others.setdefault(r.qa_id, None)
            continue
        if r.qa_hash != hashes[r.qa_id]:
            raise RunMismatchError(
                folder.path, [(f"qa[{r.qa_id}]", r.qa_hash or "(no hash)", hashes[r.qa_id])]
            )
        if r.error is None:
            done[r.qa_id] = r
    if others:
        names = list(others)
        shown = ", ".join(repr(n) for n in names[:3]) + (" ..." if len(names) > 3 else "")
        raise RunMismatchError(
            folder.path,
            [
                (
                    "qa_items",
                    f"results for {len(names)} item(s) this run does not have ({shown})",
                    f"{len(items)} item(s); a smaller --limit or a shorter QA file is a different run",
                )
            ],
        )
    return done


# --------------------------------------------------------------------------------------------
# QA files
# --------------------------------------------------------------------------------------------


def read_qa_jsonl(
    path: str | Path, *, on_error: str = "raise", skipped: list[Any] | None = None
) -> list[QAItem]:
    """QA items of a JSONL file: plain QAItem lines or the train/val.jsonl ``memsteer generate``
    writes; the one QA reader, :func:`memsteer_dspy.loaders.jsonl.read_qa_items`."""
    from memsteer_dspy.loaders.jsonl import read_qa_items

    path = Path(path)
    if not path.is_file():
        raise InputError(
            "QA file not found", file=path, hint="pass --qa official or the path of a QA JSONL file"
        )
    return read_qa_items(path, on_error=on_error, skipped=skipped)


# --------------------------------------------------------------------------------------------
# formats whose every instance is its own history (LongMemEval)
# --------------------------------------------------------------------------------------------


def evaluate_instances(
    instances: Iterable[Any],
    design: Any,
    *,
    metrics: Metrics = "all",
    lms: Any = None,
    judge_lm: Any = None,
    protocol: Protocol = "full",
    threads: int = 1,
    out_dir: str | Path | None = None,
    cache_dir: str | Path | None = None,
    on_instance: Callable[[str, EvaluationReport | None], None] | None = None,
    restart: bool = False,
) -> EvaluationReport:
    """Evaluate ``design`` instance by instance: each ``Loaded`` of ``instances`` (one history and
    its QA items, e.g. :func:`memsteer_dspy.loaders.longmemeval.iter_longmemeval`) gets its own
    memory system. With ``out_dir`` — a run folder of its own (:class:`RunFolder`: it refuses a
    folder that is not one, resumes only the same design, metrics and protocol, and ``restart``
    empties it) — each instance writes (and resumes) ``out_dir/<user>/``, and the pooled
    ``summary.json`` goes to ``out_dir``. An instance whose memory cannot be built scores its
    items 0 with the error recorded; the run goes on."""
    out = Path(out_dir) if out_dir is not None else None
    folder = None
    if out is not None:
        key = run_key(
            "evaluate_instances",
            protocol=protocol,
            design_key=design.key(),
            metrics=metrics,
            lms={
                "answerer": lms.get("answerer") if isinstance(lms, dict) else lms,
                "judge": judge_lm,
            }
            if metrics == "all"
            else None,
        )
        if metrics == "all":
            key["answer_program"] = ANSWER_PROGRAM_VERSION
            key["withhold_version"] = WITHHOLD_VERSION
        folder = RunFolder.open(out, key, restart=restart)
    try:
        return _evaluate_instances(
            instances,
            design,
            metrics,
            lms,
            judge_lm,
            protocol,
            threads,
            out,
            cache_dir,
            on_instance,
        )
    finally:
        if folder is not None:
            folder.close()


def _evaluate_instances(
    instances, design, metrics, lms, judge_lm, protocol, threads, out, cache_dir, on_instance
) -> EvaluationReport:
    t0 = time.perf_counter()
    pooled: list[ItemResult] = []
    users = 0
    for loaded in instances:
        users += 1
        user = loaded.history.user_id
        try:
            system = MemorySystem.from_design(
                design, loaded.history, cache_dir=cache_dir, lms=lms, threads=threads
            )
            report = evaluate_design(
                system,
                loaded.qa_items,
                metrics=metrics,
                judge_lm=judge_lm,
                protocol=protocol,
                threads=threads,
                out_dir=out / _safe_name(user) if out is not None else None,
            )
        except (InputError, ConfigError):
            raise  # a bad design or option fails every instance alike: stop at the first
        except Exception as exc:  # this instance's memory could not be built: its items score 0
            report = None
            for q in loaded.qa_items:
                pooled.append(
                    ItemResult(
                        qa_id=q.id,
                        question=q.question,
                        question_type=q.question_type,
                        reference=q.answer,
                        evidence_ids=list(q.evidence_ids),
                        correct=False if metrics == "all" else None,
                        qs=0.0 if metrics == "all" else None,
                        error=f"{type(exc).__name__}: {exc}",
                        error_stage="build",
                        design_key=design.key(),
                        metrics=metrics,
                    )
                )
        else:
            pooled.extend(report.items)
        if on_instance is not None:
            on_instance(user, report)
    if not users:
        raise InputError("no instances to evaluate")
    overall = summarize_items(pooled, metrics)
    by_type: dict[str, list[ItemResult]] = {}
    for r in pooled:
        by_type.setdefault(r.question_type or "unknown", []).append(r)
    summary = EvaluationSummary(
        **overall.model_dump(),
        design_key=design.key(),
        design_name=design.name,
        metrics=metrics,
        protocol=protocol,
        user=f"{users} instances",
        no_evidence=sum(not r.evidence_ids for r in pooled),
        by_type={t: summarize_items(rs, metrics) for t, rs in sorted(by_type.items())},
        seconds=round(time.perf_counter() - t0, 3),
    )
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / "summary.json", summary.model_dump_json(indent=2) + "\n")
        write_atomic(out / "design.json", design.to_json() + "\n")
    return EvaluationReport(summary=summary, items=pooled)


def _safe_name(user: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in user) or "_"
