"""The design proposer: the ProposeDesign prompt, invalid proposals sent back once, duplicates
re-sampled with a new rollout id above temperature 0, the fixed context budget."""

from __future__ import annotations

import json

import pytest
from memory_fixtures import field_value
from optimize_fixtures import ProposerLM, changed, proposal

from memsteer_dspy.memory import MemoryDesign
from memsteer_dspy.optimize.proposer import (
    DesignProposer,
    RevisionEntry,
    design_diff,
    design_space_schema,
    render_history,
)

BASE = MemoryDesign.base_bm25()
SEEN = {BASE.key(): "iteration 0 (baseline)"}
HISTORY = [RevisionEntry(iteration=0, status="baseline", score="acc 0.300")]


def test_the_prompt_carries_design_schema_history_and_feedback():
    lm = ProposerLM([proposal(changed(retrieve__top_k=30), "more units")])
    out = DesignProposer(lm)(BASE, HISTORY, "Case 1: retrieval failure ...", seen=SEEN, iteration=1)
    assert out.status == "ok" and out.design.retrieve.top_k == 30 and out.rationale == "more units"
    user = lm.calls[0]["user"]
    assert json.loads(field_value(user, "current_design")) == BASE.model_dump(mode="json")
    schema = json.loads(field_value(user, "design_space"))
    assert "retrieve" in schema["properties"] and '"title":' not in json.dumps(schema)
    assert "iteration 0: BASELINE (acc 0.300)" in field_value(user, "revision_history")
    assert field_value(user, "feedback") == "Case 1: retrieval failure ..."
    assert out.attempts[0].kind == "ok" and out.attempts[0].design_key == out.design.key()


def test_an_invalid_design_is_sent_back_once_with_the_validation_error():
    bad = changed(retrieve__pool=5)  # pool < top_k (20)
    lm = ProposerLM([proposal(bad), proposal(changed(retrieve__top_k=5))])
    out = DesignProposer(lm)(BASE, HISTORY, "fb", seen=SEEN, iteration=2)
    assert out.status == "ok" and out.design.retrieve.top_k == 5
    assert [a.kind for a in out.attempts] == ["invalid", "ok"]
    assert "retrieve.pool" in out.attempts[0].error and out.attempts[0].raw
    resent = field_value(lm.calls[1]["user"], "revision_history")
    assert (
        "not a valid design" in resent
        and "retrieve.pool (5) must be >= retrieve.top_k (20)" in resent
    )


def test_still_invalid_after_the_second_try_gives_an_invalid_proposal():
    lm = ProposerLM([proposal(changed(store__unit="paragraph")), "this is not JSON at all"])
    out = DesignProposer(lm)(BASE, HISTORY, "fb", seen=SEEN, iteration=3)
    assert out.status == "invalid" and out.design is None
    assert [a.kind for a in out.attempts] == ["invalid", "invalid"]
    assert "store.unit" in out.attempts[0].error
    assert len(lm.calls) == 2


def test_a_duplicate_is_resampled_with_rollout_id_and_temperature_and_named_in_the_history():
    lm = ProposerLM(
        [
            proposal(BASE),
            proposal(changed(retrieve__top_k=40)),
            proposal(changed(retrieve__top_k=41)),
        ]
    )
    seen = {
        **SEEN,
        MemoryDesign.from_dict(changed(retrieve__top_k=40)).key(): "iteration 4 (rejected)",
    }
    out = DesignProposer(lm, resample_temperature=0.7)(BASE, HISTORY, "fb", seen=seen, iteration=5)
    assert out.status == "ok" and out.design.retrieve.top_k == 41
    assert [a.kind for a in out.attempts] == ["duplicate", "duplicate", "ok"]
    assert [a.duplicate_of for a in out.attempts[:2]] == [
        "iteration 0 (baseline)",
        "iteration 4 (rejected)",
    ]
    assert lm.calls[0]["kwargs"] == {}  # the first call is as configured
    rollouts = [c["kwargs"].get("rollout_id") for c in lm.calls[1:]]
    assert len(set(rollouts)) == 2 and None not in rollouts
    assert all(c["kwargs"]["temperature"] >= 0.7 for c in lm.calls[1:])
    history = field_value(lm.calls[2]["user"], "revision_history")
    assert "identical to the design of iteration 0 (baseline)" in history
    assert "identical to the design of iteration 4 (rejected)" in history


