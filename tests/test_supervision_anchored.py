"""The anchored planner: the program reads the answer options off the bundle's sentences and the
planner chooses one by number (GenerationConfig.anchored, `memsteer generate --anchored`)."""

from __future__ import annotations

from datetime import datetime

import pytest
from pydantic import TypeAdapter
from supervision_helpers import (
    RECORDS,
    audit_reply,
    blind_reply,
    question_reply,
    role_lms,
    small_bundle,
)

from memsteer_dspy.bundles import (
    MAX_ANSWER_OPTIONS,
    BundleConfig,
    Task,
    answer_options,
    bundle_from_records,
)
from memsteer_dspy.records import History
from memsteer_dspy.supervision.program import ANCHORED_VERSION, MemSteerGenerator, options_text

FACT = Task(question_type="fact", evidence_count=1, answer_type="entity")


def _records(text: str, user: str = "Elena_Morales"):
    record = RECORDS[0].model_copy(
        update={"id": "r:1", "thread_id": "r", "text": text, "timestamp": datetime(2024, 4, 15)}
    )
    return bundle_from_records(History(user, [record]), ["r:1"], BundleConfig()).records


def _answers(text: str, answer_type: str | None = None) -> list[tuple[str, str]]:
    return [
        (o.answer_type, o.answer)
        for o in answer_options(_records(text), "Elena_Morales", answer_type)
    ]


def test_answer_options_are_the_names_numbers_lists_and_dates_the_sentences_state():
    got = _answers(
        "User: I met Amelia Torres at the cafe and paid 12 dollars for tea, scones and jam."
    )
    assert ("date", "2024-04-15") in got
    assert ("entity", "Amelia Torres") in got  # the whole name, not "Torres"
    assert ("number", "12 dollars") in got  # with the word it counts
    # not a part of a compound word (the tenth cost run offered "2 child" for "2 child-sized")
    assert ("number", "2") in _answers("User: Bring 2 child-sized pitchers for the pouring.")
    assert ("list", "tea, scones and jam") in got
    # the user's own name, a weekday and a year are no options
    got = _answers("User: On Friday I told Elena Morales that the 2024 plan is fine.")
    assert got == [("date", "2024-04-15")]


def test_answer_options_skip_headings_table_headers_and_sentence_initial_words():
    text = (
        "## Garden Activities\n"
        "| Student Name | Activity Role |\n"
        "|---|---|\n"
        "| Samuel Lin | Planter |\n"
        "Thank you for the seeds.\n"
        "With Elena and Mila we watered the beds, and Mila smiled."
    )
    got = _answers(text, "entity")
    names = [a for _, a in got]
    assert "Samuel Lin" in names and "Mila" in names
    assert "Student Name" not in names and "Garden Activities" not in names  # header row, heading
    assert "Thank" not in names and "With Elena" not in names and "Elena" not in names
    # a single capitalised word that starts a cell or sentence only when also written mid-sentence
    assert "Planter" not in names
    # the date is cited from a sentence that states something, never from the heading
    date = answer_options(_records(text), "Elena_Morales", "date")[0]
    assert date.answer == "2024-04-15" and not date.span_id.endswith("#1")


def test_answer_options_keep_to_the_asked_kind_when_the_records_hold_it_and_take_turns():
    text = "User: Lila, Mark, Sofia, Oliver and Ana came by. We planted 3 rows."
    assert {t for t, _ in _answers(text, "number")} == {"number"}
    # no boolean option exists: every kind is offered instead of none
    assert {t for t, _ in _answers(text, "boolean")} >= {"entity", "number", "date"}
    bundle = small_bundle()
    options = answer_options(bundle.records, "tester", limit=3)
    # one from each record before a second from any
    assert [o.span_id.rpartition("#")[0] for o in options] == bundle.record_ids


def _plan(option: int, **overrides):
    reply = {
        "answer_option": option,
        "evidence": [{"record_id": "R1", "contribution": "names it"}],
        "fact_span_ids": ["R1.1"],
        "operations": ["lookup"],
        "ask": "which laptop I wrote from",
    }
    reply.update(overrides)
    return reply


