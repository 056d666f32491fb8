"""A small MemSteer-Opt run tracked in a sqlite MLflow store, for the report and MLflow UI tests: a
scripted proposer (no real LM), an answerer that answers right exactly when the answer is in its
context, and a judge that compares with the reference. Four iterations give every kind of step: a
tie (rejected), an accepted widening, an invalid proposal, and a second accepted widening."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from memory_fixtures import ScriptedLM, field_value, signature_of, small_history, small_qa
from optimize_fixtures import ProposerLM, changed, proposal

from memsteer_dspy.memory import MemoryDesign
from memsteer_dspy.optimize import MemSteerOpt, OptimizeConfig
from memsteer_dspy.tracking import Tracker

NARROW = MemoryDesign.from_dict({"name": "narrow", "retrieve": {"top_k": 1, "pool": 1}})
ANSWERS = {"colour": "red", "conference": "Lisbon", "pay": "90", "people": "Anna, Tom"}


def _answer_lm() -> ScriptedLM:
    def handler(system: str, user: str) -> dict:
        if signature_of(system) == "judge":
            return {"correct": field_value(user, "prediction") == field_value(user, "reference")}
        question, context = field_value(user, "question"), field_value(user, "context")
        for word, answer in ANSWERS.items():
            if word in question:
                return {
                    "answer": answer
                    if all(p in context for p in answer.split(", "))
                    else "I don't know"
                }
        return {"answer": "I don't know"}

    return ScriptedLM(handler)


def _wide(k: int) -> dict:
    return changed(NARROW, retrieve__top_k=k, retrieve__pool=k)


REPLIES = [
    proposal(changed(NARROW, context__show_kind=True), "show each record's kind"),
    proposal(_wide(2), "deliver two units: the evidence is often the second hit"),
    "not json",
    "still not json",
    proposal(_wide(4), "deliver four units so multi-record answers fit"),
]


def scripted_optimize_run(out: Path, *, tracked: bool = True):
    """Run the four scripted iterations into ``out`` (tracked in ``out/mlflow.db``)."""
    history = small_history()
    lm = _answer_lm()
    tracker = (
        Tracker.for_history(
            out, history.user_id, history.fingerprint, uri=f"sqlite:///{out.resolve()}/mlflow.db"
        )
        if tracked
        else None
    )
    opt = MemSteerOpt(
        history,
        small_qa(),
        small_qa(),
        out,
        init_design=NARROW,
        tracker=tracker,
        config=OptimizeConfig(iterations=4, objective="accuracy"),
        lms={"proposer": ProposerLM(list(REPLIES)), "answerer": lm, "judge": lm},
    )
    return opt.run()


def dead_pid() -> int:
    """The pid of a process that has exited (as a killed optimization's would be)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    try:  # reaped: the pid is free (a reuse this soon is vanishingly unlikely, and checked)
        os.kill(proc.pid, 0)
    except ProcessLookupError:
        return proc.pid
    raise RuntimeError(f"pid {proc.pid} was reused at once; run the test again")