def test_a_proposal_that_keeps_repeating_gives_a_duplicate_outcome():
    lm = ProposerLM([proposal(BASE)] * 3)
    out = DesignProposer(lm, max_resamples=2)(BASE, HISTORY, "fb", seen=SEEN, iteration=1)
    assert out.status == "duplicate" and len(lm.calls) == 3
    assert "iteration 0 (baseline)" in out.error


def test_the_context_budget_is_pinned_to_the_fixed_budget():
    lm = ProposerLM(
        [proposal(changed(context__budget_tokens=20000, retrieve__top_k=50, retrieve__pool=60))]
    )
    out = DesignProposer(lm, fixed_budget=4000)(BASE, HISTORY, "fb", seen=SEEN, iteration=1)
    assert (
        out.status == "ok"
        and out.design.context.budget_tokens == 4000
        and out.design.retrieve.top_k == 50
    )
    assert "pinned back" in out.attempts[0].notes[0]


def test_an_lm_failure_is_a_failed_proposal_not_an_exception():
    lm = ProposerLM([ConnectionError("server down")])
    out = DesignProposer(lm)(BASE, HISTORY, "fb", seen=SEEN, iteration=1)
    assert out.status == "failed" and "server down" in out.error


def test_design_diff_and_history_rendering():
    new = MemoryDesign.from_dict(changed(retrieve__top_k=30, store__unit="window"))
    assert design_diff(BASE, new) == [
        "retrieve.top_k: 20 -> 30",
        'store.unit: "record" -> "window"',
    ]
    entries = HISTORY + [
        RevisionEntry(
            iteration=i,
            status="rejected",
            changes=[f"retrieve.top_k: 20 -> {i}"],
            rationale="x " * 200,
        )
        for i in range(1, 40)
    ]
    text = render_history(entries, max_tokens=300)
    assert text.startswith("- iteration 0: BASELINE") and "earlier proposal(s) omitted" in text
    assert "iteration 39" in text and "iteration 1:" not in text
    assert len(design_space_schema()) < len(json.dumps(MemoryDesign.model_json_schema()))


def changes(*pairs, rationale="scripted"):
    return {"rationale": rationale, "changes": [{"field": f, "value": v} for f, v in pairs]}


def test_changes_output_applies_fields_to_the_current_design():
    lm = ProposerLM(
        [changes(("retrieve.top_k", "40"), ("retrieve.pool", "80"), ("store.unit", "window"))]
    )
    out = DesignProposer(lm, output="changes")(BASE, HISTORY, "fb", seen=SEEN, iteration=1)
    assert out.status == "ok"
    assert design_diff(BASE, out.design) == [
        "retrieve.pool: 50 -> 80",
        "retrieve.top_k: 20 -> 40",
        'store.unit: "record" -> "window"',
    ]
    assert any("changes: retrieve.top_k=40" in n for n in out.attempts[0].notes)
    schema = json.loads(field_value(lm.calls[0]["user"], "design_space"))
    assert "retrieve" in schema["properties"]
    # a "changes" reply is short: its output is capped so a looping reply costs seconds
    from memsteer_dspy.optimize.proposer import CHANGES_MAX_TOKENS

    assert lm.calls[0]["kwargs"].get("max_tokens") == CHANGES_MAX_TOKENS


def test_changes_output_invalid_value_is_sent_back_and_no_change_is_a_duplicate():
    lm = ProposerLM(
        [changes(("retrieve.pool", "5")), changes(), changes(("retrieve.rerank", '"llm"'))]
    )
    out = DesignProposer(lm, output="changes")(BASE, HISTORY, "fb", seen=SEEN, iteration=1)
    assert [a.kind for a in out.attempts] == ["invalid", "duplicate", "ok"]
    assert "retrieve.pool" in out.attempts[0].error
    assert out.design.retrieve.rerank == "llm"
    assert "not a valid design" in field_value(lm.calls[1]["user"], "revision_history")


def test_changes_survive_a_reply_cut_off_in_the_rationale():
    cut = '{"changes": [{"field": "retrieve.top_k", "value": "30"}], "rationale": "the evidence ranks between 2'
    out = DesignProposer(ProposerLM([cut]), output="changes")(
        BASE, HISTORY, "fb", seen=SEEN, iteration=1
    )
    assert out.status == "ok" and out.design.retrieve.top_k == 30
    assert out.rationale.startswith("the evidence ranks")


