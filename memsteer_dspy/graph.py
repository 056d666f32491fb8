"""The record graph: a user's history as a graph of source records (paper Section 3.2).

"We organize each user's history as a graph of source records ... Edges connect records sharing a
conversation, occupying adjacent document sections, explicitly referencing one another, or having
sufficient lexical overlap." :class:`RecordGraph` holds those four typed, weighted edge kinds in a
``networkx.MultiGraph`` keyed by :class:`EdgeType`:

* ``conversation`` — consecutive records of one thread (conversation session, email thread);
* ``section`` — adjacent sections of one document (records of kind ``document_section``);
* ``reference`` — explicit references (``Record.references``: reply-to, attachment-of) and a record
  that names another record's document title or subject;
* ``lexical`` — each record's top-k lexical neighbours whose BM25 score, relative to the record's
  own score for the same query, is at least a threshold.

Lexical neighbours come from a bm25s index over the records, queried in batches with each record's
rarest terms through a sparse product with the index's term-score matrix: only the posting lists
of those terms are touched, never all pairs, so building stays near O(n·k) and a 100,000-record
history builds in seconds (``benchmarks/graph_build.py``).

The graph is data first: :meth:`RecordGraph.save` writes the typed edge list as JSON keyed by the
History fingerprint and the build parameters, and :meth:`RecordGraph.cached` reuses it.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np

from memsteer_dspy.errors import InputError
from memsteer_dspy.records import History, Record, RecordKind

__all__ = ["EdgeType", "GraphParams", "RecordGraph"]

GRAPH_FORMAT_VERSION = 1


class EdgeType(StrEnum):
    """The four kinds of edge between source records."""

    CONVERSATION = "conversation"
    SECTION = "section"
    REFERENCE = "reference"
    LEXICAL = "lexical"


@dataclass(frozen=True)
class GraphParams:
    """How a :class:`RecordGraph` is built.

    ``lexical_k`` neighbours per record are kept when their BM25 score is at least
    ``lexical_threshold`` times the record's own score for the same query; each query is the
    record's ``query_terms`` rarest terms that occur in at least two and at most ``max_df``
    (fraction of records, or an absolute count when ≥ 1; never more than ``max_df_cap``) records,
    so every query touches a bounded number of postings. Queries run ``batch_size`` at a
    time. A title (subject, heading) links a record that names it when it has at least
    ``min_title_terms`` terms and at most ``max_title_holders`` records carry it.
    """

    lexical_k: int = 5
    lexical_threshold: float = 0.2
    query_terms: int = 24
    max_df: float = 0.05
    max_df_cap: int = 1000
    batch_size: int = 2048
    min_title_terms: int = 2
    max_title_holders: int = 5

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:8]


@dataclass
class BuildStats:
    """Edge counts and seconds per build phase."""

    records: int = 0
    edges: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def _stemmer():
    import Stemmer

    return Stemmer.Stemmer("english")


def tokenize_records(texts: list[str]):
    """bm25s tokens (English stop words removed, Snowball-stemmed) for ``texts``."""
    import bm25s

    return bm25s.tokenize(texts, stopwords="en", stemmer=_stemmer(), show_progress=False)


class RecordGraph:
    """Typed, weighted graph over one History's records.

    ``graph`` is a ``networkx.MultiGraph`` whose nodes are record ids and whose edges carry
    ``key`` = the :class:`EdgeType` value and a ``weight`` in (0, 1] (1 for structural edges,
    the relative BM25 score for lexical ones). At most one edge of each type joins two records.
    """

    def __init__(
        self, history: History, graph: nx.MultiGraph, params: GraphParams, stats: BuildStats
    ):
        self.history = history
        self.graph = graph
        self.params = params
        self.stats = stats

    # -- building ----------------------------------------------------------------------------
    @classmethod
    def build(cls, history: History, params: GraphParams | None = None) -> RecordGraph:
        """Build the graph of ``history`` (see the module docstring for the edge kinds)."""
        params = params or GraphParams()
        stats = BuildStats(records=len(history))
        g = nx.MultiGraph()
        g.add_nodes_from(r.id for r in history.records)

        t0 = time.perf_counter()
        for u, v, kind in _structural_edges(history):
            _add(g, u, v, kind, 1.0)
        stats.seconds["structural"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        index = _LexicalIndex.build(history.records)
        stats.seconds["index"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        for u, v in _title_references(history.records, index, params):
            _add(g, u, v, EdgeType.REFERENCE, 1.0)
        stats.seconds["titles"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        ids = [r.id for r in history.records]
        for i, j, w in index.neighbours(params):
            _add(g, ids[i], ids[j], EdgeType.LEXICAL, w)
        stats.seconds["lexical"] = time.perf_counter() - t0

        stats.edges = dict(Counter(k for _, _, k in g.edges(keys=True)))
        return cls(history, g, params, stats)

    @classmethod
    def cached(
        cls, history: History, cache_dir: str | Path, params: GraphParams | None = None
    ) -> RecordGraph:
        """Load the graph of ``history`` from ``cache_dir`` if one was saved for the same History
        fingerprint and parameters; otherwise build it and save it there."""
        params = params or GraphParams()
        path = Path(cache_dir) / cls.file_name(history, params)
        if path.exists():
            return cls.load(path, history)
        graph = cls.build(history, params)
        graph.save(path)
        return graph

    @staticmethod
    def file_name(history: History, params: GraphParams) -> str:
        return f"graph-{history.fingerprint}-{params.key()}.json.gz"

    # -- persistence -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        edges = [
            [u, v, k, round(float(d["weight"]), 6)]
            for u, v, k, d in self.graph.edges(keys=True, data=True)
        ]
        return {
            "format_version": GRAPH_FORMAT_VERSION,
            "fingerprint": self.history.fingerprint,
            "user": self.history.user_id,
            "params": asdict(self.params),
            "stats": asdict(self.stats),
            "edges": edges,
        }

    def save(self, path: str | Path) -> Path:
        """Write the typed edge list (gzip JSON when the name ends in ``.gz``); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps(self.to_dict(), ensure_ascii=False).encode("utf-8")
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path, history: History) -> RecordGraph:
        """Read a saved graph; it must have been built from the same History (same fingerprint)."""
        path = Path(path)
        raw = path.read_bytes()
        try:
            obj = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        except (OSError, ValueError) as exc:
            raise InputError(
                f"not a saved record graph: {exc}",
                file=path,
                hint="delete the file; it is rebuilt on the next run",
            ) from None
        if obj.get("fingerprint") != history.fingerprint:
            raise InputError(
                f"graph was built from history {obj.get('fingerprint')}, not {history.fingerprint}",
                file=path,
                field="fingerprint",
                hint="the history changed since the graph was saved; rebuild it (delete the file)",
            )
        g = nx.MultiGraph()
        g.add_nodes_from(r.id for r in history.records)
        for u, v, k, w in obj["edges"]:
            g.add_edge(u, v, key=EdgeType(k).value, weight=float(w))
        stats = BuildStats(**obj.get("stats", {}))
        return cls(history, g, GraphParams(**obj.get("params", {})), stats)

    # -- queries -----------------------------------------------------------------------------
    def neighbours(
        self, record_id: str, types: Iterable[EdgeType | str] | None = None
    ) -> list[tuple[str, str, float]]:
        """``(neighbour id, edge type, weight)`` for every edge at ``record_id``, sorted by id."""
        wanted = {EdgeType(t).value for t in types} if types is not None else None
        out = []
        for _, nbr, key, data in self.graph.edges(record_id, keys=True, data=True):
            if wanted is None or key in wanted:
                out.append((nbr, key, float(data["weight"])))
        out.sort()
        return out

    def edge_counts(self) -> dict[str, int]:
        return dict(Counter(k for _, _, k in self.graph.edges(keys=True)))

    def has_edge(self, u: str, v: str, kind: EdgeType | str | None = None) -> bool:
        if kind is None:
            return self.graph.has_edge(u, v)
        return self.graph.has_edge(u, v, key=EdgeType(kind).value)

    def __len__(self) -> int:
        return self.graph.number_of_nodes()

    def __repr__(self) -> str:
        return f"RecordGraph(records={len(self)}, edges={self.edge_counts()})"


