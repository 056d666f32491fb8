"""MemorySystem: each store / index / query / rerank / context option changes behaviour visibly."""

from __future__ import annotations

import json

import pytest
from memory_fixtures import ScriptedLM, field_value, signature_of, small_history

from memsteer_dspy.errors import ConfigError, InputError
from memsteer_dspy.memory import MemoryDesign, MemorySystem
from memsteer_dspy.memory.index import rrf_fuse, top_k
from memsteer_dspy.tokens import count_tokens


def design(**sections) -> MemoryDesign:
    return MemoryDesign.from_dict(sections)


def build(d: MemoryDesign, **kw) -> MemorySystem:
    return MemorySystem.from_design(d, small_history(), **kw)


def answering_lm(answer="red"):
    return ScriptedLM(lambda system, user: {"answer": answer})


# --------------------------------------------------------------------------------------------
# store
# --------------------------------------------------------------------------------------------


def test_record_units_one_per_record():
    s = build(MemoryDesign.base_bm25())
    assert len(s.store) == 12
    assert all(u.record_ids == [u.id] for u in s.store.units)


def test_window_units_cover_every_record_with_overlap():
    s = build(design(store={"unit": "window", "window_size": 2, "window_stride": 1}))
    ids = [u.id for u in s.store.units]
    assert "s1[0:2]" in ids and "s1[1:3]" in ids and "s1[2:4]" in ids
    assert s.store.units[ids.index("s1[1:3]")].record_ids == ["s1:2", "s1:3"]
    assert set(s.store.units_of_record) == {r.id for r in small_history().records}
    # stride 2 over 4 records: windows [0:2] and [2:4]; the 3-record session fits one unit
    s2 = build(design(store={"unit": "window", "window_size": 2, "window_stride": 2}))
    assert [u.id for u in s2.store.units if u.thread_id == "s1"] == ["s1[0:2]", "s1[2:4]"]


def test_thread_units_hold_whole_sessions():
    s = build(design(store={"unit": "thread"}))
    by_id = {u.id: u for u in s.store.units}
    assert by_id["thread:s1"].record_ids == ["s1:1", "s1:2", "s1:3", "s1:4"]
    assert len(s.store) == 5  # s1, s2, s3, doc.md, mail-thread


def test_section_units_cut_long_records():
    s = build(design(store={"unit": "section", "section_max_tokens": 32}))
    budget_units = [u for u in s.store.units if u.record_ids == ["doc.md:Budget"]]
    assert len(budget_units) >= 2
    assert all(u.id.startswith("doc.md:Budget§") for u in budget_units)
    assert all(count_tokens(u.parts[0].text) <= 32 for u in budget_units)
    assert "# Budget" in budget_units[0].parts[0].text


def test_indexed_fields_change_what_matches():
    # "Elena" is only the email's author: found when author is indexed, not otherwise
    with_author = build(MemoryDesign.base_bm25()).retrieve("Elena")
    without = build(design(store={"fields": ["text", "date"]})).retrieve("Elena")
    assert with_author.ranked_unit_ids == ["mail:1"]
    assert without.ranked_unit_ids == []
    assert without.empty_context and without.context == ""


def _facts_handler(system, user):
    if signature_of(system) != "facts":
        return {"answer": "x"}
    ids = [r["id"] for r in json.loads(field_value(user, "records"))]
    facts = [
        {"text": f"Fact about {rid}: bicycle owner", "record_ids": [rid]}
        for rid in ids
        if rid != "s1:3"
    ]
    facts.append(
        {"text": "Invented fact", "record_ids": ["not-a-record"]}
    )  # dropped: no valid source
    return {"facts": facts}


