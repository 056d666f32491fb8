"""The Ragas-QA baseline (issue #49): Ragas's own testset generation on a user's records through an
OpenAI-compatible server, and another generator's items through MemSteer's checks."""

from __future__ import annotations

import hashlib
import json
import re

import numpy as np
import pytest
from supervision_helpers import audit_reply, endless, small_history

from memsteer_dspy.errors import ConfigError
from memsteer_dspy.lm.fake_server import FakeOpenAIServer
from memsteer_dspy.lm.serve import llama_server_format
from memsteer_dspy.runfolder import RunMismatchError
from memsteer_dspy.supervision.external import CHECKED, ExternalItem, check_external
from memsteer_dspy.supervision.outputs import load_qa_jsonl
from memsteer_dspy.systems.embed_server import EmbeddingServer

# -- a server that answers Ragas's prompts the way a (poor) LLM would ---------------------------


def _fill(schema, defs, words):
    """A value of ``schema`` whose strings are words of the prompt's input (so entities, themes
    and personas overlap between records, as Ragas needs to relate them)."""
    if "$ref" in schema:
        return _fill(defs[schema["$ref"].rsplit("/", 1)[-1]], defs, words)
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            options = [s for s in schema[key] if s.get("type") != "null"] or schema[key]
            return _fill(options[0], defs, words)
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        return {k: _fill(v, defs, words) for k, v in schema.get("properties", {}).items()}
    if kind == "array":
        return [_fill(schema.get("items", {"type": "string"}), defs, words) for _ in range(2)]
    return {"string": " ".join(words[:5]) or "garden", "integer": 4, "number": 0.9}.get(kind, True)


def ragas_answer(body):
    # either form: llama.cpp's (the embedded model's server) or OpenAI's (a server LM)
    fmt = llama_server_format(body.get("response_format")) or {}
    schema = fmt.get("schema") or {}
    text = " ".join(m["content"] for m in body["messages"] if isinstance(m.get("content"), str))
    given = {}
    if "input: {" in text:
        given = json.JSONDecoder().raw_decode(text[text.rindex("input: {") + 7 :])[0]
    props = list(schema.get("properties", {}))
    if props == ["mapping"]:  # personas to themes
        themes = given.get("themes", [])[:2]
        return json.dumps({"mapping": {p["name"]: themes for p in given.get("personas", [])}})
    if props == ["combinations"]:  # concepts across records, for multi-hop questions
        lists = given.get("lists_of_concepts", [])
        return json.dumps({"combinations": [[c[0] for c in lists[:2]]] if len(lists) > 1 else []})
    words = re.findall(r"[A-Z][a-z]{3,}", text)[-10:]
    return json.dumps(_fill(schema, schema.get("$defs", {}), words))


class HashEmbedder:
    """Bag-of-words vectors: records that share words are near."""

    def encode(self, texts):
        out = []
        for t in texts:
            v = np.zeros(64)
            for w in re.findall(r"\w+", t.lower()):
                v[int(hashlib.md5(w.encode()).hexdigest(), 16) % 64] += 1
            out.append(v / (np.linalg.norm(v) or 1.0))
        return out


def _history():
    from datetime import datetime

    from memsteer_dspy.records import Record

    extra = [
        Record(
            id=f"g{i}",
            kind="conversation_turn",
            thread_id=f"g{i}",
            timestamp=datetime(2024, 4, i + 1),
            author="Elena",
            text=f"User: Lila Nguyen and I planted {i + 3} Tomato seedlings in the Garden "
            f"behind Maple School; Oliver watered them on Saturday {i}.",
        )
        for i in range(5)
    ]
    return small_history(extra)


def test_llama_server_format_rewrites_only_openai_json_schema():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "A", "schema": schema, "strict": True}}
    assert llama_server_format(fmt) == {"type": "json_object", "schema": schema}
    assert llama_server_format({"type": "json_object"}) == {"type": "json_object"}
    assert llama_server_format(None) is None


