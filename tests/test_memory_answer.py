"""The fixed answer program (memory/answer.py): key lines picked by BM25 from the design's context,
then the answerer LM's reading; its version is in the key of every run whose scores hold answers."""

from __future__ import annotations

import dspy
from dspy.utils import DummyLM
from memory_fixtures import small_history

from memsteer_dspy.memory.answer import ANSWER_PROGRAM_VERSION, MemoryAnswerer, key_lines
from memsteer_dspy.memory.design import MemoryDesign
from memsteer_dspy.memory.system import MemorySystem

CONTEXT = """[c1:1 | 2024-04-22]
User: We painted in the art room this afternoon. Right in the middle, a pipe burst in the art room \
and we had to move the children. Lila helped me carry the easels.

[m:2 | 2024-04-23]
Subject: Garden day
Mrs. Patel will bring 12 seed trays on Friday. Dr. Liu moved my appointment."""


def test_key_lines_are_the_sentences_sharing_the_question_s_words_with_their_day_in_order():
    lines = key_lines("What burst in the art room while we painted?", CONTEXT, k=2).splitlines()
    assert lines == [
        "- [2024-04-22] User: We painted in the art room this afternoon.",
        "- [2024-04-22] Right in the middle, a pipe burst in the art room and we had to move the "
        "children.",
    ]
    # a title's period ends no sentence ("Mrs. Patel", "Dr. Liu")
    (line,) = key_lines("How many seed trays will Mrs. Patel bring?", CONTEXT, k=1).splitlines()
    assert line == "- [2024-04-23] Mrs. Patel will bring 12 seed trays on Friday."
    # nothing shared (a paraphrase the design found by meaning): the context's first lines
    first = key_lines("Which kayak did I rent?", CONTEXT, k=2).splitlines()
    assert first == [
        "- [2024-04-22] User: We painted in the art room this afternoon.",
        "- [2024-04-22] Right in the middle, a pipe burst in the art room and we had to move the "
        "children.",
    ]
    # an empty context: "none", and the program abstains without an LM call
    assert key_lines("Which kayak did I rent?", "") == "none"
    silent = DummyLM([])
    out = MemoryAnswerer(silent)(question="Which kayak?", question_date="unknown", context="")
    assert out.answer == "I don't know" and silent.history == []


def test_the_answerer_reads_the_key_lines_after_the_context():
    lm = DummyLM([{"answer": "a pipe"}] * 3, adapter=dspy.JSONAdapter())
    out = MemoryAnswerer(lm)(
        question="What burst in the art room?", question_date="2024-05-01", context=CONTEXT
    )
    assert out.answer == "a pipe" and "pipe burst" in out.key_lines
    prompt = lm.history[-1]["messages"][-1]["content"]
    assert prompt.index("key_lines") > prompt.index("context")
    assert "a pipe burst in the art room" in prompt.split("key_lines")[-1]
    # the LM is the read step's, settable as before (systems and designs set answerer.lm)
    answerer = MemoryAnswerer()
    assert answerer.lm is None
    answerer.lm = lm
    assert answerer.read.lm is lm


def test_the_answer_program_s_version_is_in_the_key_of_runs_that_answer_only():
    from memsteer_dspy.evaluation import evaluation_key

    lm = DummyLM([{"answer": "x"}])
    system = MemorySystem.from_design(
        MemoryDesign.base_bm25(), small_history(), lms={"answerer": lm}
    )
    assert evaluation_key(system, metrics="all", protocol="full", judge_lm=lm)[
        "answer_program"
    ] == (ANSWER_PROGRAM_VERSION)
    assert "answer_program" not in evaluation_key(system, metrics="recall", protocol="full")
