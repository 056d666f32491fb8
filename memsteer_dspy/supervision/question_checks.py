""":func:`check_question` holds the question writer's output to the same standard: not empty, a
question, no answer leakage, no mention of "the records" or span labels.

With it, the text tests the pipeline asks of a question (topic words, names and details the
records do not hold, echoes of the evidence's words, the kind of answer it asks for) and the
bundle-level helpers :func:`prefilter_bundle`, :func:`quoted_fact_support` and
:func:`spans_by_id`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

from memsteer_dspy.bundles import MIN_CONCRETE_DETAIL, Bundle, Task, concrete_records
from memsteer_dspy.normalize import (
    AnswerParseError,
    list_items,
    normalize_text,
    numbers_in,
    parse_answer,
)
from memsteer_dspy.records import AnswerType
from memsteer_dspy.signatures.plan import AnswerPlan
from memsteer_dspy.supervision.plan_checks import _DATE_IN_TEXT, _contains, user_display_name

_META = re.compile(
    r"\b(?:the|these|those|this|given|provided|above)\s+(?:records?|texts?|documents?|passages?|sentences?|"
    r"spans?|excerpts?|sources?|materials?|bundle)\b|\bR\d+(?:\.\d+)?\b|\bspan\s+\w*\d"
    # the user asks their own assistant: never "the user", never "the conversation" without a topic;
    # never the re-sample hint copied into the question ("… was rejected (vague)", "not like '…'")
    r"|\bthe\s+user'?s?\b|\bwas rejected\b|\bnot like ['\"]|\b(?:the|this|that|our)\s+(?:conversation|chat|session)\s*(?:\?|$|take|happen|start)",
    re.I,
)


# Words that name no topic. A standalone question names at least MIN_TOPIC_WORDS other words
# ("When was the report written?" names two: it fits any report of the user's history).
_FILLER = frozenset(
    """
a an the and or but of to in on at for with from by about into over after before during
i me my mine myself you your yours yourself we us our he him his she her it its they them their
this that these those there here some any all each one ones thing things someone something
who whom whose what when where which why how
is are was were be been being am do does did done have has had having will would can could
should shall may might must happen happened happens take took taken place occur occurred
start started get got go went come came make made time day date
feel feels felt feeling sense moment really
""".split()
)
MIN_TOPIC_WORDS = 3
# A lean question longer than this copies its sentence rather than asking by its key words: the
# embedded writer asked "When did I really appreciate my gentle suggestions—having that short guided
# breathing exercise from Sofia made such a difference, and I'd love some ideas …?" (31 words, a
# garbled whole sentence; the fourteenth and fifteenth cost runs kept it). The longest question
# read as good in those runs has 20 words.
MAX_QUESTION_WORDS = 25
_RELATIVE_TIME = re.compile(
    r"\b(?:today|tonight|yesterday|tomorrow|this (?:morning|afternoon|evening|week|month)|"
    r"last (?:night|week|month))\b",
    re.I,
)


# Quoted text: "…", “…”, or '…' opened after no letter (an apostrophe in "Julia's" opens nothing).
_QUOTED = re.compile(r"\"[^\"]*\"|“[^”]*”|(?<!\w)'[^']+'(?!\w)")


def outside_quotes(text: str, rewrite: Callable[[str], str]) -> str:
    """``text`` with ``rewrite`` applied to what lies outside quotes: a quoted email subject is the
    email's name ("When was the email 'Thank You for Your Help This Morning' sent?"), and put in
    the user's voice it names no email ('Thank me for my Help ')."""
    parts, last = [], 0
    for m in _QUOTED.finditer(text):
        parts += [rewrite(text[last : m.start()]), m.group(0)]
        last = m.end()
    return "".join([*parts, rewrite(text[last:])])


# "When did Dr. Desai remind you of this?": a pronoun at the end points at nothing the reader has.
_DANGLING = re.compile(r"\b(?:this|that|it|them|these|those)\s*\?\s*$", re.I)


# lean: words that place or perceive, naming no topic either. "Who stretched out beside me?"
# (the dog, in a chat about a lazy Sunday) named "stretched", "out" and "beside" and passed as
# specific; without them it names one word.
_STRICT_FILLER = frozenset(
    """
out up down off over under beside besides near next around across along through between behind
above below inside outside onto upon toward towards away back
notice noticed see saw seen hear heard realize realized mention mentioned say said tell told
""".split()
)