def test_fact_units_keep_their_source_records():
    lm = ScriptedLM(_facts_handler)
    s = build(design(store={"unit": "facts", "facts_batch": 4}), lms={"answerer": lm})
    assert all(u.kind == "facts" for u in s.store.units)
    assert len(s.store) == 11  # one fact per record except s1:3; the invented one dropped
    assert {tuple(u.record_ids) for u in s.store.units} == {
        (r.id,) for r in small_history().records if r.id != "s1:3"
    }
    assert (
        len(lm.calls) == 5
    )  # one call per thread batch: s1 (4 records), doc.md, s2, the email, s3
    # the record the extractor ignored is not stored; lookup says so
    assert s.lookup("s1:3").stored is False
    assert s.lookup("s1:1").stored is True


def test_fact_extraction_failure_keeps_records_and_is_reported():
    def handler(system, user):
        if "s2:1" in user:
            raise RuntimeError("LM down")
        return _facts_handler(system, user)

    s = build(design(store={"unit": "facts"}), lms={"answerer": ScriptedLM(handler)})
    assert s.store.report.failures and s.store.report.failures[0]["record_ids"] == [
        "s2:1",
        "s2:2",
        "s2:3",
    ]
    assert "LM down" in s.store.report.failures[0]["reason"]
    kinds = {u.id: u.kind for u in s.store.units}
    assert kinds["s2:1"] == "record"


def test_facts_need_an_lm():
    with pytest.raises(ConfigError, match="store.unit=facts"):
        build(design(store={"unit": "facts"}))


# --------------------------------------------------------------------------------------------
# index
# --------------------------------------------------------------------------------------------


def test_bm25_stemming_changes_matches():
    stem = build(MemoryDesign.base_bm25()).retrieve("bicycles sold")
    plain = build(design(retrieve={"bm25": {"stemmer": "none"}})).retrieve("bicycles sold")
    assert "s3:1" in stem.ranked_unit_ids[:1]
    assert "s1:1" in stem.ranked_unit_ids  # 'bicycles' ~ 'bicycle' only with stemming
    assert "s1:1" not in plain.ranked_unit_ids


def test_bm25_parameters_change_scores():
    a = build(MemoryDesign.base_bm25()).retrieve("bicycle")
    b = build(design(retrieve={"bm25": {"k1": 0.2, "b": 0.0}})).retrieve("bicycle")
    assert a.scores != b.scores


def test_dense_index_finds_paraphrases_bm25_misses():
    q = "pushbike purchase"  # no word in common with the records
    bm25 = build(MemoryDesign.base_bm25()).retrieve(q)
    dense = build(
        design(retrieve={"index": "dense", "dense": {"embedder": "wordllama"}, "top_k": 3})
    ).retrieve(q)
    assert bm25.ranked_unit_ids == []
    assert len(dense.ranked_unit_ids) == 3 and dense.scores == sorted(dense.scores, reverse=True)


def test_hybrid_fuses_both_rankings():
    q = "Anna conference"
    b = build(MemoryDesign.base_bm25()).retrieve(q).ranked_unit_ids
    d = (
        build(design(retrieve={"index": "dense", "dense": {"embedder": "wordllama"}}))
        .retrieve(q)
        .ranked_unit_ids
    )
    h = (
        build(design(retrieve={"index": "hybrid", "dense": {"embedder": "wordllama"}}))
        .retrieve(q)
        .ranked_unit_ids
    )
    expected, _ = rrf_fuse([b, d], [1.0, 1.0], 20, 60)
    assert h == expected[: len(h)]
    only_bm25 = build(
        design(retrieve={"index": "hybrid", "dense": {"embedder": "wordllama"}, "dense_weight": 0})
    )
    assert only_bm25.retrieve(q).ranked_unit_ids[: len(b)] == b


def test_minilm_default_embedder_loads_offline():
    s = build(design(retrieve={"index": "dense", "top_k": 2}))
    t = s.retrieve("Who is travelling to a science meeting in Portugal?")
    assert t.ranked_unit_ids[0] in {"s2:2", "mail:1"}


