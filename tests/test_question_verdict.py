"""The repairs and the one verdict of a written question (supervision/question_rules.py), fixed when
the generator is built: the repairs are made in a fixed order, each recorded with its reason, and
the verdict's checks run in a fixed order, the first that fails giving the code."""

from __future__ import annotations

from dataclasses import replace

import pytest
from memsteer_dspy.signatures.plan import AnswerPlan, EvidenceUse, Fact
from supervision_helpers import small_bundle

from memsteer_dspy.supervision.checks import check_question
from memsteer_dspy.supervision.program import MemSteerGenerator
from memsteer_dspy.supervision.question_rules import (
    QuestionRules,
    question_echo,
    question_repairs,
    question_verdict,
    repaired,
)

BUNDLE = small_bundle()
# the MacBook Air of "User: This morning I sent a quick note to Lila from my MacBook Air."
PLAN = AnswerPlan(
    ask="which laptop I wrote to Lila from",
    answer="MacBook Air",
    answer_type="entity",
    answer_span_id="c1:1#1",
    facts=[Fact(span_id="c1:1#1", statement="I sent a quick note to Lila from my MacBook Air")],
    evidence=[EvidenceUse(record_id="c1:1", contribution="names the laptop")],
)
ALL = QuestionRules.of(lean=True, anchored=True, own_words=True, user_name="Elena")

ECHO_NAMING_SELF = "Which laptop did Elena use when I sent a quick note to Lila this morning?"
ECHO_NOT_FRONTED = "This morning I sent a quick note to Lila from my what?"


def _verdict(question: str, rules: QuestionRules = ALL, plan: AnswerPlan = PLAN, **kwargs):
    known = f"{BUNDLE.view().text}\nElena"
    evidence = f"{BUNDLE.subset(plan.evidence_ids).view().text}\nElena"
    return question_verdict(
        question, plan, BUNDLE, rules, known_text=known, evidence_text=evidence, **kwargs
    )


def test_the_rules_are_the_generator_s_flags_fixed_at_construction():
    gen = MemSteerGenerator(lean=True, anchored=True, own_words=True, user_name="Elena")
    assert gen.question_rules == ALL
    assert (ALL.kind_check, ALL.on_evidence, ALL.names_self, ALL.role_swap) == (True,) * 4
    plain = MemSteerGenerator(user_name="Elena").question_rules
    assert plain == QuestionRules(user_name="Elena")
    assert not (plain.kind_check or plain.names_self or plain.anchored or plain.own_words)
    with pytest.raises(AttributeError):  # frozen: no run-time flag flips
        ALL.anchored = False  # type: ignore[misc]


@pytest.mark.parametrize(
    ("question", "code"),
    [
        ("Which device did I use to send a quick note to Lila on March 2?", None),
        # check_question first: the answer written in a question that also names the asker
        ("Which laptop did Elena use when I wrote to Lila from my MacBook Air?", "leaks_answer"),
        ("Which laptop did the user use to write to Lila on March 2?", "mentions_records"),
        # then names_self, before the anchored checks and echoes
        (ECHO_NAMING_SELF, "names_self"),
        # the anchored checks, before echoes
        (ECHO_NOT_FRONTED, "not_fronted"),
        ("Where the quick note to Lila from, on March 2?", "no_verb"),
        ("Who is Air's maker that I used to write to Lila on March 2?", "leaks_answer"),
        # last, echoes
        ("Which laptop did I send a quick note to Lila from on March 2?", "echoes"),
    ],
)
def test_each_question_gets_the_code_of_the_first_check_it_fails(question, code):
    assert _verdict(question) == code


def test_a_question_failing_several_checks_gets_the_earliest_one_s_code():
    # the question naming the asker echoes too: names_self comes first, echoes without it
    assert question_echo(ECHO_NAMING_SELF, PLAN, BUNDLE)
    assert _verdict(ECHO_NAMING_SELF) == "names_self"
    assert _verdict(ECHO_NAMING_SELF, replace(ALL, names_self=False)) == "echoes"
    # not fronted and echoing: not_fronted (anchored) first, echoes without anchored
    assert question_echo(ECHO_NOT_FRONTED, PLAN, BUNDLE)
    assert _verdict(ECHO_NOT_FRONTED) == "not_fronted"
    assert _verdict(ECHO_NOT_FRONTED, replace(ALL, anchored=False)) == "echoes"
    # echoes only with own_words, and only when asked for (an ask may use its sentence's words)
    assert _verdict(ECHO_NOT_FRONTED, replace(ALL, anchored=False, own_words=False)) is None
    assert _verdict(ECHO_NOT_FRONTED, replace(ALL, anchored=False), echo=False) is None


def test_check_question_is_the_verdict_s_first_step():
    known = f"{BUNDLE.view().text}\nElena"
    for question in (
        "Which laptop did Elena use when I wrote to Lila from my MacBook Air?",
        "When?",
        "Which laptop did the user use to write to Lila on March 2?",
    ):
        first = check_question(question, PLAN.answer, "entity", (), known, kind_check=True)
        assert first is not None and _verdict(question) == first


