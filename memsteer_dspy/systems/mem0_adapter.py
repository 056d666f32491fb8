"""Mem0 (``pip install 'memsteer-dspy[mem0]'``) behind the :class:`ExternalSystem` adapter.

Mem0 builds its own memory: for each batch of messages its LLM extracts short facts ("memories"),
which it embeds and stores in a vector store, and a search returns memories, not records. The
adapter runs Mem0's own pipeline with local parts only:

* **LLM** — Mem0's ``openai`` provider pointed at an OpenAI-compatible base URL: the embedded model
  served by ``memsteer_dspy/lm/serve.py`` for a real run, :class:`~memsteer_dspy.lm.fake_server.
  FakeOpenAIServer` in the tests. Fact extraction stays on (``infer=True``): that is Mem0.
* **embedder** — Mem0's ``huggingface`` provider loading the packaged MiniLM folder by path (no
  download); **vector store** — Mem0's ``qdrant`` provider in local on-disk mode; Mem0's history
  database in the same folder; telemetry off.
* **ingest** — each thread's records in batches of ``batch`` consecutive records, each batch one
  ``Memory.add(messages, user_id=..., metadata={"record_ids": ..., "day": ...})`` call: Mem0
  copies the metadata into every memory it extracts, which is how a memory maps back to the
  records it came from. One LLM call per batch.
* **search** — ``Memory.search`` with Mem0's own metadata filter ``day < cut-off`` (the as-of
  protocol); the memories' texts are the answerer's context (Mem0 builds its own context), and a
  memory's source records count as delivered when its text is in the context.

Ingest is cached per history fingerprint (``cache_dir/<fingerprint>/mem0-<key>/``) and resumes:
the batches already added are listed in ``batches.jsonl`` and skipped on a rerun. LM calls and
tokens are counted from the server's ``usage`` fields (``usage.json``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from memsteer_dspy.errors import ConfigError
from memsteer_dspy.memory.context import UNIT_SEPARATOR, BuiltContext
from memsteer_dspy.memory.retriever import as_day
from memsteer_dspy.records import History
from memsteer_dspy.systems.base import Hit
from memsteer_dspy.systems.ingest import (
    Ledger,
    PackageMemory,
    Usage,
    batch_key,
    batches,
    memory_folder,
    messages_of,
)
from memsteer_dspy.tokens import count_tokens

ADAPTER_VERSION = 1
EMBEDDING_DIMS = 384  # MiniLM


def _require():
    os.environ.setdefault("MEM0_TELEMETRY", "False")  # no network from a measurement
    try:
        from mem0 import Memory
    except ImportError:
        raise ConfigError(
            "the Mem0 adapter needs the mem0ai package: pip install 'memsteer-dspy[mem0]'"
        ) from None
    return Memory


def mem0_config(
    folder: Path,
    *,
    api_base: str,
    model: str,
    embedder_path: str,
    api_key: str = "local",
    usage: Usage | None = None,
) -> dict:
    """Mem0's config: the OpenAI-compatible LLM, the packaged embedder, local Qdrant and history DB."""
    return {
        "llm": {
            "provider": "openai",
            "config": {
                "model": model,
                "openai_base_url": api_base,
                "api_key": api_key,
                "temperature": 0.0,
                "max_tokens": 1000,
                "response_callback": usage,
            },
        },
        "embedder": {
            "provider": "huggingface",
            "config": {"model": embedder_path, "embedding_dims": EMBEDDING_DIMS},
        },
        "vector_store": {
            "provider": "qdrant",
            "config": {
                "collection_name": "memories",
                "path": str(folder / "qdrant"),
                "on_disk": True,
                "embedding_model_dims": EMBEDDING_DIMS,
            },
        },
        "history_db_path": str(folder / "history.db"),
    }


