"""Turning a plan into a question's words: the sentence ask (:func:`sentence_ask`, the answer's
sentence with a question word in the answer's place; :func:`header_ask` for an email's sender or
subject), the user's voice (:func:`first_person`, :func:`user_voice`), dates as spoken
(:func:`spoken_date`), the hint for a rewrite (:func:`rewrite_hint`), and the tests a question's
words must pass (:func:`_names_part_of`, :func:`_misses_subject`, :func:`_writes_number`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import partial

from memsteer_dspy.bundles import (
    Bundle,
    plain_text,
    whole_word,
)
from memsteer_dspy.bundles.text import SUBJECT_TEXT
from memsteer_dspy.records import Span
from memsteer_dspy.signatures.plan import AnswerPlan
from memsteer_dspy.supervision.checks import (
    _DATE_IN_TEXT,
    _RELATIVE_TIME,
    outside_quotes,
)

_REWRITE_HINTS = {
    "vague": "name the people, places, things or events it is about, and no relative day such as 'today'",
    "mentions_records": "ask about the user's own life, never about 'the user', 'the conversation' or the records",
    "leaks_answer": "do not put the answer in the question",
    "copies_demo": "ask about these records, not about the example",
    "unknown_name": "name only people, places and things the records name",
    "unknown_detail": "write no number, time or detail the facts do not state",
    "names_self": "you are the one asking: say 'I', 'me' or 'my', never your own name",
    "role_swap": "the answer is not the one who did it, you did: ask 'Who did I … to/with?'",
    "too_long": "ask in a short question (at most 20 words) by the event's key words, not its whole sentence",
    "wrong_kind": "ask for the answer's kind: 'When …?' for a date, 'How many …?' for a number, "
    "'Who …?' or 'What …?' for a name or thing, and one of them ('Who is …?'), not several ('Who are …?')",
    "compound": "ask one thing only, in one question",
    "off_evidence": "ask about what the facts say: name their people, places and things",
    "misses_record": "ask by what every fact says about the answer, one detail of each",
    "not_fronted": "start with the question word (Who, What, When, Where, How many) and end with '?'",
    "no_verb": "after the question word put a verb: 'When did I …?', 'When was the email … sent?'",
    "empty": "write one complete question ending with '?'",
    "not_a_question": "write one complete question ending with '?'",
    "echoes": "ask it as I would months later, in my own everyday words: keep the names, but do not "
    "copy the record's wording",
}


def rewrite_hint(question: str, problem: str | None, details: Sequence[str] = ()) -> str:
    """What a re-sampled question writer is told (its ``avoid`` input): the rejected question,
    what to fix, and for a vague one the facts' concrete details it can name. Measured on the
    embedded writer: told nothing, it returned the same question at temperature 0.7; told "be
    specific" without the words to be specific with, a vague one again; told inside ``ask``, it
    copied the hint into the question — hence a field of its own."""
    hint = _REWRITE_HINTS.get(problem or "", "write a different question")
    if problem == "vague" and details:
        hint += f"; it could mention {', '.join(details)}"
    if problem == "echoes" and details:
        hint += f"; say these differently or leave them out: {', '.join(repr(d) for d in details)}"
    if problem == "not_fronted" and (word := _INNER_QUESTION_WORD.search(question)):
        # the writer copied an ask with its question word in the answer's place ("Demolition
        # slips by how many, …"): name the word to move, as the general hint did not
        first = word.group(0)
        hint = (
            f"move '{first.lower()}' to the front: start with '{first.capitalize()}', "
            "then ask the rest, and end with '?'"
        )
    return f"{question!r} was rejected ({problem}): {hint}."


_INNER_QUESTION_WORD = re.compile(
    r"\b(?:how (?:many|much|long|often|far)|who|whom|whose|what|when|where|which)\b", re.I
)


_USER_AFTER_PREP = re.compile(
    r"\b(with|to|for|from|at|by|of|about|on|told|asked|helped)\s+the\s+user\b", re.I
)


# The question word a sentence ask (sentence_ask) puts in the answer's place, by answer type (an
# entity's is chosen by _entity_word). One word: "who or what" reads as two questions (compound).
_ASK_FOR = {
    "number": "how many",
    "list": "which ones",
    "date": "when",
    "text": "what",
    "boolean": "whether",
}
SENTENCE_ASK_WORDS = 40
"""A sentence ask quotes at most this many words of its sentence, around the answer's place."""
# Where a sentence splits into clauses: a sentence ask keeps the clause that holds the answer.
# where a sentence's clauses meet: a conjunction, a semicolon, a dash, a colon, or a comma before
# a new subject ("My friend Marcus Lee is running it too, he's much faster though": the whole
# sentence as the ask gave "Who is running it too, he's much faster though, …?", kept by demo-14
# and demo-15)
_CLAUSE_BREAK = re.compile(
    r",\s+(?:but|and|so|because|while|although|though|which)\s+|;\s+|\s*[—–]\s*|:\s+"
    r"|,\s+(?=(?:he|she|they|it|we|I|you)(?:['’](?:s|re|m|ll|d|ve))?\s)"
)
_PERSON = re.compile(r"(?:(?:Dr|Ms|Mr|Mrs)\.\s+)?[A-Z][a-z]+(?:\s+[A-Z][a-z]+){0,2}")