def test_an_invalid_change_names_the_value_given_and_keeps_the_reply():
    lm = ProposerLM(
        [
            changes(("store.window_size", "three records")),
            changes(("store.window_size", "4"), ("store.unit", "window")),
        ]
    )
    out = DesignProposer(lm, output="changes")(BASE, HISTORY, "fb", seen=SEEN, iteration=1)
    assert [a.kind for a in out.attempts] == ["invalid", "ok"]
    first = out.attempts[0]
    assert (
        "store.window_size" in first.error
        and "you proposed store.window_size = three records" in first.error
    )
    assert json.loads(first.raw) == [{"field": "store.window_size", "value": "three records"}]
    assert "you proposed store.window_size = three records" in field_value(
        lm.calls[1]["user"], "revision_history"
    )


def test_a_design_naming_a_model_folder_that_is_not_here_is_sent_back_once(tmp_path):
    # measured on the embedded proposer: rerank cross_encoder with reranker_model
    # "bge-reranker-v2-m3", a folder this machine does not have; the build failed a whole iteration
    lm = ProposerLM(
        [
            changes(
                ("retrieve.rerank", '"cross_encoder"'),
                ("retrieve.reranker_model", '"bge-reranker-v2-m3"'),
            ),
            changes(("retrieve.rerank", '"llm"')),
        ]
    )
    out = DesignProposer(lm, output="changes")(BASE, HISTORY, "fb", seen=SEEN, iteration=1)
    assert [a.kind for a in out.attempts] == ["invalid", "ok"]
    assert "retrieve.reranker_model" in out.attempts[0].error
    assert "no local reranker model folder" in field_value(lm.calls[1]["user"], "revision_history")
    assert out.design.retrieve.rerank == "llm"


def test_a_local_model_folder_that_exists_passes_the_check(tmp_path):
    folder = tmp_path / "my-reranker"
    folder.mkdir()
    lm = ProposerLM(
        [
            changes(
                ("retrieve.rerank", '"cross_encoder"'),
                ("retrieve.reranker_model", json.dumps(str(folder))),
            )
        ]
    )
    out = DesignProposer(lm, output="changes")(BASE, HISTORY, "fb", seen=SEEN, iteration=1)
    assert out.status == "ok" and out.design.retrieve.reranker_model == str(folder)


def spy_grammar(monkeypatch) -> list[tuple[tuple[str, ...], dict | None]]:
    """Record (offered fields, avoided values) of every changes grammar the proposer builds."""
    import memsteer_dspy.optimize.proposer as proposer_module

    calls: list[tuple[tuple[str, ...], dict | None]] = []
    real = proposer_module.changes_signature

    def spy(allowed, current=None, avoid=None):
        calls.append((allowed, avoid))
        return real(allowed, current, avoid)

    monkeypatch.setattr(proposer_module, "changes_signature", spy)
    return calls


def test_exploration_offers_only_fields_not_tried_since_the_last_accept(monkeypatch):
    from memsteer_dspy.optimize.proposer import RevisionEntry, tried_fields
    from memsteer_dspy.optimize.proposer import changes_signature as real

    grammars = spy_grammar(monkeypatch)
    history = [
        RevisionEntry(iteration=0, status="baseline"),
        RevisionEntry(iteration=1, status="rejected", changes=["retrieve.top_k: 20 -> 40"]),
        RevisionEntry(iteration=2, status="accepted", changes=['store.unit: "record" -> "window"']),
        RevisionEntry(iteration=3, status="rejected", changes=['retrieve.query: "raw" -> "hyde"']),
        RevisionEntry(iteration=4, status="duplicate", changes=["retrieve.bm25.k1: 1.5 -> 1.2"]),
    ]
    assert tried_fields(history) == {"retrieve.query", "retrieve.bm25.k1"}
    # the first reply is invalid (pool < top_k): the re-ask no longer offers retrieve.pool either
    lm = ProposerLM([changes(("retrieve.pool", "5")), changes(("retrieve.top_k", "30"))])
    out = DesignProposer(lm, output="changes", fixed_budget=BASE.context.budget_tokens)(
        BASE, history, "fb", seen=SEEN, iteration=5
    )
    assert out.status == "ok" and out.design.retrieve.top_k == 30
    (first, _), (second, _) = grammars
    assert "retrieve.query" not in first and "retrieve.bm25.k1" not in first
    assert (
        "retrieve.top_k" in first and "store.unit" in first
    )  # tried before the accept: offered again
    assert "context.budget_tokens" not in first  # the fixed budget is never offered
    assert "retrieve.pool" in first and "retrieve.pool" not in second
    assert (
        "not offered: retrieve.bm25.k1, retrieve.pool, retrieve.query" in out.attempts[-1].notes[0]
    )
    # the schema handed to the LM lists only the offered fields and asks for at least one change
    schema = real(first).output_fields["changes"].annotation
    from pydantic import TypeAdapter

    js = TypeAdapter(schema).json_schema()
    alternatives = js["items"]["anyOf"]
    assert js["minItems"] == 1 and [
        a["properties"]["field"]["const"] for a in alternatives
    ] == list(first)
    # each field's value is typed: an integer with its bounds, a list of allowed names, ...
    by_field = {a["properties"]["field"]["const"]: a["properties"]["value"] for a in alternatives}
    assert (
        by_field["retrieve.top_k"]["type"] == "integer"
        and by_field["retrieve.top_k"]["minimum"] >= 1
    )
    assert set(by_field["store.unit"]["enum"]) >= {"record", "window", "facts"}
    assert (
        by_field["store.fields"]["type"] == "array"
        and "date" in by_field["store.fields"]["items"]["enum"]
        and "text" not in by_field["store.fields"]["items"]["enum"]  # always indexed
    )


