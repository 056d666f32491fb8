"""Ragas testset generation (``pip install 'memsteer-dspy[ragas]'``: ``ragas`` 0.4) on a user's
records: the Ragas-QA baseline of the paper's generation study (Table 4), run from its own package.

:func:`ragas_items` gives Ragas the records as pre-chunked documents (one record, one chunk: its
date, kind, title and text) and runs the steps of ``TestsetGenerator.generate_with_chunks`` with
Ragas's default transforms (summary, node filter, themes, entities, embeddings, similarity and
overlap edges) and its default query distribution (single-hop specific, multi-hop abstract and
specific) — one query synthesizer at a time, through ``TestsetGenerator.generate``'s
``query_distribution``, so a synthesizer that fails (Ragas cannot go on after one, and on a small
LM one looping reply fails a whole synthesizer) costs its own samples only; it is named in the
summary's ``failed_synthesizers``.
Each sample's reference contexts are mapped back to the record ids they came from, so its items are
scored, checked and compared exactly as MemSteer's.

Local parts only:

* **LLM** — an OpenAI-compatible URL (the embedded model served by
  :mod:`memsteer_dspy.lm.serve` for a real run; any endpoint with ``schema_form="json_schema"``)
  through Ragas's Instructor LLM in instructor's ``JSON_SCHEMA`` mode. For llama.cpp's server the
  request's ``json_schema`` response format is rewritten by the HTTP client into the form that
  server binds with a grammar (:func:`~memsteer_dspy.lm.serve.llama_server_format`). One request
  at a time (a 2-core server answers one at a time anyway, and queued requests would time out).
* **embedder** — any OpenAI-compatible ``/v1/embeddings`` URL, e.g.
  :class:`~memsteer_dspy.systems.embed_server.EmbeddingServer` over the packaged MiniLM.
* **cost** — every reply's ``usage`` is counted by the HTTP client into ``usage.json`` (calls,
  prompt and completion tokens), transforms included.

Resumable: Ragas's own disk cache (``DiskCacheBackend``) keeps every LLM reply in the run folder,
which is keyed by the records, settings and LLM (:class:`~memsteer_dspy.runfolder.RunFolder`), so
a rerun after an interruption replays the replies it has and pays only for the rest; a finished
run's items are in ``items.jsonl`` and are read back without any call. Python's and NumPy's random
generators are seeded, so a rerun asks the same prompts.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from memsteer_dspy.errors import ConfigError
from memsteer_dspy.lm.serve import llama_server_format
from memsteer_dspy.records import History, Record
from memsteer_dspy.runfolder import RunFolder, run_key, write_atomic
from memsteer_dspy.systems.ingest import Usage
from memsteer_dspy.tokens import truncate_to_tokens

ADAPTER_VERSION = 1
ITEMS = "items.jsonl"
# a multi-hop sample's contexts are its chunks tagged "<1-hop>\n\n", "<2-hop>\n\n", ...
_HOP = re.compile(r"^<\d+-hop>\s*")


def _require() -> Any:
    try:
        import ragas
    except ImportError as exc:
        raise ConfigError(
            "the Ragas baseline needs the ragas extra: pip install 'memsteer-dspy[ragas]'"
        ) from exc
    return ragas


@dataclass
class RagasItem:
    """One Ragas sample, its contexts mapped back to records."""

    id: str
    question: str
    answer: str
    evidence_ids: list[str]
    synthesizer: str
    contexts_unmatched: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)


def chunk_text(record: Record, max_tokens: int) -> str:
    """The text Ragas is given for a record: a header line (date, kind, title, author) and the
    text, cut to ``max_tokens``."""
    head = " · ".join(
        p
        for p in (
            record.timestamp.date().isoformat() if record.timestamp else None,
            record.kind,
            record.title,
            f"from {record.author}" if record.author else None,
        )
        if p
    )
    return f"{head}\n{truncate_to_tokens(record.text, max_tokens)}"


def _rewrite_body(content: bytes, schema_form: str) -> bytes:
    if schema_form == "json_schema" or not content:
        return content
    body = json.loads(content)
    if isinstance(body, dict) and body.get("response_format"):
        body["response_format"] = llama_server_format(body["response_format"])
    return json.dumps(body).encode()


def _client(api_base: str, api_key: str, schema_form: str, usage: Usage, timeout: float) -> Any:
    """An ``AsyncOpenAI`` client whose transport rewrites the response format for llama.cpp's
    server and counts every reply's tokens into ``usage``."""
    import httpx
    from openai import AsyncOpenAI

    class Transport(httpx.AsyncHTTPTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if request.method == "POST" and request.url.path.endswith("/chat/completions"):
                content = _rewrite_body(request.content, schema_form)
                headers = dict(request.headers)
                headers["content-length"] = str(len(content))
                request = httpx.Request(
                    request.method, request.url, headers=headers, content=content
                )
                response = await super().handle_async_request(request)
                await response.aread()
                try:
                    u = json.loads(response.content).get("usage") or {}
                except (ValueError, AttributeError):
                    u = {}
                usage.add(u.get("prompt_tokens", 0), u.get("completion_tokens", 0))
                return response
            return await super().handle_async_request(request)

    # no kept-alive connections: Ragas runs its stages in separate event loops, and a pooled
    # connection of a closed loop fails the next stage's first request ("Connection error")
    transport = Transport(limits=httpx.Limits(max_keepalive_connections=0))
    http = httpx.AsyncClient(transport=transport, timeout=timeout)
    return AsyncOpenAI(base_url=api_base, api_key=api_key, http_client=http, max_retries=0)


def ragas_key(
    history: History,
    record_ids: Sequence[str],
    *,
    n: int,
    seed: int,
    lm_name: str,
    embed_model: str,
    max_tokens: int,
) -> dict[str, Any]:
    import ragas

    return run_key(
        "ragas_testset",
        history=history,
        lms={"ragas": lm_name},
        options={
            "records": list(record_ids),
            "n": n,
            "seed": seed,
            "embed_model": embed_model,
            "record_tokens": max_tokens,
            "ragas": ragas.__version__,
            "adapter": ADAPTER_VERSION,
        },
    )


def ragas_items(
    history: History,
    record_ids: Sequence[str],
    out: str | Path,
    *,
    n: int,
    api_base: str,
    model: str,
    embed_api_base: str,
    embed_model: str = "minilm",
    api_key: str = "local",
    lm_name: str | None = None,
    schema_form: str = "json_object",
    seed: int = 0,
    max_tokens: int = 400,
    timeout: float = 900.0,
    log: Callable[[str], None] | None = None,
) -> tuple[list[RagasItem], dict[str, Any]]:
    """Ragas's testset of ``n`` samples from the records ``record_ids`` of ``history``, into the
    run folder ``out`` (resumed there; ``lm_name`` is the LLM as the folder's key names it, default
    ``model @ api_base`` — name the model where the URL changes from run to run); returns the
    items and a summary (samples, items, LM calls and tokens, wall seconds, failures). Ragas's own
    failures (a reply it cannot parse after its retries) drop that node or sample, as Ragas does;
    they are counted, not raised."""
    _require()
    if schema_form not in ("json_object", "json_schema"):
        raise ConfigError(
            f"schema_form must be 'json_object' or 'json_schema', not {schema_form!r}"
        )
    missing = [rid for rid in record_ids if rid not in history]
    if missing:
        raise ConfigError(f"record ids not in the history: {', '.join(missing[:5])}")
    out = Path(out)
    key = ragas_key(
        history,
        record_ids,
        n=n,
        seed=seed,
        lm_name=lm_name or f"{model} @ {api_base}",
        embed_model=embed_model,
        max_tokens=max_tokens,
    )
    with RunFolder.open(out, key, extra={"user": history.user_id}) as folder:
        summary_path = out / "summary.json"
        if (out / ITEMS).is_file() and summary_path.is_file():
            items = [RagasItem(**json.loads(line)) for line in (out / ITEMS).open() if line.strip()]
            return items, json.loads(summary_path.read_text())
        started = time.perf_counter()
        usage = Usage(out / "usage.json")
        failures: list[str] = []
        chunks = {rid: chunk_text(history[rid], max_tokens) for rid in record_ids}
        samples = _generate(
            chunks,
            out,
            n=n,
            api_base=api_base,
            model=model,
            embed_api_base=embed_api_base,
            embed_model=embed_model,
            api_key=api_key,
            schema_form=schema_form,
            seed=seed,
            timeout=timeout,
            usage=usage,
            failures=failures,
            log=log,
        )
        by_text = {text.strip(): rid for rid, text in chunks.items()}
        items = []
        for i, (question, answer, contexts, synthesizer) in enumerate(samples):
            found = [by_text.get(_HOP.sub("", c).strip()) for c in contexts]
            ids = list(dict.fromkeys(rid for rid in found if rid))
            unmatched = sum(rid is None for rid in found)
            items.append(
                RagasItem(
                    id=f"ragas-s{seed}-{i:04d}",
                    question=question,
                    answer=answer,
                    evidence_ids=ids,
                    synthesizer=synthesizer,
                    contexts_unmatched=unmatched,
                )
            )
        summary = {
            "samples": len(samples),
            "items_with_evidence": sum(bool(it.evidence_ids) for it in items),
            "records": len(record_ids),
            "synthesizers": dict(Counter(it.synthesizer for it in items)),
            "failed_synthesizers": failures,
            **usage.totals,
            "wall_seconds": round(time.perf_counter() - started, 1),
        }
        write_atomic(
            out / ITEMS,
            "".join(json.dumps(asdict(it), ensure_ascii=False) + "\n" for it in items),
        )
        write_atomic(summary_path, json.dumps(summary, indent=2) + "\n")
        folder.add_usage({"ragas": usage.totals})
        return items, summary


def _generate(
    chunks: Mapping[str, str],
    out: Path,
    *,
    n: int,
    api_base: str,
    model: str,
    embed_api_base: str,
    embed_model: str,
    api_key: str,
    schema_form: str,
    seed: int,
    timeout: float,
    usage: Usage,
    failures: list[str],
    log: Callable[[str], None] | None,
) -> list[tuple[str, str, list[str], str]]:
    """Ragas's own pipeline on ``chunks`` (record id -> its text); returns (question, reference
    answer, reference contexts, synthesizer) per sample."""
    import instructor
    import numpy as np
    from openai import AsyncOpenAI
    from ragas.cache import DiskCacheBackend
    from ragas.embeddings import OpenAIEmbeddings
    from ragas.llms.base import InstructorLLM, InstructorModelArgs
    from ragas.run_config import RunConfig
    from ragas.testset import TestsetGenerator
    from ragas.testset.graph import KnowledgeGraph, Node, NodeType
    from ragas.testset.synthesizers import default_query_distribution
    from ragas.testset.synthesizers.utils import calculate_split_values
    from ragas.testset.transforms import apply_transforms, default_transforms_for_prechunked

    os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")  # Ragas's usage analytics: never sent
    random.seed(seed)
    np.random.seed(seed)
    client = _client(api_base, api_key, schema_form, usage, timeout)
    llm = InstructorLLM(
        client=instructor.from_openai(client, mode=instructor.Mode.JSON_SCHEMA),
        model=model,
        provider="openai",
        model_args=InstructorModelArgs(temperature=0.0, top_p=1.0, max_tokens=1024),
        cache=DiskCacheBackend(str(out / "ragas-cache")),
    )
    embeddings = OpenAIEmbeddings(
        client=AsyncOpenAI(base_url=embed_api_base, api_key="local"), model=embed_model
    )
    nodes = [
        Node(
            type=NodeType.CHUNK,
            properties={"page_content": text, "document_metadata": {"record_id": rid}},
        )
        for rid, text in chunks.items()
    ]
    run_config = RunConfig(timeout=int(timeout), max_retries=1, max_workers=1, seed=seed)
    generator = TestsetGenerator(llm=llm, embedding_model=embeddings)
    if log:
        log(f"ragas: {len(nodes)} records, {n} samples, LLM {model} at {api_base}")
    samples: list[Any] = []
    try:
        # generate_with_chunks's steps, one query synthesizer at a time: Ragas's generate() cannot
        # go on when one synthesizer's scenarios failed (it iterates the failed job's NaN), and on
        # a small LM one looping reply (IncompleteOutputException) fails a whole synthesizer
        kg = KnowledgeGraph(nodes=nodes)
        apply_transforms(kg, default_transforms_for_prechunked(llm, embeddings), run_config)
        generator.knowledge_graph = kg
        distribution = default_query_distribution(llm, kg)
        shares, _ = calculate_split_values([p for _, p in distribution], n)
        for (synthesizer, _), share in zip(distribution, shares, strict=True):
            if share <= 0:
                continue
            try:
                testset = generator.generate(
                    testset_size=share,
                    query_distribution=[(synthesizer, 1.0)],
                    run_config=run_config,
                    raise_exceptions=False,
                )
            except Exception as exc:  # noqa: BLE001 - Ragas's failure of one synthesizer, recorded
                failures.append(f"{synthesizer.name}: {type(exc).__name__}: {exc}"[:300])
                if log:
                    log(f"ragas: {synthesizer.name} produced nothing ({failures[-1]})")
                continue
            samples += testset.samples
    finally:
        _close(client)
    rows = []
    for sample in samples:
        ev = sample.eval_sample
        question = str(getattr(ev, "user_input", "") or "").strip()
        answer = str(getattr(ev, "reference", "") or "").strip()
        if not question or question == "nan":
            continue
        contexts = [str(c) for c in (getattr(ev, "reference_contexts", None) or [])]
        rows.append((question, answer, contexts, str(sample.synthesizer_name)))
    return rows


def _close(client: Any) -> None:
    try:
        asyncio.run(client.close())
    except RuntimeError:  # an event loop is running (a notebook): leave it to the collector
        pass