def _add(g: nx.MultiGraph, u: str, v: str, kind: EdgeType, weight: float) -> None:
    if u == v:
        return
    key = kind.value
    if g.has_edge(u, v, key=key):
        if weight > g.edges[u, v, key]["weight"]:
            g.edges[u, v, key]["weight"] = weight
        return
    g.add_edge(u, v, key=key, weight=float(weight))


def _structural_edges(history: History) -> Iterable[tuple[str, str, EdgeType]]:
    """Thread neighbours (conversation / section) and explicit references."""
    for recs in history.threads().values():
        for a, b in zip(recs, recs[1:], strict=False):
            sections = (
                a.kind == RecordKind.DOCUMENT_SECTION and b.kind == RecordKind.DOCUMENT_SECTION
            )
            yield a.id, b.id, EdgeType.SECTION if sections else EdgeType.CONVERSATION
    for r in history.records:
        for ref in r.references:
            if ref in history and ref != r.id:
                yield r.id, ref, EdgeType.REFERENCE


_NORM = re.compile(r"[^\w]+")


def _norm(text: str) -> str:
    return " " + _NORM.sub(" ", text.lower()).strip() + " "


def _title_references(records: tuple[Record, ...], index: _LexicalIndex, params: GraphParams):
    """A record that names another record's title (document title, subject, heading)."""
    holders: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(records):
        title = r.title
        if title:
            holders[_norm(title)].append(i)
    titles = [t for t, idx in holders.items() if len(idx) <= params.max_title_holders]
    # a generic heading ("Introduction") shared by many records names nothing in particular
    texts: dict[int, str] = {}
    for title, terms in zip(titles, index.term_ids_batch(titles), strict=True):
        if len(terms) < params.min_title_terms:
            continue
        idx = holders[title]
        holder_threads = {records[i].thread_id for i in idx} - {None}
        for j in index.docs_with_all(terms):
            if j in idx or records[j].thread_id in holder_threads:
                continue  # sections of one document repeat its title: not a reference
            if j not in texts:
                texts[j] = _norm(records[j].text)
            if title in texts[j]:
                for i in idx:
                    yield records[j].id, records[i].id