def topic_words(question: str, *, strict: bool = False) -> list[str]:
    """The words of a question that name what it is about (normalized; filler words removed; with
    ``strict``, lean's, also the words that only place or perceive)."""
    words = [w for w in normalize_text(question).split() if w not in _FILLER]
    return [w for w in words if w not in _STRICT_FILLER] if strict else words


# Words that say how the user felt or talked, not what happened: no use as a question's topic.
_TALK = frozenset(
    """
user assistant feel feels felt feeling really just like so very also much more most little bit well
still even though yet again back today tonight yesterday tomorrow morning afternoon evening week
maybe perhaps quite pretty kind sort lot lots way ways think thought know knew want wanted need
needed try tried trying help helped thank thanks lovely nice good great glad happy sure okay
everyone everything everybody something someone anything nothing always never sometimes
""".split()
)
_NAME = re.compile(r"(?<![.!?:]\s)(?<!^)\b([A-Z][\w'’.-]*(?:\s+[A-Z][\w'’-]*)*)")
_NUMBER = re.compile(r"\b\d[\d.,:/-]*(?:\s+[a-z]+)?")


def detail_terms(statements: Iterable[str], exclude: str = "", limit: int = 6) -> list[str]:
    """Concrete details of the facts a question can name: names, numbers, then the longest other
    words, each at most once and none already in ``exclude`` (the rejected question and answer).

    A small question writer told only "be specific" wrote "When did you have lunch today?" again;
    told "mention: empanadas, Mrs. Patel's samosas" it has the words to do so."""
    seen = set(normalize_text(exclude).split())
    names: list[str] = []
    numbers: list[str] = []
    words: list[str] = []
    for text in statements:
        text = re.sub(r"^(?:User|Assistant|Subject)\s*:\s*", "", text.strip())
        for m in _NAME.finditer(text):
            names.append(re.sub(r"['’]s$", "", m.group(1).rstrip(".’'")))
        numbers.extend(m.group(0) for m in _NUMBER.finditer(text))
        words.extend(w for w in re.findall(r"\b[A-Za-z][a-z-]{3,}\b", text) if not w.endswith("ly"))
    out: list[str] = []
    for term in [*names, *numbers, *sorted(dict.fromkeys(words), key=len, reverse=True)]:
        tokens = normalize_text(term).split()
        if not tokens or all(t in _FILLER or t in _TALK or t in seen for t in tokens):
            continue
        out.append(term)
        seen.update(tokens)
        if len(out) >= limit:
            break
    return out


def _names_date(question: str, answer: str) -> bool:
    """Whether the question writes the answer's date in any format ("When did the event happen on
    February 1, 2024?" → 2024-02-01): word matching misses it, the date parser does not."""
    try:
        target = parse_answer(answer, AnswerType.DATE)
    except AnswerParseError:
        return False
    for m in _DATE_IN_TEXT.finditer(question):
        try:
            found = parse_answer(m.group(0), AnswerType.DATE)
        except AnswerParseError:
            continue
        if found == target or (
            str(found).startswith("--") and str(target).endswith(str(found)[1:])
        ):
            return True
    return False


_CALENDAR = frozenset(
    """
january february march april may june july august september october november december
monday tuesday wednesday thursday friday saturday sunday
""".split()
)


def unknown_names(question: str, known_text: str) -> list[str]:
    """The names in a question (capitalized words after its first) that ``known_text`` never
    writes: a premise the records do not support. Measured: a 1.5B writer asked "When was the note
    written by Elena to Sofia at Clayworks Studio?" — the studio of the cold-start demonstration —
    and the 1.5B auditor passed it."""
    known = f" {normalize_text(known_text)} "
    out = []
    for m in _NAME.finditer(question.strip()):
        name = re.sub(r"['’]s$", "", m.group(1).rstrip(".’'"))
        tokens = [
            t for t in normalize_text(name).split() if t not in _FILLER and t not in _CALENDAR
        ]
        if tokens and any(f" {t} " not in known for t in tokens):
            out.append(name)
    return out


# "3:00 AM", "3 pm", "15:30": a time of day, compared by its hour and minutes.
_TIME_OF_DAY = re.compile(
    r"\b(\d{1,2})(?::(\d{2}))?\s*[ap]\.?\s?m\b\.?|\b(\d{1,2}):(\d{2})\b", re.I
)
_DIGIT_GROUP = re.compile(
    r"(?<![\w.,])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w])|(?<![\w.,])\d+(?:\.\d+)?(?![\w])"
)
_YEAR = re.compile(r"(?:19|20)\d\d")