def test_the_generator_s_question_problem_is_the_verdict_with_its_rules():
    gen = MemSteerGenerator(
        lean=True, anchored=True, own_words=True, user_name="Elena", cold_start=False
    )
    view = BUNDLE.view()
    for question in (ECHO_NAMING_SELF, ECHO_NOT_FRONTED, "Where the quick note to Lila from?"):
        assert gen._question_problem(question, PLAN, view, BUNDLE) == _verdict(question)
    # the anchored ask's check: its sentence's words are no echo
    assert (
        gen._question_problem(
            "Which laptop did I send a quick note to Lila from on March 2?",
            PLAN,
            view,
            BUNDLE,
            own_words=False,
        )
        is None
    )


# -- the repairs made before the verdict -----------------------------------------------------

REPAIR_REASONS = [
    "a doubled question mark was made one",
    "'the user' was put in the user's voice",
    "the question was put in the user's voice",
    "a date question's relative day was removed",
]


def test_the_repairs_are_built_once_from_the_flags_in_their_order():
    def reasons(**flags):
        return [fix.reason for fix in question_repairs(**flags)]

    assert reasons(lean=True, anchored=True, checks=True) == REPAIR_REASONS
    assert reasons(lean=False, anchored=True, checks=True) == [REPAIR_REASONS[i] for i in (0, 1, 3)]
    assert reasons(lean=True, anchored=False, checks=True) == REPAIR_REASONS[2:]
    assert reasons(lean=False, anchored=False, checks=True) == REPAIR_REASONS[3:]
    assert reasons(lean=True, anchored=True, checks=False) == []
    gen = MemSteerGenerator(lean=True, anchored=True, user_name="Elena", cold_start=False)
    own_name = "the user's own name was put in the user's voice"  # lean, with a user
    assert [fix.reason for fix in gen.question_repairs] == [
        *REPAIR_REASONS[:3],
        own_name,
        REPAIR_REASONS[3],
    ]


def test_the_repairs_are_applied_in_order_each_recorded_with_its_reason():
    dated = AnswerPlan(answer="2024-03-02", answer_type="date")
    written = "When did the user send your note to Lila this morning??"
    fixes = question_repairs(lean=True, anchored=True, checks=True)
    question, made = repaired(written, dated, fixes)
    assert question == "When did I send my note to Lila?"
    assert [r.reason for r in made] == REPAIR_REASONS
    assert [(r.stage, r.field) for r in made] == [("question", "question")] * 4
    # each repair starts from the one before it
    assert [r.before for r in made] == [written, *(r.after for r in made[:-1])]
    assert made[-1].after == question
    # the relative day only for a date question; a repair that changes nothing is not recorded
    entity = dated.model_copy(update={"answer_type": "entity"})
    question, made = repaired(written, entity, fixes)
    assert question == "When did I send my note to Lila this morning?"
    assert [r.reason for r in made] == REPAIR_REASONS[:3]
    assert repaired("When did I send my note to Lila?", dated, fixes) == (
        "When did I send my note to Lila?",
        [],
    )
    # lean keeps a quoted subject's words
    subject = "When was the email 'Plans Today' sent today?"
    assert repaired(subject, dated, fixes)[0] == "When was the email 'Plans Today' sent?"
    plain = question_repairs(lean=False, anchored=False, checks=True)
    assert repaired(subject, dated, plain)[0] == "When was the email 'Plans ' sent?"


def test_the_user_s_own_name_is_put_in_the_user_s_voice_where_it_is_the_asker():
    from memsteer_dspy.supervision.question_rules import question_repairs, repaired

    fixes = question_repairs(lean=True, anchored=True, checks=True, user="Elena Morales")
    from types import SimpleNamespace

    plan = SimpleNamespace(answer_type="entity")
    got, made = repaired("Who is providing a detailed update on Elena's symptoms?", plan, fixes)
    assert got == "Who is providing a detailed update on my symptoms?"
    assert [m.reason for m in made] == ["the user's own name was put in the user's voice"]
    assert repaired("Who wrote to Elena Morales about the garden?", plan, fixes)[0] == (
        "Who wrote to me about the garden?"
    )
    # as a subject, with its verb in the first person (lean 20): questions v21-elena lost to
    # names_self and misses_record
    for written, voiced in [
        ("Who is Elena studying with?", "Who am I studying with?"),
        ("Who does Elena write to about the outline?", "Who do I write to about the outline?"),
        ("When did Elena Morales send the email to Lila?", "When did I send the email to Lila?"),
        ("Who was Elena attempting to call?", "Who was I attempting to call?"),
        ("Who emails Elena to apologize?", "Who emails me to apologize?"),
        (
            "What did I bring, on the day Elena writes to Amelia?",
            "What did I bring, on the day I write to Amelia?",
        ),
    ]:
        assert repaired(written, plan, fixes)[0] == voiced, written
    # a name followed by no plain verb is left
    assert (
        repaired("Who gave Elena's sister a ride?", plan, fixes)[0] == "Who gave my sister a ride?"
    )
    assert repaired("Is Elena Morales the organizer?", plan, fixes)[0] == "Am I the organizer?"
    # someone else's name, and a pipeline that is not lean, are left alone
    assert repaired("Who helped Sofia with the seedlings?", plan, fixes)[0].endswith(
        "Sofia with the seedlings?"
    )
    plain = question_repairs(lean=False, anchored=True, checks=True, user="Elena Morales")
    assert repaired("Who wrote to Elena?", plan, plain)[0] == "Who wrote to Elena?"
