"""The answers a bundle's sentences supply (:class:`AnswerOption`): :func:`answer_kinds`,
:func:`answer_options`, two-record :func:`pair_options`, :func:`update_options` (a value a later
record changes) and :func:`bridge_options` (a one-record answer asked on the day of another
record's event), with :func:`task_options` choosing among them for a task.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import zip_longest

from memsteer_dspy.bundles.config import Task
from memsteer_dspy.bundles.text import (
    _CALENDAR_WORDS,
    _LEADING_WORDS,
    _MENTIONED_DATE,
    _NAME,
    SUBJECT_TEXT,
    UNDATED_EVENT_KINDS,
    _in_name_series,
    _in_title,
    _option_names,
    _with_unit,
    count_numbers,
    event_span,
    option_answer,
    plain_text,
    stating_spans,
    whole_word,
)
from memsteer_dspy.bundles.view import BundleRecord

_ENUMERATION = re.compile(
    r"\b[\w'-]+(?: [\w'-]+)?, [\w'-]+(?: [\w'-]+)?,? (?:and|or) [\w'-]+", re.I
)


def _span_names(text: str, user: set[str]) -> list[str]:
    """The names in a span's plain text that are not the user's, without month and weekday words."""
    names = []
    for name in _NAME.findall(text):
        words = [w for w in name.split() if not _CALENDAR_WORDS.match(w)]
        if words and not {w.lower() for w in words} <= user:
            names.append(" ".join(words))
    return names


def _user_words(user_name: str | None) -> set[str]:
    return {w.lower() for w in (user_name or "").replace("_", " ").split()}


def answer_kinds(records: Iterable[BundleRecord], user_name: str | None = None) -> set[str]:
    """The answer types the records' own sentences can supply: ``number`` (a number that is not
    part of a date or a year), ``entity`` (a name that is not the user's, a month or a weekday),
    ``list`` (an enumeration "a, b and c", or two such names in one record) and ``date`` (always:
    every record has its date).

    A task steered toward a kind its bundle does not hold cannot be planned: measured on the
    embedded model, "number" tasks on bundles without a number came back as a blind-read mismatch,
    and "entity" tasks on chats that name nobody but the user as ``answer_is_user``."""
    user = _user_words(user_name)
    kinds = {"date"}
    for record in records:
        names: set[str] = set()
        for span in record.spans:
            text = plain_text(span.text)
            if count_numbers(text):
                kinds.add("number")
            names.update(_span_names(text, user))
            if _ENUMERATION.search(text):
                kinds.add("list")
        if names:
            kinds.add("entity")
        if len(names) >= 2:
            kinds.add("list")
    return kinds


MAX_ANSWER_OPTIONS = 8


@dataclass(frozen=True)
class AnswerOption:
    """A reference answer the program reads off one sentence of a bundle: what an anchored planner
    chooses from instead of writing its own answer (see :func:`answer_options`). A two-record
    option (:func:`pair_options`) also names the sentences of other records that write the same
    answer (``also``)."""

    span_id: str
    answer: str
    answer_type: str
    also: tuple[str, ...] = ()
    bridge: str | None = None
    earlier: str | None = None

    @property
    def span_ids(self) -> tuple[str, ...]:
        """The option's sentences: its own, then those of its other records (a bridge's event
        sentence, an update's earlier sentence last)."""
        extra = tuple(s for s in (self.bridge, self.earlier) if s)
        return (self.span_id, *self.also, *extra)


_MID_SENTENCE = re.compile(r"(?<=[a-z,] )[A-Z][a-z]+")


_VERB_OR_LINK = frozenset("is are was were be of like including such also".split())


def _list_answer(enumeration: str) -> str:
    """An enumeration without the word before its first item that _ENUMERATION took along
    ("for tea, scones and jam", "is comfortable, organized and welcoming")."""
    first, _, rest = enumeration.partition(",")
    words = first.split()
    if len(words) > 1 and words[0].lower() in _LEADING_WORDS | _VERB_OR_LINK:
        words = words[1:]
    return f"{' '.join(words)},{rest}"


def answer_options(
    records: Sequence[BundleRecord],
    user_name: str | None = None,
    answer_type: str | None = None,
    limit: int | None = MAX_ANSWER_OPTIONS,
) -> list[AnswerOption]:
    """The answers the records' own sentences supply, found the way :func:`answer_kinds` finds
    their kinds: each name that is not the user's, stands in no series of names
    (:func:`_in_name_series`) and is not in its record's title (:func:`_in_title`; ``entity``),
    each number that is not part of a date or a year (``number``), each enumeration "a, b and c"
    (``list``), each date a sentence writes, and each record's own date (``date``, cited from :func:`event_span`; not for a
    document section, :data:`UNDATED_EVENT_KINDS`).

    With ``answer_type``, only that kind's options when the records hold one (else every kind).
    At most ``limit`` (None: all), taken in turn from each record so that none crowds the others
    out; the same answer once. Measured on the embedded 1.5B model, a planner that writes its own
    answer wrote one that is in no sentence it cites, or is not stated there, or is its
    demonstration's, in a third of its plans; one that picks an option cannot."""
    user = _user_words(user_name)
    mid_sentence = {
        w for r in records for s in r.spans for w in _MID_SENTENCE.findall(plain_text(s.text))
    }
    per_record: list[list[AnswerOption]] = []
    for record in records:
        found: list[AnswerOption] = []
        stating = stating_spans(record)
        dated = record.date and record.kind not in UNDATED_EVENT_KINDS
        event = event_span(stating) if dated and stating else None
        if event is not None:
            found.append(AnswerOption(event.id, record.date, "date"))
        for span in stating:
            text = plain_text(span.text)
            found += [
                AnswerOption(span.id, m.group(0), "date") for m in _MENTIONED_DATE.finditer(text)
            ]
            found += [
                AnswerOption(span.id, _list_answer(m.group(0)), "list")
                for m in _ENUMERATION.finditer(text)
            ]
            names = _option_names(text, user, mid_sentence)
            found += [
                AnswerOption(span.id, answer, "entity")
                for name in names
                if not _in_name_series(text, name, names)
                and not _in_title(record.title, name)
                and (answer := option_answer(text, name))
                and _says_more_than(text, answer)
            ]
            found += [
                AnswerOption(span.id, number, "number")
                for m in count_numbers(text)
                if _says_more_than(text, number := _with_unit(m.string, m))
            ]
        per_record.append(found)
    if answer_type and any(o.answer_type == answer_type for found in per_record for o in found):
        per_record = [[o for o in found if o.answer_type == answer_type] for found in per_record]
    options: list[AnswerOption] = []
    seen: set[str] = set()
    queues = [iter(found) for found in per_record]
    while queues:
        for queue in list(queues):  # each record's next answer not offered yet, in turn
            option = next((o for o in queue if o.answer.lower() not in seen), None)
            if option is None:
                queues.remove(queue)
                continue
            seen.add(option.answer.lower())
            options.append(option)
            if len(options) == limit:
                return options
    return options


# The kinds of answer a second record can write again word for word: a name ("Sofia") or a
# number with its unit ("12 children"). Dates and enumerations are not: a record's date is in its
# header, not in a sentence, and two records rarely enumerate the same items in the same words.
PAIR_ANSWER_TYPES = ("entity", "number")


def pair_options(
    records: Sequence[BundleRecord],
    user_name: str | None = None,
    answer_type: str | None = None,
    limit: int | None = MAX_ANSWER_OPTIONS,
) -> list[AnswerOption]:
    """The two-record answers of a bundle: each answer option of one record (:func:`answer_options`:
    a name that is not the user's, a number with its unit) that a sentence of another record also
    writes, as a whole word, with that sentence in ``also`` — the answer a question needs both
    records for when it asks by what each of them says about it ("Who brought in ginger tea and
    helped me settle in with the new supplement?" → Sofia).

    Measured on the embedded 1.5B model, two-record tasks planned from one-record options kept
    none of 60 over four runs: the planner named one record, or its question asked what one record
    says and the blind reader cited that one only. ``answer_type`` and ``limit`` as in
    :func:`answer_options`; the records of each pair in bundle order, the same answer once.

    Neither sentence may be an email's address line, and the two may not be the same words (a
    reply's quoted header or subject): each record alone then answers, and the question had
    nothing of the second record to ask by ("Who sent the email …, and also From, who <…>?").
    Measured: such pairs were 5 of the 9 two-record candidates of demo-11 and 2 of 7 in each of
    the nineteenth and twentieth cost runs, and none was kept."""
    stating = {r.id: [(s, plain_text(s.text)) for s in stating_spans(r)] for r in records}
    span_text = {s.id: text for spans in stating.values() for s, text in spans}
    raw_text = {s.id: s.text for spans in stating.values() for s, _ in spans}
    order = {r.id: n for n, r in enumerate(records)}
    options: list[AnswerOption] = []
    seen: set[str] = set()
    for option in answer_options(records, user_name, limit=None):
        if option.answer_type not in PAIR_ANSWER_TYPES or option.answer.lower() in seen:
            continue
        if answer_type and answer_type in PAIR_ANSWER_TYPES and option.answer_type != answer_type:
            continue
        own = option.span_id.rpartition("#")[0]
        word = whole_word(option.answer)
        if not _says_more(span_text[option.span_id], word) or _ADDRESS_LINE.match(
            raw_text[option.span_id]
        ):
            continue
        other = next(
            (
                span.id
                for rid in sorted(stating, key=order.__getitem__)
                if rid != own
                for span, text in stating[rid]
                if word.search(text)
                and _says_more(text, word)
                and not _ADDRESS_LINE.match(span.text)
                and not _same_sentence(span.text, raw_text[option.span_id])
            ),
            None,
        )
        if other is None:
            continue
        seen.add(option.answer.lower())
        first, second = sorted((option.span_id, other), key=lambda s: order[s.rpartition("#")[0]])
        options.append(AnswerOption(first, option.answer, option.answer_type, also=(second,)))
        if len(options) == limit:
            break
    return options


# An email's address lines ("From: Raj Mehta <raj.mehta@outlook.com>") name a sender or recipient
# and nothing a question can ask by; a reply repeats its thread's address and subject lines.
_ADDRESS_LINE = re.compile(r"^\s*(?:From|To|Cc|Bcc|Sender|Recipients?)\s*:", re.I)
_REPLY_PREFIX = re.compile(r"^\s*(?:subject\s*:\s*)?(?:(?:re|fwd?|aw)\s*:\s*)*", re.I)


def _same_sentence(a: str, b: str) -> bool:
    """Whether two sentences are the same words (a reply's "Subject: Re: …" and its original's)."""
    return " ".join(_REPLY_PREFIX.sub("", a).lower().split()) == " ".join(
        _REPLY_PREFIX.sub("", b).lower().split()
    )


PAIR_MIN_WORDS = 3
"""The words besides its answer each sentence of a two-record option must write."""
OPTION_MIN_WORDS = 2
"""The words besides its answer a name's or number's sentence must write to be an option ("We
planted 3 rows" is; a table row "| Samuel Lin | Planter |" is not: its sentence ask was "who")."""


def _says_more(text: str, answer: re.Pattern[str], words: int = PAIR_MIN_WORDS) -> bool:
    """Whether a sentence writes at least :data:`PAIR_MIN_WORDS` words besides the answer: what a
    question can ask by. A list item or a heading that is only the name ("- Sketch Summaries")
    gave the two-record ask "who, and also who"."""
    return len(re.findall(r"[A-Za-z]{2,}", answer.sub(" ", text))) >= words


def _says_more_than(text: str, answer: str) -> bool:
    return _says_more(text, whole_word(answer), OPTION_MIN_WORDS)


def task_options(
    records: Sequence[BundleRecord],
    task: Task,
    user_name: str | None = None,
    limit: int | None = MAX_ANSWER_OPTIONS,
    *,
    bridges: bool = False,
    updates: bool = False,
    pairs: bool = True,
    bridge_events: str = "subject",
) -> list[AnswerOption]:
    """What an anchored planner chooses from for ``task``: the two-record answers for a task of
    two or more evidence records, where the bundle has any — the knowledge updates
    (:func:`update_options`, with ``updates``), the bridges (:func:`bridge_options`, with
    ``bridges``, their days told as ``bridge_events`` says) and the pairs (:func:`pair_options`,
    with ``pairs``) in turn — and otherwise the one-record answers (:func:`answer_options`)."""
    if task.evidence_count >= 2:
        kinds = [
            update_options(records, user_name, task.answer_type, limit) if updates else [],
            bridge_options(records, user_name, task.answer_type, limit, bridge_events)
            if bridges
            else [],
            pair_options(records, user_name, task.answer_type, limit) if pairs else [],
        ]
        mixed = [o for row in zip_longest(*kinds) for o in row if o is not None]
        if mixed:
            return mixed[:limit] if limit is not None else mixed
    return answer_options(records, user_name, task.answer_type, limit)


# The kinds of value a later record updates: a date ("moved to March 27") or a count with its unit.
UPDATE_ANSWER_TYPES = ("date", "number")
_TOPIC_WORD = re.compile(r"[A-Za-z][A-Za-z'’-]{3,}")
_NOT_TOPIC = frozenset(
    "this that with from have will your about their there they them then than what when which "
    "would could should been were into also just some more next week weeks today tomorrow "
    "morning afternoon evening night please thanks thank sure know like want need hope".split()
)
UPDATE_MIN_SHARED = 2
"""Topic words an earlier and a later sentence share for the later one's value to update the
earlier one's (``cleaning``, ``exam``, ``Voss`` of a dental confirmation and its rescheduling)."""


def _topic(text: str) -> set[str]:
    """A sentence's topic words, lowercased and without a plural "s": no calendar word, no short
    or common word."""
    words = (w.lower().rstrip("'’") for w in _TOPIC_WORD.findall(text))
    return {
        w[:-1] if w.endswith("s") and not w.endswith("ss") else w
        for w in words
        if w not in _NOT_TOPIC and w not in _LEADING_WORDS and not _CALENDAR_WORDS.match(w)
    }


def update_values(sentence: str, kind: str) -> list[str]:
    """The values of ``kind`` a sentence writes that an update can replace: the dates (without a
    weekday), or the counted numbers with their unit."""
    return _values(plain_text(sentence), kind)


def _values(text: str, kind: str) -> list[str]:
    if kind == "date":
        return [m.group(0) for m in _MENTIONED_DATE.finditer(text)]
    return [v for m in count_numbers(text) if " " in (v := _with_unit(m.string, m))]


def _same_value(a: str, b: str) -> bool:
    def key(v: str) -> str:
        return re.sub(r",?\s+\d{4}$|(?<=\d)(?:st|nd|rd|th)\b", "", v).lower()

    return key(a) == key(b)


def update_options(
    records: Sequence[BundleRecord],
    user_name: str | None = None,
    answer_type: str | None = None,
    limit: int | None = MAX_ANSWER_OPTIONS,
) -> list[AnswerOption]:
    """The knowledge updates of a bundle: a value (a date a sentence writes, or a count with its
    unit) that a later record's sentence writes for what an earlier record's sentence wrote
    another value of — the two sentences share :data:`UPDATE_MIN_SHARED` topic words, and the
    earlier record never writes the later value. The answer is the later value; ``earlier`` is
    the earlier sentence. The question asks for the current value ("When is my dental cleaning
    now?"), so it needs both records: the later one for the answer, the earlier one to know it
    changed; a memory that keeps or delivers only the first answers with the stale value, the
    failure RHELM's and the demo's knowledge-update questions test. ``answer_type`` and ``limit``
    as in :func:`answer_options`; the later value once."""
    dated = [r for r in records if r.date and r.kind not in UNDATED_EVENT_KINDS]
    kinds = [answer_type] if answer_type in UPDATE_ANSWER_TYPES else list(UPDATE_ANSWER_TYPES)
    options: list[AnswerOption] = []
    seen: set[str] = set()
    for later in dated:
        for earlier in (r for r in dated if r.date < later.date):
            before = [(s, plain_text(s.text)) for s in stating_spans(earlier)]
            earlier_text = " ".join(t for _, t in before)
            for span in stating_spans(later):
                text = plain_text(span.text)
                for kind in kinds:
                    for value in _values(text, kind):
                        if value.lower() in seen or any(
                            _same_value(value, v) for v in _values(earlier_text, kind)
                        ):
                            continue
                        topic = _topic(text)
                        old = next(
                            (
                                s
                                for s, t in before
                                if _values(t, kind) and len(_topic(t) & topic) >= UPDATE_MIN_SHARED
                            ),
                            None,
                        )
                        if old is None:
                            continue
                        seen.add(value.lower())
                        options.append(AnswerOption(span.id, value, kind, earlier=old.id))
                        if len(options) == limit:
                            return options
    return options


# The kinds of answer a bridge asks for: "When did I …, on the day …?" is the record's own date.
BRIDGE_ANSWER_TYPES = ("entity", "number", "list")
# an upload tag or a bracketed note in a user's message: "[Upload 36_notes_task_9353f783] I …"
_TAG = re.compile(r"\[[^\]]*\]")
# "just as we finished …", "after we finished …": the event, not its relation to another
_SUBORDINATE = re.compile(r"^(?:just\s+)?(?:as|when|while|after|once|since)\s+", re.I)
_SUBJECT_START = re.compile(
    r"^(?:I|I['’]\w+|we|my|our|he|she|they|it|a|an|the|someone|everyone|"
    r"(?!Just\b)[A-Z][a-z]+(?<!ing)(?<!ed))\b"
)
# the words a cut event phrase may not end on ("… a few keywords for the")
_DANGLING = frozenset(
    "a an the this that these those my our your his her their its of for to with in on at by from "
    "and or but as into onto about after before while when so".split()
)
# What starts an event sentence and says only when, which the bridge's "on the day" says already.
_DAY_OPENER = re.compile(
    r"^(?:(?:so|and|well|honestly|actually|also|oh),?\s+)?(?:(?:early |late )?(?:this|today|tonight)"
    r"(?: (?:morning|afternoon|evening))?|today|tonight|earlier(?: today)?|just now),?\s+",
    re.I,
)
BRIDGE_MAX_SHARED = 2
"""A bridge's event shares fewer topic words than this with the answer's sentence: it is another
event of the day, not the same one told twice ("What device did I use to send a quick note to
Lila on the day I wanted to send a quick update to Lila?", the first bridge run)."""
DAY_TRIES = 12
"""How many records of the seed's day :meth:`BundleSampler._day_bundle` tries for a bridge."""
BRIDGE_EVENT_WORDS = 10
"""A bridge's event is told in at most this many words of its sentence's first clause."""


def bridge_event(sentence: str) -> str:
    """What a bridge's event sentence tells, as the words after "on the day": its first clause
    without an opening "This morning," (the day is the bridge's point), at most
    :data:`BRIDGE_EVENT_WORDS` words. ``"This morning, just as we finished setting up for the Open
    House, a sudden winter storm rolled in"`` → ``"just as we finished setting up for the Open
    House"``."""
    if subject := SUBJECT_TEXT.match(sentence):  # an email dated by its subject line
        return f'of the email "{subject.group(1).strip()}"'
    text = _TAG.sub("", plain_text(sentence)).strip()
    text = _SUBORDINATE.sub("", _DAY_OPENER.sub("", text))
    clause = re.split(r"[;:—–]|,\s+", text)[0]
    words = clause.split()[:BRIDGE_EVENT_WORDS]
    while words and words[-1].lower().strip(",.!") in _DANGLING:  # "… keywords for the"
        words.pop()
    return " ".join(words).rstrip(" ,.!")


# A user's reaction in a conversation, not an event of the day: a question ("What really struck
# me …"), a word to the assistant ("I think you're right"), a feeling or wish ("I really like how the
# document breaks down …", "I do feel pretty isolated", "I kept hoping I'd rally", "I wanted to …").
_QUESTION_START = re.compile(
    r"^(?:what|how|why|which|who|whom|whose|where|when|could|can|would|should|will|do|does|did|"
    r"is|are|was|were|shall|may|might)\b",
    re.I,
)
_TO_ASSISTANT = re.compile(r"(?<![\w-])(?:you|your|yours|you['’]\w+)\b", re.I)  # not "thank-you"
_REACTION = re.compile(
    r"^(?:I|we)(?:\s+(?:really|just|still|also|do|did|truly|honestly|actually|definitely|totally|"
    r"so|kind of|sort of))*\s+(?:like|love|think|feel|felt|wonder|appreciate|agree|hope|hoped|"
    r"guess|believe|want|wanted|need|wish|wished|enjoy|prefer|know|understand|realize|"
    r"kept\s+(?:hoping|wondering|thinking)|was\s+(?:(?:really|just|still)\s+)*"
    r"(?:looking forward|hoping|wondering|thinking|feeling))\b"
    r"|^I['’]d\s+(?:really\s+)?(?:love|like|appreciate)\b"
    r"|^(?:I['’]m|we['’]re)\s+(?:(?:really|just|still|now|also|so)\s+)*(?:feeling|noticing|"
    r"wondering|thinking|hoping|curious|glad|grateful|starting to (?:realize|see|notice)|"
    r"turning over|trying to (?:figure|decide|understand))\b",
    re.I,
)


def _tells_event(phrase: str) -> bool:
    """Whether a bridge's event phrase has a subject to tell something with (``I just got back
    from a full day in Eugene``, not ``felt especially peaceful in my bedroom``) and four words.
    An email's subject line is no bridge: the writer quoted it whole ("… on the day of the email
    'Update on Elena's Symptoms – December 15'?" was too long, and an echo)."""
    words = phrase.split()
    return len(words) >= 4 and bool(_SUBJECT_START.match(phrase)) and "email" not in words[:3]


def _tells_deed(phrase: str) -> bool:
    """:func:`_tells_event`, and what the phrase tells is something done or something that
    happened, not the user's reaction in a conversation: no question, no word to the assistant, no
    feeling, opinion or wish. Read from the embedded model's bridges on RHELM, whose day phrases
    were a conversation's first sentence: "… on the day I think you're right?", "… on the day What
    really struck me was how the podcast …", "… on the day I really like how the document breaks
    down the cost?" — none says which day."""
    return (
        _tells_event(phrase)
        and not _QUESTION_START.match(phrase)
        and not _TO_ASSISTANT.search(phrase)
        and not _REACTION.match(phrase)
    )


_BRIDGE_TELLS = {"subject": _tells_event, "told": _tells_deed}
BRIDGE_EVENTS = tuple(_BRIDGE_TELLS)
"""How :func:`bridge_options` picks another record's sentence as a bridge's day
(:attr:`~memsteer_dspy.bundles.BundleConfig.bridge_events`): ``subject`` — any four words after a
subject (:func:`_tells_event`); ``told`` — also no question, no word to the assistant and no
feeling or wish (:func:`_tells_deed`)."""


def bridge_options(
    records: Sequence[BundleRecord],
    user_name: str | None = None,
    answer_type: str | None = None,
    limit: int | None = MAX_ANSWER_OPTIONS,
    events: str = "subject",
) -> list[AnswerOption]:
    """The bridged answers of a bundle: each one-record answer option (:func:`answer_options`: a
    name, a number, a list) with, as its ``bridge``, the event sentence (:func:`event_span`) of
    another record of the same day — the question asks for the answer "on the day" that other
    event happened, so it needs both records, as RHELM's official multi-record questions do ("Who
    shared the evening meal with me on the day Sofia completed her model rocket launch?").

    The answer record's date is not in the question: the other record's event says which day.
    The event sentence must not write the answer (it would answer alone) and must not be the
    answer's own sentence; a document section (:data:`UNDATED_EVENT_KINDS`) dates nothing. Each
    answer once, the records in turn so that none crowds the others out; ``answer_type`` and
    ``limit`` as in :func:`answer_options`; ``events``: which sentences may name the day
    (:data:`BRIDGE_EVENTS`).

    Measured on the embedded model: two-record *pair* options (an answer two records write) kept
    none of their candidates in most runs: two records rarely write one name in sentences that
    each say something else, and the blind reader cited one of them."""
    tells = _BRIDGE_TELLS.get(events)
    if tells is None:
        raise ValueError(f"bridge events: {events!r} is none of {', '.join(BRIDGE_EVENTS)}")
    dated = [r for r in records if r.date and r.kind not in UNDATED_EVENT_KINDS]
    sentences = {r.id: e for r in dated if (st := stating_spans(r)) and (e := event_span(st))}
    span_text = {s.id: s.text for r in dated for s in r.spans}
    options: list[AnswerOption] = []
    seen: set[str] = set()
    for option in answer_options(dated, user_name, limit=None):
        if option.answer_type not in BRIDGE_ANSWER_TYPES or option.answer.lower() in seen:
            continue
        if answer_type in BRIDGE_ANSWER_TYPES and option.answer_type != answer_type:
            continue
        own = option.span_id.rpartition("#")[0]
        if _ADDRESS_LINE.match(span_text[option.span_id]):  # "From: Amelia Torres <…>"
            continue
        day = next(r.date for r in dated if r.id == own)
        word = whole_word(option.answer)
        topic = _topic(plain_text(span_text[option.span_id]))
        bridge = next(
            (
                e
                for r in dated
                if r.id != own
                and r.date == day
                and (e := sentences.get(r.id)) is not None
                and not word.search(plain_text(e.text))
                and tells(event := bridge_event(e.text))
                and len(_topic(event) & topic) < BRIDGE_MAX_SHARED
            ),
            None,
        )
        if bridge is None:
            continue
        seen.add(option.answer.lower())
        options.append(
            AnswerOption(option.span_id, option.answer, option.answer_type, bridge=bridge.id)
        )
        if len(options) == limit:
            break
    return options
