"""MemPalace (``pip install 'memsteer-dspy[mempalace]'``) behind the :class:`ExternalSystem` adapter.

MemPalace stores verbatim content in a ChromaDB "palace" and searches it with its own hybrid
BM25 + vector ranking; no LM and no API key. The adapter uses the package for everything it does:

* **ingest** — each history record is written as one small text file (a front-matter header with
  the record's date, author, kind and subject, then its text) into a corpus folder, and
  MemPalace's own miner (``mempalace.miner.mine``) files it: its chunker (800 characters, 100
  overlap), its room routing, its metadata. The file name (a digest of the record id, listed in ``files.json``) carries the record id back.
* **embedding** — MemPalace's documented ``openai-compat`` embedding model, pointed at
  :class:`~memsteer_dspy.systems.embed_server.EmbeddingServer`, which serves the packaged MiniLM
  (the model our dense designs use). Nothing is downloaded; ``HF_HUB_OFFLINE`` can stay on.
* **search** — ``mempalace.searcher.search_memories`` (its default vector candidates, hybrid
  re-rank); each hit's ``source_file`` maps to the record id.

The palace is cached per history fingerprint under ``cache_dir/<fingerprint>/mempalace-<key>/``;
MemPalace's miner skips files it has already filed, so an interrupted ingest resumes, and a
finished one (``ingest.json``) is reused as is. Its configuration lives inside that folder
(``MEMPALACE_CONFIG_DIR``), never in the user's ``~/.mempalace``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import time
from pathlib import Path
from typing import Any
from unittest import mock

from memsteer_dspy.errors import ConfigError
from memsteer_dspy.memory.design import _digest
from memsteer_dspy.records import History, Record
from memsteer_dspy.systems.base import ExternalSystem, Hit, SystemCard
from memsteer_dspy.systems.embed_server import EmbeddingServer

ADAPTER_VERSION = 1


def _require():
    try:
        import mempalace  # noqa: F401
    except ImportError:
        raise ConfigError(
            "the MemPalace adapter needs the mempalace package: pip install 'memsteer-dspy[mempalace]'"
        ) from None
    from mempalace.miner import mine
    from mempalace.searcher import search_memories

    return mine, search_memories


def record_file_name(rid: str) -> str:
    """The corpus file of record ``rid``: a digest of the id (ids can be longer than a file name
    may be); ``files.json`` in the palace folder maps each name back to its record id."""
    return f"r-{hashlib.sha256(rid.encode('utf-8')).hexdigest()[:20]}.txt"


def record_document(r: Record) -> str:
    """The text MemPalace files for one record: front matter, then the record's text."""
    head = ["---"]
    if r.timestamp is not None:
        head.append(f"date: {r.timestamp.date().isoformat()}")
    if r.author:
        head.append(f"author: {json.dumps(r.author)}")
    head.append(f"kind: {r.kind}")
    if subject := r.metadata.get("subject"):
        head.append(f"subject: {json.dumps(str(subject))}")
    head.append("---")
    return "\n".join(head) + "\n" + r.text.strip() + "\n"


