"""Bridges and knowledge updates (BundleConfig.bridges, BundleConfig.updates): two-record items
the program builds. A bridge's answer one record writes, asked "on the day" another record's event
happened, the way RHELM's official multi-record questions are asked ("Who shared the evening meal
with me on the day Sofia completed her model rocket launch?"); an update's answer is the value a
later record writes for what an earlier one wrote ("When is my dental cleaning now?")."""

from __future__ import annotations

from datetime import datetime

from supervision_helpers import (
    RECORDS,
    audit_reply,
    blind_reply,
    option_reply,
    question_reply,
    role_lms,
    small_history,
)

from memsteer_dspy.bundles import (
    BundleConfig,
    BundleSampler,
    Task,
    bridge_event,
    bridge_options,
    bundle_from_records,
    small_lm_bundle_config,
    task_options,
)
from memsteer_dspy.graph import RecordGraph
from memsteer_dspy.supervision.program import MemSteerGenerator
from memsteer_dspy.supervision.run import GenerationConfig

MULTI = Task(question_type="multi-hop", evidence_count=2, answer_type="entity")


def _turn(rid: str, when: datetime, text: str):
    """A conversation turn of its own thread."""
    thread = rid.partition(":")[0]
    update = {"id": rid, "thread_id": thread, "timestamp": when, "text": f"User: {text}"}
    return RECORDS[0].model_copy(update=update)


# another thread on c1's day (2024-03-02), and one on a day nothing else happened
KILN = _turn(
    "d1:1",
    datetime(2024, 3, 2, 18),
    "This morning the kiln at Stoneworks cracked during the glaze firing.",
)
LATER = _turn(
    "z1:1",
    datetime(2024, 6, 9, 18),
    "Today I repotted the fig tree from Dana Pruitt into a bigger planter.",
)


def _history():
    return small_history([KILN, LATER])


def _bundle(ids):
    return bundle_from_records(_history(), ids, BundleConfig())


def test_a_bridge_event_is_its_sentence_s_first_clause_without_the_time_of_day():
    storm = (
        "This morning, just as we finished setting up for the Open House, a sudden winter storm "
        "rolled in with icy rain"
    )
    assert bridge_event(storm) == "we finished setting up for the Open House"
    assert bridge_event("[Upload 36_notes_task_9353f783] I printed the checklist for Lila.") == (
        "I printed the checklist for Lila"
    )
    assert (
        bridge_event("Subject: Draft Feedback Request") == 'of the email "Draft Feedback Request"'
    )
    long = "I " + " ".join(f"w{i}" for i in range(30))
    assert len(bridge_event(long).split()) == 10
    # an email's subject is no bridge's event (the writer quoted it whole), nor a subjectless one
    from memsteer_dspy.bundles import _tells_event

    assert not _tells_event(bridge_event("Subject: Update on Elena's Symptoms – December 15"))
    assert _tells_event("I just got back from a full day in Eugene")
    assert not _tells_event("felt especially peaceful in my bedroom")
    # a phrase cut at its tenth word does not end on "for the"; a gerund or "Just …" is no subject
    cut = "I tried to jot down a few keywords for the Resilience section of my outline."
    assert bridge_event(cut) == "I tried to jot down a few keywords"
    assert not _tells_event(bridge_event("Referencing that passage from the book helped me."))
    assert not _tells_event(bridge_event("Just wrapped up a productive call with Katarzyna."))