_MONTH_NAMES = (
    "January February March April May June July August September October November December".split()
)
_DATE_WORDS = re.compile(
    rf"\b(?:{'|'.join(_MONTH_NAMES)})\b|\b\d{{4}}-\d{{2}}-\d{{2}}\b|\b(?:19|20)\d\d\b", re.I
)


def spoken_date(iso: str | None) -> str | None:
    """``2024-05-18`` as "May 18, 2024" (None for a missing or unreadable date)."""
    m = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})", iso or "")
    if m is None or not 1 <= int(m.group(2)) <= 12:
        return None
    return f"{_MONTH_NAMES[int(m.group(2)) - 1]} {int(m.group(3))}, {m.group(1)}"


_HEADER_LINE = re.compile(r"^\s*(Sender|From|Recipient|To)\s*:", re.I)


def header_ask(bundle: Bundle, span: Span, answer: str) -> str | None:
    """The ask for a name cited from an email's sender or recipient line: who sent, or received,
    the email with that record's subject (``who sent the email "Quick Health Update"``); None for
    any other sentence. The sentence ask of such a line is its address: the embedded writer turned
    ``who <sofia.morales@email.com>`` into "Who is Sofia Morales?"."""
    line = _HEADER_LINE.match(span.text)
    record = bundle.record(span.id.rpartition("#")[0])
    if line is None or record is None:
        return None
    subject = next(
        (m.group(1).strip() for s in record.spans if (m := SUBJECT_TEXT.match(s.text))), None
    )
    if not subject:
        return None
    if line.group(1).lower() in ("sender", "from"):
        return f'who sent the email "{subject}"'
    return f'who the email "{subject}" was sent to'


# A question that starts with its question word (after a preposition: "On what day …", "With whom
# …") or an auxiliary ("Did …"). The embedded writer returned sentence asks as they were: "October
# 14, 2024 brought unexpected health challenges that … altered my day as the what?"
_FRONTED = re.compile(
    r"^\W*(?:(?:on|in|at|with|to|for|from|by|since|during|of|about|after|before)\s+)?"
    r"(?:who|whom|whose|what|when|where|which|why|how|is|are|was|were|did|do|does|has|have|had"
    r"|can|could|will|would|should)\b",
    re.I,
)
# "When", "Where" or "Why" followed by no verb: a title or subject copied after the question word
# ("When Unable to Update on School Garden Plans?"). "When's …" and "Where'd …" are verbs, and a
# question with an auxiliary further on ("When I was in Eugene, what did I wear?") has its verb.
_AUXILIARY = (
    r"(?:is|are|was|were|am|did|do|does|has|have|had|can|could|will|would|should|shall|may|might"
    r"|must)"
)
_NO_VERB = re.compile(
    r"^\W*(?:(?:on|in|at|with|to|for|from|by|since|during|of|about|after|before)\s+)?"
    rf"(?:when|where|why)\s+(?!.*\b{_AUXILIARY}\b)",
    re.I,
)


def _names_part_of(question: str, answer: str) -> bool:
    """Whether the question writes a capitalised word of a name answer ("Who is Sofia's mother?"
    for "Sofia Morales"): it gives the answer away, or asks about the answer's own relation."""
    words = [w for w in re.findall(r"[A-Z][A-Za-z-]{2,}", answer)]
    return any(re.search(rf"(?<![\w-]){re.escape(w)}(?![\w-])", question) for w in words)


# Subject words that say nothing about which email it is ("Thank You for Your Help").
_COURTESY = frozenset({"thank", "thanks", "your", "this", "that", "with", "from", "about"})


def _subject_stems(text: str) -> set[str]:
    return {w.lower()[:5] for w in re.findall(r"[A-Za-z]{4,}", text)} - {w[:5] for w in _COURTESY}