def test_hub_names_fail_fast_with_how_to_point_at_a_local_copy():
    with pytest.raises(InputError) as info:
        build(design(retrieve={"index": "dense", "dense": {"embedder": "BAAI/bge-m3"}}))
    assert info.value.field == "retrieve.dense.embedder"
    assert "--local-dir" in info.value.hint
    with pytest.raises(InputError) as info:
        build(
            design(
                retrieve={"rerank": "cross_encoder", "reranker_model": "BAAI/bge-reranker-v2-m3"}
            )
        )
    assert info.value.field == "retrieve.reranker_model"


def test_top_k_helper_respects_mask_and_clamps():
    import numpy as np

    idx, scores = top_k(
        np.array([0.5, 2.0, 1.0, 0.0]), 10, np.array([True, False, True, True]), min_score=0.0
    )
    assert idx == [2, 0] and scores == [1.0, 0.5]


# --------------------------------------------------------------------------------------------
# query strategies and rerank
# --------------------------------------------------------------------------------------------


def _query_handler(system, user):
    sig = signature_of(system)
    if sig == "rewrite":
        return {"query": "dentist Tuesday"}
    if sig == "decompose":
        return {"sub_questions": ["When is the dentist?", "Where is the conference?"]}
    if sig == "hyde":
        return {"records": ["Rent is paid monthly in euros."]}
    if sig == "multi_query":
        return {"queries": ["novel lighthouse keeper", "book reading"]}
    return {"answer": "x"}


@pytest.mark.parametrize(
    ("strategy", "expected_query", "expected_hit"),
    [
        ("rewrite", "dentist Tuesday", "s2:1"),
        ("decompose", "When is the dentist?", "s2:1"),
        ("hyde", "Rent is paid monthly in euros.", "doc.md:Budget"),
        ("multi_query", "novel lighthouse keeper", "s2:3"),
    ],
)
def test_query_strategies_search_with_lm_queries(strategy, expected_query, expected_hit):
    question = "Xyzzy plugh?"  # matches nothing by itself
    raw = build(MemoryDesign.base_bm25()).retrieve(question)
    assert raw.ranked_unit_ids == [] and raw.queries == [question]
    lm = ScriptedLM(_query_handler)
    s = build(design(retrieve={"query": strategy}), lms={"answerer": lm})
    t = s.retrieve(question, question_date="2024-06-01")
    assert t.queries[0] == question and expected_query in t.queries
    assert expected_hit in t.ranked_unit_ids
    assert "2024-06-01" in lm.calls[0]["user"]


def test_query_strategy_without_lm_is_refused():
    with pytest.raises(ConfigError, match="retrieve.query"):
        build(design(retrieve={"query": "hyde"}))


def test_llm_listwise_rerank_reorders_candidates():
    def handler(system, user):
        cands = json.loads(field_value(user, "candidates"))
        return {"ranked_ids": [c["id"] for c in reversed(cands)]}

    q = "bicycle Anna Tom"
    plain = build(MemoryDesign.base_bm25()).retrieve(q).ranked_unit_ids
    lm = ScriptedLM(handler)
    rr = (
        build(design(retrieve={"rerank": "llm", "rerank_top": 20}), lms={"answerer": lm})
        .retrieve(q)
        .ranked_unit_ids
    )
    assert rr == list(reversed(plain))
    assert "treat" not in lm.calls[0]["user"]  # candidates are data fields, not instructions


def test_llm_rerank_ignores_unknown_ids_and_keeps_the_rest():
    lm = ScriptedLM(lambda s, u: {"ranked_ids": ["3", "99", "3", "x"]})
    plain = build(MemoryDesign.base_bm25()).retrieve("bicycle Anna Tom").ranked_unit_ids
    rr = (
        build(design(retrieve={"rerank": "llm"}), lms={"answerer": lm})
        .retrieve("bicycle Anna Tom")
        .ranked_unit_ids
    )
    assert rr[0] == plain[2] and sorted(rr) == sorted(plain)


