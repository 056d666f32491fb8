"""MemoryDesign: the paper's Base-BM25, JSON round trips, keys, and validation messages."""

from __future__ import annotations

import json

import pytest

from memsteer_dspy.errors import InputError
from memsteer_dspy.memory import MemoryDesign, design_json_schema
from memsteer_dspy.memory.design import DEFAULT_CONTEXT_BUDGET


def test_base_bm25_is_the_papers_starting_system():
    d = MemoryDesign.base_bm25()
    assert d.store.unit == "record"
    assert "text" in d.store.fields and {"author", "date", "subject"} <= set(d.store.fields)
    assert d.retrieve.index == "bm25" and d.retrieve.query == "raw" and d.retrieve.rerank == "none"
    assert d.context.order == "rank" and d.context.budget_tokens == DEFAULT_CONTEXT_BUDGET
    assert d.answer.verify is False
    assert d.lm_uses(answering=False) == []
    assert d.lm_uses() == ["answer"]


def test_json_round_trip_and_stable_keys(tmp_path):
    d = MemoryDesign.base_bm25()
    path = tmp_path / "d.json"
    d.save(path)
    back = MemoryDesign.load(path)
    assert back == d and back.key() == d.key()
    # the name is a label, not identity
    assert d.model_copy(update={"name": "other"}).key() == d.key()


def test_indexed_fields_are_a_set_and_base_bm25_keeps_its_key():
    """A reordering of store.fields is the same design (the store reads them as a set): same key,
    so a proposer that only reorders them writes a duplicate, not a new candidate (seen on the
    shared RHELM run: one iteration scored such a reordering, with identical results). Base-BM25's
    key is pinned: run folders record it, and a changed key would refuse every resume."""
    base = MemoryDesign.base_bm25()
    assert base.key() == "b2f7082d0a99b4fb"
    moved = MemoryDesign.from_dict(
        {"store": {"fields": ["author", "date", "subject", "kind", "thread_title", "text"]}}
    )
    assert moved.key() == base.key() and moved.store.fields == base.store.fields
    subset = MemoryDesign.from_dict({"store": {"fields": ["date", "text"]}})
    assert subset.store.fields == ["text", "date"] and subset.key() != base.key()
    with pytest.raises(InputError, match="twice"):
        MemoryDesign.from_dict({"store": {"fields": ["text", "date", "date"]}})


def test_keys_separate_store_index_and_retrieval_changes():
    base = MemoryDesign.base_bm25()
    retrieval_only = MemoryDesign.from_dict(
        {
            "retrieve": {"top_k": 5, "pool": 30, "expand_neighbors": 1},
            "context": {"order": "chronological"},
        }
    )
    assert retrieval_only.key() != base.key()
    assert retrieval_only.index_key() == base.index_key()
    assert retrieval_only.store_key() == base.store_key()
    new_bm25 = MemoryDesign.from_dict({"retrieve": {"bm25": {"k1": 0.9}}})
    assert new_bm25.store_key() == base.store_key() and new_bm25.index_key() != base.index_key()
    # dense settings do not matter to a BM25 index
    assert (
        MemoryDesign.from_dict({"retrieve": {"dense": {"embedder": "wordllama"}}}).index_key()
        == base.index_key()
    )
    new_store = MemoryDesign.from_dict({"store": {"unit": "window"}})
    assert new_store.store_key() != base.store_key() and new_store.index_key() != base.index_key()


def _error(data) -> InputError:
    with pytest.raises(InputError) as info:
        MemoryDesign.from_dict(data, source="design.json")
    return info.value


def test_unknown_value_names_the_field_and_the_allowed_values():
    err = _error({"retrieve": {"index": "faiss"}})
    assert err.field == "retrieve.index"
    assert "'bm25'" in err.hint and "'dense'" in err.hint and "'hybrid'" in err.hint
    assert err.file == "design.json"


def test_unknown_field_lists_the_allowed_fields():
    err = _error({"retrieve": {"topk": 5}})
    assert err.field == "retrieve.topk"
    assert "unknown field" in err.message and "top_k" in err.hint


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"retrieve": {"pool": 5, "top_k": 10}}, "retrieve.pool", "top_k"),
        ({"retrieve": {"rerank": "cross_encoder"}}, "retrieve.reranker_model", "cross_encoder"),
        (
            {"store": {"unit": "window", "window_size": 2, "window_stride": 3}},
            "store.window_stride",
            "skips",
        ),
        ({"store": {"fields": ["author", "date"]}}, "store.fields", "text"),
        (
            {"retrieve": {"index": "hybrid", "bm25_weight": 0, "dense_weight": 0}},
            "retrieve.bm25_weight",
            "both",
        ),
        ({"retrieve": {"top_k": 0}}, "retrieve.top_k", "greater"),
    ],
)
def test_impossible_combinations_are_rejected_with_the_field(data, field, words):
    err = _error(data)
    assert err.field == field
    assert words in err.message


def test_bad_json_names_the_line(tmp_path):
    path = tmp_path / "d.json"
    path.write_text('{\n  "store": {"unit": "record",}\n}')
    with pytest.raises(InputError) as info:
        MemoryDesign.load(path)
    assert info.value.line == 2 and str(path) in str(info.value)


def test_schema_is_readable_by_a_proposer():
    schema = design_json_schema()
    text = json.dumps(schema)
    for word in (
        "store",
        "retrieve",
        "context",
        "answer",
        "hyde",
        "cross_encoder",
        "budget_tokens",
    ):
        assert word in text
    retrieve = schema["$defs"]["RetrieveSpec"]["properties"]
    assert all("description" in v for k, v in retrieve.items() if k not in ("bm25", "dense"))
    assert retrieve["query"]["enum"] == ["raw", "rewrite", "decompose", "hyde", "multi_query"]