def _misses_subject(question: str, plan: AnswerPlan, bundle: Bundle) -> bool:
    """Whether a date question cited from an email's subject line names fewer than half of the
    subject's words (compared by their first five letters): "When did I send the email to Sofia
    Morales?" for "Subject: Thank You for Your Help This Morning" asks about one of many emails,
    and its own date is then no check that the reader found the right one."""
    if str(plan.answer_type) != "date" or not plan.answer_span_id:
        return False
    span = bundle.span(plan.answer_span_id)
    subject = SUBJECT_TEXT.match(span.text) if span is not None else None
    if subject is None or not (words := _subject_stems(subject.group(1))):
        return False
    return 2 * len(words & _subject_stems(question)) < len(words)


def _writes_number(question: str, answer: str) -> bool:
    """Whether the question writes a number answer's number outside a date ("How long did it take
    me during that 25-minute chat?" for 25; the "on July 9, 2024" a one-record ask carries does not
    count)."""
    m = re.match(r"\s*(\d+(?:[.,]\d+)?)", answer)
    if m is None:
        return False
    rest = _DATE_IN_TEXT.sub(" ", question)
    return re.search(rf"(?<![\d.,]){re.escape(m.group(1))}(?![\d]|[.,]\d)", rest) is not None


def _second_answer_span(plan: AnswerPlan, bundle: Bundle) -> Span | None:
    """The fact sentence of another evidence record that writes the plan's answer too (the second
    sentence of a two-record option), or None."""
    if not plan.answer_span_id or len(plan.evidence_ids) < 2:
        return None
    own = plan.answer_span_id.rpartition("#")[0]
    word = whole_word(plan.answer)
    for fact in plan.facts:
        span = bundle.span(fact.span_id)
        rid = fact.span_id.rpartition("#")[0]
        if (
            span is not None
            and rid != own
            and rid in plan.evidence_ids
            and word.search(plain_text(span.text))
        ):
            return span
    return None


def _entity_word(answer: str, before: str) -> str:
    """An entity's question word from the words before it: "where" after "at" / "in" / "near",
    "what" after an article or possessive ("my MacBook Air") or for anything but a name of one to
    three capitalised words, else "who"."""
    last = before.split()[-1].lower() if before.split() else ""
    if last in ("at", "in", "near"):
        return "where"
    determiner = last in ("a", "an", "the", "my", "our", "your", "his", "her", "their")
    return "what" if determiner or not _PERSON.fullmatch(answer) else "who"


