"""Retrieve_r(q, M_d): a DSPy retriever over memory units.

``MemoryRetriever(query)`` follows ``dspy.retrievers.Embeddings``: it returns a ``dspy.Prediction``
with ``passages``, ``indices`` and ``scores``, plus what memory evaluation needs — the ranked
``unit_ids``, the ``record_ids`` behind each unit, and the ``queries`` actually searched.

Steps, each a field of the design's ``retrieve`` section: query strategy (raw / LM rewrite /
decomposition / HyDE / multi-query, fused by RRF) → candidate pool from the index under the time
filter → rerank (none / cross-encoder / LM listwise) → top-k (clamped to what exists) →
neighbour expansion within threads.
"""

from __future__ import annotations

from datetime import date, datetime

import dspy

from memsteer_dspy.memory.design import RetrieveSpec
from memsteer_dspy.memory.index import UnitIndex, rrf_fuse
from memsteer_dspy.memory.store import MemoryStore
from memsteer_dspy.signatures.query import (
    Candidate,
    DecomposeQuestion,
    HypotheticalRecords,
    MultiQuery,
    RerankCandidates,
    RewriteQuery,
)

RERANK_CHARS = 600  # how much of each candidate the listwise reranker sees


def as_day(when: date | datetime | str | None) -> int | None:
    """A date (or ISO string) as a day ordinal; None stays None."""
    if when is None:
        return None
    if isinstance(when, str):
        when = (
            datetime.fromisoformat(when.strip()[:19])
            if len(when.strip()) > 10
            else date.fromisoformat(when.strip())
        )
    if isinstance(when, datetime):
        when = when.date()
    return when.toordinal()


def date_text(when: date | datetime | str | None) -> str:
    if when is None:
        return "unknown"
    if isinstance(when, datetime):
        return when.date().isoformat()
    return when.isoformat() if isinstance(when, date) else str(when)


