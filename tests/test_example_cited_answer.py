"""examples/cited_answer.py: two signatures composed into a new program under ChatAdapter, run
with a test LM (the embedded-model run is `python examples/cited_answer.py`)."""

import json

import dspy
from dspy.utils.dummies import DummyLM
from script_helpers import load_script

from memsteer_dspy.records import Record


def load_example():
    return load_script("examples/cited_answer.py")


RECORDS = [
    Record(
        id="mail-1",
        kind="email",
        text="Kayak rental is booked. It is at Lagos harbour on Saturday.",
    ),
    Record(
        id="chat-1", kind="conversation_turn", text="User: My sister Ines moves to Porto in June."
    ),
]


def test_reader_cites_and_verifier_sees_only_the_cited_sentences():
    ex = load_example()
    lm = DummyLM([
        {"cited_ids": ["R2.1"], "answer": "Porto", "answerable": True},
        {"supported": True, "answer": "Porto"},
    ])  # fmt: skip
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        pred = ex.CitedAnswer()(
            question="Where does Ines move?", records=RECORDS, answer_type="entity"
        )
    assert (pred.answer, pred.draft, pred.supported, pred.citations) == (
        "Porto",
        "Porto",
        True,
        ["R2.1"],
    )
    assert pred.cited_text == "R2.1 User: My sister Ines moves to Porto in June."
    read_prompt, verify_prompt = (json.dumps(h["messages"]) for h in lm.history)
    assert (
        "[[ ## records ## ]]" in read_prompt
        and "R1.2 It is at Lagos harbour on Saturday." in read_prompt
    )  # ChatAdapter, labelled
    assert "[[ ## draft_answer ## ]]" in verify_prompt and "Porto in June" in verify_prompt
    assert "Lagos" not in verify_prompt  # the verifier never sees uncited records


def test_unanswerable_or_uncited_reads_give_i_dont_know():
    ex = load_example()
    lm = DummyLM([{"cited_ids": ["R9.9"], "answer": "Lisbon", "answerable": True}])
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        pred = ex.CitedAnswer()(question="Where does Ines move?", records=RECORDS)
    assert (
        pred.answer == "I don't know" and pred.citations == [] and len(lm.history) == 1
    )  # no verifier call


def test_run_retrieves_from_the_demo_history_and_answers():
    ex = load_example()
    lm = DummyLM([
        {"cited_ids": ["R1.1"], "answer": "Taberna do Largo", "answerable": True},
        {"supported": True, "answer": "Taberna do Largo"},
    ])  # fmt: skip
    pred = ex.run(ex.DEFAULT_QUESTION, lm, k=3)
    assert pred.answer == "Taberna do Largo"
    read_prompt = json.dumps(lm.history[0]["messages"])
    assert "Taberna do Largo" in read_prompt  # Base-BM25 put the booking among the 3 records