@pytest.fixture(scope="module")
def tiny_cross_encoder(tmp_path_factory):
    """A randomly initialised 1-layer BERT cross-encoder saved locally (MiniLM's tokenizer)."""
    transformers = pytest.importorskip("transformers")
    from memsteer_dspy.memory.embedders import minilm_path

    folder = tmp_path_factory.mktemp("tiny-reranker")
    cfg = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=1,
    )
    transformers.set_seed(0)
    transformers.BertForSequenceClassification(cfg).save_pretrained(folder)
    transformers.AutoTokenizer.from_pretrained(str(minilm_path())).save_pretrained(folder)
    return folder


def test_cross_encoder_rerank_orders_by_model_score(tiny_cross_encoder):
    from memsteer_dspy.memory.embedders import LocalCrossEncoder

    q = "bicycle Anna Tom"
    d = design(retrieve={"rerank": "cross_encoder", "reranker_model": str(tiny_cross_encoder)})
    s = build(d)
    t = s.retrieve(q)
    ce = LocalCrossEncoder(str(tiny_cross_encoder))
    scores = ce.score(q, s.retriever.candidate_texts(t.ranked_unit_ids))
    assert t.scores == pytest.approx(scores)
    assert t.scores == sorted(t.scores, reverse=True)


# --------------------------------------------------------------------------------------------
# top-k, expansion, time filter
# --------------------------------------------------------------------------------------------


def test_top_k_larger_than_the_store_is_clamped():
    s = build(design(retrieve={"top_k": 1000, "pool": 1000}))
    t = s.retrieve("the")  # a stopword only: nothing matches
    assert t.ranked_unit_ids == [] and t.empty_context
    t = s.retrieve("bicycle Anna Tom dentist Lisbon rent novel soup fence Porto")
    assert len(t.ranked_unit_ids) == len(set(t.ranked_unit_ids)) <= 12


def test_neighbour_expansion_adds_thread_neighbours():
    plain = build(design(retrieve={"top_k": 1})).retrieve("lentil soup")
    assert plain.ranked_unit_ids == ["s1:3"]
    exp = build(design(retrieve={"top_k": 1, "expand_neighbors": 1})).retrieve("lentil soup")
    assert exp.ranked_unit_ids == ["s1:3", "s1:2", "s1:4"]


def test_time_filter_uses_the_question_date():
    s = build(MemoryDesign.base_bm25())
    later = s.retrieve("red bicycle", question_date="2024-04-01").ranked_unit_ids
    assert "s3:1" in later
    before_sale = s.retrieve(
        "red bicycle", question_date="2024-03-20"
    ).ranked_unit_ids  # strictly before
    assert "s3:1" not in before_sale and "s1:1" in before_sale
    no_filter = build(design(retrieve={"time_filter": False})).retrieve(
        "red bicycle", question_date="2024-03-20"
    )
    assert "s3:1" in no_filter.ranked_unit_ids
    # the protocol's as_of cut-off applies even when the design does not filter
    assert (
        "s3:1"
        not in build(design(retrieve={"time_filter": False}))
        .retrieve("red bicycle", as_of="2024-03-01")
        .ranked_unit_ids
    )


def test_time_filter_drops_future_parts_of_a_unit():
    from memory_fixtures import rec

    from memsteer_dspy.records import History

    h = History(
        "u",
        [
            rec("t:1", "The red bicycle was bought.", "2024-01-01", "t", 1),
            rec("t:2", "The red bicycle was sold.", "2024-02-01", "t", 2),
        ],
    )
    s = MemorySystem.from_design(design(store={"unit": "thread"}), h)
    early = s.retrieve("red bicycle", question_date="2024-01-15")
    assert early.ranked_unit_ids == ["thread:t"] and early.ranked_record_ids == [["t:1"]]
    assert "sold" not in early.context and "bought" in early.context
    late = s.retrieve("red bicycle", question_date="2024-03-01")
    assert late.ranked_record_ids == [["t:1", "t:2"]] and "sold" in late.context
    assert s.retrieve("red bicycle", question_date="2024-01-01").ranked_unit_ids == []


# --------------------------------------------------------------------------------------------
# context
# --------------------------------------------------------------------------------------------