def test_the_grammar_offers_no_value_that_changes_nothing_and_no_endless_list_or_text():
    """Measured with the embedded proposer: one reply repeated "date", "author" inside
    ``store.fields`` until max_tokens (443 s), and two of four calls of one iteration re-proposed
    the value the design already had. The schema handed to the LM now rules both out."""
    from pydantic import TypeAdapter

    from memsteer_dspy.optimize.proposer import (
        MAX_RATIONALE_CHARS,
        MAX_VALUE_CHARS,
        changes_signature,
    )

    current = BASE.model_copy(
        update={"store": BASE.store.model_copy(update={"date_format": "long"})}
    )
    fields = (
        "store.fields",
        "store.date_format",
        "context.show_ids",
        "retrieve.dense.embedder",
        "retrieve.reranker_model",
        "retrieve.top_k",
    )
    sig = changes_signature(fields, current)
    js = TypeAdapter(sig.output_fields["changes"].annotation).json_schema()
    value = {
        a["properties"]["field"]["const"]: a["properties"]["value"] for a in js["items"]["anyOf"]
    }
    # the metadata fields only (the text is always indexed), each at most once
    assert value["store.fields"]["maxItems"] == 5 and value["store.fields"]["uniqueItems"] is True
    assert value["store.date_format"]["enum"] == ["iso", "none"]  # not the current "long"
    assert value["context.show_ids"] == {"type": "boolean", "enum": [False]}  # current: true
    assert value["retrieve.dense.embedder"]["maxLength"] == MAX_VALUE_CHARS
    assert all(
        alt.get("maxLength") == MAX_VALUE_CHARS
        for alt in value["retrieve.reranker_model"]["anyOf"]
        if alt.get("type") == "string"
    )
    assert value["retrieve.top_k"]["type"] == "integer"  # numbers keep their bounds only
    rationale = TypeAdapter(sig.output_fields["rationale"].annotation).json_schema()
    assert rationale["maxLength"] == MAX_RATIONALE_CHARS
    # without a current design every allowed value stays on offer (parsing is never narrowed)
    plain = TypeAdapter(changes_signature(fields).output_fields["changes"].annotation).json_schema()
    by_field = {
        a["properties"]["field"]["const"]: a["properties"]["value"] for a in plain["items"]["anyOf"]
    }
    assert by_field["store.date_format"]["enum"] == ["iso", "long", "none"]


def test_every_field_is_offered_again_when_few_are_left():
    from memsteer_dspy.signatures.propose import DESIGN_FIELDS

    from memsteer_dspy.optimize.proposer import MIN_UNTRIED_FIELDS

    proposer = DesignProposer(ProposerLM([]), output="changes")
    active = [f for f in DESIGN_FIELDS if f not in BASE.inert_fields()]
    almost_all = set(active[: len(active) - MIN_UNTRIED_FIELDS + 1])
    assert proposer._allowed_fields(almost_all, BASE) == tuple(active)
    assert DesignProposer(ProposerLM([]), output="design")._allowed_fields(set(), BASE) is None