def _times_of_day(text: str) -> set[tuple[int, int]]:
    return {
        (int(m.group(1) or m.group(3)), int(m.group(2) or m.group(4) or 0))
        for m in _TIME_OF_DAY.finditer(text)
    }


def unknown_details(question: str, known_text: str) -> list[str]:
    """The numbers and times of day a question writes that ``known_text`` never does: an invented
    detail. Dates are left to the date checks (the program adds the record's own day to a
    question, "on December 15, 2024"), and a year counts as known when any date has it. Measured:
    the embedded writer asked "Who did I try to dictate my certification reflections to this
    morning at 3:00 AM …?" of a record that gives no time, and the blind reader still answered
    it — the premise is simply false."""
    q = _DATE_IN_TEXT.sub(" ", question)
    known = _DATE_IN_TEXT.sub(" ", known_text)
    out = []
    known_times = _times_of_day(known)
    for m in _TIME_OF_DAY.finditer(q):
        h, mm = int(m.group(1) or m.group(3)), int(m.group(2) or m.group(4) or 0)
        if (h, mm) not in known_times:
            out.append(m.group(0).strip())
    q = _TIME_OF_DAY.sub(" ", q)
    known_numbers = numbers_in(_TIME_OF_DAY.sub(" ", known))
    for m in _DIGIT_GROUP.finditer(q):
        token = m.group(0)
        if _YEAR.fullmatch(token) and token in known_text:
            continue
        value = round(float(token.replace(",", "")), 9)
        if value not in known_numbers:
            out.append(token)
    return out


def demo_borrowed(topic: list[str], demo_topics: Iterable[list[str]], known_text: str) -> list[str]:
    """The topic words a question shares with a demonstration's question that ``known_text`` (the
    bundle) never writes: borrowed from the demonstration, not read off the records. Measured: the
    embedded writer asked "Who is running the pottery class on February 23, 2025?" of "My friend
    Marcus Lee is running it too" (a race): one word of the cold-start demonstration's "Who is
    coming with me to the pottery class at Clayworks Studio?", too few for the overlap test."""
    known = _stems(known_text)
    borrowed = set().union(*demo_topics) if demo_topics else set()
    return [w for w in topic if w in borrowed and _stem(w) not in known and w not in _ASKING_WORDS]


# The words after "how" that ask for a kind of answer ("How many …", "How long …"): a question
# takes them from its question word, not from a demonstration. With the writer's examples ("How
# many boxes did we haul for Marco?") "many" was flagged as borrowed in "How many people showed up
# at the workshop …?" — a record never writes "many" (the first Jonas_Richter run with examples).
_ASKING_WORDS = frozenset("many much long often far fast old".split())


# The user's own voice in a question: "I" (capitalised only: "i" is a list marker), me, my, mine.
_FIRST_PERSON = re.compile(r"\bI\b|\b(?i:me|my|mine|myself)\b")


def names_self(question: str, user_name: str | None) -> bool:
    """Whether a question in the user's voice (I, me, my) also names the user — by first name — as
    someone else: the asker talking about herself in the third person. Measured: the sixteenth
    cost run's writer asked "When did I talk to Elena Morales?" of Elena Morales' own chat turn.
    A question about the user in the third person ("When did Elena Morales write the email …?")
    is not this: it has no first person."""
    display = user_display_name(user_name) if user_name else ""
    if not display or not _FIRST_PERSON.search(question):
        return False
    first = display.split()[0]
    return len(first) >= 2 and re.search(rf"\b{re.escape(first)}\b", question, re.I) is not None


# words of a "Who …?" clause that are not its verb: auxiliaries, "the person who", articles
_WHO_FILLER = frozenset(
    "who was is were are did does do has had have will would could can the a an person one "
    "someone that".split()
)