def sentence_ask(sentence: str, answer: str, answer_type: str) -> str:
    """What the question should ask, read off the answer's own sentence: the clause that holds the
    answer, with its question word in the answer's place (``I tried to message who for
    feedback``; a number keeps its unit: ``we lost how many hours of class``), or, where the
    sentence does not write the answer (a date answered by its record's date), the sentence as the
    event asked about (``when: "I cleared that small pile of books"``).

    The anchored planner knows its answer but writes a poor ask: on the embedded model it copied
    the cold-start demonstration's "who is coming with me to the pottery class" into bundles with
    no pottery class, and wrote "who is involved in the garden activities" (vague); the question
    writer then wrote "Who is Lila?". Its first forms were copied too: ``who or what is the ___
    in: "…"`` gave "Who or what is the recipient in the given text?", and the whole sentence with
    "who or what" in place gave "Who or what did I try to message for feedback, but my hands were
    shaking so much …?" (compound, twice over)."""
    text = plain_text(sentence).strip()
    if answer_type == "date" and (subject := SUBJECT_TEXT.match(sentence)):
        # an email dated by its subject line: the bare subject after "when" came back as "When
        # Unable to Update on School Garden Plans?" (the twenty-second cost run)
        return f'when was the email "{subject.group(1).strip()}" sent'
    needle = answer.strip()
    match = re.search(rf"(?<!\w){re.escape(needle)}(?!\w)", text, re.I) if needle else None
    if match is None:  # "when I cleared that small pile of books" (v6 quoted it after "when:",
        # and the writer copied the frame: "When: 'Active communication among staff …'?")
        words = text.split()[:SENTENCE_ASK_WORDS]
        return f"{_ASK_FOR.get(answer_type, 'what')} {' '.join(words)}".rstrip(" ,.;:!")
    if answer_type == "entity":
        wh = _entity_word(match.group(0), text[: match.start()])
    elif answer_type == "number" and (unit := re.fullmatch(r"[\d.,]+\s+([A-Za-z-]+)", needle)):
        wh = f"how many {unit.group(1)}"
    else:
        wh = _ASK_FOR.get(answer_type, "what")
    marked = f"{text[: match.start()]}\x00{text[match.end() :]}"
    clauses = _CLAUSE_BREAK.split(marked)
    at = next(i for i, c in enumerate(clauses) if "\x00" in c)
    clause = clauses[at]
    if len(clause.split()) < 4:  # too short to name anything: with the clause before, or whole
        clause = f"{clauses[at - 1]}, {clause}" if at else marked
    words = clause.split()
    if len(words) > SENTENCE_ASK_WORDS:  # the words around the answer's place
        i = next((n for n, w in enumerate(words) if "\x00" in w), 0)
        start = max(0, min(i - SENTENCE_ASK_WORDS // 2, len(words) - SENTENCE_ASK_WORDS))
        words = words[start : start + SENTENCE_ASK_WORDS]
    return " ".join(words).replace("\x00", wh).rstrip(" ,.")


def first_person(ask: str, *, keep_quoted: bool = False) -> str:
    """The plan's ``ask`` in the user's voice for the question writer: "the user's" → "my",
    "with the user" → "with me", "the user" → "I". A writer given "what the user's health profile
    is" wrote "What is the health profile of the user?" three times out of three. With
    ``keep_quoted`` (anchored) quoted text keeps its words (:func:`outside_quotes`)."""

    def voice(text: str) -> str:
        text = re.sub(r"\bthe\s+user['’]s\b", "my", text, flags=re.I)
        text = _USER_AFTER_PREP.sub(lambda m: f"{m.group(1)} me", text)
        return re.sub(r"\bthe\s+user\b", "I", text, flags=re.I)

    return outside_quotes(ask, voice) if keep_quoted else voice(ask)


_YOU_SUBJECT = re.compile(
    r"\byou\b(?=\s+(?:am|was|have|had|will|would|can|could|should|might|must|"
    r"do|did|got|went|met|made|said|told|saw|took|gave|sent|bought|ate|wrote|felt|left|came|"
    r"kept|found|heard|thought|knew|began|spent|paid|read|\w+ed|"
    r"want|need|like|love|hope|plan|think|feel|know|see|say|use|get|wish|prefer|mean|keep|try|"
    r"remember|mention|have|go|work|live|enjoy|call|ask|tell|bring|take|make|buy|visit|meet)\b)",
    re.I,
)
# "help you plan", "made you feel", "let you know": "you" is the object of these before a bare verb
_CAUSATIVE = frozenset(
    "help helps helped let lets make makes made have has had watch watched saw hear heard "
    "bid get got".split()
)


def _object_you(text: str, at: int) -> bool:
    before = re.findall(r"[A-Za-z']+", text[:at])
    return bool(before) and before[-1].lower() in _CAUSATIVE


_AUX_YOU = re.compile(
    r"\b(did|do|does|have|had|will|would|can|could|should|shall|might|must|are|were)\s+you\b", re.I
)
_FIRST_PERSON_AUX = {"are": "am", "were": "was"}


def user_voice(question: str) -> str:
    """A question in the user's own voice: "you" → "I" / "me", "your" → "my". The user asks their
    assistant, so "you" would be the assistant; measured on the embedded writer, which copies the
    assistant's turns ("Who stretched out beside you?", "When did you notice the space feel
    lighter?"), a third of the questions came back in the second person."""

    def aux(m: re.Match[str]) -> str:
        verb = m.group(1)
        return f"{_FIRST_PERSON_AUX.get(verb.lower(), verb)} I"

    def voice(q: str) -> str:
        q = _AUX_YOU.sub(aux, q)
        q = re.sub(r"\byourself\b", "myself", q, flags=re.I)
        q = re.sub(r"\byours\b", "mine", q, flags=re.I)
        q = re.sub(r"\byour\b", "my", q, flags=re.I)
        q = re.sub(r"\byou\s+are\b", "I am", q, flags=re.I)
        q = re.sub(r"\byou\s+were\b", "I was", q, flags=re.I)
        q = _YOU_SUBJECT.sub(lambda m: m.group(0) if _object_you(q, m.start()) else "I", q)
        return re.sub(r"\byou\b", "me", q, flags=re.I)

    q = outside_quotes(question, voice)  # a quoted subject is a name: "Thank You for …"
    return q[:1].upper() + q[1:] if q else q


def _drop_relative_day(question: str, *, keep_quoted: bool = False) -> str:
    """A date question without its relative day ("When did I have lunch today with Lila?" →
    "When did I have lunch with Lila?"): the answer is the day, so "today" only hides it. With
    ``keep_quoted`` (lean) a quoted subject keeps its words ("… Plans Today' sent?")."""
    drop = partial(_RELATIVE_TIME.sub, "")
    out = outside_quotes(question, drop) if keep_quoted else drop(question)
    return re.sub(r"\s+([?,.])", r"\1", re.sub(r"\s{2,}", " ", out)).strip()
