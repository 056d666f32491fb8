"""Question-writer demonstrations from another history's hand-written questions
(``generate --writer-examples K``): what is drawn, what is refused, and that the writer is shown
them while a run's key tells runs with and without them apart."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from memsteer_dspy.cli import app
from memsteer_dspy.demo_data import demo_path, load_demo
from memsteer_dspy.errors import InputError
from memsteer_dspy.supervision.config import GenerationConfig
from memsteer_dspy.supervision.program import make_generator
from memsteer_dspy.supervision.question_checks import echoes
from memsteer_dspy.supervision.writer_examples import WRITER_EXAMPLE_TYPES, writer_examples


def test_examples_are_one_record_own_words_questions_in_the_writers_format():
    examples = writer_examples(demo_path(), 4)
    assert [e.answer_type for e in examples] == ["entity", "number", "text", "entity"]
    assert len({e.source for e in examples}) == 4
    records = {
        json.loads(line)["id"]: json.loads(line)
        for line in (demo_path() / "records.jsonl").read_text().splitlines()
    }
    qa = {
        json.loads(line)["id"]: json.loads(line)
        for line in (demo_path() / "qa.jsonl").read_text().splitlines()
    }
    for e in examples:
        item = qa[e.source.partition("/")[2]]
        assert e.question == item["question"] and len(item["evidence_ids"]) == 1
        text = records[item["evidence_ids"][0]]["text"]
        assert echoes(e.question, text, e.answer) is None
        assert e.answer.lower() not in e.question.lower()
        # the record cut around the answer's sentence, the program's ask with a question word
        assert e.answer in e.records and len(e.records) < len(text) + 200
        assert e.answer not in e.ask and e.facts and e.answer in e.facts[0]
        assert set(e.example().inputs().keys()) == {
            "records",
            "ask",
            "facts",
            "answer",
            "answer_type",
            "avoid",
        }


def test_draw_is_seeded_and_every_kind_comes_in_turn():
    assert writer_examples(demo_path(), 3, seed=1) == writer_examples(demo_path(), 3, seed=1)
    draws = {tuple(e.source for e in writer_examples(demo_path(), 3, seed=s)) for s in range(5)}
    assert len(draws) > 1
    kinds = [e.answer_type for e in writer_examples(demo_path(), 6)]
    assert kinds[:3] == [k for k in WRITER_EXAMPLE_TYPES if k in kinds][:3]


def test_the_packaged_fictional_examples_are_all_usable_and_the_default():
    from memsteer_dspy.cli.generate import _writer_examples
    from memsteer_dspy.supervision.writer_examples import packaged_examples_path

    every = writer_examples(packaged_examples_path(), 12)
    assert len({e.source for e in every}) == 12
    assert {e.answer_type for e in every} == set(WRITER_EXAMPLE_TYPES)
    demo = load_demo()
    chosen = _writer_examples(3, None, demo_path(), demo, 0)
    assert [e.source.partition("/")[0] for e in chosen] == ["writer_examples"] * 3
    # and no question of the demo's reference is among them
    assert not {e.question for e in every} & {q.question for q in demo.qa_items}


def test_the_history_generated_for_is_refused_as_a_source():
    with pytest.raises(InputError, match="the history generated for") as err:
        writer_examples(demo_path(), 2, not_history=demo_path() / "records.jsonl")
    assert err.value.field == "writer_examples"
    with pytest.raises(InputError, match="the history generated for"):
        writer_examples(demo_path(), 2, not_records=[r.id for r in load_demo().history.records])


def test_more_examples_than_the_source_holds_is_an_error_naming_the_option():
    with pytest.raises(InputError, match=r"only \d+ usable question-writer examples") as err:
        writer_examples(demo_path(), 40)
    assert "ask for fewer" in err.value.render()


def test_run_key_holds_the_examples_and_is_unchanged_without_them():
    plain = GenerationConfig().identity()
    assert "writer_examples" not in plain
    a = GenerationConfig(writer_examples=writer_examples(demo_path(), 2, seed=0)).identity()
    b = GenerationConfig(writer_examples=writer_examples(demo_path(), 2, seed=3)).identity()
    assert a["writer_examples"]["sources"] and a != plain
    assert (
        a["writer_examples"] != b["writer_examples"]
        or a["writer_examples"]["sources"] == (b["writer_examples"]["sources"])
    )


def test_the_writer_is_shown_the_examples_before_the_cold_start_demo():
    examples = writer_examples(demo_path(), 3)
    gen = make_generator(
        "memsteer", lean=True, anchored=True, bounded=True, writer_examples=examples
    )
    demos = gen.write_question.demos
    assert [d.question for d in demos[:3]] == [e.question for e in examples]
    assert len(demos) == 4 and "pottery" in demos[-1].question  # the fictional format demo last
    assert all(len(p.demos) <= 1 for name, p in gen.named_predictors() if name != "write_question")
    with pytest.raises(ValueError, match="no question writer"):
        make_generator("direct", writer_examples=examples)


def test_generate_refuses_examples_from_the_history_it_generates_for(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        [
            "generate",
            "--format",
            "jsonl",
            "--path",
            str(demo_path()),
            "--writer-examples",
            "2",
            "--writer-examples-from",
            str(demo_path()),
            "--out",
            str(out),
        ],
    )
    assert result.exit_code != 0
    assert "the history generated for" in result.output and "writer_examples" in result.output
    assert not out.exists()


def test_an_example_s_everyday_words_are_no_borrowed_topic_but_copying_one_still_is():
    """v22-jonas lost 3 of 40 candidates to copies_demo for "bike" and "finish", words of the
    packaged examples ("When did I get my bike back …?") that the bundle did not write ("Canyon
    Commuter 7.0"): a hand-written example's words are held to the copying test only (lean 21).
    The cold-start demonstration's words stay held to both."""
    from memsteer_dspy.supervision.question_checks import check_question

    bundle = "User: I set out early on my Canyon Commuter 7.0 toward Boxhagener Platz."
    question = "What type of bike did I ride toward Boxhagener Platz?"
    example = "When did I get my bike back from the repair shop?"
    kw = {"known_text": bundle, "kind_check": True}
    assert check_question(question, "Canyon Commuter 7.0", "entity", [example], **kw) == (
        "copies_demo"
    )  # as a demonstration's question: "bike" borrowed
    assert (
        check_question(question, "Canyon Commuter 7.0", "entity", examples=[example], **kw) is None
    )
    # copying an example's question is still copying
    copied = "When did I get my bike back from the repair shop?"
    assert check_question(copied, "2024-05-02", "date", examples=[example], **kw) == "copies_demo"


def test_the_generator_holds_its_writer_examples_to_the_copying_test_only():
    from unittest import mock

    from memsteer_dspy.signatures.plan import AnswerPlan
    from supervision_helpers import small_bundle

    import memsteer_dspy.supervision.generator as generator
    from memsteer_dspy.supervision.writer_examples import packaged_examples_path

    examples = writer_examples(packaged_examples_path(), 4, seed=0)
    gen = make_generator(
        "memsteer", lean=True, anchored=True, bounded=True, writer_examples=examples
    )
    seen = {}
    real = generator.question_verdict

    def spy(question, plan, bundle, rules, **kw):
        seen.update(kw)
        return real(question, plan, bundle, rules, **kw)

    bundle = small_bundle()
    plan = AnswerPlan(answer="x", answer_type="entity")
    with mock.patch.object(generator, "question_verdict", spy):
        gen._question_problem("Which laptop did I use?", plan, bundle.view(), bundle)
    assert set(seen["examples"]) == {e.question for e in examples}
    assert not set(seen["demos"]) & set(seen["examples"])
    assert any("pottery" in d for d in seen["demos"])  # the cold-start demo stays a demo
