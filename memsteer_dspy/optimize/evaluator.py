"""Scoring a candidate: the evaluator over one history, the per-item scores the accept rules and
selectors pair, and what a design costs or needs at retrieval time (the buildability check a
proposal must pass before it is scored)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memsteer_dspy.errors import InputError
from memsteer_dspy.evaluation import ItemResult, evaluate_design
from memsteer_dspy.memory.design import MemoryDesign, store_build_calls
from memsteer_dspy.memory.embedders import check_local_models
from memsteer_dspy.memory.store import unit_count
from memsteer_dspy.memory.system import MemorySystem
from memsteer_dspy.optimize.types import Candidate, Objective
from memsteer_dspy.records import History, QAItem


class HistoryEvaluator:
    """Scores designs over one history; keeps the two most recent systems (the current design's
    and one candidate's), and their stores and indexes in ``cache_dir``.

    ``lm`` is a function role -> LM, called only for the roles a design and the metrics need.
    """

    def __init__(
        self,
        history: History,
        *,
        lm: Callable[[str], Any],
        protocol: str = "full",
        threads: int = 1,
        cache_dir: str | Path | None = None,
        answering: bool = True,
    ):
        self.history = history
        self.lm = lm
        self.protocol = protocol
        self.threads = threads
        self.cache_dir = cache_dir
        self.answering = answering
        self._systems: dict[tuple[str, bool], Any] = {}

    def system(self, design: MemoryDesign):
        key = (design.key(), self.answering)
        if key not in self._systems:
            uses = design.lm_uses(answering=self.answering)
            lms = {"answerer": self.lm("answerer")} if uses else {}
            system = MemorySystem.from_design(
                design, self.history, cache_dir=self.cache_dir, lms=lms, threads=self.threads
            )
            while len(self._systems) >= 2:
                self._systems.pop(next(iter(self._systems)))
            self._systems[key] = system
        return self._systems[key]

    def evaluate(self, design: MemoryDesign, items: list[QAItem], metrics: str, folder: Path):
        system = self.system(design)
        judge = self.lm("judge") if metrics == "all" else None
        report = evaluate_design(
            system,
            items,
            metrics=metrics,
            judge_lm=judge,
            protocol=self.protocol,
            threads=self.threads,
            out_dir=folder,
        )
        return system, report


def item_primary(objective: Objective, r: ItemResult) -> float | None:
    """One item's score under the objective's primary metric (delivered recall, or accuracy)."""
    if objective == "recall":
        return r.delivered_recall
    return float(bool(r.correct)) if (r.correct is not None or r.error is not None) else None


def item_metric(metric: str, r: ItemResult) -> float | None:
    """One item's value of a guard metric (``accuracy``: 1/0 when the item was answered)."""
    if metric == "accuracy":
        return float(bool(r.correct)) if (r.correct is not None or r.error is not None) else None
    return getattr(r, metric)


def retrieval_lm_calls(design: MemoryDesign) -> int:
    """LM calls one question costs at retrieval time under ``design`` (query rewrite, decomposition,
    HyDE or multi-query: one call each; an LM listwise rerank: one more). 0 for an LM-free design."""
    r = design.retrieve
    return int(r.query != "raw") + int(r.rerank == "llm")


def check_extras(design: MemoryDesign) -> None:
    """Raise :class:`InputError` naming the field when ``design`` needs an optional package this
    machine lacks (the proposer is sent it back, as for a missing model folder)."""
    r = design.retrieve
    if r.index in ("dense", "hybrid"):
        need = {"wordllama": "wordllama"}.get(r.dense.embedder, "sentence_transformers")
        if (
            importlib.util.find_spec(need) is None
            and importlib.util.find_spec("FlagEmbedding") is None
        ):
            raise InputError(
                f"retrieve.index {r.index!r} needs the 'dense' extra ({need}), which is not installed here",
                field="retrieve.index",
                hint="choose index 'bm25', or install it: pip install 'memsteer-dspy[dense]'",
            )
    if r.rerank == "cross_encoder" and not (
        importlib.util.find_spec("FlagEmbedding")
        or importlib.util.find_spec("sentence_transformers")
    ):
        raise InputError(
            "retrieve.rerank 'cross_encoder' needs the 'dense' extra, which is not installed here",
            field="retrieve.rerank",
            hint="choose rerank 'none' or 'llm', or pip install 'memsteer-dspy[dense]'",
        )


class BuildCheck:
    """Raises :class:`InputError` naming the field when this machine cannot build ``design`` or
    this run's limits refuse it: a model folder that is not there, a missing extra, retrieval-time
    LM calls over ``max_eval_lm_calls`` on the ``n_val`` selecting items, a dense index over
    ``max_embed_units`` units, or a store over ``max_build_calls``. The proposer is sent such a
    design back, as it is an invalid one. The limits are read from ``limits`` (an
    :class:`~memsteer_dspy.optimize.config.OptimizeConfig`) at each call, so a changed limit
    holds at once."""

    def __init__(self, history: History, n_val: int, limits: Any):
        self.history, self.n_val, self.limits = history, n_val, limits

    def __call__(self, design: MemoryDesign) -> None:
        check_local_models(design)
        check_extras(design)
        self._eval_calls(design)
        self._embed_units(design)
        self._build_calls(design)

    def _eval_calls(self, design: MemoryDesign) -> None:
        per_question, limit = retrieval_lm_calls(design), self.limits.max_eval_lm_calls
        if limit is None or per_question * self.n_val <= limit:
            return
        field = "retrieve.rerank" if design.retrieve.rerank == "llm" else "retrieve.query"
        raise InputError(
            f"{field} {getattr(design.retrieve, field.split('.')[1])!r} costs {per_question} LM "
            f"call(s) per question at retrieval time, {per_question * self.n_val} to score "
            f"{self.n_val} items; this run allows {limit}",
            field=field,
            hint="choose an LM-free retrieval: query 'raw' and rerank 'none' or 'cross_encoder'",
        )

    def _embed_units(self, design: MemoryDesign) -> None:
        limit = self.limits.max_embed_units
        if limit is None or design.retrieve.index not in ("dense", "hybrid"):
            return
        units = unit_count(self.history, design.store)
        if units is None or units <= limit:
            return
        section = design.store.unit == "section"
        raise InputError(
            f"a {design.retrieve.index} index over this store embeds {units:,} units "
            f"({design.retrieve.dense.embedder}); this run allows {limit:,}",
            field="store.section_max_tokens" if section else "retrieve.index",
            hint="keep fewer, larger units (a larger store.section_max_tokens, record or thread "
            "units) or a bm25 index",
        )

    def _build_calls(self, design: MemoryDesign) -> None:
        limit = self.limits.max_build_calls
        needed = store_build_calls(design, len(self.history))
        if limit is not None and needed > limit:
            raise InputError(
                f"store.unit {design.store.unit!r} needs about {needed} LM calls to build over "
                f"{len(self.history)} records; this run allows {limit}",
                field="store.unit",
                hint="choose a unit that needs no LM to build: record, window, thread or section",
            )


def candidate_of(
    iteration: int,
    design: MemoryDesign,
    score: Any,
    items: list[ItemResult],
    val: list[QAItem],
    objective: Objective,
    guard_metrics: list[str],
) -> Candidate:
    """A scored design as accept rules and selectors see it: per-item primary scores (and guard
    metrics) on the selecting items ``val``, in their order (None for an item without a result)."""
    by_id = {r.qa_id: r for r in items}
    ids = [q.id for q in val]
    return Candidate(
        iteration=iteration,
        design=design,
        score=score,
        item_ids=ids,
        item_scores=[item_primary(objective, by_id[i]) if i in by_id else None for i in ids],
        retrieval_lm_calls=retrieval_lm_calls(design),
        item_metrics={
            m: [item_metric(m, by_id[i]) if i in by_id else None for i in ids]
            for m in guard_metrics
        },
    )
