"""Fixtures for the MemSteer-Opt tests: a scripted proposer LM (JSON replies, as the proposer's
JSONAdapter expects), designs with a few fields changed, and results built by hand."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import dspy
from dspy.clients.engines.dummy_engine import AsyncDummyEngine, DummyEngine
from dspy.utils.dummies import DummyLM

from memsteer_dspy.evaluation import ItemResult
from memsteer_dspy.memory import MemoryDesign
from memsteer_dspy.memory.system import MemoryTrace


def small_opt(folder: Path, design: MemoryDesign, config, lms: dict, **kw: Any):
    """MemSteer-Opt over the small history with its QA items as both training and validation
    items, writing to ``folder / "run"``."""
    from memory_fixtures import small_history, small_qa

    from memsteer_dspy.optimize import MemSteerOpt

    args = (small_history(), small_qa(), small_qa(), folder / "run")
    return MemSteerOpt(*args, init_design=design, config=config, lms=lms, **kw)


def changed(base: MemoryDesign | None = None, **changes: Any) -> dict[str, Any]:
    """``base`` (default Base-BM25) as a dict with ``section__field=value`` changes applied."""
    d = (base or MemoryDesign.base_bm25()).model_dump(mode="json")
    for path, value in changes.items():
        node = d
        *parents, last = path.split("__")
        for p in parents:
            node = node[p]
        node[last] = value
    return d


class _ProposerEngine(DummyEngine):
    def _complete_messages(self, messages):
        from dspy.lm15 import Message, Response, TextPart, Usage

        owner = self.owner
        if not owner.replies:
            raise AssertionError("the scripted proposer ran out of replies")
        reply = owner.replies.pop(0)
        if callable(reply) and not isinstance(reply, type):
            reply = reply(messages[-1]["content"])
        if isinstance(reply, BaseException):
            raise reply
        text = reply if isinstance(reply, str) else json.dumps(reply)
        return Response(
            id=None,
            model="scripted-proposer",
            message=Message.assistant([TextPart(text)]),
            finish_reason="stop",
            usage=Usage(input_tokens=10, output_tokens=5, total_tokens=15),
        )


class ProposerLM(DummyLM):
    """Replies with one scripted proposal per call: a dict ``{"rationale", "design"}`` (serialized as
    JSON), a raw string, an exception to raise, or a function of the user message returning one of
    those. ``calls`` lists each answered request's user message and ``kwargs`` (temperature,
    rollout_id)."""

    def __init__(self, replies: list[Any]):
        super().__init__([], adapter=dspy.JSONAdapter())
        self.replies = list(replies)
        self._engine_spec = _ProposerEngine(self)
        self._async_engine_spec = AsyncDummyEngine(self._engine_spec)

    @property
    def calls(self) -> list[dict[str, Any]]:
        return [
            {"user": h["messages"][-1]["content"], "kwargs": dict(h.get("kwargs") or {})}
            for h in self.history
        ]

    def copy(self, **kwargs):  # keep the script and the call log
        return self


def proposal(
    design: dict[str, Any] | MemoryDesign, rationale: str = "scripted change"
) -> dict[str, Any]:
    if isinstance(design, MemoryDesign):
        design = design.model_dump(mode="json")
    return {"rationale": rationale, "design": design}


def result(
    qa_id: str,
    *,
    delivered: list[str],
    context: str = "",
    correct: bool | None = False,
    ranked: list[str] | None = None,
    prediction: str | None = "wrong",
    delivered_recall: float | None = None,
    error: str | None = None,
) -> ItemResult:
    """An ItemResult with a hand-built trace."""
    ranked = ranked if ranked is not None else delivered
    trace = MemoryTrace(
        question="q",
        ranked_unit_ids=ranked,
        ranked_record_ids=[[r] for r in ranked],
        delivered_record_ids=delivered,
        delivered_unit_ids=delivered,
        context=context,
    )
    return ItemResult(
        qa_id=qa_id,
        question="q",
        prediction=prediction if correct is not None else None,
        correct=correct,
        trace=trace,
        delivered_recall=delivered_recall,
        error=error,
    )


def scripted_lm(handler: Callable[[str, str], dict[str, Any]]):
    from memory_fixtures import ScriptedLM

    return ScriptedLM(handler)


def write_optimize_inputs(
    base: Path, train: Sequence[Any], val: Sequence[Any], design: dict[str, Any]
) -> tuple[Path, Path, Path]:
    """What ``memsteer optimize`` reads, under ``base``: ``hist/records.jsonl`` (the small
    history), ``sup/train.jsonl`` and ``sup/val.jsonl`` (the given QA items) and ``design.json``
    (the initial design). Returns (history folder, supervision folder, design file)."""
    from memory_fixtures import small_history

    hist, sup = base / "hist", base / "sup"
    hist.mkdir()
    sup.mkdir()
    (hist / "records.jsonl").write_text(
        "".join(r.model_dump_json() + "\n" for r in small_history().records)
    )
    (sup / "train.jsonl").write_text("".join(q.to_json() + "\n" for q in train))
    (sup / "val.jsonl").write_text("".join(q.to_json() + "\n" for q in val))
    path = base / "design.json"
    MemoryDesign.from_dict(design).save(path)
    return hist, sup, path