Q_MANY = "bicycle Anna Tom dentist Lisbon rent"


def test_context_budget_is_enforced_with_the_tokenizer():
    full = build(MemoryDesign.base_bm25()).retrieve(Q_MANY)
    assert not full.context_truncated
    truncated = 0
    for budget in range(64, full.context_tokens, 7):
        t = build(design(context={"budget_tokens": budget})).retrieve(Q_MANY)
        assert 0 < t.context_tokens <= budget
        assert count_tokens(t.context) == t.context_tokens
        assert len(t.delivered_record_ids) < len(full.delivered_record_ids)
        truncated += t.context_truncated
    assert truncated  # some budget cut a unit mid-way


def test_context_order_options():
    q = "bicycle Anna Tom"
    ranked = build(MemoryDesign.base_bm25()).retrieve(q)
    chrono = build(design(context={"order": "chronological"})).retrieve(q)
    assert chrono.ranked_unit_ids == ranked.ranked_unit_ids  # ordering is a context choice
    assert chrono.delivered_record_ids != ranked.delivered_record_ids
    days = [small_history()[r].timestamp for r in chrono.delivered_record_ids]
    assert days == sorted(days)
    grouped = build(design(context={"order": "thread"})).retrieve(q).delivered_record_ids
    threads = [small_history()[r].thread_id for r in grouped]
    assert threads == sorted(threads, key=threads.index)  # each thread contiguous


def test_context_formatting_options():
    q = "lentil soup"
    with_ids = build(MemoryDesign.base_bm25()).retrieve(q).context
    assert with_ids.startswith("[s1:3 | 2024-01-05 | user]\n")
    bare = (
        build(design(context={"show_ids": False, "show_dates": False, "show_author": False}))
        .retrieve(q)
        .context
    )
    assert bare == "We had lentil soup for dinner afterwards."
    kind = build(design(context={"show_kind": True})).retrieve(q).context
    assert "conversation_turn" in kind


def test_context_dedupes_records_of_overlapping_units():
    d = {"store": {"unit": "window", "window_size": 3, "window_stride": 1}}
    deduped = build(design(**d)).retrieve("bicycle Anna")
    dup = build(design(**d, context={"dedupe": False})).retrieve("bicycle Anna")
    assert deduped.context.count("My sister Anna said") == 1
    assert dup.context.count("My sister Anna said") > 1


def test_truncate_last_option():
    q = "rent groceries euros"  # the long budget section ranks first
    full = build(MemoryDesign.base_bm25()).retrieve(q)
    budget = 64
    assert count_tokens(full.context.split("\n\n")[0]) > budget
    cut = build(design(context={"budget_tokens": budget})).retrieve(q)
    drop = build(design(context={"budget_tokens": budget, "truncate_last": False})).retrieve(q)
    assert cut.ranked_unit_ids[0] == "doc.md:Budget"
    assert cut.context_truncated and cut.delivered_record_ids == ["doc.md:Budget"]
    assert cut.context.startswith("[doc.md:Budget | 2024-02-01]\n# Budget\nRent is 900 euros")
    assert drop.context == "" and drop.delivered_record_ids == [] and drop.empty_context


# --------------------------------------------------------------------------------------------
# answering, trace, verification
# --------------------------------------------------------------------------------------------


def test_prediction_carries_its_trace():
    lm = answering_lm("red")
    s = build(MemoryDesign.base_bm25(), lms={"answerer": lm})
    pred = s("What colour was the bicycle I bought?", question_date="2024-03-01")
    t = pred.trace
    assert pred.answer == "red" == t.answer == t.draft_answer
    assert t.ranked_unit_ids and t.ranked_record_ids[0] and t.delivered_record_ids
    assert t.context and t.context in lm.calls[0]["user"]
    assert t.question_date == "2024-03-01" and t.cutoff == "2024-03-01"