def test_bridge_options_ask_an_answer_by_another_record_of_its_day():
    bundle = _bundle(["c1:1", "d1:1", "mail:1"])
    got = {o.answer: o for o in bridge_options(bundle.records, "Elena")}
    # c1:1's names, bridged by the kiln (the same day, another record), and the kiln's by c1:1
    assert got["MacBook Air"].bridge == "d1:1#1"
    assert got["MacBook Air"].span_ids == ("c1:1#1", "d1:1#1")
    assert got["Stoneworks"].bridge == "c1:1#1"
    # mail:1 is the only record of its day: no bridge for GreenLeaf or its 45 dollars
    assert "GreenLeaf" not in got and "45 dollars" not in got
    # never a date: "When did I …, on the day …?" is the record's own date
    assert all(o.answer_type != "date" for o in got.values())
    # an event sentence that writes the answer answers alone: c1:2's Lila is not bridged by c1:1
    # ("a quick note to Lila"), and nothing bridges across days
    bundle = _bundle(["c1:1", "c1:2", "z1:1"])
    got = {o.answer: o for o in bridge_options(bundle.records, "Elena")}
    assert "Lila" not in got and "Dana Pruitt" not in got
    # a same-day event about the answer's own topic is the same event told twice: no bridge
    twice = _turn(
        "d2:1", datetime(2024, 3, 2, 19), "I sent another quick note about the garden to Sofia."
    )
    bundle = bundle_from_records(small_history([twice]), ["c1:1", "d2:1"], BundleConfig())
    got = {o.answer: o for o in bridge_options(bundle.records, "Elena")}
    assert "MacBook Air" not in got, got


def test_told_bridge_events_are_deeds_not_a_conversation_s_reactions():
    """--bridge-events told: the day phrases the embedded model's RHELM bridges carried, which say
    nothing of the day, are turned away; events — the user's, another person's, an email's
    summary — still bridge."""
    from memsteer_dspy.bundles.options import _tells_deed, _tells_event

    reactions = [
        "I think you’re right",  # a word to the assistant
        "What really struck me was how the podcast emphasized giving",  # a question's opener
        "I really like how the document breaks down the cost",
        "I do feel pretty isolated tonight",
        "I love how intentional our little Advent setting feels",
        "I kept hoping I’d rally enough to reach out",
        "I was really looking forward to some focused journaling",
        "I wanted to send a quick update to Lila",
        "I’d love some help drafting a short reflection for families",
        "I’m still turning over how energizing it was to sketch",
        "It’s interesting you mention “emotional directness”",
    ]
    for phrase in reactions:
        assert _tells_event(phrase) or phrase.startswith("It’s"), phrase
        assert not _tells_deed(phrase), phrase
    deeds = [
        "I cycled over to Charité for my annual health check-up",
        "Sofia completed her model rocket launch",
        "Jonas sends Ahmed a thank-you email following the morning’s repair",  # not "you"
        "We agreed we don't want to go over $5,500 total",
        "I finally brought my bike over to Ahmed’s Werkstatt",
        "I really appreciated how Dr. Liu guided the conversation",  # it happened
    ]
    for phrase in deeds:
        assert _tells_deed(phrase), phrase
    # still a subject and four words first, as _tells_event asks
    assert not _tells_deed("felt especially peaceful in my bedroom")


def test_told_bridge_events_leave_a_reaction_s_day_unbridged():
    like = "I really like how the Stoneworks studio arranged the glaze shelves."
    bundle = bundle_from_records(
        small_history([_turn("d3:1", datetime(2024, 3, 2, 20), like)]),
        ["c1:1", "d3:1"],
        BundleConfig(),
    )
    subject = {o.answer: o for o in bridge_options(bundle.records, "Elena")}
    assert subject["MacBook Air"].bridge == "d3:1#1"  # the default takes any subject's clause
    assert "MacBook Air" not in {
        o.answer for o in bridge_options(bundle.records, "Elena", events="told")
    }
    # a deed of the same day still bridges under "told"
    bundle = _bundle(["c1:1", "d1:1"])
    told = {o.answer: o for o in bridge_options(bundle.records, "Elena", events="told")}
    assert told["MacBook Air"].bridge == "d1:1#1"
    # the task's options and the sampler's bundle kinds follow the setting
    options = task_options(bundle.records, MULTI, "Elena", bridges=True, bridge_events="told")
    assert any(o.bridge == "d1:1#1" for o in options)
    try:
        bridge_options(bundle.records, "Elena", events="said")
    except ValueError as e:
        assert "said" in str(e) and "told" in str(e)
    else:
        raise AssertionError("an unknown bridge_events value was taken")


def test_bridge_events_keep_the_runs_key_at_their_default():
    """Runs made before the setting existed resume: the default is not in the key."""
    assert "bridge_events" not in GenerationConfig().identity()["bundle"]
    told = GenerationConfig(bundle=BundleConfig(bridge_events="told")).identity()["bundle"]
    assert told["bridge_events"] == "told"