def _verb_stem(word: str) -> str:
    """A crude shared stem: "tried"/"try"/"trying" -> "tr", "dictated"/"dictate" -> "dictat".
    Not :func:`_stem` (off_evidence_words, under LEAN_VERSION 6): that one keeps "tri" and "try"
    apart, and widening it would change off_evidence verdicts of earlier lean versions."""
    for suffix in ("ying", "ied", "ing", "ies", "ed", "es", "e", "s", "y"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 2:
            return word[: -len(suffix)]
    return word


def swaps_roles(question: str, answer: str, sentence: str) -> bool:
    """Whether "Who <verb> …?" asks for the one who did what the answer sentence says the user
    did, answered by someone else in that sentence: "Who tried to dictate my certification
    reflections?" → Sofia, of "I tried to dictate my certification reflections to Sofia" (three cost
    runs in a row kept such an item). A question with the user as its subject ("Who did I try to
    dictate … to?") asks the right role and is not this; nor is one whose answer is the subject of
    that verb in the sentence ("Sofia tried …")."""
    words = normalize_text(question).split()
    if len(words) < 2 or words[0] != "who" or answer.strip() == "":
        return False
    clause = words[1:7]
    if "i" in clause or "me" in clause:
        return False  # the user is in the clause: "Who did I …", "Who called me …"
    verbs = {_verb_stem(w) for w in clause if w not in _WHO_FILLER and len(w) >= 3}
    said = normalize_text(sentence).split()
    name = normalize_text(answer).split()
    if not verbs or not name:
        return False
    for i, w in enumerate(said):
        if w != "i":
            continue
        after = said[i + 1 : i + 4]
        if not any(_verb_stem(v) in verbs for v in after if len(v) >= 3):
            continue
        rest = said[i + 1 :]
        # the answer comes after the user's verb (its object), not as a subject of its own
        return any(rest[j : j + len(name)] == name for j in range(len(rest)))
    return False


def _overlap(a: list[str], b: list[str]) -> float:
    sa, sb = set(a), set(b)
    return len(sa & sb) / len(sa | sb) if sa and sb else 0.0


def check_question(
    question: str,
    answer: str,
    answer_type: str,
    demo_questions: Iterable[str] = (),
    known_text: str | None = None,
    *,
    kind_check: bool = False,
    evidence_text: str | None = None,
    own_words: bool = False,
    extra_words: int = 0,
    examples: Iterable[str] = (),
) -> str | None:
    """Why a written question is unusable (a reason code), or None when it is fine.
    ``extra_words``: words the program added to the question (a bridge's "on the day …"), beyond
    :data:`MAX_QUESTION_WORDS`. ``examples``: the questions of hand-written examples of another
    history shown to the writer (``generate --writer-examples``), held to the copying test of
    ``copies_demo`` like ``demo_questions`` but not to its borrowed-word test: their words are a
    person's everyday words ("bike", "finish"), not a demonstration's topic.

    ``empty`` — no question; ``not_a_question`` — no question mark and no question word;
    ``mentions_records`` — refers to "the records", "the document", "the user", span labels…;
    ``vague`` — names fewer than :data:`MIN_TOPIC_WORDS` topic words (feelings do not count: "When
    did you feel a sense of peace?" fits any calm day), asks for a date by a time relative to a day
    nobody is told ("When did I have lunch today?"; with ``kind_check`` not inside quotes: "When
    was the email 'Unable to Update on School Garden Plans Today' sent?" names its email), or ends
    on a pronoun that points at nothing ("When did Dr. Desai remind you of this?"): it is not
    standalone;
    ``copies_demo`` — mostly the words of a few-shot demonstration's question (a small LM copies
    its demonstrations: measured, "Who is coming with me to the pottery class at Clayworks
    Studio?" came back word for word on a history without any pottery class), or, with
    ``kind_check`` and ``known_text``, any of its words the records never write
    (:func:`demo_borrowed`);
    ``leaks_answer`` — contains the answer (text, entity, date and list answers);
    ``unknown_name`` — names someone or something ``known_text`` (the bundle's records and the
    user's name) never mentions (:func:`unknown_names`); with ``kind_check`` (lean), topic words
    exclude words that only place or perceive ("out", "beside", "noticed"), ``unknown_detail`` —
    writes a number or time of day ``known_text`` never does (:func:`unknown_details`),
    ``too_long`` — more than :data:`MAX_QUESTION_WORDS` words (a copied sentence), ``wrong_kind`` —
    its question word asks for another kind of answer than the answer type (:func:`asked_kinds`)
    or "Who …?" is answered by a role (:func:`is_role`) or a plural question ("What dates …?",
    "Who are the children …?") by one value (:func:`asks_plural`), and ``compound`` — it asks two
    questions in one ("… and what is …?"); ``off_evidence`` — fewer than half of its topic words
    are in ``evidence_text`` (the evidence records: "When did I sit with my lesson plan journal
    during breakfast?" on a record about watching chickadees; :func:`off_evidence_words`); with
    ``own_words`` (questions asked in the user's words, not the record's: :func:`echoes`) fewer
    than a third — "Which laptop did I message Lila from?" names a MacBook Air by what it is.
    """
    q = (question or "").strip()
    if len(q.split()) < 3:
        return "empty"
    if "?" not in q and not re.match(
        r"(?i)^(who|what|when|where|which|why|how|is|are|was|were|did|do|does|can)\b", q
    ):
        return "not_a_question"
    if _META.search(q):
        return "mentions_records"
    topic = topic_words(q, strict=kind_check)
    if (
        len(topic) < MIN_TOPIC_WORDS
        # lean: a quoted subject's "Today" is part of the email's name, not a day nobody is told
        or (
            str(answer_type) == "date"
            and _RELATIVE_TIME.search(_QUOTED.sub("''", q) if kind_check else q)
        )
        or _DANGLING.search(q)
    ):
        return "vague"
    demo_topics = [topic_words(d) for d in demo_questions]
    example_topics = [topic_words(e) for e in examples]
    if any(_overlap(topic, d) >= 0.5 for d in [*demo_topics, *example_topics]):
        return "copies_demo"
    if kind_check and known_text is not None and demo_borrowed(topic, demo_topics, known_text):
        return "copies_demo"
    if known_text is not None and unknown_names(q, known_text):
        return "unknown_name"
    kind = str(answer_type)
    if kind_check:
        if known_text is not None and unknown_details(q, known_text):
            return "unknown_detail"
        if len(q.split()) > MAX_QUESTION_WORDS + extra_words:
            return "too_long"
        if (asked := asked_kinds(q)) is not None and kind not in asked:
            return "wrong_kind"
        if kind == "entity" and _WHO.match(q) and is_role(answer):
            return "wrong_kind"
        one_value = kind in ("entity", "date", "number") or (
            kind == "list" and len(list_items(answer)) < 2
        )
        if one_value and asks_plural(q):
            return "wrong_kind"
        if _COMPOUND.search(q):
            return "compound"
    if evidence_text is not None and topic:
        off = off_evidence_words(q, evidence_text, strict=kind_check)
        if (len(off) * 3 > 2 * len(topic)) if own_words else (len(off) * 2 > len(topic)):
            return "off_evidence"
    if (
        kind in ("text", "entity", "date")
        and len(normalize_text(answer)) >= 3
        and _contains(q, answer)
    ) or (kind == "date" and _names_date(q, answer)):
        return "leaks_answer"
    if kind == "list":
        items = [i for i in list_items(answer) if len(i) >= 3]
        if items and all(_contains(q, i) for i in items):
            return "leaks_answer"
    return None


# What a question's opening words ask for, by answer type. "What time …?" asks for a time of day,
# never a date; "How long …?" for a duration, not a date.
_CALENDAR_UNIT = r"(?:date|day|month|year)"
_FEW = r"(?:two|three|four|five)"
_ASKED_KINDS: tuple[tuple[re.Pattern[str], frozenset[str]], ...] = (
    (
        re.compile(
            rf"^(?:when|(?:on|in) (?:what|which) {_CALENDAR_UNIT}|(?:what|which) {_CALENDAR_UNIT})\b",
            re.I,
        ),
        frozenset({"date"}),
    ),
    (re.compile(r"^how (?:many|much|long|old|often|far)\b", re.I), frozenset({"number"})),
    (
        re.compile(
            rf"^(?:which|what|who) {_FEW} \b|^(?:which|what|who) (?:are|were) the {_FEW}\b"
            rf"|^name (?:the )?{_FEW}\b",
            re.I,
        ),
        frozenset({"list"}),
    ),
    (re.compile(r"^(?:at )?what time\b", re.I), frozenset({"number", "text"})),
    (
        re.compile(r"^(?:who|whom|whose|where|with whom)\b", re.I),
        frozenset({"entity", "list", "text"}),
    ),
)


# "Who is the program lead teacher?" → "Montessori Program Lead Teacher": a "Who …?" question
# answered by a role or a title names nobody (measured on the embedded model; the role was the
# apposition in "Elena Morales (Montessori Program Lead Teacher)").
_WHO = re.compile(r"^\W*(?:who|whom|with whom|to whom)\b", re.I)
_ROLE_NOUNS = frozenset(
    """
teacher teachers lead leads director manager coordinator administrator principal officer
specialist assistant aide head chair secretary counselor therapist supervisor instructor
volunteer volunteers staff team committee department office leader president organizer
""".split()
)


def is_role(answer: str) -> bool:
    """Whether an entity answer is a role or a title ("Montessori Program Lead Teacher",
    "Administrative Lead", "the school nurse office") rather than a name: its last word is a role
    noun."""
    words = normalize_text(answer).split()
    return bool(words) and words[-1] in _ROLE_NOUNS


# Two questions in one ("How many tasks are there and what is the total number of tasks?"): one
# reference answer cannot answer both.
_COMPOUND = re.compile(r"\b(?:and|or)\s+(?:what|who|when|where|which|how)\b|\?\s*\S", re.I)


# "What dates did I …?", "Which books did …?", "Who are the children …?": asks for several things.
# The plural noun is lower case (not a name: "What does Charles do?") and not a singular in -s
# ("status", "class", "analysis").
_PLURAL_ARE = re.compile(r"^(?i:who|what|which)\s+(?i:are|were)\s+(?i:the|all|my|your|some|our)\b")
_AUX = "did|do|does|were|are|have|had|will|would|could|can"
_PLURAL_NOUN = re.compile(
    rf"^(?i:what|which)\s+(?:(?!(?i:is|was|{_AUX})\b)\w+\s+)?"  # an optional modifier ("garden tools")
    rf"(?![a-z]*(?:ss|us|is)\b)[a-z]{{2,}}s\s+(?i:{_AUX})\b"  # a plural noun, then its verb
)


def asks_plural(question: str) -> bool:
    """Whether a question asks for several things ("What dates did I …?", "Which books did Sofia
    read?", "Who are the children in …?"), which one name, date or number cannot answer. Measured
    on the embedded model: "Who are the children in the sensory bin exploration?" → "Amelia" and
    "What dates did I take photos of the seedlings?" → one date were accepted."""
    q = question.strip().lstrip("\"'“‘(")
    return bool(_PLURAL_ARE.match(q) or _PLURAL_NOUN.match(q))


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def _stems(text: str) -> set[str]:
    """The crude stems (:func:`_stem`) of a text's normalized words."""
    return {_stem(w) for w in normalize_text(text).split()}


def off_evidence_words(question: str, evidence_text: str, *, strict: bool = False) -> list[str]:
    """The question's topic words (:func:`topic_words`) that ``evidence_text`` does not contain,
    compared by a crude stem ("planted" ~ "planting")."""
    have = _stems(evidence_text)
    return [w for w in topic_words(question, strict=strict) if _stem(w) not in have]


def records_missed(question: str, answer: str, record_texts: Sequence[str]) -> list[int]:
    """The positions of the evidence records (``record_texts``) the question names nothing of:
    none of its topic words (:func:`topic_words`, lean's strict ones, the answer's own words left
    out) is in that record and in none of the others. A two-record question that asks by one
    record's words only is answered, and cited, from that record alone: the blind reader's
    citations then miss the other. Measured on the embedded model: no two-record item of 60 passed
    the blind read, most of them citing one record."""
    answer_words = set(normalize_text(answer).split())
    words = {_stem(w) for w in topic_words(question, strict=True) if w not in answer_words}
    stems = [_stems(t) for t in record_texts]
    missed = []
    for i, own in enumerate(stems):
        elsewhere = set().union(*(o for j, o in enumerate(stems) if j != i))
        if not (words & own) - elsewhere:
            missed.append(i)
    return missed


def asked_kinds(question: str) -> frozenset[str] | None:
    """The answer types a question's opening words ask for ("When …?" → date, "How many …?" →
    number, "Who …?" / "Where …?" → entity, list or text), or None when they do not say ("What …?",
    "Which …?"). Measured on the embedded model: "What time did Mark Jensen start …?" was planned
    with a date for its answer, and the blind reader, answering a date, confirmed it."""
    q = question.strip().lstrip("\"'“‘(").strip()
    for pattern, kinds in _ASKED_KINDS:
        if pattern.match(q):
            return kinds
    return None


def prefilter_bundle(
    bundle: Bundle, task: Task, min_detail: float = MIN_CONCRETE_DETAIL
) -> str | None:
    """Why a bundle cannot give the task a concrete question (``nothing_concrete``), or None.

    A task needs ``evidence_count`` records; when fewer of the bundle's records carry concrete
    detail (:func:`concrete_records`), the planner can only ask about moods and chat — on the
    embedded model the source of most ``question:vague`` rejections on conversation turns — so the
    candidate is rejected before it costs an LM call."""
    found = concrete_records(bundle, min_detail)
    if len(found) < task.evidence_count:
        return "nothing_concrete"
    return None


def quoted_fact_support(plan: AnswerPlan, span_texts: dict[str, str]) -> bool:
    """Whether every fact of a resolved plan is its cited span's own words (after text
    normalization), so the span states the fact by construction: the lexical source-support check
    that settles the audit's per-fact judgment before any LM call. False for a plan without facts,
    a fact whose span is not in the bundle, or a statement the span does not contain."""
    if not plan.facts:
        return False
    for f in plan.facts:
        span, statement = span_texts.get(f.span_id), normalize_text(f.statement)
        if span is None or not statement or statement not in normalize_text(span):
            return False
    return True


def spans_by_id(spans: Iterable) -> dict[str, str]:
    return {s.id: s.text for s in spans}


ECHO_MAX_WORDS = 3
"""A question may share at most this many distinctive words with its evidence records (beyond
names, numbers and the answer). Calibrated on the demo's 34 hand-written questions: each shares 0 to
3 such words with its evidence (the most: "When is my VIZ 110 final project due?" — final,
project, due), while generated questions asked from their sentence shared up to 9 ("When did I wake
up early, feeling excited about taking Oliver for our usual nature walk in Forest Park?")."""
ECHO_MAX_RUN = 4
"""…and copy at most this many consecutive words of them (names included): the hand-written
questions' longest run is 4 words ("the Columbia Gorge Half Marathon")."""
# Title-case words: names a user says as they are, unless quoted (a quoted email subject is
# words a user would not recall verbatim months later).
_TITLE_WORD = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][\w'’.-]*")


def _content_words(question: str, answer: str) -> list[str]:
    """The question's distinctive words (:func:`topic_words`, strict): not the answer's, not a
    name written in title case outside quotes, not a number, one letter at least two."""
    unquoted = _QUOTED.sub(" ", question)
    names = {n for w in _TITLE_WORD.findall(unquoted) for n in normalize_text(w).split()}
    answer_words = set(normalize_text(answer).split())
    return [
        w
        for w in topic_words(question, strict=True)
        if w not in answer_words
        and w not in names
        and not any(c.isdigit() for c in w)
        and len(w) > 1
    ]


def echoed_words(question: str, evidence_text: str, answer: str = "") -> list[str]:
    """The question's distinctive words (:func:`_content_words`) that its evidence records write,
    compared by a crude stem ("planted" ~ "planting"), each once."""
    have = _stems(evidence_text)
    seen: list[str] = []
    for w in _content_words(question, answer):
        if _stem(w) in have and w not in seen:
            seen.append(w)
    return seen


def copied_run(question: str, evidence_text: str) -> list[str]:
    """The longest run of consecutive question words (normalized) that the evidence writes."""
    words = normalize_text(question).split()
    text = f" {normalize_text(evidence_text)} "
    best: list[str] = []
    for i in range(len(words)):
        j = i + len(best) + 1
        while j <= len(words) and f" {' '.join(words[i:j])} " in text:
            best = words[i:j]
            j += 1
    return best


def echoes(
    question: str, evidence_text: str, answer: str = "", *, records: int = 1
) -> list[str] | None:
    """What of its evidence's wording the question copies (the words to say differently), or None
    when it asks in its own words: more than :data:`ECHO_MAX_WORDS` distinctive words of the
    evidence (per evidence record: ``records`` of them, each of which a multi-record question must
    name something of), or a run of more than :data:`ECHO_MAX_RUN` of its words. Lexical retrieval finds a
    question in its evidence's words by construction; a user asking months later does not write
    them (the paper's supervision has to tell memory designs apart)."""
    words = echoed_words(question, evidence_text, answer)
    run = copied_run(question, evidence_text)
    if len(words) <= ECHO_MAX_WORDS * max(1, records) and len(run) <= ECHO_MAX_RUN:
        return None
    if len(run) > ECHO_MAX_RUN:
        phrase = " ".join(run)
        return [phrase, *(w for w in words if w not in run)]
    return words