def test_empty_retrieval_gives_an_empty_context_not_a_crash():
    lm = answering_lm("I don't know")
    s = build(MemoryDesign.base_bm25(), lms={"answerer": lm})
    pred = s("zzz qqq")
    assert pred.trace.empty_context and pred.trace.context == ""
    assert pred.answer == "I don't know"


def test_answer_verification_revises_the_draft():
    def handler(system, user):
        if signature_of(system) == "verify":
            assert field_value(user, "draft_answer") == "blue"
            return {"supported": False, "answer": "red"}
        return {"answer": "blue"}

    lm = ScriptedLM(handler)
    s = build(design(answer={"verify": True}), lms={"answerer": lm})
    pred = s("What colour was the bicycle?")
    assert (
        pred.answer == "red" and pred.trace.draft_answer == "blue" and pred.trace.verified is False
    )
    assert len(lm.calls) == 2


def test_answering_without_an_lm_is_refused_but_retrieval_works():
    s = build(MemoryDesign.base_bm25())
    assert s.retrieve("bicycle").ranked_unit_ids
    with pytest.raises(ConfigError, match="answerer"):
        s("bicycle")


def test_separate_lms_per_part():
    answer_lm = answering_lm("red")
    query_lm = ScriptedLM(_query_handler)
    s = build(design(retrieve={"query": "rewrite"}), lms={"answerer": answer_lm, "query": query_lm})
    s("Remind me")
    assert [signature_of(c["system"]) for c in query_lm.calls] == ["rewrite"]
    assert [signature_of(c["system"]) for c in answer_lm.calls] == ["answer"]


# --------------------------------------------------------------------------------------------
# persistence and lookup
# --------------------------------------------------------------------------------------------


def test_index_is_reused_across_designs_that_change_only_retrieval(tmp_path):
    a = build(MemoryDesign.base_bm25(), cache_dir=tmp_path)
    assert a.build_info["store"] == "built" and a.build_info["bm25"] == "built"
    b = build(
        design(retrieve={"top_k": 3, "expand_neighbors": 1}, context={"order": "thread"}),
        cache_dir=tmp_path,
    )
    assert b.build_info["store"] == "loaded" and b.build_info["bm25"] == "loaded"
    assert b.retrieve("bicycle").ranked_unit_ids[0] == a.retrieve("bicycle").ranked_unit_ids[0]
    c = build(design(retrieve={"bm25": {"k1": 1.0}}), cache_dir=tmp_path)
    assert c.build_info["store"] == "loaded" and c.build_info["bm25"] == "built"
    d = build(design(store={"unit": "thread"}), cache_dir=tmp_path)
    assert d.build_info["store"] == "built"
    # a different history never reuses another's index
    other = MemorySystem.from_design(
        MemoryDesign.base_bm25(),
        small_history().filter(lambda r: r.id != "s1:1"),
        cache_dir=tmp_path,
    )
    assert other.build_info["store"] == "built"
    assert "s1:1" not in other.retrieve("red bicycle market").ranked_unit_ids


def test_corrupt_cached_index_is_rebuilt(tmp_path):
    a = build(MemoryDesign.base_bm25(), cache_dir=tmp_path)
    folder = next(p for p in tmp_path.rglob("bm25-*") if p.is_dir())
    for f in folder.glob("*.npy"):
        f.write_bytes(b"garbage")
    b = build(MemoryDesign.base_bm25(), cache_dir=tmp_path)
    assert b.build_info["bm25"] == "built"
    assert b.retrieve("bicycle").ranked_unit_ids == a.retrieve("bicycle").ranked_unit_ids


def test_lookup_reports_storage_and_retrievability():
    s = build(MemoryDesign.base_bm25())
    found = s.lookup("s2:2", question="Where is Anna's conference?")
    assert (
        found.stored and found.unit_ids == ["s2:2"] and found.retrievable and found.self_rank == 1
    )
    assert found.question_rank is not None
    future = s.lookup("s3:1", question_date="2024-03-01")
    assert future.stored and not future.visible and not future.retrievable
    assert s.lookup("nope").in_history is False
    assert "not in the history" in s.lookup("nope").summary()
