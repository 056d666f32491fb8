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
from memsteer_dspy.memory.design import _digest
from memsteer_dspy.memory.retriever import as_day
from memsteer_dspy.records import History, Record
from memsteer_dspy.systems.base import ExternalSystem, Hit, SystemCard
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


def batches(history: History, size: int) -> list[list[Record]]:
    """Consecutive records of each thread (conversation, email thread, document), ``size`` at a
    time, threads in order of first appearance; records without a thread go alone."""
    threads: dict[str, list[Record]] = {}
    for r in history:
        threads.setdefault(r.thread_id or f"\0{r.id}", []).append(r)
    out = []
    for recs in threads.values():
        out += [recs[i : i + size] for i in range(0, len(recs), size)]
    return out


def messages_of(records: list[Record]) -> list[dict[str, str]]:
    """One batch as chat messages: the user's own turns as ``user``, everything else (assistant
    turns, emails, documents) as ``assistant`` with its date, kind and author in front."""
    out = []
    for r in records:
        when = r.timestamp.date().isoformat() if r.timestamp else "undated"
        role = "user" if (r.author or "").lower() == "user" else "assistant"
        head = f"[{when} | {r.kind}{' | ' + r.author if r.author else ''}] "
        out.append({"role": role, "content": head + r.text.strip()})
    return out


class Usage:
    """LM calls and tokens of Mem0's LLM, counted from each response's ``usage`` (Mem0's
    ``response_callback``), saved beside the memory so a resumed ingest adds to it."""

    def __init__(self, path: Path):
        self.path = path
        self.totals = {"lm_calls": 0, "prompt_tokens": 0, "completion_tokens": 0}
        if path.is_file():
            self.totals.update(json.loads(path.read_text()))

    def __call__(self, llm: Any, response: Any, params: Any) -> None:
        usage = getattr(response, "usage", None)
        self.totals["lm_calls"] += 1
        self.totals["prompt_tokens"] += int(getattr(usage, "prompt_tokens", 0) or 0)
        self.totals["completion_tokens"] += int(getattr(usage, "completion_tokens", 0) or 0)
        self.path.write_text(json.dumps(self.totals) + "\n")

    def as_costs(self) -> dict[str, int]:
        t = self.totals
        return {"lm_calls": t["lm_calls"], "tokens": t["prompt_tokens"] + t["completion_tokens"]}


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


class Mem0System(ExternalSystem):
    """Mem0 over one history: Mem0 extracts and searches; memories map back to record ids."""

    def __init__(
        self,
        history: History,
        memory: Any,
        folder: Path,
        *,
        top_k: int = 20,
        cache_dir: str | Path | None = None,
        params: dict[str, Any] | None = None,
        budget_tokens: int = 4000,
    ):
        card = SystemCard(
            name="mem0",
            system="mem0",
            params={**(params or {}), "top_k": top_k},
            lm_parts=["ingest.fact_extraction"],
        )
        from memsteer_dspy.memory.design import ContextSpec

        super().__init__(
            card,
            history,
            top_k=top_k,
            cache_dir=cache_dir,
            context=ContextSpec(budget_tokens=budget_tokens),
        )
        self.memory = memory
        self.folder = folder
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
        log: Any = None,
    ) -> Mem0System:
        """Build (or resume, or load) Mem0's memory of ``history`` with the LLM at ``api_base``."""
        Memory = _require()
        from memsteer_dspy.memory.embedders import minilm_path

        params = {"adapter": ADAPTER_VERSION, "llm": model, "embedder": "minilm", "batch": batch}
        folder = Path(cache_dir).expanduser() / history.fingerprint / f"mem0-{_digest(params)}"
        folder.mkdir(parents=True, exist_ok=True)
        usage = Usage(folder / "usage.json")
        memory = Memory.from_config(
            mem0_config(
                folder,
                api_base=api_base,
                model=model,
                embedder_path=str(minilm_path()),
                usage=usage,
            )
        )
        system = cls(history, memory, folder, top_k=top_k, cache_dir=cache_dir, params=params)
        system.lm_usage = usage
        system.ingest(batch, log=log)
        return system

    def ingest(self, batch: int, log: Any = None) -> dict[str, Any]:
        """Add every batch not added yet (``batches.jsonl`` lists those done)."""
        done_path = self.folder / "batches.jsonl"
        done = set()
        if done_path.is_file():
            done = {json.loads(line)["key"] for line in done_path.read_text().splitlines() if line}
        todo = [
            b for b in batches(self.user_history, batch) if ",".join(r.id for r in b) not in done
        ]
        t0 = time.perf_counter()
        with done_path.open("a", encoding="utf-8") as out:
            for n, recs in enumerate(todo, 1):
                days = [as_day(r.timestamp) for r in recs if r.timestamp is not None]
                meta = {"record_ids": ",".join(r.id for r in recs), "day": max(days) if days else 0}
                res = self.memory.add(
                    messages_of(recs), user_id=self.user_id, metadata=meta, infer=True
                )
                added = len((res or {}).get("results", [])) if isinstance(res, dict) else 0
                out.write(json.dumps({"key": meta["record_ids"], "memories": added}) + "\n")
                out.flush()
                if log is not None and n % 50 == 0:
                    log(f"mem0 ingest: {n}/{len(todo)} batches")
        self.build_info.update(
            ingest_seconds=round(time.perf_counter() - t0, 1),
            batches=len(done) + len(todo),
            batches_added_now=len(todo),
        )
        return self.build_info

    def close(self) -> None:
        """Release the local Qdrant store (it locks its folder: one open memory per folder)."""
        client = getattr(getattr(self.memory, "vector_store", None), "client", None)
        if client is not None:
            client.close()

    def usage(self) -> dict[str, int]:
        """LM calls and tokens Mem0's LLM has spent on this memory (all ingest sessions)."""
        return self.lm_usage.as_costs()

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
