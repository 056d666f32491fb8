"""examples/cited_answer.py: two signatures composed into a new program under ChatAdapter, run
with a test LM (the embedded-model run is `python examples/cited_answer.py`)."""

import json

import dspy
import pytest
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
    lm = DummyLM(
        [
            {"cited_ids": ["R2.1"], "answer": "Porto", "answerable": True},
            {"supported": True, "answer": "Porto"},
        ]
    )
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


def test_a_record_label_cites_all_its_sentences():
    """The embedded model cited ['R1', 'R2', 'R3'] instead of sentence labels (measured run)."""
    ex = load_example()
    _, sentences = ex.label_records(RECORDS)
    assert ex.expand_citations(["R1", "R2.1", "R1.2", "R7"], sentences) == ["R1.1", "R1.2", "R2.1"]


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
    lm = DummyLM(
        [
            {"cited_ids": ["R1.1"], "answer": "Taberna do Largo", "answerable": True},
            {"supported": True, "answer": "Taberna do Largo"},
        ]
    )
    pred = ex.run(ex.DEFAULT_QUESTION, lm, k=3)
    assert pred.answer == "Taberna do Largo"
    read_prompt = json.dumps(lm.history[0]["messages"])
    assert "Taberna do Largo" in read_prompt  # Base-BM25 put the booking among the 3 records


@pytest.mark.integration
def test_example_runs_on_the_embedded_model():
    """The example's own command line on local/qwen2.5-coder-1.5b, under ChatAdapter: a parsed,
    typed prediction whose citations are real sentence labels of the retrieved records."""
    pytest.importorskip("llama_cpp", reason="pip install 'memsteer-dspy[local]'")
    from memsteer_dspy.lm import DEFAULT_LM, LMConfig, LMSpec
    from memsteer_dspy.lm.model_files import MissingModelFilesError, ensure_embedded_model

    try:
        ensure_embedded_model(DEFAULT_LM.split("/", 1)[1])
    except MissingModelFilesError as exc:
        pytest.skip(str(exc))
    ex = load_example()
    lm = LMConfig.uniform(LMSpec(model=DEFAULT_LM, max_tokens=256)).lm("answerer")
    pred = ex.run(ex.DEFAULT_QUESTION, lm, k=3)
    records = ex.retrieve(ex.DEMO, ex.DEFAULT_QUESTION, 3)
    _, sentences = ex.label_records(records)
    assert isinstance(pred.answer, str) and pred.answer.strip()
    assert isinstance(pred.supported, bool)
    assert set(pred.citations) <= set(sentences)
    if pred.citations:  # the verifier saw exactly the cited sentences
        assert pred.cited_text.splitlines() == [f"{c} {sentences[c]}" for c in pred.citations]