class MemPalaceSystem(ExternalSystem):
    """MemPalace's palace over one history; search through its own package."""

    pool = 100  # ask for more than top_k: hits dated on or after the question are dropped after

    def __init__(
        self,
        history: History,
        folder: Path,
        embedder: Any,
        *,
        top_k: int = 20,
        cache_dir: str | Path | None = None,
        ingest: dict[str, Any] | None = None,
    ):
        card = SystemCard(
            name="mempalace",
            system="mempalace",
            params={"adapter": ADAPTER_VERSION, "embedder": "minilm", "top_k": top_k},
        )
        super().__init__(card, history, top_k=top_k, cache_dir=cache_dir)
        self.folder = folder
        self.embedder = embedder
        self.record_of: dict[str, str] = json.loads((folder / "files.json").read_text())
        self.build_info.update(ingest or {})

    # -- building -----------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        history: History,
        *,
        cache_dir: str | Path | None,
        top_k: int = 20,
        embedder: Any = None,
        log: Any = None,
    ) -> MemPalaceSystem:
        """The palace of ``history``: loaded when ingested before, else built (resuming)."""
        mine, _ = _require()
        if cache_dir is None:
            raise ConfigError("MemPalace keeps its palace on disk: pass cache_dir")
        if embedder is None:
            from memsteer_dspy.memory.embedders import load_embedder

            embedder = load_embedder("minilm")
        key = _digest({"adapter": ADAPTER_VERSION, "embedder": "minilm"})
        folder = Path(cache_dir).expanduser() / history.fingerprint / f"mempalace-{key}"
        done = folder / "ingest.json"
        if done.is_file():
            system = cls(
                history,
                folder,
                embedder,
                top_k=top_k,
                cache_dir=cache_dir,
                ingest=json.loads(done.read_text()),
            )
            system.build_info["palace"] = "loaded"
            return system
        corpus = folder / "corpus"
        corpus.mkdir(parents=True, exist_ok=True)
        wing = "history"
        (corpus / "mempalace.yaml").write_text(
            f"wing: {wing}\nrooms:\n  - name: general\n    description: All records\n    keywords: [general]\n"
        )
        names = {record_file_name(r.id): r.id for r in history}
        if len(names) != len(history):
            raise ValueError("two record ids share a corpus file name (a digest collision)")
        (folder / "files.json").write_text(json.dumps(names) + "\n")
        for name, rid in names.items():
            path = corpus / name
            if not path.exists():
                path.write_text(record_document(history[rid]), encoding="utf-8")
        t0 = time.perf_counter()
        with EmbeddingServer(embedder) as server, cls._mempalace_env(folder, server.api_base):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):  # the miner prints a progress report per file
                mine(
                    str(corpus), str(folder / "palace"), wing_override=wing, respect_gitignore=False
                )
            ingest = {
                "ingest_seconds": round(time.perf_counter() - t0, 1),
                "records": len(history),
                "embedding_requests": server.requests,
                "texts_embedded": server.texts,
                "lm_calls": 0,
                "tokens": 0,
            }
        if log is not None:
            log(out.getvalue()[-2000:])
        done.write_text(json.dumps(ingest, indent=2) + "\n")
        system = cls(history, folder, embedder, top_k=top_k, cache_dir=cache_dir, ingest=ingest)
        system.build_info["palace"] = "built"
        return system

    @staticmethod
    def _mempalace_env(folder: Path, api_base: str):
        return mock.patch.dict(
            os.environ,
            {
                "MEMPALACE_CONFIG_DIR": str(folder / "config"),
                "MEMPALACE_PALACE_PATH": str(folder / "palace"),
                "MEMPALACE_EMBEDDING_MODEL": "openai-compat",
                "MEMPALACE_EMBEDDING_API_URL": api_base,
                "MEMPALACE_EMBEDDING_API_MODEL": "minilm",
                "HF_HUB_OFFLINE": "1",
            },
        )

    # -- searching ----------------------------------------------------------------------------
    def search(self, question: str, question_date: Any, n: int) -> list[Hit]:
        _, search_memories = _require()
        with (
            EmbeddingServer(self.embedder) as server,
            self._mempalace_env(self.folder, server.api_base),
        ):
            res = search_memories(question, str(self.folder / "palace"), n_results=n)
        if res.get("error"):
            raise RuntimeError(f"mempalace search failed: {res['error']}")
        hits = []
        for h in res.get("results", []):
            rid = self.record_of.get(Path(str(h.get("source_file") or "")).name)
            if rid is not None:
                hits.append(Hit([rid], float(h.get("similarity") or h.get("score") or 0.0)))
        return hits

    def usage(self) -> dict[str, Any]:
        """What building cost in LM terms (MemPalace calls no LM)."""
        return {"lm_calls": 0, "tokens": 0}
