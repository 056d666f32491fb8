"""Fieldwise decoding of structured answers by the embedded LM (``LlamaCppEngine(fieldwise=True)``).

The plan (:func:`field_grammars`) needs llama-cpp-python's schema converter only; the decoding
tests need the embedded model and are skipped without it, like ``test_lm_local.py``.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Literal

import dspy
import pytest
from pydantic import BaseModel

from memsteer_dspy.lm import DEFAULT_LM
from memsteer_dspy.lm.config import LMConfig, LMSpec
from memsteer_dspy.runfolder import lm_identity

llama_cpp = pytest.importorskip("llama_cpp", reason="pip install 'memsteer-dspy[local]'")

from memsteer_dspy.lm.local import field_grammars  # noqa: E402


class Use(BaseModel):
    record_id: str
    contribution: str


def plan_schema() -> dict:
    class Plan(BaseModel):
        answer_option: int
        evidence: list[Use]
        ask: str

    return Plan.model_json_schema()


def test_an_object_of_required_fields_is_written_field_by_field():
    steps = field_grammars(plan_schema())
    assert [s.name for s in steps] == ["answer_option", "evidence", "ask"]
    # the keys are fed up to their colon; the first opens the object
    assert [s.prefix for s in steps] == ['{"answer_option":', ' "evidence":', ' "ask":']
    # each value is sampled with the separator that closes it: "," between fields, "}" at the end
    roots = [
        next(line for line in s.grammar.splitlines() if line.startswith("root ::=")) for s in steps
    ]
    assert all(r.endswith('","') for r in roots[:-1]) and roots[-1].endswith('"}"')
    # a field whose schema refers to $defs gets the definitions it needs
    assert '"\\"record_id\\""' in steps[1].grammar
    assert "contribution" not in steps[0].grammar


def test_the_fields_grammars_accept_the_object_the_whole_schema_accepts():
    """Fed keys + sampled values concatenate to the JSON a whole-object decode writes."""
    steps = field_grammars(plan_schema())
    values = ["3,", ' [{"record_id": "R1", "contribution": "who came"}],', ' "Who came?"}']
    text = "".join(s.prefix + v for s, v in zip(steps, values, strict=True))
    assert json.loads(text) == {
        "answer_option": 3,
        "evidence": [{"record_id": "R1", "contribution": "who came"}],
        "ask": "Who came?",
    }
    for step in steps:  # every grammar compiles in llama.cpp
        llama_cpp.LlamaGrammar.from_string(step.grammar, verbose=False)


@pytest.mark.parametrize(
    "schema",
    [
        {
            "type": "object",
            "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
            "required": ["a"],
        },
        {"type": "array", "items": {"type": "string"}},
        {"type": "object", "properties": {}},
        {"type": "string"},
    ],
    ids=["optional-field", "array", "no-properties", "string"],
)
def test_other_schemas_are_decoded_whole(schema):
    assert field_grammars(schema) is None


def test_the_decoding_is_part_of_an_in_process_lm_s_identity():
    def lm(decoding):
        kwargs = {"temperature": 0.0, "metadata": {"model_sha256": "x", "decoding": decoding}}
        return SimpleNamespace(model="local/m", kwargs=kwargs)

    assert lm_identity(lm("fast")) != lm_identity(lm("whole"))
    assert '"decoding": "fast"' in lm_identity(lm("fast"))
    assert LMSpec(model=DEFAULT_LM).fast_decoding is True
    assert "fast_decoding" not in LMSpec(model=DEFAULT_LM).options()  # the default is not written
    assert LMSpec(model=DEFAULT_LM, fast_decoding=False).options() == {"fast_decoding": False}


# -- on the embedded model ---------------------------------------------------------------------


class Classify(dspy.Signature):
    """Classify what kind of answer the question asks for, and list the cities it names."""

    question: str = dspy.InputField()
    answer_type: str = dspy.OutputField(desc="one of date, number, entity, yes_no")
    cities: list[str] = dspy.OutputField()
    count: int = dspy.OutputField(desc="how many cities")


@pytest.fixture(scope="module")
def model_ready():
    from memsteer_dspy.lm.model_files import MissingModelFilesError, ensure_embedded_model

    try:
        ensure_embedded_model(DEFAULT_LM.split("/", 1)[1])
    except MissingModelFilesError as exc:
        pytest.skip(str(exc))


@pytest.mark.integration
def test_fieldwise_feeds_the_keys_and_samples_only_the_values(model_ready):
    question = "Which is bigger, Paris or Lyon?"
    results = {}
    for fieldwise in (True, False):
        config = LMConfig.uniform(
            LMSpec(model=DEFAULT_LM, max_tokens=128, cache=False, fast_decoding=fieldwise)
        )
        lm = config.lm("judge")
        with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
            out = dspy.Predict(Classify)(question=question)
        timings = lm.engine.last_timings
        usage = lm.history[-1]["usage"]
        results[fieldwise] = (out, timings, usage, lm.history[-1]["outputs"][0])
    for out, _, _, _ in results.values():  # both parse into the signature's types
        assert isinstance(out.cities, list) and isinstance(out.count, int)
    out, timings, usage, text = results[True]
    assert text.startswith('{"answer_type":') and json.loads(text)["cities"] == out.cities
    # the answer is counted whole, as one call's completion; but fewer of its tokens were decoded
    # one at a time than it has: the three keys went in as prompt
    assert usage["completion_tokens"] >= len(text) // 8
    assert timings.generated_tokens < usage["completion_tokens"]
    _, whole_timings, whole_usage, whole_text = results[False]
    assert whole_timings.generated_tokens >= whole_usage["completion_tokens"] - 1
    # greedy: the grammar-first picks are the masked vocabulary's picks, the same answer
    assert json.loads(text) == json.loads(whole_text)


class Pick(BaseModel):
    word: Literal["xylograph", "quince"]


@pytest.mark.integration
def test_a_pick_the_grammar_refuses_is_made_again_from_what_the_grammar_allows(model_ready):
    """The model would write its own word; the grammar allows two it would not. Each refused pick
    masks the whole vocabulary and picks again, so the answer is still one of the two."""
    lm = LMConfig.uniform(LMSpec(model=DEFAULT_LM, max_tokens=32, cache=False)).lm("judge")
    llama = lm.engine.model().llama
    before = llama.grammar_refusals
    response = lm.forward(
        messages=[{"role": "user", "content": "What fruit is yellow and curved? One word."}],
        response_format=Pick,
    )
    assert json.loads(response.choices[0].message.content)["word"] in ("xylograph", "quince")
    assert llama.grammar_refusals > before


class Cities(BaseModel):
    cities: list[str]
    n: int


@pytest.mark.integration
def test_a_fieldwise_answer_cut_by_max_tokens_is_reported_as_cut(model_ready, caplog):
    config = LMConfig.uniform(LMSpec(model=DEFAULT_LM, max_tokens=6, cache=False, num_retries=0))
    lm = config.lm("judge")
    response = lm.forward(
        messages=[{"role": "user", "content": "Name three French cities and count them."}],
        response_format=Cities,
    )
    text = response.choices[0].message.content
    assert text.startswith('{"cities":')
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    assert response.usage.completion_tokens <= 6
    assert "truncated" in caplog.text  # the engine's finish_reason "length", as DSPy reads it
