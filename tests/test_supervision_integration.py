"""Supervision construction with the real embedded model on a small RHELM slice (marked
``integration``: it runs the 1.5B model on CPU, a few minutes)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from memsteer_dspy.bundles import small_lm_bundle_config
from memsteer_dspy.supervision.program import GENERATION_ROLES
from memsteer_dspy.supervision.run import (
    GenerationConfig,
    generate_supervision,
    load_qa_jsonl,
    read_log,
)

KNOWN_REASON_PREFIXES = (
    "plan_check:",
    "question:",
    "audit:",
    "blind:",
    "dedup:",
    "lm_error",
    "bundle:",
    "prefilter:",
)


@pytest.fixture(scope="module")
def embedded_lms():
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (pip install 'memsteer-dspy[local]')")
    from memsteer_dspy.lm import LMConfig
    from memsteer_dspy.lm.model_files import ensure_embedded_model

    try:
        ensure_embedded_model("qwen2.5-coder-1.5b")
    except Exception as exc:  # the model chunks are not installed
        pytest.skip(f"embedded model unavailable: {exc}")
    config = LMConfig.uniform("local/qwen2.5-coder-1.5b")
    return {role: config.lm(role) for role in GENERATION_ROLES}


@pytest.mark.integration
def test_generate_two_candidates_with_the_embedded_model(rhelm_root, embedded_lms, tmp_path):
    from memsteer_dspy.loaders.rhelm import load_rhelm

    loaded = load_rhelm(rhelm_root, "Elena_Morales", external=True)
    # a small slice: February 2024 (a few sessions, emails and attachments)
    history = loaded.history.filter(lambda r: r.timestamp is not None and r.timestamp.month == 2)
    config = GenerationConfig(
        n=2, max_candidates=2, batch_size=2, bundle=small_lm_bundle_config(), max_retries=1
    )
    summary = generate_supervision(history, embedded_lms, tmp_path, config, progress=False)

    assert summary["candidates"] + summary["skipped_bundles"] == 2
    log = read_log(tmp_path)
    assert len(log) == 2
    for rec in log:
        if rec.status == "accepted":
            assert rec.item["question"] and rec.item["evidence_ids"]
        else:
            assert rec.reason and rec.reason.startswith(KNOWN_REASON_PREFIXES), rec.reason
    # every LM call reached the model and was booked with real token counts
    assert summary["lm_calls"]["planner"] >= 1
    assert summary["tokens_by_role"]["planner"]["prompt_tokens"] > 100
    assert not summary["tokens_estimated"]
    accepted = load_qa_jsonl(tmp_path / "train.jsonl") + load_qa_jsonl(tmp_path / "val.jsonl")
    assert len(accepted) == summary["accepted"]
    assert (
        json.loads((tmp_path / "summary.json").read_text())["candidates"] == summary["candidates"]
    )
