"""MemorySystem: a memory design built over one user's history, as a ``dspy.Module``.

    M_d = Store_s(H);  X = Context_c(Retrieve_r(q, M_d));  a = Answer(q, X)     (paper, eq. 2)

``MemorySystem.from_design(design, history, cache_dir=..., lms=...)`` builds (or loads from the
on-disk cache) the store and index, then composes the retriever, the context builder and the fixed
answerer. Every prediction carries a :class:`MemoryTrace`: the queries searched, the ranked unit
ids and the records behind them, the records actually delivered to the answerer, the context and
the answer — what evaluation scores and failure diagnosis reads.

LMs are passed explicitly as a mapping role → LM: ``answerer`` answers and, unless a more specific
key is given, also serves the design's other LM parts (``query`` rewriting/HyDE/decomposition,
``rerank`` listwise reranking, ``facts`` fact extraction, ``verify`` answer verification). Nothing
reads a globally configured LM.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dspy
from pydantic import BaseModel, Field

import memsteer_dspy.memory.embedders as embedders
from memsteer_dspy.errors import ConfigError
from memsteer_dspy.memory.answer import MemoryAnswerer
from memsteer_dspy.memory.context import BuiltContext, ContextBuilder
from memsteer_dspy.memory.design import MemoryDesign, _digest
from memsteer_dspy.memory.index import HybridIndex, bm25_key, dense_key, open_bm25, open_dense
from memsteer_dspy.memory.lookup import RecordLookup, lookup_record
from memsteer_dspy.memory.retriever import MemoryRetriever, date_text
from memsteer_dspy.memory.store import MemoryStore, StoreReport, build_units
from memsteer_dspy.records import History, Record
from memsteer_dspy.signatures.answer import VerifyAnswer
from memsteer_dspy.signatures.query import ExtractFacts, SourceRecord

# which LM serves which part of a design; every part falls back to the answerer's LM
LM_PARTS = {
    "query": "retrieve.query",
    "rerank": "retrieve.rerank=llm",
    "facts": "store.unit=facts",
    "verify": "answer.verify",
    "answer": "answer",
}


class MemoryTrace(BaseModel):
    """What one question did inside the memory system."""

    question: str
    question_date: str | None = None
    cutoff: str | None = Field(None, description="First date whose records could not be retrieved.")
    queries: list[str] = Field(default_factory=list)
    ranked_unit_ids: list[str] = Field(default_factory=list)
    ranked_record_ids: list[list[str]] = Field(
        default_factory=list, description="Records of each ranked unit, in order."
    )
    scores: list[float] = Field(default_factory=list)
    delivered_unit_ids: list[str] = Field(default_factory=list)
    delivered_record_ids: list[str] = Field(default_factory=list)
    context: str = ""
    context_tokens: int = 0
    context_truncated: bool = False
    empty_context: bool = False
    draft_answer: str | None = None
    answer: str | None = None
    verified: bool | None = None

    def ranked_records(self, k: int | None = None) -> list[str]:
        """The first ``k`` distinct records, taking ranked units in order and each unit's records
        in order (how recall@k counts, so bigger units do not raise it)."""
        out: dict[str, None] = {}
        for recs in self.ranked_record_ids:
            for r in recs:
                if k is not None and len(out) >= k:
                    return list(out)
                out.setdefault(r, None)
        return list(out)


def _lm_name(lm: Any) -> str:
    return str(getattr(lm, "model", None) or type(lm).__name__)


class MemorySystem(dspy.Module):
    """A memory design d built over one history: store → retriever → context builder → answerer."""

    def __init__(
        self,
        design: MemoryDesign,
        history: History,
        store: MemoryStore,
        retriever: MemoryRetriever,
        context_builder: ContextBuilder,
        lms: Mapping[str, Any],
        build_info: dict[str, Any],
    ):
        super().__init__()
        self.design = design
        self.user_history = history  # (dspy.Module reserves `history` for its call log)
        self.store = store
        self.retriever = retriever
        self.context_builder = context_builder
        self.lms = dict(lms)
        self.build_info = build_info
        self.answerer = MemoryAnswerer(self.lms.get("answer"))
        self.verifier = None
        if design.answer.verify:
            self.verifier = dspy.Predict(VerifyAnswer)
            self.verifier.lm = self.lms.get("verify")

    # -- building -----------------------------------------------------------------------------
    @staticmethod
    def resolve_lms(lms: Mapping[str, Any] | Any | None) -> dict[str, Any]:
        """Role mapping → the LM of each design part (``answerer`` serves any part not named)."""
        if lms is None:
            return {}
        if not isinstance(lms, Mapping):
            lms = {"answerer": lms}
        default = lms.get("answerer")
        return {
            part: lms.get(part, default) for part in LM_PARTS if lms.get(part, default) is not None
        }

    @classmethod
    def from_design(
        cls,
        design: MemoryDesign,
        history: History,
        *,
        cache_dir: str | Path | None = None,
        lms: Mapping[str, Any] | Any | None = None,
        threads: int = 1,
    ) -> MemorySystem:
        """Build the memory system of ``design`` over ``history``.

        With ``cache_dir``, the store and index are saved under
        ``cache_dir/<history fingerprint>/store-<store key>/<index key>/`` and loaded from there
        by any later design with the same store and index parameters. ``lms`` maps roles to LMs
        (see the module docstring); LMs the design's retrieval or store needs must be present,
        the answerer's only when answering. ``threads`` parallelises fact extraction.
        """
        parts = cls.resolve_lms(lms)
        for part, needed in (
            ("facts", design.store.unit == "facts"),
            ("query", design.retrieve.query != "raw"),
            ("rerank", design.retrieve.rerank == "llm"),
        ):
            if needed and part not in parts:
                raise ConfigError(
                    f"the design's {LM_PARTS[part]} needs an LM, and none was given: pass "
                    "lms={'answerer': <dspy LM>} (CLI: --lm or --lm-answerer)"
                )
        info: dict[str, Any] = {
            "design_key": design.key(),
            "history_fingerprint": history.fingerprint,
        }
        t0 = time.perf_counter()
        store = cls._open_store(design, history, cache_dir, parts.get("facts"), threads, info)
        index = cls._open_index(design, store, cache_dir, info)
        reranker = None
        if design.retrieve.rerank == "cross_encoder":
            reranker = embedders.LocalCrossEncoder(design.retrieve.reranker_model)
        retriever = MemoryRetriever(
            store,
            index,
            design.retrieve,
            query_lm=parts.get("query"),
            rerank_lm=parts.get("rerank"),
            reranker=reranker,
        )
        info["open_seconds"] = round(time.perf_counter() - t0, 3)
        return cls(
            design, history, store, retriever, ContextBuilder(design.context, store), parts, info
        )

    @staticmethod
    def _store_folder(design: MemoryDesign, history: History, cache_dir, facts_lm) -> Path | None:
        if cache_dir is None:
            return None
        tag = design.store_key()
        if design.store.unit == "facts":
            tag = _digest({"store": tag, "extractor": _lm_name(facts_lm)})
        return Path(cache_dir).expanduser() / history.fingerprint / f"store-{tag}"

    @classmethod
    def _open_store(cls, design, history, cache_dir, facts_lm, threads, info) -> MemoryStore:
        folder = cls._store_folder(design, history, cache_dir, facts_lm)
        info["store_dir"] = str(folder) if folder else None
        if folder is not None:
            store = MemoryStore.load(folder, history, design.store)
            if store is not None:
                info["store"] = "loaded"
                return store
        t0 = time.perf_counter()
        report = StoreReport()
        extract = (
            fact_extractor(facts_lm, design.store.max_facts_per_record)
            if design.store.unit == "facts"
            else None
        )
        units = build_units(
            history, design.store, extract_facts=extract, threads=threads, report=report
        )
        report.built_seconds = time.perf_counter() - t0
        store = MemoryStore(history, design.store, units, report)
        info["store"] = "built"
        if folder is not None:
            store.save(folder, key=design.store_key())
        return store

    @staticmethod
    def _open_index(design: MemoryDesign, store: MemoryStore, cache_dir, info):
        spec = design.retrieve
        base = Path(info["store_dir"]) if cache_dir is not None and info.get("store_dir") else None
        texts = store.texts()

        def embedder():
            return embedders.load_embedder(
                spec.dense.embedder,
                backend=spec.dense.backend,
                query_instruction=spec.dense.query_instruction,
            )

        bm25 = dense = None
        if spec.index in ("bm25", "hybrid"):
            bm25 = open_bm25(texts, spec.bm25, base / bm25_key(spec.bm25) if base else None, info)
        if spec.index in ("dense", "hybrid"):
            dense = open_dense(
                texts, spec.dense, base / dense_key(spec.dense) if base else None, info, embedder
            )
        if spec.index == "bm25":
            return bm25
        if spec.index == "dense":
            return dense
        return HybridIndex(
            bm25,
            dense,
            bm25_weight=spec.bm25_weight,
            dense_weight=spec.dense_weight,
            rrf_k=spec.rrf_k,
        )

    # -- running ------------------------------------------------------------------------------
    def retrieve(self, question: str, question_date=None, as_of=None) -> MemoryTrace:
        """Retrieval and context construction only (no answer): what recall metrics need."""
        pred = self.retriever(question, question_date=question_date, as_of=as_of)
        built = self.context_builder(pred.indices, pred.cutoff_day)
        return self._trace(question, question_date, pred, built)

    def _trace(self, question, question_date, pred, built: BuiltContext) -> MemoryTrace:
        from datetime import date

        cutoff = pred.cutoff_day
        return MemoryTrace(
            question=question,
            question_date=date_text(question_date) if question_date is not None else None,
            cutoff=date.fromordinal(cutoff).isoformat() if cutoff is not None else None,
            queries=pred.queries,
            ranked_unit_ids=pred.unit_ids,
            ranked_record_ids=pred.record_ids,
            scores=[float(s) for s in pred.scores],
            delivered_unit_ids=built.delivered_unit_ids,
            delivered_record_ids=built.delivered_record_ids,
            context=built.text,
            context_tokens=built.tokens,
            context_truncated=built.truncated,
            empty_context=built.empty,
        )

    def forward(self, question: str, question_date=None, as_of=None) -> dspy.Prediction:
        """Answer ``question`` from memory. ``question_date`` drives the design's time filter;
        ``as_of`` is an evaluation protocol's hard cut-off (only records strictly before it)."""
        if self.answerer.lm is None:
            raise ConfigError(
                "answering needs an LM for the answerer role: pass lms={'answerer': <dspy LM>} "
                "(CLI: --lm or --lm-answerer), or evaluate with metrics='recall'"
            )
        trace = self.retrieve(question, question_date=question_date, as_of=as_of)
        qd = date_text(question_date)
        draft = self.answerer(question=question, question_date=qd, context=trace.context).answer
        trace.draft_answer = draft
        answer = draft
        if self.verifier is not None:
            if self.verifier.lm is None:
                raise ConfigError("answer.verify needs an LM: pass lms={'answerer': <dspy LM>}")
            v = self.verifier(
                question=question, question_date=qd, context=trace.context, draft_answer=draft
            )
            trace.verified = bool(v.supported)
            answer = (v.answer or "").strip() or draft
        trace.answer = answer
        return dspy.Prediction(answer=answer, trace=trace)

    # -- diagnosis ----------------------------------------------------------------------------
    def lookup(
        self, record_id: str, *, question: str | None = None, question_date=None, as_of=None
    ) -> RecordLookup:
        """Is ``record_id``'s content in the store (which units) and retrievable at all?
        See :func:`memsteer_dspy.memory.lookup.lookup_record`."""
        return lookup_record(
            self, record_id, question=question, question_date=question_date, as_of=as_of
        )


def fact_extractor(lm: Any, max_facts_per_record: int):
    """The ``facts`` memory unit's extractor: one LM call per batch of records."""
    predictor = dspy.Predict(ExtractFacts)
    predictor.lm = lm

    def extract(records: list[Record]) -> list[tuple[str, list[str]]]:
        src = [
            SourceRecord(
                id=r.id,
                date=r.timestamp.date().isoformat() if r.timestamp else None,
                author=r.author,
                text=r.text,
            )
            for r in records
        ]
        out = predictor(records=src, max_facts_per_record=max_facts_per_record)
        return [(f.text, list(f.record_ids)) for f in out.facts]

    return extract
