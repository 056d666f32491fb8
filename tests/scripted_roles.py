"""Deterministic scripted LMs for every role a ``generate`` or ``optimize`` run uses: each reply is
a pure function of the request (see :mod:`fault_helpers`), so an interrupted and resumed run can
be compared exactly with an uninterrupted one; with ``fault_seed`` every role fails about 20% of
its calls."""

from __future__ import annotations

from typing import Any

import dspy
from fault_helpers import FaultyLM, HandlerLM, digest
from test_supervision_run import PLACES, TOPICS  # the same laptop-trip world


def _field(user: str, name: str) -> str:
    head = f"[[ ## {name} ## ]]\n"
    if head not in user:
        return user
    start = user.index(head) + len(head)
    end = user.find("\n\n[[ ## ", start)
    return user[start : end if end >= 0 else None].strip()


# ---- generate ------------------------------------------------------------------------------


def _plan(system: str, user: str) -> dict[str, Any]:
    return {
        "fact_span_ids": ["R1.1"],
        "answer_span_id": "R1.1",
        "answer": "MacBook Air",
        "answer_type": "entity",
        "evidence": [{"record_id": "R1", "contribution": "names the laptop packed for the trip"}],
        "operations": ["lookup"],
        "ask": "which laptop the user packed for the trip with Ana",
    }


def _question(system: str, user: str) -> dict[str, Any]:
    d = digest(user)
    return {
        "question": f"Which laptop did I bring to the {PLACES[d % 10]} meeting about {TOPICS[(d // 10) % 10]}?"
    }


def _audit(system: str, user: str) -> dict[str, Any]:
    return {
        "fact_checks": [{"span_id": "R1.1", "rationale": "stated", "verdict": "supported"}],
        "record_checks": [{"record_id": "R1", "rationale": "contributes", "verdict": "supported"}],
        "answer_rationale": "the record names it",
        "answer_support": "supported",
        "consistency_rationale": "asks what the plan says",
        "consistency": "supported",
    }


def _blind(system: str, user: str) -> dict[str, Any]:
    return {"cited_ids": ["R1.1", "R2.1", "R3.1"], "answer": "MacBook Air", "answerable": True}


GENERATE = {
    "planner": _plan,
    "question_writer": _question,
    "auditor": _audit,
    "blind_reader": _blind,
}

# ---- optimize (proposer, answerer, judge) ----------------------------------------------------

NARROW = {"name": "narrow", "retrieve": {"top_k": 1, "pool": 1}}


def _proposal(system: str, user: str) -> dict[str, Any]:
    from memsteer_dspy.memory import MemoryDesign

    k = 2 + digest(user) % 5
    design = MemoryDesign.from_dict(NARROW).model_dump(mode="json")
    design["retrieve"].update(top_k=k, pool=k)
    return {"rationale": f"widen retrieval to {k} records", "design": design}


def _answer(system: str, user: str) -> dict[str, Any]:
    context = _field(user, "context")
    # answers from what reached the context: a word of the first line that names something
    words = [w.strip(".,:;!?") for w in context.split() if w[:1].isupper()]
    return {"answer": words[digest(user) % len(words)] if words else "unknown"}


def _judge(system: str, user: str) -> dict[str, Any]:
    return {"correct": digest(_field(user, "prediction") + _field(user, "reference")) % 3 == 0}


OPTIMIZE = {"proposer": _proposal, "answerer": _answer, "judge": _judge}
JSON_ROLES = {"planner", "question_writer", "auditor", "blind_reader", "proposer"}


def role_lms(
    kind: str, *, fault_seed: int | None = None, rate: float = 0.2
) -> dict[str, HandlerLM]:
    """One scripted LM per role of ``kind`` ('generate' or 'optimize'); faulty when ``fault_seed``."""
    handlers = {"generate": GENERATE, "optimize": OPTIMIZE}[kind]
    out: dict[str, HandlerLM] = {}
    for i, (role, handler) in enumerate(handlers.items()):
        adapter = dspy.JSONAdapter() if role in JSON_ROLES else dspy.ChatAdapter()
        if fault_seed is None:
            out[role] = HandlerLM(handler, adapter=adapter, model=f"scripted/{role}")
        else:
            out[role] = FaultyLM(
                handler,
                seed=fault_seed * 101 + i,
                rate=rate,
                adapter=adapter,
                model=f"scripted/{role}",
            )
    return out


def config_loader(lms: dict[str, Any]):
    """A stand-in for ``memsteer_dspy.lm.load_lm_config``: every role in ``lms`` on its scripted
    LM (the others keep a model string that is never called)."""
    from memsteer_dspy.lm import LMConfig

    def load(config=None, lm=None, role_lms=None):
        cfg = LMConfig.uniform("openai/scripted")
        for role, role_lm in lms.items():
            cfg.set_lm(role, role_lm)
        return cfg

    return load


def invoke(argv: list[str], kind: str, *, fault_seed: int | None = None):
    """Run ``memsteer <argv>`` in this process (typer's CliRunner) with fresh scripted LMs of
    ``kind`` in place of whatever ``--lm``/``--config`` would load. Returns the CliRunner result."""
    from typer.testing import CliRunner

    import memsteer_dspy.lm as lm_pkg
    from memsteer_dspy.cli import app

    original = lm_pkg.load_lm_config
    lm_pkg.load_lm_config = config_loader(role_lms(kind, fault_seed=fault_seed))
    try:
        return CliRunner().invoke(app, argv)
    finally:
        lm_pkg.load_lm_config = original
