"""What a generator holds its written questions to, fixed when the generator is built from its
flags (``lean``, ``anchored``, ``own_words``, ``checks``), as ``dspy.ChainOfThought`` adds its
field once instead of asking at every call: the repairs made to a question's words
(:class:`QuestionRepair`, :func:`question_repairs`, applied in order by :func:`repaired`) and the
one verdict on it (:class:`QuestionRules`, :func:`question_verdict`), of which
:func:`~memsteer_dspy.supervision.checks.check_question` is the first step.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial

from memsteer_dspy.bundles import Bundle
from memsteer_dspy.records import Span
from memsteer_dspy.signatures.plan import AnswerPlan
from memsteer_dspy.supervision.asks import (
    _FRONTED,
    _NO_VERB,
    _drop_relative_day,
    _misses_subject,
    _names_part_of,
    _writes_number,
    first_person,
    user_voice,
)
from memsteer_dspy.supervision.checks import (
    _RELATIVE_TIME,
    Repair,
    check_question,
    echoes,
    names_self,
    records_missed,
    swaps_roles,
)

BRIDGE_DAY = ", on the day "
"""What the program adds before a bridge's other record's event ("…, on the day <event>?")."""


# -- repairs of a question's words -----------------------------------------------------------


@dataclass(frozen=True)
class QuestionRepair:
    """One deterministic repair of a written question: ``apply`` returns the question repaired, or
    unchanged when it does not apply; ``reason`` is the :class:`Repair` record's reason."""

    reason: str
    apply: Callable[[str, AnswerPlan], str]


def _one_question_mark(question: str, plan: AnswerPlan) -> str:
    return re.sub(r"\?{2,}", "?", question)  # "…cover??" failed as compound


def _users_voice(question: str, plan: AnswerPlan) -> str:
    return first_person(question, keep_quoted=True)  # "Who did the user sketch …?"


def _voiced(question: str, plan: AnswerPlan) -> str:
    return user_voice(question)


def _no_relative_day(question: str, plan: AnswerPlan, *, keep_quoted: bool) -> str:
    if str(plan.answer_type) != "date" or not _RELATIVE_TIME.search(question):
        return question
    return _drop_relative_day(question, keep_quoted=keep_quoted)


# where the user's own name stands for "me": after a preposition or a verb done to someone
_TO_SOMEONE = (
    "to with for from about by on at of helped told asked invited thanked emailed visited called "
    "sent wrote reminded gave met joined "
    "helps tells asks invites thanks emails visits calls sends reminds gives meets joins".split()
)


# an auxiliary before the user's name ("Who is Elena studying with?") or after it ("Elena has"),
# in the first person
_FIRST_PERSON_INVERTED = {
    "is": "am",
    "was": "was",
    "does": "do",
    "did": "did",
    "has": "have",
    "had": "had",
    "will": "will",
    "would": "would",
    "can": "can",
    "could": "could",
    "should": "should",
    "might": "might",
    "must": "must",
}
# past forms that keep their form after "I" ("Elena wrote" -> "I wrote"), besides "-ed"
_PAST = frozenset(
    "went met made said told saw took gave sent bought ate wrote felt left came kept found heard "
    "thought knew began spent paid read got brought taught ran sat stood won lost held chose drove "
    "flew forgot grew hung hid led lit meant rode rang rose sang slept spoke swam threw "
    "understood woke wore".split()
)


def _first_person_verb(word: str) -> str | None:
    """``word`` as the verb of "I" where it is the verb of a third-person subject ("writes" ->
    "write", "is" -> "am", "wrote" -> "wrote"), else None (not plainly a verb)."""
    low = word.lower()
    if low in _FIRST_PERSON_INVERTED:  # is -> am, has -> have, does -> do; was, did, … as they are
        return _same_case(_FIRST_PERSON_INVERTED[low], word)
    if low in _PAST or (low.endswith("ed") and len(low) > 4):
        return word
    if low.endswith("ies") and len(low) > 4:
        return word[:-3] + "y"  # replies -> reply
    if re.search(r"(?:ss|sh|ch|x|z|o)es$", low):
        return word[:-2]  # finishes -> finish, goes -> go
    if low.endswith("s") and not low.endswith(("ss", "us", "is")) and len(low) > 3:
        return word[:-1]  # writes -> write, recaps -> recap
    return None


def _same_case(word: str, like: str) -> str:
    return word[:1].upper() + word[1:] if like[:1].isupper() else word