class _LexicalIndex:
    """bm25s index over record texts, with sparse batched neighbour search."""

    def __init__(self, retriever, doc_terms: list[np.ndarray]):
        import scipy.sparse as sp

        self.retriever = retriever
        s = retriever.scores
        self.n_docs = int(s["num_docs"])
        self.n_terms = len(s["indptr"]) - 1
        # term-score matrix: rows are records, columns are terms (CSC as bm25s stores it)
        self.matrix = sp.csc_matrix(
            (s["data"], s["indices"], s["indptr"]), shape=(self.n_docs, self.n_terms)
        )
        self.df = np.diff(s["indptr"])
        self.doc_terms = doc_terms
        self.vocab: dict[str, int] = retriever.vocab_dict
        self.sorted_postings = self.matrix.has_sorted_indices

    @classmethod
    def build(cls, records: tuple[Record, ...]) -> _LexicalIndex:
        import bm25s

        tokens = tokenize_records([_record_text(r) for r in records])
        retriever = bm25s.BM25()
        retriever.index(tokens, show_progress=False)
        doc_terms = [np.unique(np.asarray(ids, dtype=np.int64)) for ids in tokens.ids]
        return cls(retriever, doc_terms)

    def term_ids_batch(self, texts: list[str]) -> list[list[int]]:
        """Index term ids of each text (terms the index does not know are dropped)."""
        if not texts:
            return []
        tok = tokenize_records(texts)
        inv = {i: t for t, i in tok.vocab.items()}
        return [
            sorted({self.vocab[inv[i]] for i in ids if inv[i] in self.vocab}) for ids in tok.ids
        ]

    def docs_with_all(self, terms: list[int]) -> np.ndarray:
        """Records containing every term (posting lists intersected rarest first)."""
        indptr, indices = self.matrix.indptr, self.matrix.indices
        terms = sorted(terms, key=lambda t: self.df[t])
        docs = np.sort(indices[indptr[terms[0]] : indptr[terms[0] + 1]])
        for t in terms[1:]:
            if docs.size == 0:
                break
            posting = indices[indptr[t] : indptr[t + 1]]
            if not self.sorted_postings:
                posting = np.sort(posting)
            pos = np.searchsorted(posting, docs)
            pos[pos == posting.size] = 0
            docs = docs[posting[pos] == docs] if posting.size else docs[:0]
        return docs.tolist()

    def neighbours(self, params: GraphParams) -> Iterable[tuple[int, int, float]]:
        """``(record, neighbour, relative score)`` for each record's top-k lexical neighbours."""
        import scipy.sparse as sp

        n = self.n_docs
        if n < 2:
            return
        max_df = params.max_df if params.max_df >= 1 else max(2, int(params.max_df * n))
        max_df = max(min(max_df, params.max_df_cap), 2)
        k = params.lexical_k
        for start in range(0, n, params.batch_size):
            stop = min(n, start + params.batch_size)
            rows, cols = [], []
            for q in range(start, stop):
                terms = self.doc_terms[q]
                if terms.size == 0:
                    continue
                df = self.df[terms]
                keep = terms[(df >= 2) & (df <= max_df)]
                if keep.size > params.query_terms:
                    # rarest terms first; ties broken by term id for determinism
                    order = np.lexsort((keep, self.df[keep]))
                    keep = keep[order[: params.query_terms]]
                rows.append(keep)
                cols.append(np.full(keep.size, q - start, dtype=np.int64))
            if not rows:
                continue
            r = np.concatenate(rows)
            c = np.concatenate(cols)
            query = sp.csc_matrix(
                (np.ones(r.size, dtype=np.float32), (r, c)), shape=(self.n_terms, stop - start)
            )
            scores = (self.matrix @ query).tocsc()
            for j in range(stop - start):
                q = start + j
                lo, hi = scores.indptr[j], scores.indptr[j + 1]
                docs, vals = scores.indices[lo:hi], scores.data[lo:hi]
                if docs.size < 2:
                    continue
                own = vals[docs == q]
                if own.size == 0 or own[0] <= 0:
                    continue
                mask = docs != q
                docs, vals = docs[mask], vals[mask] / own[0]
                if docs.size > k:
                    top = np.argpartition(-vals, k - 1)[:k]
                    docs, vals = docs[top], vals[top]
                for d, v in zip(docs.tolist(), vals.tolist(), strict=True):
                    if v >= params.lexical_threshold:
                        yield q, d, min(1.0, float(v))


def _record_text(r: Record) -> str:
    return f"{r.title}\n{r.text}" if r.title and r.title not in r.text else r.text
