"""A-Mem (``pip install 'memsteer-dspy[amem]'``: the ``a-mem`` package, Xu et al. 2025, "A-MEM:
Agentic Memory for LLM Agents") behind the :class:`ExternalSystem` adapter.

A-Mem keeps *notes*: for each new note its LLM writes keywords, a one-sentence context and tags
(``analyze_content``), then decides, from the note's nearest neighbours, whether to link it to them
and rewrite their context and tags (``process_memory``, the memory's "evolution"); the note's text
with its keywords, context and tags is embedded into ChromaDB. A search ranks notes by that
embedding and adds the notes they link to (``search_agentic``). The adapter runs all of it from the
package, with local parts only:

* **LLM** — A-Mem's ``openai`` backend, its client given an OpenAI-compatible base URL: the
  embedded model served by ``memsteer_dspy/lm/serve.py`` for a real run, the fake server in the
  tests. llama.cpp's server takes a JSON schema as ``{"type": "json_object", "schema": ...}``, not
  OpenAI's ``json_schema`` form A-Mem sends, so with ``schema_form="json_object"`` (the default) the
  adapter's controller rewrites that one field; the prompts and what A-Mem does with the replies
  are A-Mem's. A call that fails is counted with its reason (A-Mem itself then keeps the note with
  empty keywords, or without evolving: its own fallback).
* **embedder** — the packaged MiniLM folder, by path (ChromaDB's sentence-transformers function;
  no download); **store** — ChromaDB on disk in the cache folder; telemetry off.
* **ingest** — one note per batch of ``batch`` consecutive records of a thread (its transcript,
  dated by its last record): two LLM calls a note, so a persona costs hundreds of calls, not
  thousands. The note's id is the batch's, which is how a hit maps back to its records.

Ingest is cached per history fingerprint (``cache_dir/<fingerprint>/amem-<key>/``) and resumes:
the notes already added are listed in ``notes.jsonl`` (with their LM failures) and skipped on a
rerun; LM calls and tokens are in ``usage.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path
from typing import Any

from memsteer_dspy.errors import ConfigError
from memsteer_dspy.lm.serve import llama_server_format
from memsteer_dspy.memory.retriever import as_day
from memsteer_dspy.records import History, Record
from memsteer_dspy.systems.base import Hit
from memsteer_dspy.systems.ingest import (
    Ledger,
    PackageMemory,
    Usage,
    batch_key,
    batches,
    memory_folder,
    transcript,
)

ADAPTER_VERSION = 1


def _require():
    os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")  # ChromaDB: no network
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # A-Mem imports litellm
    try:
        from agentic_memory.memory_system import AgenticMemorySystem
    except ImportError:
        raise ConfigError(
            "the A-Mem adapter needs the a-mem package: pip install 'memsteer-dspy[amem]'"
        ) from None
    return AgenticMemorySystem


def note_id(records: list[Record]) -> str:
    """A note's id: a digest of its batch's record ids (ChromaDB ids must be short and unique)."""
    return "n-" + hashlib.sha256(batch_key(records).encode()).hexdigest()[:16]


def note_time(records: list[Record]) -> str | None:
    """A-Mem's timestamp format (YYYYMMDDHHMM) of the batch's last dated record."""
    stamps = [r.timestamp for r in records if r.timestamp is not None]
    return max(stamps).strftime("%Y%m%d%H%M") if stamps else None


class ServerController:
    """A-Mem's LLM controller (``get_completion(prompt, response_format, temperature)``) on an
    OpenAI-compatible URL, counting calls and tokens into ``usage`` and every failure into
    ``failures`` (A-Mem swallows them). ``schema_form``: ``json_object`` sends A-Mem's schema the
    way llama.cpp's server takes it; ``json_schema`` passes A-Mem's request as it is (OpenAI)."""

    def __init__(
        self,
        *,
        api_base: str,
        model: str,
        usage: Usage,
        api_key: str = "local",
        schema_form: str = "json_object",
        temperature: float = 0.0,
        max_tokens: int = 1000,
        timeout: float = 600.0,
    ):
        from openai import OpenAI

        if schema_form not in ("json_object", "json_schema"):
            raise ConfigError(
                f"schema_form must be 'json_object' or 'json_schema', not {schema_form!r}"
            )
        self.client = OpenAI(base_url=api_base, api_key=api_key, timeout=timeout, max_retries=0)
        self.model = model
        self.usage = usage
        self.schema_form = schema_form
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.failures: list[str] = []

    def _format(self, response_format: dict | None) -> dict | None:
        if self.schema_form == "json_schema":
            return response_format
        return llama_server_format(response_format)

    def get_completion(
        self, prompt: str, response_format: dict | None = None, temperature: float | None = None
    ) -> str:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": [
                {"role": "system", "content": "You must respond with a JSON object."},
                {"role": "user", "content": prompt},
            ],
            # A-Mem asks for temperature 1.0; a measurement is run at the adapter's (0 by default)
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        fmt = self._format(response_format)
        if fmt:
            kwargs["response_format"] = fmt
        try:
            response = self.client.chat.completions.create(**kwargs)
        except Exception as exc:
            self.failures.append(f"{type(exc).__name__}: {exc}"[:300])
            raise
        usage = getattr(response, "usage", None)
        self.usage.add(getattr(usage, "prompt_tokens", 0), getattr(usage, "completion_tokens", 0))
        text = response.choices[0].message.content or ""
        if fmt:
            try:
                json.loads(text)
            except json.JSONDecodeError as exc:
                self.failures.append(f"reply is not JSON: {exc.msg} ({text[:80]!r})")
        return text


class AMemSystem(PackageMemory):
    """A-Mem over one history: A-Mem builds, links and searches its notes; notes map back to the
    records of their batch."""

    system_name = "a-mem"
    ingest_lm_parts = ["ingest.note_construction", "ingest.memory_evolution"]
    #: notes asked for before the as-of cut-off drops later ones (a note holds ``batch`` records)
    pool: int = 100

    def __init__(self, history: History, memory: Any, folder: Path, usage: Usage, **kwargs: Any):
        super().__init__(history, memory, folder, usage, **kwargs)
        self.ledger = Ledger(folder / "notes.jsonl")
        self._records_of: dict[str, list[str]] = {}  # note id -> its batch's record ids

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
        schema_form: str = "json_object",
        api_key: str = "local",
        budget_s: float | None = None,
        log: Any = None,
    ) -> AMemSystem:
        """Build (or resume, or load) A-Mem's notes of ``history`` with the LLM at ``api_base``;
        with ``budget_s`` the ingest adds no note after that many seconds (``build_info
        ["complete"]`` says whether every batch is in; a rerun goes on)."""
        AgenticMemorySystem = _require()
        from memsteer_dspy.memory.embedders import minilm_path

        params = {"adapter": ADAPTER_VERSION, "llm": model, "embedder": "minilm", "batch": batch}
        folder, usage = memory_folder(cache_dir, history, "amem", params)
        with redirect_stdout(StringIO()):  # A-Mem prints; the ledger and the log say what happened
            memory = AgenticMemorySystem(
                model_name=str(minilm_path()),
                llm_backend="openai",
                llm_model=model,
                api_key=api_key,
                storage_path=str(folder / "chroma"),
            )
        controller = ServerController(
            api_base=api_base, model=model, usage=usage, api_key=api_key, schema_form=schema_form
        )
        memory.llm_controller.llm = controller  # A-Mem's own client, pointed at the local server
        system = cls(
            history, memory, folder, usage, top_k=top_k, cache_dir=cache_dir, params=params
        )
        system.controller = controller
        system.ingest(batch, budget_s=budget_s, log=log)
        return system

    def ingest(self, batch: int, budget_s: float | None = None, log: Any = None) -> dict[str, Any]:
        """Add a note for every batch not in ``notes.jsonl`` yet (none after ``budget_s``
        seconds), recording per note the LM calls that failed (A-Mem keeps the note with its
        fallback metadata)."""
        todo = [b for b in batches(self.user_history, batch) if batch_key(b) not in self.ledger]
        t0 = time.perf_counter()
        added = 0
        for n, recs in enumerate(todo, 1):
            if budget_s is not None and time.perf_counter() - t0 >= budget_s:
                break
            failures_before = len(self.controller.failures)
            with redirect_stdout(StringIO()):
                self.memory.add_note(transcript(recs), time=note_time(recs), id=note_id(recs))
            failed = self.controller.failures[failures_before:]
            days = [as_day(r.timestamp) for r in recs if r.timestamp is not None]
            self.ledger.add(
                batch_key(recs),
                note=note_id(recs),
                day=max(days) if days else 0,
                lm_failures=failed,
            )
            added += 1
            if log is not None and (n % 25 == 0 or n == len(todo)):
                log(f"a-mem ingest: {n}/{len(todo)} notes")
        self._records_of = {row["note"]: key.split(",") for key, row in self.ledger.rows.items()}
        self.build_info.update(
            ingest_seconds=round(time.perf_counter() - t0, 1),
            notes=len(self.ledger),
            notes_added_now=added,
            complete=added == len(todo),
            notes_with_lm_failures=sum(1 for r in self.ledger.rows.values() if r["lm_failures"]),
        )
        return self.build_info

    # -- searching ----------------------------------------------------------------------------
    def search(self, question: str, question_date: Any, n: int) -> list[Hit]:
        hits = []
        for rank, m in enumerate(self.memory.search_agentic(question, k=n)):
            records = self._records_of.get(m.get("id"))
            if records:  # a note this adapter added (its batch's records, best first by position)
                hits.append(Hit(records, -float(rank)))
        return hits