def own_name_in_voice(text: str, user: str) -> str:
    """``user``'s own name put in the user's voice where it is plainly the asker: "Elena's" →
    "my", "to Elena (Morales)" → "to me", and as a subject with its verb — "is Elena studying" →
    "am I studying", "Elena writes to" → "I write to", "did Jonas Richter find" → "did I find".
    The writer reads records that speak of the user in the third person (RHELM's email summaries:
    "Sofia emails Dr. Liu … about Elena's worsened symptoms") and asked "Who is providing a
    detailed update on Elena's symptoms", which the program's "on the day I …" then made a
    question naming its own asker (``names_self``): three of wx-elena's candidates, two of them
    bridges; and a bridge's day phrase made from such a summary named the user itself ("…, on the
    day Jonas recaps the afternoon team session at Impact Hub?", v21-jonas). A name followed by no
    plain verb is left."""
    if not user:
        return text
    first = re.escape(user.split()[0])
    name = rf"(?:{re.escape(user)}|{first})"
    out = re.sub(rf"\b{name}['’]s\b", "my", text)
    out = re.sub(rf"\b({'|'.join(_TO_SOMEONE)})\s+{name}\b", r"\1 me", out, flags=re.I)
    inverted = "|".join(_FIRST_PERSON_INVERTED)
    out = re.sub(
        rf"\b({inverted})\s+{name}\b",
        lambda m: f"{_same_case(_FIRST_PERSON_INVERTED[m.group(1).lower()], m.group(1))} I",
        out,
        flags=re.I,
    )

    def subject(m: re.Match[str]) -> str:
        verb = _first_person_verb(m.group(1))
        return m.group(0) if verb is None else f"I {verb}"

    return re.sub(rf"\b{name}\s+([A-Za-z]+)\b", subject, out)


def _own_name_in_voice(question: str, plan: AnswerPlan, *, user: str) -> str:
    return own_name_in_voice(question, user)


def question_repairs(
    *, lean: bool, anchored: bool, checks: bool, user: str = ""
) -> tuple[QuestionRepair, ...]:
    """The repairs a generator's written question gets, in the order they are made: with
    ``anchored``, a doubled question mark made one and "the user" put in the user's voice
    (:func:`~memsteer_dspy.supervision.asks.first_person`, quoted text kept); with ``lean``, "you"
    put in the user's voice (:func:`~memsteer_dspy.supervision.asks.user_voice`), and ``user``'s own
    name where it is plainly the asker (:func:`_own_name_in_voice`); a date question's
    relative day removed ("today" only hides the answer; ``lean`` keeps a quoted subject's words).
    No repairs without ``checks``."""
    if not checks:
        return ()
    fixes: list[QuestionRepair] = []
    if anchored:
        fixes.append(QuestionRepair("a doubled question mark was made one", _one_question_mark))
        fixes.append(QuestionRepair("'the user' was put in the user's voice", _users_voice))
    if lean:
        fixes.append(QuestionRepair("the question was put in the user's voice", _voiced))
        if user:
            fixes.append(
                QuestionRepair(
                    "the user's own name was put in the user's voice",
                    partial(_own_name_in_voice, user=user),
                )
            )
    fixes.append(
        QuestionRepair(
            "a date question's relative day was removed",
            partial(_no_relative_day, keep_quoted=lean),
        )
    )
    return tuple(fixes)


def repaired(
    question: str, plan: AnswerPlan, fixes: Sequence[QuestionRepair]
) -> tuple[str, list[Repair]]:
    """``question`` after each of ``fixes`` in turn, and a :class:`Repair` for each that changed it."""
    made: list[Repair] = []
    for fix in fixes:
        if (after := fix.apply(question, plan)) != question:
            made.append(
                Repair(
                    stage="question",
                    field="question",
                    before=question,
                    after=after,
                    reason=fix.reason,
                )
            )
            question = after
    return question, made


# -- the verdict -----------------------------------------------------------------------------


@dataclass(frozen=True)
class QuestionRules:
    """Which checks of :func:`question_verdict` a generator's questions must pass, fixed from its
    flags (:meth:`of`); :func:`~memsteer_dspy.supervision.checks.check_question`'s defaults always.

    ``kind_check`` (lean): check_question's strict topic words, unknown details, length, kind of
    answer and compound questions; ``on_evidence`` (lean): its topic words held to the plan's
    evidence records (``off_evidence``); ``names_self`` and ``role_swap`` (lean): the asker named
    in the third person, a "Who …?" answered by the one the user did it to; ``anchored``: the
    anchored writer's failures (not fronted, no verb, a part of the answer or its number written,
    an email's subject not named, an evidence record named nothing of); ``own_words``: a question
    that copies its evidence records' wording is ``echoes`` (and check_question's
    ``off_evidence`` allowance is a third)."""

    kind_check: bool = False
    on_evidence: bool = False
    names_self: bool = False
    role_swap: bool = False
    anchored: bool = False
    own_words: bool = False
    user_name: str | None = None

    @classmethod
    def of(
        cls, *, lean: bool, anchored: bool, own_words: bool, user_name: str | None
    ) -> QuestionRules:
        """The rules of a generator built with these flags."""
        return cls(
            kind_check=lean,
            on_evidence=lean,
            names_self=lean,
            role_swap=lean,
            anchored=anchored,
            own_words=own_words,
            user_name=user_name,
        )