class Mem0System(PackageMemory):
    """Mem0 over one history: Mem0 extracts and searches; memories map back to record ids."""

    system_name = "mem0"
    ingest_lm_parts = ["ingest.fact_extraction"]

    def __init__(self, history: History, memory: Any, folder: Path, usage: Usage, **kwargs: Any):
        super().__init__(history, memory, folder, usage, **kwargs)
        self.user_id = history.user_id or "user"

    # -- building -----------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        history: History,
        *,
        cache_dir: str | Path,
        api_base: str,
        model: str,
        batch: int = 4,
        top_k: int = 20,
        budget_s: float | None = None,
        log: Any = None,
    ) -> Mem0System:
        """Build (or resume, or load) Mem0's memory of ``history`` with the LLM at ``api_base``;
        with ``budget_s`` the ingest adds no batch after that many seconds (``build_info
        ["complete"]`` says whether every batch is in; a rerun goes on)."""
        Memory = _require()
        from memsteer_dspy.memory.embedders import minilm_path

        params = {"adapter": ADAPTER_VERSION, "llm": model, "embedder": "minilm", "batch": batch}
        folder, usage = memory_folder(cache_dir, history, "mem0", params)
        memory = Memory.from_config(
            mem0_config(
                folder,
                api_base=api_base,
                model=model,
                embedder_path=str(minilm_path()),
                usage=usage,
            )
        )
        system = cls(
            history, memory, folder, usage, top_k=top_k, cache_dir=cache_dir, params=params
        )
        system.ingest(batch, budget_s=budget_s, log=log)
        return system

    def ingest(self, batch: int, budget_s: float | None = None, log: Any = None) -> dict[str, Any]:
        """Add every batch not added yet (``batches.jsonl`` lists those done). A batch whose
        ``add`` raises (an LM call that failed, a reply Mem0 could not parse) is logged with its
        reason in ``errors.jsonl`` and left out of the ledger: the ingest goes on, and a rerun
        tries that batch again."""
        ledger = Ledger(self.folder / "batches.jsonl")
        todo = [b for b in batches(self.user_history, batch) if batch_key(b) not in ledger]
        t0 = time.perf_counter()
        failed = added = 0
        for n, recs in enumerate(todo, 1):
            if budget_s is not None and time.perf_counter() - t0 >= budget_s:
                break
            days = [as_day(r.timestamp) for r in recs if r.timestamp is not None]
            meta = {"record_ids": batch_key(recs), "day": max(days) if days else 0}
            try:
                res = self.memory.add(
                    messages_of(recs), user_id=self.user_id, metadata=meta, infer=True
                )
            except Exception as exc:  # noqa: BLE001 - one failed batch never stops the ingest
                failed += 1
                with (self.folder / "errors.jsonl").open("a", encoding="utf-8") as out:
                    why = f"{type(exc).__name__}: {exc}"[:500]
                    out.write(json.dumps({"key": meta["record_ids"], "error": why}) + "\n")
                continue
            memories = len((res or {}).get("results", [])) if isinstance(res, dict) else 0
            ledger.add(meta["record_ids"], memories=memories)
            added += 1
            if log is not None and n % 50 == 0:
                log(f"mem0 ingest: {n}/{len(todo)} batches")
        self.build_info.update(
            ingest_seconds=round(time.perf_counter() - t0, 1),
            batches=len(ledger),
            batches_added_now=added,
            batches_failed_now=failed,
            complete=added == len(todo),
        )
        return self.build_info

    def close(self) -> None:
        """Release the local Qdrant store (it locks its folder: one open memory per folder)."""
        client = getattr(getattr(self.memory, "vector_store", None), "client", None)
        if client is not None:
            client.close()

    # -- searching ----------------------------------------------------------------------------
    def search(self, question: str, question_date: Any, n: int) -> list[Hit]:
        filters: dict[str, Any] = {"user_id": self.user_id}
        cutoff = getattr(self, "_cutoff", None)
        if cutoff is not None:
            filters["day"] = {"lt": cutoff}
        res = self.memory.search(question, top_k=n, filters=filters, threshold=0.0)
        hits = []
        for m in res.get("results", []) if isinstance(res, dict) else res:
            ids = [r for r in str((m.get("metadata") or {}).get("record_ids", "")).split(",") if r]
            if ids:
                hits.append(Hit(ids, float(m.get("score") or 0.0), text=m.get("memory", "")))
        return hits

    def retrieve(self, question: str, question_date=None, as_of=None):
        self._cutoff = as_day(as_of)  # Mem0 filters by its own metadata; the base drops the rest
        try:
            return super().retrieve(question, question_date=question_date, as_of=as_of)
        finally:
            self._cutoff = None

    def build_context(self, hits: list[Hit], cutoff: int | None) -> BuiltContext:
        """Mem0's memories, best first, one per line, under the token budget; a memory's records
        count as delivered when the memory's text is in the context."""
        budget = self.context_spec.budget_tokens
        lines: list[str] = []
        delivered: dict[str, None] = {}
        used = 0
        truncated = False
        for h in hits:
            piece = f"- {h.text}"
            n = count_tokens((UNIT_SEPARATOR if lines else "") + piece)
            if used + n > budget:
                truncated = True
                break
            lines.append(piece)
            used += n
            for r in h.record_ids:
                delivered.setdefault(r, None)
        text = UNIT_SEPARATOR.join(lines)
        return BuiltContext(text, count_tokens(text), list(delivered), [], truncated)