def test_fields_that_change_nothing_under_the_current_design_are_not_offered():
    from memsteer_dspy.signatures.propose import DESIGN_FIELDS

    proposer = DesignProposer(ProposerLM([]), output="changes")
    offered = set(proposer._allowed_fields(set(), BASE))
    # Base-BM25 stores records in a BM25 index, searched with the question itself
    for inert in (
        "store.window_size",
        "store.facts_batch",
        "store.section_max_tokens",
        "retrieve.dense.max_chars",
        "retrieve.dense_weight",
        "retrieve.rrf_k",
        "retrieve.n_queries",
        "retrieve.reranker_model",
    ):
        assert inert not in offered
    # …while the switches that would make them act are offered
    assert {
        "store.unit",
        "retrieve.index",
        "retrieve.query",
        "retrieve.rerank",
        "retrieve.bm25.k1",
    } <= offered
    hybrid = BASE.model_copy(
        update={"retrieve": BASE.retrieve.model_copy(update={"index": "hybrid", "query": "hyde"})}
    )
    windows = hybrid.model_copy(update={"store": BASE.store.model_copy(update={"unit": "window"})})
    offered = set(proposer._allowed_fields(set(), windows))
    assert {
        "store.window_size",
        "retrieve.dense.max_chars",
        "retrieve.dense_weight",
        "retrieve.rrf_k",
        "retrieve.n_queries",
        "retrieve.bm25.k1",
    } <= offered
    assert "store.facts_batch" not in offered and len(offered) < len(DESIGN_FIELDS)


def test_a_list_field_written_as_text_is_read_as_a_list():
    from memsteer_dspy.signatures.propose import DesignChange

    from memsteer_dspy.optimize.proposer import apply_changes

    design = apply_changes(BASE, [DesignChange(field="store.fields", value="text, date, subject")])
    assert design.store.fields == ["text", "date", "subject"]
    design = apply_changes(BASE, [DesignChange(field="store.fields", value="text")])
    assert design.store.fields == ["text"]
    design = apply_changes(BASE, [DesignChange(field="store.fields", value='["text", "author"]')])
    assert design.store.fields == ["text", "author"]


def test_typed_values_from_the_grammar_are_applied_as_they_are():
    from memsteer_dspy.signatures.propose import DesignChange

    from memsteer_dspy.optimize.proposer import apply_changes

    design = apply_changes(
        BASE,
        [
            DesignChange(field="store.window_size", value=4),
            DesignChange(field="store.unit", value="window"),
            DesignChange(field="store.fields", value=["text", "date"]),
            DesignChange(field="retrieve.time_filter", value=False),
        ],
    )
    assert (design.store.window_size, design.store.unit, design.store.fields) == (
        4,
        "window",
        ["text", "date"],
    )
    assert design.retrieve.time_filter is False
    lm = ProposerLM([{"rationale": "r", "changes": [{"field": "retrieve.top_k", "value": 30}]}])
    out = DesignProposer(lm, output="changes")(BASE, HISTORY, "fb", seen=SEEN, iteration=1)
    assert out.status == "ok" and out.design.retrieve.top_k == 30


def test_a_budget_fixed_after_construction_is_never_offered():
    # the loop builds its proposer before it knows the budget and sets fixed_budget afterwards
    proposer = DesignProposer(ProposerLM([]), output="changes")
    assert "context.budget_tokens" in proposer._allowed_fields(set(), BASE)
    proposer.fixed_budget = 1000
    assert "context.budget_tokens" not in proposer._allowed_fields(set(), BASE)


def test_single_change_names_the_switch_of_a_coupled_group():
    from memsteer_dspy.optimize.proposer import single_change

    assert single_change(['store.unit: "record" -> "window"', "store.window_size: 3 -> 4"]) == (
        "store.unit",
        "window",
    )
    assert single_change(["retrieve.time_filter: true -> false"]) == ("retrieve.time_filter", False)
    two = ["retrieve.time_filter: true -> false", 'store.date_format: "iso" -> "long"']
    assert single_change(two) is None  # two fields: neither is rejected on its own
    assert single_change([]) is None and single_change(["not a diff line"]) is None


TABU_HISTORY = [
    RevisionEntry(iteration=0, status="baseline"),
    RevisionEntry(
        iteration=1,
        status="rejected",
        changes=['store.unit: "record" -> "window"'],
        rejected_alone=[("store.unit", "window")],
    ),
    RevisionEntry(iteration=2, status="accepted", changes=["retrieve.top_k: 20 -> 30"]),
    RevisionEntry(
        iteration=3,
        status="rejected",
        changes=["context.dedupe: true -> false"],
        rejected_alone=[("context.dedupe", False)],
    ),
]