def question_echo(
    question: str, plan: AnswerPlan, bundle: Bundle, bridge: Span | None = None
) -> list[str] | None:
    """What of its evidence records' wording the question copies
    (:func:`~memsteer_dspy.supervision.checks.echoes`), else None (also for a plan without
    evidence records). With a ``bridge`` the program's "on the day <event>" names the other record
    by its own words (as RHELM's questions do): the writer's part is held to the answer's record."""
    if not plan.evidence_ids:
        return None
    ids = plan.evidence_ids
    if bridge is not None:
        question, ids = question.split(BRIDGE_DAY)[0], ids[:1]
    text = "\n".join(s.text for s in bundle.subset(ids).spans())
    # a question about two records names something of each (records_missed): the allowance
    # is per evidence record
    return echoes(question, text, plan.answer, records=len(ids))


def question_verdict(
    question: str,
    plan: AnswerPlan,
    bundle: Bundle,
    rules: QuestionRules,
    *,
    demos: Iterable[str] = (),
    known_text: str | None = None,
    evidence_text: str | None = None,
    bridge: Span | None = None,
    update: Span | None = None,
    echo: bool = True,
    examples: Iterable[str] = (),
) -> str | None:
    """Why a written question is unusable (a reason code), or None: the one verdict, its checks in
    a fixed order, the first that fails giving the code.

    First :func:`~memsteer_dspy.supervision.checks.check_question` against ``demos`` (the
    demonstrations' questions) and ``examples`` (the writer examples' questions), ``known_text``
    (what it may name) and ``evidence_text`` (the plan's evidence records, with ``on_evidence``);
    a ``bridge``'s "on the day <event>" is the program's, not the writer's length. Then, by ``rules``: ``names_self``, ``role_swap``; the
    anchored ``not_fronted``, ``no_verb``, ``leaks_answer`` (a part of a name answer, a number
    answer's number), ``vague`` (an email's subject not named) and ``misses_record`` (not for an
    ``update``: its two records share its topic, the question asks by it, not by each); last, with
    ``own_words`` and ``echo``, ``echoes`` (:func:`question_echo`)."""
    added = 0  # a bridge's "on the day <event>" is the program's, not the writer's length
    if BRIDGE_DAY in question and bridge is not None:
        added = 3 + len(question.split(BRIDGE_DAY, 1)[1].split())
    kind = str(plan.answer_type)
    problem = check_question(
        question,
        plan.answer,
        kind,
        demos,
        known_text,
        kind_check=rules.kind_check,
        evidence_text=evidence_text,
        own_words=rules.own_words,
        extra_words=added,
        examples=examples,
    )
    if problem is not None:
        return problem
    if rules.names_self and names_self(question, rules.user_name):
        return "names_self"  # "When did I talk to Elena Morales?", asked by Elena Morales
    if rules.role_swap and kind == "entity":
        span = bundle.span(plan.answer_span_id) if plan.answer_span_id else None
        if span is not None and swaps_roles(question, plan.answer, span.text):
            return "role_swap"  # "Who tried to dictate …?" -> whom the user dictated to
    if rules.anchored:
        if not _FRONTED.match(question):  # "… altered my day as the what?"
            return "not_fronted"
        if _NO_VERB.match(question):  # "When Unable to Update on School Garden Plans?"
            return "no_verb"
        if kind == "entity" and _names_part_of(question, plan.answer):
            return "leaks_answer"  # "Who is Sofia's mother?" -> Sofia Morales
        if kind == "number" and _writes_number(question, plan.answer):
            return "leaks_answer"  # "How long … that 25-minute chat …?" -> 25
        if _misses_subject(question, plan, bundle):
            return "vague"  # "When did I send the email to Sofia Morales?": which one?
        if len(plan.evidence_ids) > 1 and update is None:
            # (an update's two records share its topic: the question asks by it, not by each)
            texts = [bundle.subset([rid]).view().text for rid in plan.evidence_ids]
            if records_missed(question, plan.answer, texts):
                return "misses_record"
    if echo and rules.own_words and question_echo(question, plan, bundle, bridge):
        return "echoes"
    return None