class MemoryRetriever(dspy.Module):
    """Ranks memory units for a question under one design's retrieval settings."""

    def __init__(
        self,
        store: MemoryStore,
        index: UnitIndex,
        spec: RetrieveSpec,
        *,
        query_lm=None,
        rerank_lm=None,
        reranker=None,
    ):
        super().__init__()
        self.store = store
        self.index = index
        self.spec = spec
        self.reranker = reranker
        self.expand_query = None
        if spec.query != "raw":
            sig = {
                "rewrite": RewriteQuery,
                "decompose": DecomposeQuestion,
                "hyde": HypotheticalRecords,
                "multi_query": MultiQuery,
            }[spec.query]
            self.expand_query = dspy.Predict(sig)
            self.expand_query.lm = query_lm
        self.listwise = None
        if spec.rerank == "llm":
            self.listwise = dspy.Predict(RerankCandidates)
            self.listwise.lm = rerank_lm

    # -- queries ----------------------------------------------------------------------------
    def queries(self, question: str, question_date=None) -> list[str]:
        """The search queries for ``question`` under the design's query strategy."""
        spec = self.spec
        if self.expand_query is None:
            return [question]
        qd = date_text(question_date)
        if spec.query == "rewrite":
            out = [self.expand_query(question=question, question_date=qd).query]
        elif spec.query == "decompose":
            out = list(
                self.expand_query(
                    question=question, question_date=qd, n=spec.n_queries
                ).sub_questions
            )
        elif spec.query == "hyde":
            out = list(
                self.expand_query(question=question, question_date=qd, n=spec.n_queries).records
            )
        else:
            out = list(
                self.expand_query(question=question, question_date=qd, n=spec.n_queries).queries
            )
        out = [str(q).strip() for q in out if str(q).strip()][
            : spec.n_queries if spec.query != "rewrite" else 1
        ]
        if spec.keep_original_query:
            out = [question, *out]
        return list(dict.fromkeys(out)) or [question]

    # -- the retriever ------------------------------------------------------------------------
    def cutoff_day(self, question_date=None, as_of=None) -> int | None:
        """The first day whose records may not be retrieved: the question date under the design's
        time filter, and ``as_of`` from an evaluation protocol; the earlier one wins."""
        days = [as_day(as_of)]
        if self.spec.time_filter:
            days.append(as_day(question_date))
        days = [d for d in days if d is not None]
        return min(days) if days else None

    def forward(
        self, query: str, question_date=None, as_of=None, queries: list[str] | None = None
    ) -> dspy.Prediction:
        spec = self.spec
        cutoff = self.cutoff_day(question_date, as_of)
        mask = self.store.mask(cutoff)
        queries = queries if queries is not None else self.queries(query, question_date)
        rankings, score_maps = [], []
        for q in queries:
            idx, scores = self.index.search(q, spec.pool, mask)
            rankings.append(idx)
            score_maps.append(dict(zip(idx, scores, strict=True)))
        if len(rankings) == 1:
            pool, pool_scores = rankings[0], [score_maps[0][i] for i in rankings[0]]
        else:
            pool, pool_scores = rrf_fuse(rankings, [1.0] * len(rankings), spec.pool, spec.rrf_k)
        pool, pool_scores = self._rerank(query, question_date, pool, pool_scores, cutoff)
        k = min(spec.top_k, len(pool))  # k larger than the units that exist is clamped
        hits, hit_scores = pool[:k], pool_scores[:k]
        ranked, scores, via = self._expand(hits, hit_scores, mask)

        passages, record_ids = [], []
        for i in ranked:
            parts = self.store.units[i].visible_parts(cutoff)
            passages.append("\n\n".join(p.text for p in parts))
            record_ids.append(list(dict.fromkeys(r for p in parts for r in p.record_ids)))
        return dspy.Prediction(
            passages=passages,
            indices=ranked,
            scores=scores,
            via=via,
            unit_ids=[self.store.units[i].id for i in ranked],
            record_ids=record_ids,
            queries=queries,
            cutoff_day=cutoff,
        )

    # -- rerank and expansion -----------------------------------------------------------------
    def _candidate_text(self, i: int, cutoff: int | None) -> str:
        return "\n".join(p.text for p in self.store.units[i].visible_parts(cutoff))[:RERANK_CHARS]

    def candidate_texts(self, unit_ids: list[str], cutoff_day: int | None = None) -> list[str]:
        """The text a reranker sees for each unit (its visible content, cut to ``RERANK_CHARS``)."""
        return [self._candidate_text(self.store.index_of[u], cutoff_day) for u in unit_ids]

    def _rerank(self, question, question_date, pool, scores, cutoff):
        spec = self.spec
        if spec.rerank == "none" or len(pool) < 2:
            return pool, scores
        head, tail = pool[: spec.rerank_top], pool[spec.rerank_top :]
        tail_scores = scores[spec.rerank_top :]
        if spec.rerank == "cross_encoder":
            ce = self.reranker.score(question, [self._candidate_text(i, cutoff) for i in head])
            order = sorted(range(len(head)), key=lambda j: (-ce[j], j))
            return [head[j] for j in order] + tail, [ce[j] for j in order] + tail_scores
        # LM listwise: the LM orders short candidate ids; ids it drops keep their order after
        cands = [
            Candidate(id=str(j + 1), text=self._candidate_text(i, cutoff))
            for j, i in enumerate(head)
        ]
        ranked_ids = self.listwise(
            question=question, question_date=date_text(question_date), candidates=cands
        ).ranked_ids
        order: list[int] = []
        for rid in ranked_ids:
            j = int(rid) - 1 if str(rid).strip().isdigit() else -1
            if 0 <= j < len(head) and j not in order:
                order.append(j)
        order += [j for j in range(len(head)) if j not in order]
        n = len(head)
        return [head[j] for j in order] + tail, [float(n - r) for r in range(n)] + tail_scores

    def _expand(
        self, hits: list[int], scores: list[float], mask
    ) -> tuple[list[int], list[float], list[str]]:
        n = self.spec.expand_neighbors
        if n <= 0:
            return list(hits), list(scores), ["index"] * len(hits)
        out, out_scores, via = [], [], []
        seen = set(hits)
        for i, s in zip(hits, scores, strict=True):
            out.append(i)
            out_scores.append(s)
            via.append("index")
            for j in self.store.neighbours(i, n):
                if j in seen or (mask is not None and not mask[j]):
                    continue
                seen.add(j)
                out.append(j)
                out_scores.append(0.0)
                via.append(f"neighbour:{self.store.units[i].id}")
        return out, out_scores, via
