"""Indexes over memory units: BM25 (bm25s), dense (embeddings), and hybrid (weighted RRF).

Each index scores every unit for a query and returns the best ones among those a mask allows —
the time filter is a mask computed per question, so one index serves every question date.
Indexes save to and load from a folder; :func:`open_index` keys that folder by the History
fingerprint, the store key and the index parameters, so designs that differ only in retrieval
strategy or context reuse a built index.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Protocol

import numpy as np

from memsteer_dspy.memory.design import BM25Params, DenseParams, _digest
from memsteer_dspy.memory.store import _replace_dir

_WORD = re.compile(r"\w+", re.UNICODE)


class UnitIndex(Protocol):
    """Scores units for a query; ``search`` returns (unit indices, scores), best first."""

    kind: str

    def search(
        self, query: str, k: int, mask: np.ndarray | None = None
    ) -> tuple[list[int], list[float]]: ...


def top_k(
    scores: np.ndarray, k: int, mask: np.ndarray | None, *, min_score: float | None
) -> tuple[list[int], list[float]]:
    """The ``k`` best entries of ``scores`` among those ``mask`` allows (ties: lower index first)."""
    scores = scores.astype(np.float64, copy=True)
    if mask is not None:
        scores[~mask] = -np.inf
    if min_score is not None:
        scores[scores <= min_score] = -np.inf
    valid = int(np.isfinite(scores).sum())
    k = min(k, valid)
    if k <= 0:
        return [], []
    if k < len(scores):
        cand = np.argpartition(-scores, k - 1)[:k]
    else:
        cand = np.arange(len(scores))
    order = cand[np.lexsort((cand, -scores[cand]))]
    order = [int(i) for i in order if np.isfinite(scores[i])][:k]
    return order, [float(scores[i]) for i in order]


# --------------------------------------------------------------------------------------------
# BM25
# --------------------------------------------------------------------------------------------


class BM25Tokenizer:
    """Lower-cased word tokens, optional English stopword removal and Snowball stemming."""

    def __init__(self, params: BM25Params):
        self.params = params
        self._stop: frozenset[str] = frozenset()
        if params.stopwords == "english":
            from bm25s.stopwords import STOPWORDS_EN

            self._stop = frozenset(STOPWORDS_EN)
        self._stemmer = None
        if params.stemmer == "english":
            import Stemmer

            self._stemmer = Stemmer.Stemmer("english")
        self._lock = threading.Lock()  # PyStemmer objects are not thread-safe

    def __call__(self, text: str) -> list[str]:
        m = self.params.min_token_chars
        words = [w for w in _WORD.findall(text.lower()) if len(w) >= m and w not in self._stop]
        if self._stemmer is not None and words:
            with self._lock:
                words = self._stemmer.stemWords(words)
        return words


class BM25Index:
    """BM25 over the units' indexed text (bm25s sparse scores; exact, not approximate)."""

    kind = "bm25"

    def __init__(self, params: BM25Params):
        self.params = params
        self.tokenize = BM25Tokenizer(params)
        self.model = None
        self.n = 0

    def build(self, texts: list[str]) -> BM25Index:
        import bm25s

        self.model = bm25s.BM25(k1=self.params.k1, b=self.params.b, method=self.params.method)
        self.model.index([self.tokenize(t) for t in texts], show_progress=False)
        self.n = len(texts)
        return self

    def save(self, folder: Path) -> None:
        self.model.save(str(folder), show_progress=False)
        (folder / "memsteer.json").write_text(
            json.dumps({"n": self.n, "params": self.params.model_dump()})
        )

    @classmethod
    def load(cls, folder: Path, params: BM25Params) -> BM25Index:
        import bm25s

        idx = cls(params)
        idx.model = bm25s.BM25.load(str(folder), show_progress=False, verbosity=0)
        idx.n = json.loads((folder / "memsteer.json").read_text())["n"]
        return idx

    def scores(self, query: str) -> np.ndarray:
        ids = self.model.get_tokens_ids(self.tokenize(query))
        if not ids:
            return np.zeros(self.n, dtype=np.float32)
        return self.model.get_scores_from_ids(ids)

    def search(
        self, query: str, k: int, mask: np.ndarray | None = None
    ) -> tuple[list[int], list[float]]:
        # a unit sharing no query term is not a hit
        return top_k(self.scores(query), k, mask, min_score=0.0)


# --------------------------------------------------------------------------------------------
# dense
# --------------------------------------------------------------------------------------------


