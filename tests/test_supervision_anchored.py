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
    option_reply,
    question_reply,
    role_lms,
    small_bundle,
    small_history,
)

from memsteer_dspy.bundles import (
    MAX_ANSWER_OPTIONS,
    BundleConfig,
    Task,
    answer_kinds,
    answer_options,
    bundle_from_records,
    pair_options,
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
    # the user's own name and a year are no options
    got = _answers("User: Today I told Elena Morales that the 2024 plan is fine.")
    assert got == [("date", "2024-04-15")]
    # nor is a weekday, and a sentence writing a day of its own carries no record date
    assert _answers("User: On Friday I told Elena Morales that the 2024 plan is fine.") == []


def test_numbers_of_names_codes_addresses_and_clock_times_are_no_count_options():
    from memsteer_dspy.bundles import count_numbers

    def counts(text: str) -> list[str]:
        return [a for t, a in _answers(f"User: {text}") if t == "number"]

    # the demo's lost or bad number options: a course code, a product model, a house number, a room
    assert counts("My VIZ 110 final presentation moved, so I have 3 weeks left.") == ["3 weeks"]
    assert counts("The Bosch 800 Series range is on sale for $2,899 this week.") == ["2,899"]
    assert counts("Got the quote for the remodel at 4418 SE Lincoln St from Marcus.") == []
    assert counts(
        "Class meets from 6:30 to 9:00 PM in Terrell Hall, room 214, with 18 students."
    ) == ["18 students"]
    assert counts("We board flight 1492 at 7 am with 2 bags each.") == ["2 bags"]
    # counts stay, at the start of a sentence too, and answer_kinds agrees
    assert counts("About 30 people came and 12 children planted 3 rows.") == [
        "30 people",
        "12 children",
        "3 rows",
    ]
    assert not count_numbers("Oh no, VIZ 110 again.")
    (record,) = _records("User: Oh no, the VIZ 110 room moved to Terrell Hall 214 today.")
    assert "number" not in answer_kinds([record], "Elena_Morales")


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
    # a table row that is the name and one word says nothing to ask by
    assert "Mila" in names and "Samuel Lin" not in names
    assert "Student Name" not in names and "Garden Activities" not in names  # header row, heading
    assert "Thank" not in names and "With Elena" not in names and "Elena" not in names
    # a single capitalised word that starts a cell or sentence only when also written mid-sentence
    assert "Planter" not in names
    # the date is cited from a sentence that states something, never from the heading
    date = answer_options(_records(text), "Elena_Morales", "date")[0]
    assert date.answer == "2024-04-15" and not date.span_id.endswith("#1")


def test_answer_options_keep_to_the_asked_kind_when_the_records_hold_it_and_take_turns():
    text = "User: Lila Nguyen came by after lunch. We planted 3 rows."
    assert {t for t, _ in _answers(text, "number")} == {"number"}
    # no boolean option exists: every kind is offered instead of none
    assert {t for t, _ in _answers(text, "boolean")} >= {"entity", "number", "date"}
    bundle = small_bundle()
    options = answer_options(bundle.records, "tester", limit=3)
    # one from each record before a second from any
    assert [o.span_id.rpartition("#")[0] for o in options] == bundle.record_ids


def _anchored(lms, bundle=None, task=FACT):
    gen = MemSteerGenerator(lms, max_retries=0, lean=True, anchored=True, user_name="Elena")
    bundle = bundle or small_bundle()
    options = answer_options(bundle.records, "Elena", task.answer_type)
    return gen(bundle=bundle, task=task, shuffle_seed=0).outcome, options


def test_the_anchored_planner_s_answer_is_the_option_it_chose():
    bundle = small_bundle()
    options = answer_options(bundle.records, "Elena", "entity")
    n = next(i for i, o in enumerate(options, 1) if o.answer == "MacBook Air")
    lms = role_lms([option_reply(n)], [question_reply()], [audit_reply()], [blind_reply()])
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
    reply = option_reply(
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
    lms = role_lms([option_reply(9), option_reply(0)])
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
    # a comma before a new subject ends the clause too (demo-15 kept "Who is running it too, he's
    # much faster though, …?")
    ask = sentence_ask(
        "User: My friend Marcus Lee is running it too, he's much faster though.",
        "Marcus Lee",
        "entity",
    )
    assert ask == "My friend who is running it too"
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
    assert ask == "when I cleared that small pile of books"
    # an email dated by its subject line is asked by the quoted subject: the bare subject after
    # "when" came back as the verbless "When Unable to Update on School Garden Plans?"
    ask = sentence_ask(
        "Subject: Unable to Update on School Garden Plans Today", "2024-07-02", "date"
    )
    assert ask == 'when was the email "Unable to Update on School Garden Plans Today" sent'
    # whole words only ("Ana" is not replaced inside "Banana"), and a long clause keeps the words
    # around the answer's place
    banana = sentence_ask("Banana bread again.", "Ana", "entity")
    assert banana == "what Banana bread again"
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
    lms = role_lms(
        [option_reply(n, ask=copied)], [question_reply()], [audit_reply()], [blind_reply()]
    )
    out, _ = _anchored(lms, bundle)
    assert out.status == "accepted", out.detail
    # with the record's day, so that the question is about one event of the whole history
    assert out.plan.ask == "This morning I sent a quick note to Lila from my what, on March 2, 2024"
    (repair,) = [r for r in out.repairs if r.field == "ask"]
    assert (repair.before, repair.after) == (copied, out.plan.ask)
    assert "copies_demo" in repair.reason
    # the question writer was given the sentence's ask, not the copied one
    prompt = lms["question_writer"].history[-1]["messages"][-1]["content"]
    assert "from my what" in prompt and "pottery" not in prompt.split("ask")[-1]


def test_a_plan_ask_that_would_pass_as_a_question_is_kept_with_its_record_s_day():
    bundle = small_bundle()
    options = answer_options(bundle.records, "Elena", "entity")
    n = next(i for i, o in enumerate(options, 1) if o.answer == "MacBook Air")
    ask = "what I sent a quick note to Lila from this morning"
    lms = role_lms([option_reply(n, ask=ask)], [question_reply()], [audit_reply()], [blind_reply()])
    out, _ = _anchored(lms, bundle)
    assert out.status == "accepted", out.detail
    assert out.plan.ask == f"{ask}, on March 2, 2024"
    (repair,) = [r for r in out.repairs if r.field == "ask"]
    assert repair.before == ask and "date anchors" in repair.reason
    # an ask that already names its day, and a date answer, get none
    dated = "what I sent a quick note to Lila from on March 2"
    lms = role_lms(
        [option_reply(n, ask=dated)], [question_reply()], [audit_reply()], [blind_reply()]
    )
    out, _ = _anchored(lms, bundle)
    assert out.plan.ask == dated and not [r for r in out.repairs if r.field == "ask"]


# ---- two-record tasks: an answer two records write ----------------------------------------------

MULTI = Task(question_type="multi-hop", evidence_count=2, answer_type="entity")


def test_pair_options_are_the_answers_two_records_write():
    from memsteer_dspy.bundles import task_options

    bundle = small_bundle()  # Lila: in c1:1 ("a quick note to Lila") and c1:2 ("Lila replied …")
    pairs = pair_options(bundle.records, "Elena")
    assert [(o.answer, o.span_ids) for o in pairs] == [("Lila", ("c1:1#1", "c1:2#1"))]
    # a name one record writes (GreenLeaf, MacBook Air) is no pair; a one-record task gets the
    # one-record options, a two-record task the pairs
    assert {o.answer for o in task_options(bundle.records, FACT, "Elena")} >= {
        "MacBook Air",
        "Lila",
    }
    assert [o.answer for o in task_options(bundle.records, MULTI, "Elena")] == ["Lila"]
    # no pair (only the email and one chat turn): a two-record task falls back to one-record options
    apart = small_bundle(ids=["c1:1", "mail:1"])
    assert pair_options(apart.records, "Elena") == []
    assert task_options(apart.records, MULTI, "Elena")
    # whole words only: "Lila" is not in "Lilac"
    lilac = RECORDS[1].model_copy(
        update={"id": "c2:1", "thread_id": "c2", "text": "User: The lilac bloomed."}
    )
    bundle = small_bundle(small_history([lilac]), ["c1:1", "c2:1"])
    assert pair_options(bundle.records, "Elena") == []


def test_the_sampler_asks_for_two_records_only_where_two_records_write_one_answer():
    from memsteer_dspy.bundles import BundleSampler, small_lm_bundle_config
    from memsteer_dspy.graph import RecordGraph
    from memsteer_dspy.supervision.run import GenerationConfig

    others = [
        RECORDS[2].model_copy(
            update={"id": f"m{i}:1", "thread_id": f"m{i}", "text": f"Subject: {name}\n{text}"}
        )
        for i, (name, text) in enumerate(
            [
                ("Pottery", "Dana Pruitt booked the kiln for 3 hours."),
                ("Dentist", "Dr. Voss moved my cleaning to June 4."),
                ("Books", "Raj Mehta lent me 2 novels."),
            ]
        )
    ]
    history = small_history(others)
    graph = RecordGraph.build(history)
    # nearly every task asks for two records where it can
    config = small_lm_bundle_config(
        steer_to_options=True, steer_to_pairs=True, evidence_weights={1: 0.01, 2: 0.99}
    )
    sampler = BundleSampler(graph, config, seed=0, max_candidates=6)
    counts = {True: set(), False: set()}
    for i in range(len(sampler)):
        cand = sampler.candidate(i)
        if cand.bundle is None:
            continue
        pairs = pair_options(cand.bundle.records, history.user_id, limit=None)
        counts[bool(pairs)].add(cand.task.evidence_count)
        if cand.task.evidence_count == 2:  # of a pair's kind
            assert cand.task.answer_type in {o.answer_type for o in pairs}
    assert counts[False] == {1}, counts  # no answer two records write: one record
    assert 2 in counts[True], counts
    # without the flag the same bundles get two-record tasks without pairs
    off = BundleSampler(
        graph, config.model_copy(update={"steer_to_pairs": False}), seed=0, max_candidates=6
    )
    assert any(
        c.bundle is not None
        and c.task.evidence_count == 2
        and not pair_options(c.bundle.records, history.user_id)
        for c in map(off.candidate, range(len(off)))
    )
    # the flag is part of a run's key only when on (older runs keep their keys)
    assert "steer_to_pairs" not in GenerationConfig().identity()["bundle"]
    assert GenerationConfig(bundle=config).identity()["bundle"]["steer_to_pairs"] is True
    # with pairs off (the anchored sampling) no bundle whose only two-record answers are pairs
    # gets a two-record task: those bundles ask for one record
    no_pairs = BundleSampler(
        graph, config.model_copy(update={"pairs": False}), seed=0, max_candidates=6
    )
    tasks = [c.task.evidence_count for c in map(no_pairs.candidate, range(len(no_pairs)))]
    assert tasks and set(tasks) == {1}, tasks
    assert "pairs" not in GenerationConfig().identity()["bundle"]
    assert (
        GenerationConfig(bundle=config.model_copy(update={"pairs": False})).identity()["bundle"][
            "pairs"
        ]
        is False
    )


def test_the_anchored_sampling_offers_no_pairs_to_a_two_record_task():
    """0 of 75 two-record candidates that were no bridge or update were ever kept on the embedded
    model (every anchored run of 2026-12-07): a two-record task of the anchored sampling chooses
    from bridges and updates only, and a bundle with only a pair gives one-record options."""
    from memsteer_dspy.bundles import ANCHORED_SAMPLING, task_options

    assert ANCHORED_SAMPLING["pairs"] is False
    bundle = small_bundle()  # Lila: a pair of c1:1 and c1:2, nothing else two records write
    assert [o.answer for o in task_options(bundle.records, MULTI, "Elena")] == ["Lila"]
    offered = task_options(bundle.records, MULTI, "Elena", pairs=False)
    assert offered and all(len(o.span_ids) == 1 and o.bridge is None for o in offered)


def _two_record_audit():
    audit = audit_reply(facts=("R1.1", "R2.1"))
    audit["record_checks"].append(
        {"record_id": "R2", "rationale": "contributes", "verdict": "supported"}
    )
    return audit


def _two_record_plan(**overrides):
    fields = {
        "evidence": [
            {"record_id": "R1", "contribution": "I sent her a note"},
            {"record_id": "R2", "contribution": "she moved the workshop"},
        ],
        "fact_span_ids": ["R1.1", "R2.1"],
        "ask": "who I sent a note to from my MacBook Air and who moved the garden workshop",
    }
    return option_reply(1, **{**fields, **overrides})


def test_a_two_record_plan_cites_both_records_of_its_option():
    question = (
        "Who did I send a quick note to from my MacBook Air, who later said the garden workshop "
        "moved to Friday?"
    )
    lms = role_lms(
        [_two_record_plan(evidence=[{"record_id": "R1", "contribution": "the note"}])],
        [question_reply(question)],
        [_two_record_audit()],
        [blind_reply("Lila", cited=("c1:1#1", "c1:2#1"))],
    )
    out, options = _anchored(lms, task=MULTI)
    assert out.status == "accepted", out.detail
    assert (out.plan.answer, out.plan.evidence_ids) == ("Lila", ["c1:1", "c1:2"])
    assert {f.span_id for f in out.plan.facts} >= {"c1:1#1", "c1:2#1"}
    # the planner was shown the option with both sentences' labels
    prompt = lms["planner"].history[-1]["messages"][-1]["content"]
    assert "1. entity: Lila (R1.1, R2.1)" in prompt
    # the blind reader that cites one record only fails the citation check, as before
    lms = role_lms(
        [_two_record_plan()],
        [question_reply(question)],
        [_two_record_audit()],
        [blind_reply("Lila", cited=("c1:2#1",))],
    )
    out, _ = _anchored(lms, task=MULTI)
    assert out.reason == "blind:citation", out.reason


def test_a_two_record_question_that_names_one_record_only_is_rewritten():
    from memsteer_dspy.supervision.checks import records_missed

    one, two = RECORDS[0].text, RECORDS[1].text
    assert records_missed(
        "Who did I send a quick note to from my MacBook Air?", "Lila", [one, two]
    ) == [1]
    assert records_missed("Who moved the garden workshop to Friday?", "Lila", [one, two]) == [0]
    both = "Who did I send a note to from my MacBook Air, who moved the workshop to Friday?"
    assert records_missed(both, "Lila", [one, two]) == []
    lms = role_lms(
        [_two_record_plan()],
        [
            question_reply("Who did I send a quick note to from my MacBook Air?"),
            question_reply(both),
        ],
        [_two_record_audit()],
        [blind_reply("Lila", cited=("c1:1#1", "c1:2#1"))],
    )
    out, _ = _anchored(lms, task=MULTI)
    assert out.status == "accepted", out.detail
    (rewrite,) = [r for r in out.repairs if r.field == "question"]
    assert "misses_record" in rewrite.reason
    hint = lms["question_writer"].history[-1]["messages"][-1]["content"]
    assert "one detail of each" in hint


def test_a_two_record_ask_that_fails_asks_by_both_sentences():
    copied = _cold_start_ask()  # the demo's ask: no pottery class here
    lms = role_lms(
        [_two_record_plan(ask=copied)],
        [
            question_reply(
                "Who did I send a note to from my MacBook Air, who moved the workshop to Friday?"
            )
        ],
        [_two_record_audit()],
        [blind_reply("Lila", cited=("c1:1#1", "c1:2#1"))],
    )
    out, _ = _anchored(lms, task=MULTI)
    assert out.status == "accepted", out.detail
    assert out.plan.ask == (
        "This morning I sent a quick note to who from my MacBook Air, and also who replied that "
        "the garden workshop moved to Friday"
    )


def _mail_bundle(sender: str, recipient: str, subject: str):
    """A bundle of an email e:1 (sender, recipient, subject lines: spans e:1#1..3) and c1:1."""
    text = (
        f"Sender: {sender} Morales <{sender.lower()}.morales@email.com>\n"
        f"Recipient: {recipient} Morales <{recipient.lower()}.morales@email.com>\n"
        f"Subject: {subject}"
    )
    mail = RECORDS[2].model_copy(update={"id": "e:1", "thread_id": "e", "text": text})
    return small_bundle(small_history([mail]), ["e:1", "c1:1"])


def test_spoken_dates_and_the_ask_of_an_email_s_sender_or_recipient():
    from memsteer_dspy.supervision.program import header_ask, spoken_date

    assert spoken_date("2024-05-18") == "May 18, 2024"
    assert spoken_date(None) is None and spoken_date("2024-13-01") is None
    bundle = _mail_bundle("Sofia", "Elena", "Quick Health Update\nSummary: Sofia shares news.")
    sender, recipient, subject = (bundle.span(f"e:1#{i}") for i in (1, 2, 3))
    assert header_ask(bundle, sender, "Sofia Morales") == 'who sent the email "Quick Health Update"'
    assert header_ask(bundle, recipient, "x") == 'who the email "Quick Health Update" was sent to'
    assert header_ask(bundle, subject, "x") is None
    assert header_ask(bundle, bundle.span("c1:1#1"), "Lila") is None


def test_a_record_s_date_is_cited_from_its_event_and_written_dates_are_options():
    from memsteer_dspy.bundles import event_span, stating_spans

    text = (
        "User: I like your idea of a small corner.\n"
        "This morning Mark Jensen started his composting demonstration in the garden.\n"
        "My evaluation is on September 23 at home."
    )
    (record,) = _records(text)
    # the most concrete sentence that writes no date of its own, not the opinion before it
    assert event_span(stating_spans(record)).text.startswith("This morning Mark Jensen")
    dates = [(o.answer, o.span_id[-1]) for o in answer_options([record], "Elena", "date")]
    assert dates == [("2024-04-15", "2"), ("September 23", "3")]
    # an email's date is cited from its body's event, never from its subject line (asked by its
    # subject, the question copies it: 0 of 20 kept since the own-words check)
    mail = RECORDS[2].model_copy(update={"id": "e:2", "thread_id": "e2"})
    (record,) = bundle_from_records(History("Elena", [mail]), ["e:2"], BundleConfig()).records
    event = event_span(stating_spans(record))
    assert event is None or not event.text.startswith("Subject:")
    # a sentence whose event is on another day never carries the record's date
    text = (
        "User: Alex Kim called about the Harbor Grey sample.\n"
        "We went to Stoneworks NW yesterday to see the two quartz samples.\n"
        "Alpine Mist looked great in the showroom."
    )
    (record,) = _records(text)
    assert event_span(stating_spans(record)).text.startswith("User: Alex Kim called")
    # nor the sentences after it, which tell the same other day (the demo's "When did Alpine Mist
    # look great in the showroom?" with the message's date)
    (record,) = _records(
        "User: We went to Stoneworks NW yesterday.\nAlpine Mist looked great there."
    )
    assert event_span(stating_spans(record)) is None
    (record,) = _records("User: Two days ago Dana Cole moved the meeting to Room 4.")
    assert event_span(stating_spans(record)) is None
    options = answer_options([record], "Elena", "date")  # no date option: every kind's instead
    assert options and not [o for o in options if o.answer_type == "date"]
    # a document section's date is the document's, not its sentences' events': only written dates
    (section,) = _records("Mark Jensen gives the composting demonstration on September 23.")
    section = section.model_copy(update={"kind": "document_section"})
    assert [o.answer for o in answer_options([section], "Elena", "date")] == ["September 23"]
    # "Mark 12" is no date
    got = [
        (o.answer_type, o.answer)
        for o in answer_options(_records("User: Mark planted 12 rows."), "x")
    ]
    assert got == [("number", "12 rows")]


def test_a_record_s_date_is_no_answer_for_a_reply_subject_a_state_or_a_sentence_naming_nothing():
    from memsteer_dspy.bundles import event_span, stating_spans

    def event(text: str) -> str | None:
        (record,) = _records(text)
        span = event_span(stating_spans(record))
        return None if span is None else span.text

    # a reply's subject names the first message's topic; the reply's own sentence is the event
    text = "Subject: Re: I'm in Denver in April!\nI booked the Larimer Inn for two nights."
    assert event(text) == "I booked the Larimer Inn for two nights."
    assert event("Subject: Fwd: Denver trip\nSee below.") is None
    # nor is a plain subject: the body's event is, or there is none
    assert event("Subject: Seedling Swap in Forest Park\nSee you there.") is None
    body = "Subject: Seedling Swap\nThis morning Dana Cole and I swapped kale seedlings in Forest Park."
    assert event(body).startswith("This morning Dana Cole")
    # a state or a habit is no event (the demo kept "When is Harbor Grey matte …?" in every run)
    assert event("User: Harbor Grey is matte and hides stains, and it's cheaper too.") is None
    assert event("User: Sam keeps telling me to switch to his dentist at Alberta Dental.") is None
    # nor a sentence naming no detail ("Perfect, I'll send it." → "When is my midterm due?")
    assert event("User: Perfect, I'll send it to you.\nWe fly to Lisbon on May 12.") is None
    # an event that happened: a past-tense verb or the record's day
    assert event("User: I spent the afternoon reading with Oliver in Forest Park.")
    assert event("User: This morning Dana Cole and I planted kale at the garden.")
    assert [
        o.answer_type
        for o in answer_options(
            _records("User: Harbor Grey is matte and hides stains, and it's cheaper too."), "x"
        )
    ] == ["entity"]


def test_user_turns_only_shows_a_turn_s_user_message_and_keeps_other_records_whole():
    turn = RECORDS[0].model_copy(
        update={
            "id": "t:1",
            "thread_id": "t",
            "text": "User: I planted 3 rows of kale with Amelia.\nAssistant: Lovely! Try 2 more.",
        }
    )
    history = small_history([turn])
    on = BundleConfig(user_turns_only=True)
    (shown, mail) = bundle_from_records(history, ["t:1", "mail:1"], on).records
    assert [s.text for s in shown.spans] == ["User: I planted 3 rows of kale with Amelia."]
    assert shown.truncated  # rendered with its "[…]" marker
    assert len(mail.spans) == len(history["mail:1"].spans) and not mail.truncated
    # the assistant's numbers are no options any more
    numbers = [o.answer for o in answer_options([shown], "Elena", "number")]
    assert numbers == ["3 rows"]
    (whole,) = bundle_from_records(history, ["t:1"], BundleConfig()).records
    assert len(whole.spans) == 3


def test_a_bundle_with_nothing_concrete_is_skipped_as_no_candidate():
    from memsteer_dspy.bundles import BundleSampler, small_lm_bundle_config
    from memsteer_dspy.graph import RecordGraph

    chat = [
        RECORDS[0].model_copy(
            update={"id": f"v:{i}", "thread_id": "v", "position": i, "text": f"User: {text}"}
        )
        for i, text in enumerate(["I feel calm today.", "It was a quiet, slow morning.", "Okay."])
    ]
    history = History("tester", chat)
    graph = RecordGraph.build(history)
    on = small_lm_bundle_config(skip_unconcrete=True)
    cands = [BundleSampler(graph, on, seed=0, max_candidates=3).candidate(i) for i in range(3)]
    assert cands and all(c.bundle is None and c.skip_reason == "nothing_concrete" for c in cands)
    off = BundleSampler(graph, small_lm_bundle_config(), seed=0, max_candidates=3)
    assert all(off.candidate(i).bundle is not None for i in range(len(off)))


def test_options_keep_hyphenated_names_and_skip_questions_and_bare_pair_lines():
    assert ("entity", "Alberta Co-op") in _answers(
        "User: I got the zinnia seeds from Alberta Co-op."
    )
    # the user asking the assistant states nothing that happened
    asked = _answers("User: Could you help me tell Lila that I need more time?", "entity")
    assert ("entity", "Lila") not in asked
    # a two-record option needs a sentence that says more than the answer in each record
    bare = RECORDS[1].model_copy(
        update={"id": "c3:1", "thread_id": "c3", "text": "- Lila\n- GreenLeaf"}
    )
    bundle = small_bundle(small_history([bare]), ["c1:1", "c3:1"])
    assert pair_options(bundle.records, "Elena") == []


def test_a_doubled_question_mark_is_made_one():
    bundle = small_bundle()
    options = answer_options(bundle.records, "Elena", "entity")
    n = next(i for i, o in enumerate(options, 1) if o.answer == "MacBook Air")
    doubled = "Which device did I use to send a quick note to Lila on March 2??"
    lms = role_lms([option_reply(n)], [question_reply(doubled)], [audit_reply()], [blind_reply()])
    out, _ = _anchored(lms, bundle)
    assert out.status == "accepted", out.detail
    assert out.question.endswith("March 2?")
    assert any(r.before == doubled for r in out.repairs)
    # with "the user" too: both repairs, in their order, each recorded with its reason
    written = "Which device did the user use to send a quick note to Lila on March 2??"
    lms = role_lms([option_reply(n)], [question_reply(written)], [audit_reply()], [blind_reply()])
    out, _ = _anchored(lms, bundle)
    assert out.status == "accepted", out.detail
    assert out.question == "Which device did I use to send a quick note to Lila on March 2?"
    made = [r for r in out.repairs if r.field == "question"]
    assert [r.reason for r in made] == [
        "a doubled question mark was made one",
        "'the user' was put in the user's voice",
    ]
    assert made[0].before == written and made[-1].after == out.question


def test_an_echo_question_or_one_naming_part_of_the_answer_is_rewritten():
    from memsteer_dspy.supervision.program import _names_part_of

    assert _names_part_of("Who is Sofia's mother?", "Sofia Morales")
    assert not _names_part_of("Who brought in ginger tea?", "Sofia Morales")
    # a number answer written in the question leaks it; the ask's own date does not
    from memsteer_dspy.supervision.program import _writes_number

    leak = "How long did it take me to type during that 25-minute chat, on July 9, 2024?"
    assert _writes_number(leak, "25") and _writes_number("Did 2 hours pass?", "2 hours")
    assert not _writes_number("How many trays did I fill, on July 25, 2024?", "25")
    assert not _writes_number("How many trays did I fill, on 2024-07-25?", "25 trays")
    assert not _writes_number("How many trays cost 2.5 dollars?", "2") and not _writes_number(
        "x", "two"
    )
    echo = "This morning I sent a quick note to Lila from my what?"
    good = "Which laptop did the user send a quick note to Lila from on March 2?"
    out = _macbook_question_rewritten(echo, good, "not_fronted")
    # "the user" is the one asking: put in their voice
    assert out.question == "Which laptop did I send a quick note to Lila from on March 2?"


def test_a_question_word_with_no_verb_after_it_is_rewritten():
    from memsteer_dspy.supervision.program import _NO_VERB

    assert _NO_VERB.match("When Unable to Update on School Garden Plans?")
    assert _NO_VERB.match("On when Update on Canceled Garden Planting Activity?")
    for fine in (
        "When did I go?",
        "Where's my jacket?",
        "When was the email sent?",
        "When I was in Eugene, what did I wear?",
        "Who stopped by?",
    ):
        assert not _NO_VERB.match(fine), fine
    verbless = "Where the quick note to Lila from, on March 2?"
    good = "Which laptop did I send a quick note to Lila from on March 2?"
    assert _macbook_question_rewritten(verbless, good, "no_verb").question == good


def _macbook_question_rewritten(first: str, second: str, problem: str):
    """The MacBook Air option's candidate whose writer returns ``first``, rejected as ``problem``,
    then ``second``: accepted, with the rejection recorded as a repair."""
    bundle = small_bundle()
    options = answer_options(bundle.records, "Elena", "entity")
    n = next(i for i, o in enumerate(options, 1) if o.answer == "MacBook Air")
    lms = role_lms(
        [option_reply(n)],
        [question_reply(first), question_reply(second)],
        [audit_reply()],
        [blind_reply()],
    )
    out, _ = _anchored(lms, bundle)
    assert out.status == "accepted", out.detail
    reasons = [r.reason for r in out.repairs if r.field == "question"]
    assert any(problem in r for r in reasons), reasons
    return out


def test_a_question_writing_its_number_answer_is_rewritten():
    bundle = small_bundle()
    options = answer_options(bundle.records, "Elena", "number")
    n = next(i for i, o in enumerate(options, 1) if o.answer == "12 seed")
    plan = option_reply(
        n,
        evidence=[{"record_id": "R2", "contribution": "says it"}],
        fact_span_ids=["R2.2"],
        ask="how many seed trays Lila will bring",
    )
    leak = "How many trays will Lila bring besides the 12 seed trays?"
    good = "How many seed trays will Lila bring to the garden workshop?"
    lms = role_lms(
        [plan],
        [question_reply(leak), question_reply(good)],
        [audit_reply(facts=("R2.2",))],
        [blind_reply("12", cited=("c1:2#2",))],
    )
    out, _ = _anchored(
        lms, bundle, Task(question_type="fact", evidence_count=1, answer_type="number")
    )
    reasons = [r.reason for r in out.repairs if r.field == "question"]
    assert any("leaks_answer" in r for r in reasons), (reasons, out.detail)
    assert out.question == good  # (the scripted audit, about R1, then rejects it: not tested here)


def test_a_date_from_an_email_subject_is_asked_by_that_subject():
    from memsteer_dspy.signatures.plan import AnswerPlan, Fact

    from memsteer_dspy.supervision.program import _misses_subject, _subject_stems

    subject = "Apologies for Cancelling Tea and Garden Planning\nSummary: Elena is unwell."
    bundle = _mail_bundle("Elena", "Sofia", subject)
    subject = bundle.span("e:1#3")
    plan = AnswerPlan(
        ask="when I cancelled tea",
        answer="2024-07-01",
        answer_type="date",
        answer_span_id=subject.id,
        facts=[Fact(span_id=subject.id, statement=subject.text)],
        evidence=[],
        operations=["lookup"],
    )
    # one of many emails to Sofia: its date checks nothing
    assert _misses_subject("When did I send the email to Sofia Morales?", plan, bundle)
    assert _misses_subject("When did I write to Sofia about the garden?", plan, bundle)  # 1 of 4
    named = "When did I write the email apologizing for cancelling tea and garden planning?"
    assert not _misses_subject(named, plan, bundle)
    # only a date cited from a subject line is held to it
    sender = bundle.span("e:1#1")
    other = plan.model_copy(update={"answer_span_id": sender.id})
    assert not _misses_subject("When did I send the email to Sofia Morales?", other, bundle)
    assert not _misses_subject(
        "Who did I send it to?", plan.model_copy(update={"answer_type": "entity"}), bundle
    )
    # courtesies do not say which email it is: "Help" and "Morning" have to be asked by
    assert _subject_stems("Thank You for Your Help This Morning") == {"help", "morni"}


def test_a_name_in_a_series_of_names_is_no_entity_option():
    # one name of four has four right answers ("Who do I want to send a quick update to?" → Lila)
    series = (
        "User: I wanted to send a quick update to Lila, Mrs. Patel, Mr. Kim, and Ms. Rivera today."
    )
    assert [a for k, a in _answers(series) if k == "entity"] == []
    pair = "User: This morning Sofia and Mark came by with soup while Lila Nguyen watered the beds."
    assert [a for k, a in _answers(pair, "entity")] == ["Lila Nguyen"]
    # names in one sentence but in no series stay options
    apart = "User: Lila Nguyen brought the seed trays, then Mark Jensen fixed the speaker."
    assert [a for k, a in _answers(apart, "entity")] == ["Lila Nguyen", "Mark Jensen"]


def test_a_name_its_record_title_writes_is_no_entity_option():
    # the record's topic, not a detail: "What is the historical context of the Montessori Method?"
    text = "The Montessori Method guided my day with Amelia Torres at the garden club."
    title = {"title": "Notes on the Montessori Method"}
    record = RECORDS[0].model_copy(
        update={
            "id": "r:1",
            "thread_id": "r",
            "text": text,
            "timestamp": datetime(2024, 4, 15),
            "kind": "document_section",
            "metadata": title,
        }
    )
    history = History("Elena_Morales", [record])
    records = bundle_from_records(history, ["r:1"], BundleConfig()).records
    assert records[0].title == "Notes on the Montessori Method"
    got = [o.answer for o in answer_options(records, "Elena_Morales", "entity")]
    assert got == ["Amelia Torres"]
    # the same sentence under another title offers both names
    untitled = [records[0].model_copy(update={"title": "Garden club"})]
    got = [o.answer for o in answer_options(untitled, "Elena_Morales", "entity")]
    assert got == ["Montessori Method", "Amelia Torres"]


def _thread(*texts: str):
    records = [
        RECORDS[0].model_copy(
            update={
                "id": f"r:{n}",
                "thread_id": "r",
                "text": t,
                "timestamp": datetime(2024, 4, 15 + n),
                "kind": "email",
            }
        )
        for n, t in enumerate(texts, 1)
    ]
    ids = [r.id for r in records]
    return bundle_from_records(History("Elena_Morales", records), ids, BundleConfig()).records


def test_no_pair_option_on_an_address_line_or_a_repeated_sentence():
    # a reply repeats its thread's From line and subject: each email alone names the sender
    repeated = _thread(
        "From: Raj Mehta <raj.mehta@outlook.com>\nSubject: Book club: February\nThanks for coming.",
        "From: Raj Mehta <raj.mehta@outlook.com>\nSubject: Re: Book club: February\nApril is at mine.",
    )
    assert pair_options(repeated, "Elena_Morales") == []
    # a sentence and an address line: the question had nothing of the email to ask by
    header = _thread(
        "User: Several families, including Amelia Torres, had to cancel at the last minute today.",
        "Sender: Amelia Torres <amelia.torres@email.com>\nSorry we missed the open house.",
    )
    assert [o.answer for o in pair_options(header, "Elena_Morales")] == []
    # two records that each tell something of the same person still pair
    told = _thread(
        "User: Raj Mehta hosted the book club at his flat on Thursday evening.",
        "User: Raj Mehta lent me his copy of the novel after the meeting.",
    )
    got = pair_options(told, "Elena_Morales")
    assert [o.answer for o in got] == ["Raj Mehta"] and got[0].also


def test_part_of_a_quoted_title_gives_the_whole_title_and_a_label_no_option():
    # the blind reader answered "Resilience in Montessori" for the option "Resilience" (own-elena)
    quoted = (
        "User: I tried to jot down a few keywords for the “Resilience in Montessori” section "
        "with Sofia, but my hand cramped up."
    )
    entities = [a for k, a in _answers(quoted, "entity")]
    assert "Resilience in Montessori" in entities and "Resilience" not in entities
    assert "Sofia" in entities
    # a quoted passage is a quotation, not a name: none of its words is an option
    long_quote = (
        "User: My friend Sofia wrote “Resilience is what we practise when the garden floods and the Kids "
        "Club still meets on Thursday” on the card she gave me this morning."
    )
    entities = [a for k, a in _answers(long_quote, "entity")]
    assert "Sofia" in entities and not {"Resilience", "Kids Club", "Thursday"} & set(entities)
    # "*Student Highlight:* Mia …" — the label is no answer, the name after it is
    label = "- *Student Highlight:* Mia zipped her coat on her own and showed Amelia Torres."
    entities = [a for k, a in _answers(label, "entity")]
    assert "Student Highlight" not in entities and "Amelia Torres" in entities