def _anchored(lms, bundle=None, task=FACT):
    gen = MemSteerGenerator(lms, max_retries=0, lean=True, anchored=True, user_name="Elena")
    bundle = bundle or small_bundle()
    options = answer_options(bundle.records, "Elena", task.answer_type)
    return gen(bundle=bundle, task=task, shuffle_seed=0).outcome, options


def test_the_anchored_planner_s_answer_is_the_option_it_chose():
    bundle = small_bundle()
    options = answer_options(bundle.records, "Elena", "entity")
    n = next(i for i, o in enumerate(options, 1) if o.answer == "MacBook Air")
    lms = role_lms([_plan(n)], [question_reply()], [audit_reply()], [blind_reply()])
    out, _ = _anchored(lms, bundle)
    assert out.status == "accepted", out.detail
    assert (out.plan.answer, out.plan.answer_type) == ("MacBook Air", "entity")
    assert out.plan.answer_span_id == options[n - 1].span_id
    assert out.plan.evidence_ids == ["c1:1"]
    # the planner was shown the numbered options with their sentences' labels
    prompt = lms["planner"].history[-1]["messages"][-1]["content"]
    assert options_text(bundle.view(), options) in prompt


def test_the_option_s_record_is_evidence_even_when_the_planner_names_another():
    bundle = small_bundle()
    options = answer_options(bundle.records, "Elena", "entity")
    n = next(i for i, o in enumerate(options, 1) if o.answer == "GreenLeaf")
    reply = _plan(
        n, evidence=[{"record_id": "R1", "contribution": "the note"}], fact_span_ids=["R3.2"]
    )
    audit = audit_reply(facts=("R3.2",))
    audit["record_checks"][0]["record_id"] = "R3"
    lms = role_lms(
        [reply],
        [question_reply("Which company sent the compost order for my garden workshop?")],
        [audit],
        [blind_reply("GreenLeaf", cited=("mail:1#2",))],
    )
    out, _ = _anchored(lms, bundle)
    assert out.plan.evidence_ids == ["mail:1"], out.plan
    assert out.status == "accepted", out.detail


def test_a_number_that_names_no_option_is_re_planned_then_rejected():
    lms = role_lms([_plan(9), _plan(0)])
    out, options = _anchored(lms)
    assert len(options) < 9
    assert out.status == "rejected" and out.reason.startswith("plan_check:"), out.reason
    assert len(lms["planner"].history) == 2  # the first plan was re-sampled once
    assert "option 0" in out.detail or "empty" in out.detail


def test_a_bundle_without_options_is_rejected_before_any_lm_call():
    record = RECORDS[0].model_copy(update={"id": "q:1", "thread_id": "q", "text": "---\n***"})
    bundle = bundle_from_records(History("tester", [record]), ["q:1"], BundleConfig())
    lms = role_lms()  # nothing scripted: any call would fail
    gen = MemSteerGenerator(
        lms, anchored=True, user_name="tester"
    )  # the earlier pipeline, anchored
    out = gen(bundle=bundle, task=FACT, shuffle_seed=0).outcome
    assert (out.status, out.reason) == ("rejected", "prefilter:no_options")
    assert all(not lm.history for lm in lms.values())


def test_the_cold_start_demo_shows_options_and_the_number_of_its_answer():
    gen = MemSteerGenerator(anchored=True, lean=True, bounded=True, user_name="Elena_Morales")
    demo = gen.plan.demos[0]
    chosen = demo.options.splitlines()[demo.answer_option - 1]
    assert chosen.startswith(f"{demo.answer_option}. entity: Maya (")
    assert "answer" not in demo.toDict()  # the planner no longer writes the answer
    # the bounded schema limits the number to the options there can be
    schema = TypeAdapter(gen.plan.signature.output_fields["answer_option"].annotation).json_schema()
    assert (schema["type"], schema["minimum"], schema["maximum"]) == (
        "integer",
        1,
        MAX_ANSWER_OPTIONS,
    )