def test_a_change_rejected_on_its_own_is_not_offered_again_even_after_an_accept(monkeypatch):
    """Measured on the shared RHELM run: the embedded proposer re-proposed a window store after
    each accept (5 times of 20), each time rejected again. The grammar now leaves the value out;
    a field with no value left (a switch already rejected) is not offered at all."""
    from memsteer_dspy.optimize.proposer import changes_signature as real
    from memsteer_dspy.optimize.proposer import field_value_schema, rejected_alone

    assert rejected_alone(TABU_HISTORY) == {
        ("store.unit", '"window"'): 1,
        ("context.dedupe", "false"): 3,
    }
    grammars = spy_grammar(monkeypatch)
    design = MemoryDesign.from_dict(changed(retrieve__top_k=30))
    lm = ProposerLM([changes(("store.unit", '"thread"'))])
    out = DesignProposer(lm, output="changes")(design, TABU_HISTORY, "fb", seen=SEEN, iteration=4)
    assert out.status == "ok" and out.design.store.unit == "thread"
    ((_, avoid),) = grammars
    assert avoid["store.unit"] == ["window"] and avoid["context.dedupe"] == [False]
    schema = real(("store.unit",), design, avoid).output_fields["changes"].annotation
    from pydantic import TypeAdapter

    (alt,) = TypeAdapter(schema).json_schema()["items"]["anyOf"]
    units = alt["properties"]["value"]["enum"]
    assert "window" not in units and "record" not in units and "thread" in units
    assert field_value_schema("context.dedupe", True, [False]) == {"type": "boolean", "enum": []}
    offered = [n for n in out.attempts[0].notes if "rejected on their own" in n]
    assert offered == [
        'values rejected on their own earlier were not offered: context.dedupe=false; store.unit="window"'
    ]
    # without the tabu list the same history offers the window store again
    grammars.clear()
    lm = ProposerLM([changes(("store.unit", '"window"'))])
    out = DesignProposer(lm, output="changes", tabu=False)(
        design, TABU_HISTORY, "fb", seen=SEEN, iteration=4
    )
    assert out.status == "ok" and out.design.store.unit == "window"
    assert (
        "window" not in grammars[0][1].get("store.unit", [])
        and "context.dedupe" not in grammars[0][1]
    )


def test_a_value_that_gives_an_already_scored_design_is_not_offered(monkeypatch):
    """Measured on the shared RHELM run: after a section store was accepted, the embedded
    proposer's next call proposed ``store.unit = record`` — its parent's design, a duplicate that
    cost a call and a re-sample. The grammar leaves out every value that, set on its own, gives a
    design already in ``seen`` (here the parent), beside the tabu list; other values stay."""
    from memsteer_dspy.optimize.proposer import DESIGN_FIELDS, excluded_values
    from memsteer_dspy.optimize.proposer import changes_signature as real

    def repeating_values(design, fields, seen):
        return excluded_values(design, fields, seen)["scored"]

    grammars = spy_grammar(monkeypatch)
    section = MemoryDesign.from_dict(changed(store__unit="section"))
    seen = {BASE.key(): "iteration 0 (baseline)", section.key(): "iteration 1 (accepted)"}
    assert repeating_values(section, DESIGN_FIELDS, seen) == {"store.unit": ["record"]}
    history = [
        *HISTORY,
        RevisionEntry(
            iteration=1, status="accepted", changes=['store.unit: "record" -> "section"']
        ),
    ]
    lm = ProposerLM([changes(("store.unit", '"thread"'))])
    out = DesignProposer(lm, output="changes")(section, history, "fb", seen=seen, iteration=2)
    assert out.status == "ok" and out.design.store.unit == "thread"
    ((_, avoid),) = grammars
    assert avoid["store.unit"] == ["record"]
    from pydantic import TypeAdapter

    schema = real(("store.unit",), section, avoid).output_fields["changes"].annotation
    (alt,) = TypeAdapter(schema).json_schema()["items"]["anyOf"]
    units = alt["properties"]["value"]["enum"]
    assert "record" not in units and "section" not in units and {"thread", "window"} <= set(units)
    assert 'values that give an already scored design were not offered: store.unit="record"' in (
        out.attempts[0].notes
    )
    # a value that gives a design never scored is offered: from the base design, nothing repeats
    assert repeating_values(BASE, DESIGN_FIELDS, seen) == {"store.unit": ["section"]}
    assert repeating_values(BASE, DESIGN_FIELDS, {BASE.key(): "iteration 0"}) == {}