class DenseIndex:
    """Exact inner-product search over L2-normalised unit embeddings."""

    kind = "dense"

    def __init__(self, params: DenseParams, embedder):
        self.params = params
        self.embedder = embedder
        self.vectors: np.ndarray | None = None

    def _cut(self, text: str) -> str:
        return text[: self.params.max_chars]

    def build(self, texts: list[str]) -> DenseIndex:
        if texts:
            self.vectors = self.embedder.encode(
                [self._cut(t) for t in texts], is_query=False
            ).astype(np.float32)
        else:
            self.vectors = np.zeros((0, 1), dtype=np.float32)
        return self

    def save(self, folder: Path) -> None:
        np.save(folder / "vectors.npy", self.vectors)
        (folder / "memsteer.json").write_text(
            json.dumps(
                {
                    "n": int(self.vectors.shape[0]),
                    "embedder": self.embedder.name,
                    "params": self.params.model_dump(),
                }
            )
        )

    @classmethod
    def load(cls, folder: Path, params: DenseParams, embedder) -> DenseIndex:
        idx = cls(params, embedder)
        idx.vectors = np.load(folder / "vectors.npy")
        return idx

    def scores(self, query: str) -> np.ndarray:
        if self.vectors is None or self.vectors.shape[0] == 0:
            return np.zeros(0, dtype=np.float32)
        q = self.embedder.encode([query], is_query=True)[0]
        return self.vectors @ q

    def search(
        self, query: str, k: int, mask: np.ndarray | None = None
    ) -> tuple[list[int], list[float]]:
        return top_k(self.scores(query), k, mask, min_score=None)


# --------------------------------------------------------------------------------------------
# fusion
# --------------------------------------------------------------------------------------------


def rrf_fuse(
    rankings: list[list[int]], weights: list[float], k: int, rrf_k: int = 60
) -> tuple[list[int], list[float]]:
    """Weighted reciprocal rank fusion: score(u) = sum_i w_i / (rrf_k + rank_i(u)), rank from 1."""
    fused: dict[int, float] = {}
    first_seen: dict[int, tuple[int, int]] = {}
    for li, (ranking, w) in enumerate(zip(rankings, weights, strict=True)):
        for r, u in enumerate(ranking, start=1):
            fused[u] = fused.get(u, 0.0) + w / (rrf_k + r)
            first_seen.setdefault(u, (r, li))
    order = sorted(fused, key=lambda u: (-fused[u], first_seen[u]))[:k]
    return order, [fused[u] for u in order]


class HybridIndex:
    """BM25 and dense rankings fused by weighted reciprocal rank fusion."""

    kind = "hybrid"

    def __init__(
        self,
        bm25: BM25Index,
        dense: DenseIndex,
        *,
        bm25_weight: float,
        dense_weight: float,
        rrf_k: int,
    ):
        self.bm25, self.dense = bm25, dense
        self.weights = [bm25_weight, dense_weight]
        self.rrf_k = rrf_k

    def search(
        self, query: str, k: int, mask: np.ndarray | None = None
    ) -> tuple[list[int], list[float]]:
        a, _ = self.bm25.search(query, k, mask)
        b, _ = self.dense.search(query, k, mask)
        return rrf_fuse([a, b], self.weights, k, self.rrf_k)


# --------------------------------------------------------------------------------------------
# on-disk cache
# --------------------------------------------------------------------------------------------


def bm25_key(params: BM25Params) -> str:
    return "bm25-" + _digest(params.model_dump())


def dense_key(params: DenseParams) -> str:
    return "dense-" + _digest(params.model_dump())


def _load_or_build(folder: Path | None, load, build, stats: dict, label: str):
    """Load the index saved in ``folder`` or build (and save) it; notes which in ``stats``."""
    if folder is not None and (folder / "memsteer.json").exists():
        try:
            idx = load(folder)
            stats[label] = "loaded"
            return idx
        except Exception:  # a corrupt or partial folder is rebuilt
            shutil.rmtree(folder, ignore_errors=True)
    t0 = time.perf_counter()
    idx = build()
    stats[label] = "built"
    stats[f"{label}_build_seconds"] = round(time.perf_counter() - t0, 3)
    if folder is not None:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=folder.parent))
        idx.save(tmp)
        _replace_dir(tmp, folder)
    return idx


def open_bm25(texts: list[str], params: BM25Params, folder: Path | None, stats: dict) -> BM25Index:
    return _load_or_build(
        folder,
        lambda f: BM25Index.load(f, params),
        lambda: BM25Index(params).build(texts),
        stats,
        "bm25",
    )


def open_dense(
    texts: list[str], params: DenseParams, folder: Path | None, stats: dict, embedder_factory
) -> DenseIndex:
    embedder = embedder_factory()
    return _load_or_build(
        folder,
        lambda f: DenseIndex.load(f, params, embedder),
        lambda: DenseIndex(params, embedder).build(texts),
        stats,
        "dense",
    )