def test_bridge_events_reach_the_bundle_config_from_the_cli():
    import pytest
    import typer

    from memsteer_dspy.cli.generate import _bundle_config
    from memsteer_dspy.lm import LMConfig

    lm_config = LMConfig.uniform()
    args = ("small", lm_config, 2500, None, True, 2.0)
    config, _ = _bundle_config(*args, True, None, "told")
    assert config.bridge_events == "told" and config.bridges
    assert _bundle_config(*args, True)[0].bridge_events == "subject"
    with pytest.raises(typer.BadParameter, match="choose one of subject, told"):
        _bundle_config(*args, True, None, "said")
    # without the anchored planner there are no bridges to tell: refused, not ignored
    with pytest.raises(typer.BadParameter, match="anchored planner"):
        _bundle_config("small", lm_config, 2500, None, False, 1.0, False, None, "told")


def test_two_record_tasks_offer_bridges_first_and_one_record_tasks_none():
    bundle = _bundle(["c1:1", "d1:1", "mail:1"])
    options = task_options(bundle.records, MULTI, "Elena", bridges=True)
    assert options[0].bridge is not None
    assert all(o.bridge is None for o in task_options(bundle.records, MULTI, "Elena"))
    fact = Task(question_type="fact", evidence_count=1, answer_type="entity")
    assert all(o.bridge is None for o in task_options(bundle.records, fact, "Elena", bridges=True))


def test_the_sampler_puts_a_record_of_the_seed_s_day_in_place_of_the_last_and_rebuilds_it():
    history = _history()
    graph = RecordGraph.build(history)
    config = small_lm_bundle_config(steer_to_options=True, steer_to_pairs=True, bridges=True)
    bundle = bundle_from_records(history, ["c1:1", "mail:1", "z1:1"], BundleConfig())
    sampler = BundleSampler(graph, config, seed=3, max_candidates=3)
    day = sampler._day_bundle(bundle, 0)
    assert day is not None
    assert day.record_ids[:2] == ["c1:1", "mail:1"]
    assert day.record_ids[2] in {"c1:2", "d1:1"}  # c1:1's day, not in the bundle yet
    assert day.path[-1] == ("c1:1", day.record_ids[2], "day")
    assert bridge_options(day.records, history.user_id)
    # a resumed run rebuilds the same bundle: the day's record comes from the candidate's index
    again = BundleSampler(graph, config, seed=3, max_candidates=3)._day_bundle(bundle, 0)
    assert again is not None and again.id == day.id
    # a seed whose day has no other record keeps its bundle
    alone = bundle_from_records(history, ["z1:1", "mail:1", "c1:1"], BundleConfig())
    assert sampler._day_bundle(alone, 0) is None
    # every candidate of the sampler is rebuilt from its logged task
    for i in range(len(sampler)):
        cand = sampler.candidate(i)
        if cand.bundle is not None:
            rebuilt = BundleSampler(graph, config, seed=3, max_candidates=3).candidate(
                i, task=cand.task
            )
            assert rebuilt.bundle is not None and rebuilt.bundle.id == cand.bundle.id
    # on in the anchored sampling, and part of a run's key only when on
    assert "bridges" not in GenerationConfig().identity()["bundle"]
    assert GenerationConfig(bundle=config).identity()["bundle"]["bridges"] is True


def _bridged(blind_cited, question, day_verdict: str | None = "supported"):
    bundle = _bundle(["c1:1", "d1:1", "mail:1"])
    options = task_options(bundle.records, MULTI, "Elena", bridges=True)
    n = next(i for i, o in enumerate(options, 1) if o.answer == "MacBook Air" and o.bridge)
    audit = audit_reply(facts=("R1.1", "R2.1"))
    if day_verdict is not None:
        audit["record_checks"].append(
            {"record_id": "R2", "rationale": "says the day", "verdict": day_verdict}
        )
    plan = option_reply(n, evidence=[{"record_id": "R1", "contribution": "names the laptop"}])
    lms = role_lms(
        [plan],
        [question_reply(question)] * 2,  # the first, and its one re-write
        [audit],
        [blind_reply("MacBook Air", cited=blind_cited)],
    )
    gen = MemSteerGenerator(
        lms,
        max_retries=0,
        lean=True,
        anchored=True,
        user_name="Elena",
        bridges=True,
        own_words=True,
    )
    return gen(bundle=bundle, task=MULTI, shuffle_seed=0).outcome, lms