def test_a_switch_with_no_value_left_is_not_offered(monkeypatch):
    grammars = spy_grammar(monkeypatch)
    design = MemoryDesign.from_dict(changed(retrieve__top_k=30))
    lm = ProposerLM([changes(("retrieve.top_k", "40"))])
    DesignProposer(lm, output="changes")(design, TABU_HISTORY, "fb", seen=SEEN, iteration=4)
    offered = grammars[0][0]
    assert "context.dedupe" not in offered and "store.unit" in offered


def test_a_whole_design_repeating_a_rejected_change_is_resampled_like_a_duplicate():
    """The tabu list also binds an LM that writes whole designs (no grammar to narrow)."""
    design = MemoryDesign.from_dict(changed(retrieve__top_k=30))
    lm = ProposerLM(
        [
            proposal(changed(design, context__dedupe=False)),
            proposal(changed(design, context__order="thread")),
        ]
    )
    out = DesignProposer(lm)(design, TABU_HISTORY, "fb", seen=SEEN, iteration=4)
    assert out.status == "ok" and out.design.context.order == "thread"
    assert [a.kind for a in out.attempts] == ["duplicate", "ok"]
    assert out.attempts[0].duplicate_of == (
        "iteration 3, where context.dedupe = false was rejected on its own"
    )
    assert "rejected on its own" in field_value(lm.calls[1]["user"], "revision_history")
    # a change made together with another one is not a repeat of either
    lm = ProposerLM([proposal(changed(design, context__dedupe=False, context__order="thread"))])
    out = DesignProposer(lm)(design, TABU_HISTORY, "fb", seen=SEEN, iteration=4)
    assert out.status == "ok" and [a.kind for a in out.attempts] == ["ok"]


def test_values_that_cannot_be_built_here_are_not_offered_and_text_is_always_indexed(monkeypatch):
    """Measured on the shared RHELM run: one iteration proposed ``retrieve.rerank =
    cross_encoder`` on a machine with no reranker model (invalid twice over), and two listed
    ``store.fields`` without ``text``. A choice value that on its own gives an invalid design or
    one the run's check refuses is left out of the grammar; ``store.fields`` offers only the
    metadata fields, and the text is added back when a proposal leaves it out."""
    from memsteer_dspy.signatures.propose import DesignChange

    from memsteer_dspy.errors import InputError
    from memsteer_dspy.optimize.proposer import (
        DESIGN_FIELDS,
        apply_changes,
        excluded_values,
        field_value_schema,
    )

    grammars = spy_grammar(monkeypatch)
    seen = {BASE.key(): "iteration 0 (baseline)"}

    def no_dense(design):  # a run whose machine lacks the dense extra
        if design.retrieve.index != "bm25":
            raise InputError("needs the dense extra", field="retrieve.index")

    out = excluded_values(BASE, DESIGN_FIELDS, seen, check=no_dense)
    assert "cross_encoder" in out["unbuildable"]["retrieve.rerank"]  # no reranker model: invalid
    assert out["unbuildable"]["retrieve.index"] == ["dense", "hybrid"]
    assert out["scored"] == {}
    lm = ProposerLM([changes(("store.fields", '["author", "date"]'))])
    res = DesignProposer(lm, output="changes", check=no_dense)(
        BASE, HISTORY, "fb", seen=seen, iteration=1
    )
    assert res.status == "ok" and res.design.store.fields == ["text", "author", "date"]
    ((offered, avoid),) = grammars
    assert set(avoid["retrieve.index"]) == {"dense", "hybrid"}
    assert any(
        "cannot be built or scored here" in n and "retrieve.index" in n
        for n in res.attempts[0].notes
    )
    assert "text" not in field_value_schema("store.fields", BASE.store.fields)["items"]["enum"]
    # the text stays when it is given, and a list that lists it twice is still refused
    assert apply_changes(
        BASE, [DesignChange(field="store.fields", value='["text", "date"]')]
    ).store.fields == [
        "text",
        "date",
    ]
    with pytest.raises(InputError, match="twice"):
        apply_changes(BASE, [DesignChange(field="store.fields", value='["date", "date"]')])
