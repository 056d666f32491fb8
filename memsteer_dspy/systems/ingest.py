"""What the LLM-driven adapters (Mem0, A-Mem) share when they feed a history to their system.

* :func:`batches` — the units each ``add`` call gets: consecutive records of one thread;
* :func:`messages_of` / :func:`transcript` — a batch as chat messages or as one text;
* :class:`Usage` — LM calls and tokens of the system's LLM, kept beside its memory so a resumed
  ingest adds to them;
* :class:`PackageMemory` — the adapter base: the package's memory object, its cache folder, the
  card (name, the LM parts of its ingest) and the LLM's usage;
* :class:`Ledger` — the batches already added (one JSON line each, with what the system made of
  it and any LM failure), so a rerun resumes where the last one stopped and adds nothing twice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from memsteer_dspy.memory.design import ContextSpec, _digest
from memsteer_dspy.records import History, Record
from memsteer_dspy.systems.base import ExternalSystem, SystemCard


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


def memory_folder(
    cache_dir: str | Path, history: History, system: str, params: dict[str, Any]
) -> tuple[Path, Usage]:
    """Where a package's memory of ``history`` lives, built under ``params`` (adapter version, LLM,
    embedder, batch): ``cache_dir/<fingerprint>/<system>-<digest>/``, created; and its LLM usage."""
    folder = Path(cache_dir).expanduser() / history.fingerprint / f"{system}-{_digest(params)}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder, Usage(folder / "usage.json")


def batch_key(records: list[Record]) -> str:
    """A batch's identity in a ledger: its record ids, comma-joined."""
    return ",".join(r.id for r in records)


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


def transcript(records: list[Record]) -> str:
    """One batch as one text (:func:`messages_of`, a line per record): what a system that stores
    notes, not chats, is given."""
    return "\n".join(m["content"] for m in messages_of(records))


class Usage:
    """LM calls and tokens of a system's LLM, saved to ``path`` after every call so a resumed
    ingest adds to them. Call it as Mem0's ``response_callback`` or use :meth:`add`."""

    def __init__(self, path: Path):
        self.path = path
        self.totals = {"lm_calls": 0, "prompt_tokens": 0, "completion_tokens": 0}
        if path.is_file():
            self.totals.update(json.loads(path.read_text()))

    def add(self, prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        self.totals["lm_calls"] += 1
        self.totals["prompt_tokens"] += int(prompt_tokens or 0)
        self.totals["completion_tokens"] += int(completion_tokens or 0)
        self.path.write_text(json.dumps(self.totals) + "\n")

    def __call__(self, llm: Any, response: Any, params: Any) -> None:
        usage = getattr(response, "usage", None)
        self.add(getattr(usage, "prompt_tokens", 0), getattr(usage, "completion_tokens", 0))

    def as_costs(self) -> dict[str, int]:
        t = self.totals
        return {"lm_calls": t["lm_calls"], "tokens": t["prompt_tokens"] + t["completion_tokens"]}


class Ledger:
    """The batches a system's memory already holds: ``path`` has one JSON line per batch added
    (``{"key": ..., ...}``), written as soon as the system has it, so an interrupted ingest loses
    at most the batch in flight and a rerun skips every batch listed."""

    def __init__(self, path: Path):
        self.path = path
        self.rows: dict[str, dict[str, Any]] = {}
        lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                if n == len(lines):
                    continue  # the last line cut short by a kill: that batch is redone
                raise
            self.rows[row["key"]] = row

    def __contains__(self, key: str) -> bool:
        return key in self.rows

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, key: str, **fields: Any) -> None:
        row = {"key": key, **fields}
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
        self.rows[key] = row


class PackageMemory(ExternalSystem):
    """An :class:`ExternalSystem` whose memory a third-party package builds with an LLM: the
    package's memory object (``memory``), its folder in the cache (:func:`memory_folder`), and the
    LLM usage of its ingest (``usage``: the one the package's LLM client counts into). Subclasses
    name the system and the LM parts of its ingest."""

    system_name: ClassVar[str]
    ingest_lm_parts: ClassVar[list[str]]

    def __init__(
        self,
        history: History,
        memory: Any,
        folder: Path,
        usage: Usage,
        *,
        top_k: int = 20,
        cache_dir: str | Path | None = None,
        params: dict[str, Any] | None = None,
        budget_tokens: int = 4000,
    ):
        card = SystemCard(
            name=self.system_name,
            system=self.system_name,
            params={**(params or {}), "top_k": top_k, "budget_tokens": budget_tokens},
            lm_parts=list(self.ingest_lm_parts),
        )
        super().__init__(
            card,
            history,
            top_k=top_k,
            cache_dir=cache_dir,
            context=ContextSpec(budget_tokens=budget_tokens),
        )
        self.memory = memory
        self.folder = folder
        self.lm_usage = usage

    def usage(self) -> dict[str, int]:
        """LM calls and tokens the package's LLM has spent on this memory (all ingest sessions)."""
        return self.lm_usage.as_costs()