QUESTION = "From which computer did I send a quick note on the day the Stoneworks kiln cracked?"


def test_a_bridge_is_asked_by_the_other_record_s_event_and_its_day_record_needs_no_citation():
    out, lms = _bridged(("c1:1#1",), QUESTION)
    assert out.status == "accepted", (out.reason, out.detail)
    assert out.plan.evidence_ids == ["c1:1", "d1:1"]
    assert out.question_type == "multi-hop"
    # the writer was asked by the answer's record alone (no date, no day), and read only it
    assert "on the day" not in out.plan.ask and "March" not in out.plan.ask
    prompt = str(lms["question_writer"].history[-1]["messages"])
    assert "MacBook Air" in prompt and "Stoneworks" not in prompt
    # it wrote the day itself here, so the program added nothing
    assert out.question == QUESTION
    # the blind reader found the answer in its record; the day's record is checked by its date
    (day,) = [r for r in out.repairs if r.stage == "blind"]
    assert day.after == "d1:1" and "bridge" in day.reason
    assert out.blind.missing_evidence == []


def test_a_bridge_s_day_record_is_settled_by_the_program_whatever_the_auditor_says_of_it():
    # v20-jonas: the auditor judged only the answer's record and the right-read bridge was lost
    for day_verdict in (None, "unsupported"):
        out, _ = _bridged(("c1:1#1",), QUESTION, day_verdict=day_verdict)
        assert out.status == "accepted", (day_verdict, out.reason, out.detail)
        day = [c for c in out.audit.record_checks if c["record_id"] == "d1:1"]
        assert day[-1]["verdict"] == "supported" and "program checked" in day[-1]["rationale"]


def test_the_program_adds_the_day_a_writer_left_out_and_holds_its_own_words_to_the_answer():
    out, _ = _bridged(("c1:1#1",), "Which laptop did I write to Lila from?")
    assert out.status == "accepted", (out.reason, out.detail)
    assert out.question == (
        "Which laptop did I write to Lila from, on the day the kiln at Stoneworks cracked during "
        "the glaze firing?"
    )
    (added,) = [r for r in out.repairs if r.field == "question"]
    assert "bridge" in added.reason
    # the program's clause does not count toward the writer's 25 words
    long = "Which laptop did I use this morning to write my quick hello and the garden news to Lila from?"
    out, _ = _bridged(("c1:1#1",), long)
    assert len(out.question.split()) > 25 and out.reason != "question:too_long", out.reason
    # the program's clause copies the day's record by design; the writer's part may not copy
    # the answer's: rewritten once, then rejected
    copied = "Which device did I send a quick note to Lila from?"
    out, _ = _bridged(("c1:1#1",), copied)
    assert out.reason == "question:echoes", out.reason


# ---- knowledge updates -----------------------------------------------------------------------


def _mail(rid: str, when: datetime, text: str):
    return RECORDS[2].model_copy(
        update={"id": rid, "thread_id": "dental", "timestamp": when, "text": text}
    )


BOOKED = _mail(
    "e:1",
    datetime(2025, 2, 20),
    "Subject: Appointment confirmation\nThis confirms your cleaning and exam with Dr. Helen Voss on Tuesday, March 18, 2025 at 9:00 AM.",
)
MOVED = _mail(
    "e:2",
    datetime(2025, 3, 12),
    "Subject: Re: Appointment confirmation\nI've moved your cleaning and exam with Dr. Voss to Thursday, March 27, 2025 at 3:30 PM.",
)
DATE_TASK = Task(question_type="multi-hop", evidence_count=2, answer_type="date")