def test_ragas_items_from_its_own_package_resume_and_refuse_other_settings(tmp_path):
    pytest.importorskip("ragas", reason="the [ragas] extra is not installed")
    from memsteer_dspy.systems.ragas_testset import ragas_items

    history = _history()
    ids = [r.id for r in history.records]
    out = tmp_path / "ragas"
    with (
        FakeOpenAIServer(alias="m", answer=ragas_answer) as llm,
        EmbeddingServer(HashEmbedder()) as emb,
    ):
        opts = dict(api_base=llm.api_base, model="m", embed_api_base=emb.api_base, lm_name="fake")
        items, summary = ragas_items(history, ids, out, n=4, **opts)
        first = len(llm.requests)

        # Ragas's own stages ran: per-record extraction, personas, scenarios, query synthesis
        assert first >= 4 * len(ids)
        # every chat request reached the server in the form llama.cpp binds with a grammar
        formats = [r.get("response_format") or {} for r in llm.requests]
        assert all(f.get("type") == "json_object" and f.get("schema") for f in formats)
        assert summary["samples"] == len(items) == 4
        assert summary["lm_calls"] == first and summary["prompt_tokens"] > 0
        assert {it.synthesizer for it in items} >= {"single_hop_specific_query_synthesizer"}
        for it in items:
            assert it.question and it.evidence_ids and set(it.evidence_ids) <= set(ids)
            assert it.contexts_unmatched == 0  # multi-hop contexts ("<1-hop>" tags) map back too
        assert (out / "ragas-cache").is_dir()

        # a finished run is read back without a call
        again, _ = ragas_items(history, ids, out, n=4, **opts)
        assert len(llm.requests) == first and again == items

        # interrupted before its items were written: Ragas's cache replays every extraction
        (out / "items.jsonl").unlink()
        (out / "summary.json").unlink()
        ragas_items(history, ids, out, n=4, **opts)
        asked_again = llm.requests[first:]
        extraction = {"text", "output", "entities"}  # summary, themes, named entities
        assert not [
            r
            for r in asked_again
            if set(r["response_format"]["schema"].get("properties", {})) & extraction
        ]

        with pytest.raises(RunMismatchError, match="options.n"):
            ragas_items(history, ids, out, n=5, **opts)
        with pytest.raises(ConfigError, match="not in the history"):
            ragas_items(history, ["nope"], tmp_path / "other", n=2, **opts)


def test_a_failed_ragas_synthesizer_costs_only_its_own_samples(tmp_path):
    """On the embedded model one looping reply failed Ragas's whole single-hop synthesizer, and
    Ragas's generate() then stopped on the failed job (TypeError): each synthesizer runs alone."""
    pytest.importorskip("ragas", reason="the [ragas] extra is not installed")
    from memsteer_dspy.systems.ragas_testset import ragas_items

    def broken_combinations(body):
        schema = (llama_server_format(body.get("response_format")) or {}).get("schema") or {}
        if list(schema.get("properties", {})) == ["combinations"]:
            return '{"combinations": [["unfinished'  # cut off, as at a max_tokens limit
        return ragas_answer(body)

    history = _history()
    ids = [r.id for r in history.records]
    with (
        FakeOpenAIServer(alias="m", answer=broken_combinations) as llm,
        EmbeddingServer(HashEmbedder()) as emb,
    ):
        items, summary = ragas_items(
            history,
            ids,
            tmp_path / "r",
            n=6,
            api_base=llm.api_base,
            model="m",
            embed_api_base=emb.api_base,
            lm_name="fake",
        )
    assert [f.split(":")[0] for f in summary["failed_synthesizers"]] == [
        "multi_hop_abstract_query_synthesizer"
    ]
    # the other synthesizers still ran (the single-hop one wrote its share)
    assert summary["samples"] == len(items) >= 2
    assert "multi_hop_abstract_query_synthesizer" not in summary["synthesizers"]
    assert summary["synthesizers"].get("single_hop_specific_query_synthesizer", 0) >= 2


def _items():
    return [
        ExternalItem("e1", "Which device did I use to write to Lila?", "MacBook Air", ("c1:1",)),
        ExternalItem("e2", "How many seed trays will Lila bring?", "12", ("c1:2",), "single"),
        ExternalItem("e3", "What did the summit decide?", "nothing", ()),
        ExternalItem("e4", "Who wrote?", "Lila", ("gone:1",)),
    ]


def test_check_external_without_checks_keeps_every_item_with_evidence(tmp_path):
    history = small_history()
    out = tmp_path / "nochecks"
    summary = check_external(history, _items(), {}, out, method="ragas", checks=False)
    assert summary["candidates"] == 4 and summary["accepted"] == 2
    assert summary["kept_fraction"] == 0.5
    assert summary["rejected_by_reason"] == {
        "external:no_evidence": 1,
        "external:evidence_not_in_history": 1,
    }
    kept = load_qa_jsonl(out / "train.jsonl") + load_qa_jsonl(out / "val.jsonl")
    assert sorted(q.id for q in kept) == ["e1", "e2"]
    assert all(q.source == "generated" and q.question_date is not None for q in kept)
    rejected = [json.loads(line) for line in (out / "rejected.jsonl").open()]
    assert {r["id"] for r in rejected} == {"e3", "e4"} and rejected[0]["question"]