def test_anchored_is_part_of_a_run_s_key_reaches_it_from_the_cli_and_is_memsteer_only():
    from memsteer_dspy.cli.generate import _bundle_config
    from memsteer_dspy.lm import LMConfig
    from memsteer_dspy.supervision.run import GenerationConfig

    bundle, _ = _bundle_config("small", LMConfig.uniform(), 2500, None, anchored=True)
    assert bundle.steer_to_options
    off, on = (
        GenerationConfig().identity(),
        GenerationConfig(anchored=True, bundle=bundle).identity(),
    )
    assert on["anchored_version"] == ANCHORED_VERSION and on["bundle"]["steer_to_options"] is True
    assert (
        "anchored_version" not in off and "steer_to_options" not in off["bundle"]
    )  # older runs' keys
    with pytest.raises(ValueError, match="memsteer"):
        GenerationConfig(anchored=True, method="joint")


def test_a_sentence_ask_puts_the_question_word_in_the_answer_s_place():
    from memsteer_dspy.supervision.program import SENTENCE_ASK_WORDS, sentence_ask

    # the clause that holds the answer (the whole sentence came back as a compound question)
    ask = sentence_ask(
        "User: I tried to message Lila for feedback, but my hands were shaking so much.",
        "lila",
        "entity",
    )
    assert ask == "I tried to message who for feedback"
    # one question word, by what comes before the name ("who or what" is two questions)
    assert sentence_ask("I wrote from my MacBook Air.", "MacBook Air", "entity").endswith("my what")
    assert sentence_ask("We met at Clayworks Studio today.", "Clayworks Studio", "entity") == (
        "We met at where today"
    )
    assert sentence_ask("We lost 2 hours of class.", "2 hours", "number") == (
        "We lost how many hours of class"
    )
    # a clause too short to name anything keeps the sentence
    assert sentence_ask("Sofia: thanks for the seeds!", "Sofia", "entity") == (
        "who: thanks for the seeds!"
    )
    # a record's date is not in its sentence: the sentence is the event asked about
    ask = sentence_ask("User: I cleared that small pile of books.", "2024-05-18", "date")
    assert ask == 'when: "I cleared that small pile of books."'
    # whole words only ("Ana" is not replaced inside "Banana"), and a long clause keeps the words
    # around the answer's place
    banana = sentence_ask("Banana bread again.", "Ana", "entity")
    assert banana == 'what: "Banana bread again."'
    long = " ".join(["word"] * 60 + ["Amelia", "Torres", "leads"] + ["more"] * 60)
    quoted = sentence_ask(long, "Amelia Torres", "entity").split()
    assert len(quoted) == SENTENCE_ASK_WORDS and "who leads" in " ".join(quoted)


def _cold_start_ask() -> str:
    gen = MemSteerGenerator(anchored=True, lean=True, user_name="Elena")
    return str(gen.plan.demos[0].ask)


def test_a_plan_ask_copied_from_the_demo_is_replaced_by_its_answer_sentence_s_ask():
    bundle = small_bundle()
    options = answer_options(bundle.records, "Elena", "entity")
    n = next(i for i, o in enumerate(options, 1) if o.answer == "MacBook Air")
    copied = _cold_start_ask()  # "who is coming with me to the pottery class": no pottery here
    lms = role_lms([_plan(n, ask=copied)], [question_reply()], [audit_reply()], [blind_reply()])
    out, _ = _anchored(lms, bundle)
    assert out.status == "accepted", out.detail
    assert out.plan.ask == "This morning I sent a quick note to Lila from my what"
    (repair,) = [r for r in out.repairs if r.field == "ask"]
    assert (repair.before, repair.after) == (copied, out.plan.ask)
    assert "copies_demo" in repair.reason
    # the question writer was given the sentence's ask, not the copied one
    prompt = lms["question_writer"].history[-1]["messages"][-1]["content"]
    assert "from my what" in prompt and "pottery" not in prompt.split("ask")[-1]


def test_a_plan_ask_that_would_pass_as_a_question_is_kept():
    bundle = small_bundle()
    options = answer_options(bundle.records, "Elena", "entity")
    n = next(i for i, o in enumerate(options, 1) if o.answer == "MacBook Air")
    ask = "what I sent a quick note to Lila from this morning"
    lms = role_lms([_plan(n, ask=ask)], [question_reply()], [audit_reply()], [blind_reply()])
    out, _ = _anchored(lms, bundle)
    assert out.status == "accepted", out.detail
    assert out.plan.ask == ask and not [r for r in out.repairs if r.field == "ask"]