def test_update_options_are_the_later_value_of_what_an_earlier_record_wrote():
    from memsteer_dspy.bundles import update_options

    history = small_history([BOOKED, MOVED])
    bundle = bundle_from_records(history, ["e:1", "e:2", "mail:1"], BundleConfig())
    (update,) = update_options(bundle.records, "Elena")
    assert (update.answer, update.answer_type) == ("March 27, 2025", "date")
    assert (update.span_id, update.earlier) == ("e:2#2", "e:1#2")
    assert update.span_ids == ("e:2#2", "e:1#2")
    # the earlier record's value is no update of the later one, whatever the bundle's order
    reverse = bundle_from_records(history, ["e:2", "e:1"], BundleConfig())
    assert [o.answer for o in update_options(reverse.records, "Elena")] == ["March 27, 2025"]
    # another topic is no update (mail:1's March 4 compost order), nor is a value written before
    again = MOVED.model_copy(update={"id": "e:3", "timestamp": datetime(2025, 3, 20)})
    history = small_history([BOOKED, MOVED, again])
    same = bundle_from_records(history, ["e:2", "e:3"], BundleConfig())
    assert update_options(same.records, "Elena") == []
    assert all(
        o.bridge is None and o.earlier is None
        for o in task_options(same.records, DATE_TASK, "Elena")
    )
    # offered to two-record tasks with the flag, first
    assert task_options(bundle.records, DATE_TASK, "Elena", updates=True)[0] == update


def _updated(blind_answer: str):
    history = small_history([BOOKED, MOVED])
    bundle = bundle_from_records(history, ["e:1", "e:2", "mail:1"], BundleConfig())
    options = task_options(bundle.records, DATE_TASK, "Elena", updates=True)
    n = next(i for i, o in enumerate(options, 1) if o.earlier)
    audit = audit_reply(facts=("R2.2", "R1.2"))
    audit["record_checks"].append(
        {"record_id": "R2", "rationale": "moves it", "verdict": "supported"}
    )
    plan = option_reply(
        n,
        evidence=[{"record_id": "R2", "contribution": "the new date"}],
        fact_span_ids=["R2.2"],
        ask="when the cleaning is",
    )
    lms = role_lms(
        [plan],
        [question_reply("When is my cleaning and exam with Dr. Voss now?")],
        [audit],
        [blind_reply(blind_answer, cited=("e:2#2",))],
    )
    gen = MemSteerGenerator(
        lms, max_retries=0, lean=True, anchored=True, user_name="Elena", updates=True
    )
    return gen(bundle=bundle, task=DATE_TASK, shuffle_seed=0).outcome, lms


def test_an_update_asks_for_the_current_value_and_a_reader_giving_the_stale_one_fails_it():
    out, lms = _updated("March 27, 2025")
    assert out.status == "accepted", (out.reason, out.detail)
    assert out.plan.evidence_ids == ["e:2", "e:1"] and out.plan.answer == "March 27, 2025"
    assert out.question_type == "knowledge-update"
    # asked by the earlier sentence, "now": the question may name the shared topic only
    assert out.plan.ask.endswith("now that it has changed") and "Voss" in out.plan.ask
    (cite,) = [r for r in out.repairs if r.stage == "blind"]
    assert cite.after == "e:1"
    out, _ = _updated("March 18, 2025")  # the memory that kept the first booking
    assert out.reason == "blind:mismatch", out.reason


def test_the_program_s_day_names_the_user_in_the_user_s_voice(monkeypatch):
    """A day record that speaks of the user in the third person (RHELM's email summaries) gives a
    day in the asker's voice: "…, on the day I recap …", never "…, on the day Elena recaps …"
    (anchored 22; v21-jonas lost such a bridge)."""
    import sys

    here = sys.modules[__name__]
    summary = KILN.model_copy(
        update={
            "text": "User: Elena recaps the glaze firing at Stoneworks, which cracked the kiln."
        }
    )
    monkeypatch.setattr(here, "KILN", summary)
    assert "Elena recaps" in bridge_event("Elena recaps the glaze firing at Stoneworks.")
    out, _ = _bridged(("c1:1#1",), "Which laptop did I write to Lila from?")
    assert out.status == "accepted", (out.reason, out.detail)
    assert out.question.startswith("Which laptop did I write to Lila from, on the day I recap ")
    assert "Elena" not in out.question