def test_check_external_runs_the_audit_and_blind_read_and_resumes(tmp_path):
    history = small_history()
    out = tmp_path / "checks"
    auditor = endless(lambda i: audit_reply(facts=("R1.1",)))
    # a reader that answers "MacBook Air" from the first record whatever it is asked
    reader = endless(lambda i: {"cited_ids": ["R1"], "answer": "MacBook Air", "answerable": True})
    lms = {"auditor": auditor, "blind_reader": reader}
    items = _items()[:2]
    summary = check_external(history, items, lms, out, method="ragas", checks=True)
    assert summary["candidates"] == 2
    # the trays question is not answered "12" by the reader: the checks reject it
    rows = [json.loads(line) for line in (out / CHECKED).open()]
    by_id = {r["id"]: r for r in rows}
    assert by_id["e2"]["status"] == "rejected" and by_id["e2"]["reason"]
    assert summary["tokens_by_role"]["blind_reader"]["calls"] >= 1
    calls = len(reader.history)

    # a rerun checks nothing again; other items are another run
    check_external(history, items, lms, out, method="ragas", checks=True)
    assert len(reader.history) == calls
    assert len((out / CHECKED).read_text().splitlines()) == 2
    with pytest.raises(RunMismatchError):
        check_external(history, _items()[:3], lms, out, method="ragas", checks=True)

    # stopped after the first item, a rerun reads the second as the whole run did (same order)
    import shutil

    whole = str(reader.history[-1]["messages"])  # e2's blind read, the whole run's last call
    resumed = tmp_path / "resumed"
    shutil.copytree(out, resumed)
    (resumed / CHECKED).write_text((out / CHECKED).read_text().splitlines()[0] + "\n")
    reader2 = endless(lambda i: {"cited_ids": ["R1"], "answer": "MacBook Air", "answerable": True})
    lms2 = {"auditor": auditor, "blind_reader": reader2}
    check_external(history, items, lms2, resumed, method="ragas", checks=True)
    assert len(reader2.history) >= 1 and str(reader2.history[0]["messages"]) == whole


def test_supervision_ablation_runs_ragas_with_and_without_checks(rhelm_root, tmp_path, monkeypatch):
    """The ablation's Ragas-QA rows: Ragas on the seed records of a MemSteer run (its LLM the
    planner's, here at a fake server), the same Ragas items for both rows, MemSteer's checks on
    one of them, Ragas's tokens in the row's cost."""
    pytest.importorskip("ragas", reason="the [ragas] extra is not installed")
    from test_experiments import (
        World,
        load_script,
        no_stage_failed,
        official_answers,
        tiny,
        world_config,
    )

    import memsteer_dspy.memory.embedders as embedders
    from memsteer_dspy.lm.config import LMSpec

    monkeypatch.setattr(embedders, "load_embedder", lambda name: HashEmbedder())
    world = World(official_answers(rhelm_root, ["Elena_Morales"]))
    lm = world_config(world)
    panel = tmp_path / "panel.json"  # lexical designs only: no MiniLM index in a test
    panel.write_text(
        json.dumps(
            {
                "base-bm25": {},
                "long-dates": {"store": {"date_format": "long"}},
                "no-stemming": {"retrieve": {"bm25": {"stemmer": "none", "stopwords": "none"}}},
                "budget-1000": {"context": {"budget_tokens": 1000}},
            }
        )
    )
    cfg = tiny(
        rhelm_root,
        supervision_ablation={
            "methods": ["ragas"],
            "downstream": False,
            "steering": True,
            "steering_panel": str(panel),
        },
    )
    out = tmp_path / "abl"
    with FakeOpenAIServer(alias="m", answer=ragas_answer) as server:
        lm._specs["planner"] = LMSpec(model="openai/m", api_base=server.api_base)
        load_script("supervision_ablation").run(cfg, out, lm_config=lm, progress=False)
        asked = len(server.requests)
    data = json.loads((out / "results.json").read_text())
    no_stage_failed(data)
    conds = data["conditions"]
    assert set(conds) == {"ragas-checks", "ragas-nochecks"}
    ragas = out / "supervision" / "ragas" / "Elena_Morales"
    ragas_summary = json.loads((ragas / "summary.json").read_text())
    assert asked == ragas_summary["lm_calls"] > 0  # one Ragas run serves both rows
    # Ragas's calls are booked to the stage that made them
    stage = next(s for s in data["stages"] if s["name"] == "ragas-nochecks: generate")
    assert stage["calls"] >= asked
    for key, cond in conds.items():
        folder = out / "supervision" / key / "Elena_Morales"
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["method"] == "ragas" and summary["checks"] == cond["checks"]
        assert cond["candidates"] == summary["candidates"] == ragas_summary["samples"]
        assert cond["tokens_per_item"] is None or cond["tokens_per_item"] > 0
    # without checks every item with evidence is kept; with them, no more than that
    assert conds["ragas-checks"]["accepted"] <= conds["ragas-nochecks"]["accepted"]
    md = (out / "results.md").read_text()
    assert "Ragas-QA" in md
    # the steering stage scored the panel on the kept items against the official QA
    steer = conds["ragas-nochecks"]["steering"]["Elena_Morales"]
    assert steer["items"] == conds["ragas-nochecks"]["accepted"] > 0
    assert "base_r10_reference" in steer and steer["base_r10_reference"] is not None
    assert "## Steering" in md
