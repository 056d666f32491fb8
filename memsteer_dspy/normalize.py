"""Type-specific answer normalization: the paper's blind-answer agreement rules (Appendix A.4).

Blind answer recovery accepts a candidate only if the blind reader's answer *exactly* matches the
reference after type-specific normalization. The same rules score predictions elsewhere.

* ``text`` / ``entity`` — Unicode-folded, lower-cased, accents, punctuation and the articles
  *a/an/the* removed, whitespace collapsed.
* ``number`` — one value and an optional unit: digits (``1,200``, ``3.50``, ``2.5k``), number
  words (``three``, ``twenty-five``, ``one hundred and two``, ``3 million``); units are mapped to a
  canonical name by a small table (``km``/``kilometers``/``kilometres`` → ``km``, ``$``/``dollars``
  → ``usd``, ``%``/``percent`` → ``percent``; other words lose a plural ``s``). Values compare
  exactly (up to float rounding); units compare exactly when both sides name one — no unit
  conversion (``3.5 km`` ≠ ``3500 m``), as the paper asks for value-and-unit agreement. A side
  with no unit matches any unit (``50`` == ``$50``). A string with two different numbers does
  not parse as a number (ambiguous).
* ``date`` — ISO: ``YYYY-MM-DD``; partial dates keep their precision (``March 2024`` →
  ``2024-03``, ``2024`` → ``2024``, ``March 3`` → ``--03-03``). Numeric dates read month first
  (``03/04/2024`` → ``2024-03-04``) unless the first number cannot be a month.
* ``list`` — set equality of items normalized as text; items are split on commas, semicolons,
  newlines, bullets and the word *and* / ``&``.
* ``boolean`` — yes/true/correct/… vs no/false/incorrect/…, compared exactly.

:func:`parse_answer` returns the typed value (raising :class:`AnswerParseError` when the text does
not read as that type), :func:`normalize_answer` its canonical string, :func:`answers_match` the
agreement test and :func:`list_jaccard` the partial credit for lists.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from memsteer_dspy.records import AnswerType

__all__ = [
    "AnswerParseError",
    "Quantity",
    "answers_match",
    "coerce_answer_type",
    "list_items",
    "list_jaccard",
    "normalize_answer",
    "normalize_text",
    "numbers_in",
    "parse_answer",
]


class AnswerParseError(ValueError):
    """The answer text does not read as a value of the requested answer type."""


@dataclass(frozen=True)
class Quantity:
    """A numeric answer: its value and its canonical unit (``None`` without one)."""

    value: float
    unit: str | None = None

    def __str__(self) -> str:
        v = self.value
        text = str(int(v)) if v == int(v) and abs(v) < 1e15 else repr(v)
        return f"{text} {self.unit}" if self.unit else text


def coerce_answer_type(answer_type: AnswerType | str) -> AnswerType:
    """The :class:`AnswerType` named by ``answer_type``; raises ``ValueError`` for an unknown one."""
    if isinstance(answer_type, AnswerType):
        return answer_type
    try:
        return AnswerType(str(answer_type).strip().lower())
    except ValueError:
        valid = ", ".join(t.value for t in AnswerType)
        raise ValueError(f"unknown answer type {answer_type!r}; expected one of {valid}") from None


# --------------------------------------------------------------------------------------------
# text
# --------------------------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = re.compile(r"[^\w\s]|_")
_SPACES = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """Lower-case, strip accents, punctuation and articles, collapse whitespace.

    A text that is nothing but an article ("A", a grade or a letter option) keeps it.
    """
    text = unicodedata.normalize("NFKD", str(text))
    text = "".join(c for c in text if not unicodedata.combining(c))
    text = text.lower().replace("&", " and ")
    text = _SPACES.sub(" ", _PUNCT.sub(" ", text)).strip()
    return _SPACES.sub(" ", _ARTICLES.sub(" ", text)).strip() or text


# --------------------------------------------------------------------------------------------
# numbers
# --------------------------------------------------------------------------------------------

_SMALL = {
    "zero": 0,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "thirteen": 13,
    "fourteen": 14,
    "fifteen": 15,
    "sixteen": 16,
    "seventeen": 17,
    "eighteen": 18,
    "nineteen": 19,
    "twenty": 20,
    "thirty": 30,
    "forty": 40,
    "fifty": 50,
    "sixty": 60,
    "seventy": 70,
    "eighty": 80,
    "ninety": 90,
}
_SCALES = {"hundred": 100, "thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000}
_WORDS_ALT = "|".join(sorted([*_SMALL, *_SCALES, "a", "an", "and", "dozen"], key=len, reverse=True))
_NUMBER_WORDS = re.compile(rf"\b(?:{_WORDS_ALT})(?:[\s-]+(?:{_WORDS_ALT}))*\b", re.IGNORECASE)
_DIGITS = re.compile(
    r"(?<![\w.])([-+−]?)(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
    r"(?:\s*(k|thousand|million|m(?:ln|n)?\b|billion|bn)\b)?",
    re.IGNORECASE,
)
_UNIT_WORD = re.compile(r"\s*([%°$€£¥]|[A-Za-z][A-Za-z./]*(?:\s+(?:per|an|a)\s+[A-Za-z]+)?)")
_CURRENCY_PREFIX = re.compile(r"(us\$|\$|€|£|¥|usd|eur|gbp)\s*$", re.IGNORECASE)

# Canonical unit names. Keys are lower-case surface forms.
_UNITS: dict[str, str] = {}
for _canon, _forms in {
    "km": "km kms kilometer kilometers kilometre kilometres",
    "m": "m meter meters metre metres",
    "cm": "cm centimeter centimeters centimetre centimetres",
    "mm": "mm millimeter millimeters millimetre millimetres",
    "mi": "mi mile miles",
    "ft": "ft foot feet",
    "in": "inch inches",
    "kg": "kg kgs kilogram kilograms kilo kilos",
    "g": "g gram grams",
    "lb": "lb lbs pound pounds",
    "l": "l liter liters litre litres",
    "ml": "ml milliliter milliliters millilitre millilitres",
    "s": "s sec secs second seconds",
    "min": "min mins minute minutes",
    "h": "h hr hrs hour hours",
    "day": "day days",
    "week": "wk wks week weeks",
    "month": "mo mos month months",
    "year": "yr yrs year years",
    "percent": "% percent per cent pct",
    "usd": "$ us$ usd dollar dollars buck bucks",
    "eur": "€ eur euro euros",
    "gbp": "£ gbp",
    "jpy": "¥ jpy yen",
    "degree": "° deg degree degrees",
    "mph": "mph",
    "kph": "kph km/h kmh",
    "calorie": "cal kcal calorie calories",
    "step": "step steps",
    "time": "time times",
    "people": "person persons people",
    "bpm": "bpm",
}.items():
    for _f in _forms.split(" "):
        _UNITS[_f] = _canon
_UNITS["per cent"] = "percent"
_UNITS["fahrenheit"] = "degree_f"
_UNITS["°f"] = "degree_f"
_UNITS["celsius"] = "degree_c"
_UNITS["°c"] = "degree_c"
# Words after a number that are not units (so "3 of them" has no unit "of").
_NOT_UNITS = {"of", "and", "or", "to", "in", "on", "at", "for", "the", "a", "an", "is", "was", "by"}


def _words_value(phrase: str) -> float | None:
    """Value of a number-word phrase ("twenty-five", "one hundred and two", "a dozen")."""
    tokens = [t for t in re.split(r"[\s-]+", phrase.lower()) if t and t != "and"]
    if not tokens or all(t in ("a", "an") for t in tokens):
        return None
    total, current, seen = 0.0, 0.0, False
    for t in tokens:
        if t in ("a", "an"):
            current = current or 1
        elif t == "dozen":
            current = (current or 1) * 12
            seen = True
        elif t in _SMALL:
            current += _SMALL[t]
            seen = True
        elif t in _SCALES:
            scale = _SCALES[t]
            if scale == 100:
                current = (current or 1) * 100
            else:
                total += (current or 1) * scale
                current = 0
            seen = True
    return total + current if seen else None


def _canonical_unit(word: str) -> str | None:
    w = word.strip().lower().rstrip(".")
    if not w or w in _NOT_UNITS:
        return None
    if w in _UNITS:
        return _UNITS[w]
    first = w.split()[0]
    if first in _UNITS:
        return _UNITS[first]
    if first in _NOT_UNITS:
        return None
    if len(first) > 3 and first.endswith("s") and not first.endswith("ss"):
        first = first[:-1]
    return first


def _number_spans(raw: str) -> list[tuple[int, int, float]]:
    """Every number written in ``raw`` (digits, with "k"/"million" multipliers, or number words):
    ``(start, end, value)``."""
    found: list[tuple[int, int, float]] = []  # (start, end, value)
    for m in _DIGITS.finditer(raw):
        value = float(m.group(2).replace(",", ""))
        if m.group(1) in ("-", "−"):
            value = -value
        mult = (m.group(3) or "").lower()
        if mult in ("k", "thousand"):
            value *= 1_000
        elif mult in ("million", "m", "mn", "mln"):
            # "5m" is five metres; "5 million" / "$5m" / "5mn" are five million
            if mult != "m" or _CURRENCY_PREFIX.search(raw[: m.start()]):
                value *= 1_000_000
            else:
                found.append((m.start(), m.start(3), value))
                continue
        elif mult in ("billion", "bn"):
            value *= 1_000_000_000
        found.append((m.start(), m.end(), value))
    for m in _NUMBER_WORDS.finditer(raw):
        if any(a <= m.start() < b for a, b, _ in found):
            continue
        value = _words_value(m.group(0))
        if value is not None:
            end = m.end()
            # "3 million" written with a digit is handled above; "two million" here
            found.append((m.start(), end, value))
    return found


def numbers_in(text: str) -> set[float]:
    """The values of every number written in ``text`` ("3", "1,200", "two dozen", "5 million")."""
    return {round(v, 9) for _, _, v in _number_spans(unicodedata.normalize("NFKC", str(text)))}


def _parse_number(text: str) -> Quantity:
    raw = unicodedata.normalize("NFKC", str(text)).strip()
    if not raw:
        raise AnswerParseError("empty answer")
    found = _number_spans(raw)
    if not found:
        raise AnswerParseError(f"no number in {text!r}")
    values = {round(v, 9) for _, _, v in found}
    if len(values) > 1:
        raise AnswerParseError(f"more than one number in {text!r}; a numeric answer has one value")
    start, end, value = min(found)
    unit = None
    prefix = _CURRENCY_PREFIX.search(raw[:start])
    if prefix:
        unit = _canonical_unit(prefix.group(1))
    else:
        m = _UNIT_WORD.match(raw, end)
        if m:
            unit = _canonical_unit(m.group(1))
            # "5 °F" / "5°F"
            if m.group(1) == "°":
                nxt = raw[m.end() : m.end() + 1].lower()
                unit = {"f": "degree_f", "c": "degree_c"}.get(nxt, "degree")
    return Quantity(value=value, unit=unit)


# --------------------------------------------------------------------------------------------
# dates
# --------------------------------------------------------------------------------------------

_ISO = re.compile(r"^\s*(\d{4})(?:-(\d{1,2})(?:-(\d{1,2}))?)?(?:[T ][\d:.+\-Z]*)?\s*$")
_ORDINAL = re.compile(r"\b(\d{1,2})(st|nd|rd|th)\b", re.IGNORECASE)
_HAS_DATE_WORD = re.compile(
    r"\b(jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?\b|\d", re.IGNORECASE
)
_DEFAULT_A = datetime(2000, 1, 1)
_DEFAULT_B = datetime(2004, 12, 28)


def _parse_date(text: str) -> str:
    raw = unicodedata.normalize("NFKC", str(text)).strip().rstrip(".")
    if not raw:
        raise AnswerParseError("empty answer")
    m = _ISO.match(raw)
    if m:
        y, mo, d = m.group(1), m.group(2), m.group(3)
        try:
            if d:
                return datetime(int(y), int(mo), int(d)).strftime("%Y-%m-%d")
            if mo:
                datetime(int(y), int(mo), 1)
                return f"{int(y):04d}-{int(mo):02d}"
            return f"{int(y):04d}"
        except ValueError as exc:
            raise AnswerParseError(f"not a valid date: {text!r} ({exc})") from None
    if not _HAS_DATE_WORD.search(raw):
        raise AnswerParseError(f"no date in {text!r}")
    from dateutil import parser as dparser

    cleaned = _ORDINAL.sub(r"\1", raw)
    parsed = []
    for default in (_DEFAULT_A, _DEFAULT_B):
        try:
            parsed.append(dparser.parse(cleaned, default=default, fuzzy=True))
        except (ValueError, OverflowError):
            raise AnswerParseError(f"not a date: {text!r}") from None
    a, b = parsed
    has_year, has_month, has_day = a.year == b.year, a.month == b.month, a.day == b.day
    if not has_year and not has_month:
        raise AnswerParseError(f"not a date (no month or year): {text!r}")
    if has_year and has_month and has_day:
        return a.strftime("%Y-%m-%d")
    if has_year and has_month:
        return a.strftime("%Y-%m")
    if has_month and has_day:
        return a.strftime("--%m-%d")
    if has_year and not has_month:
        return a.strftime("%Y")
    return a.strftime("--%m")


# --------------------------------------------------------------------------------------------
# lists and booleans
# --------------------------------------------------------------------------------------------

_LIST_SPLIT = re.compile(
    r"\s*(?:[,;\n|]|\s&\s|\band\b|(?<!\d)/|/(?!\d)|^\s*[-*•]\s+|\n\s*[-*•]\s+)\s*", re.IGNORECASE
)
# ATM-Bench's memory ids (image/video file stems YYYYMMDD_HHMMSS, emailNNNN): a prediction that
# names any is scored on those ids alone, as ATM-Bench's list_jaccard does.
_MEMORY_ID = re.compile(r"(?<![\w])(\d{8}_\d{6}|email\d+)(?![\w])", re.IGNORECASE)
_ENUM = re.compile(r"^\s*(?:\d+[.)]|[-*•])\s+")
_TRUE = {"yes", "true", "y", "correct", "right", "affirmative", "yep", "yeah", "indeed", "1"}
_FALSE = {"no", "false", "n", "incorrect", "wrong", "negative", "nope", "not", "0", "never"}


def list_items(text: str | Iterable[str]) -> list[str]:
    """The normalized, non-empty items of a list answer (a string or an iterable of strings)."""
    if isinstance(text, str):
        stripped = text.strip().strip("[]()")
        pieces = _LIST_SPLIT.split(stripped)
    else:
        pieces = [p for t in text for p in _LIST_SPLIT.split(str(t))]
    items = []
    for piece in pieces:
        item = normalize_text(_ENUM.sub("", piece or ""))
        if item and item not in items:
            items.append(item)
    return items


def _parse_boolean(text: str) -> bool:
    words = normalize_text(text).split()
    if not words:
        raise AnswerParseError("empty answer")
    if words[0] in _TRUE:
        return True
    if words[0] in _FALSE:
        return False
    raise AnswerParseError(f"not a yes/no answer: {text!r}")


# --------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------


def parse_answer(text: str, answer_type: AnswerType | str):
    """The typed value of an answer: ``str`` (text, entity), :class:`Quantity` (number), ISO
    ``str`` (date), ``frozenset[str]`` (list) or ``bool`` (boolean).

    Raises :class:`AnswerParseError` when ``text`` does not read as that type, and ``ValueError``
    for an unknown answer type.
    """
    kind = coerce_answer_type(answer_type)
    text = "" if text is None else str(text)
    if kind in (AnswerType.TEXT, AnswerType.ENTITY):
        value = normalize_text(text)
        if not value:
            raise AnswerParseError("empty answer")
        return value
    if kind is AnswerType.NUMBER:
        return _parse_number(text)
    if kind is AnswerType.DATE:
        return _parse_date(text)
    if kind is AnswerType.LIST:
        items = list_items(text)
        if not items:
            raise AnswerParseError("empty list answer")
        return frozenset(items)
    return _parse_boolean(text)


def normalize_answer(text: str, answer_type: AnswerType | str) -> str:
    """The canonical string form of an answer of ``answer_type``.

    Falls back to :func:`normalize_text` when the text does not parse as that type, so it never
    raises for bad answer text (only for an unknown answer type).
    """
    kind = coerce_answer_type(answer_type)
    try:
        value = parse_answer(text, kind)
    except AnswerParseError:
        return normalize_text(text or "")
    if isinstance(value, frozenset):
        return "; ".join(sorted(value))
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _same_number(a: Quantity, b: Quantity) -> bool:
    if not math.isclose(a.value, b.value, rel_tol=1e-9, abs_tol=1e-9):
        return False
    return a.unit is None or b.unit is None or a.unit == b.unit


def answers_match(prediction: str, reference: str, answer_type: AnswerType | str) -> bool:
    """Whether ``prediction`` agrees exactly with ``reference`` after type normalization.

    A date without a year agrees with a full date of the same month and day ("May 13" and
    "2024-05-13": measured, a blind reader wrote the record's full date for an official "May 13").

    When either side does not parse as the type, the two match only if their normalized text is
    equal and non-empty (so "unknown" never matches a real answer).
    """
    kind = coerce_answer_type(answer_type)
    try:
        p, r = parse_answer(prediction, kind), parse_answer(reference, kind)
    except AnswerParseError:
        p_text, r_text = normalize_text(prediction or ""), normalize_text(reference or "")
        return bool(p_text) and p_text == r_text
    if kind is AnswerType.NUMBER:
        return _same_number(p, r)
    if kind is AnswerType.DATE and p != r and (str(p).startswith("--") != str(r).startswith("--")):
        # one side has no year ("May 13" -> --05-13): the rest must agree ("2024-05-13")
        partial, full = (p, r) if str(p).startswith("--") else (r, p)
        return str(full)[4:] == str(partial)[1:]
    return p == r


def list_jaccard(prediction: str | Iterable[str], reference: str | Iterable[str]) -> float:
    """Jaccard overlap of the normalized item sets (ATM-Bench's list partial credit).

    As in ATM-Bench's ``list_jaccard_score``: items are split at ``,`` ``;`` ``and`` ``/`` (here
    also at newlines, ``|`` and bullets, and not at a ``/`` between digits, so ``3/4`` stays one
    item), and a prediction that names memory ids (``20220430_132212``, ``email2024...``) is scored
    on those ids alone. Unlike ATM-Bench, a parenthetical inside an item is kept.

    Two empty lists score 1.0; one empty list scores 0.0.
    """
    flat = prediction if isinstance(prediction, str) else "\n".join(map(str, prediction))
    ids = _MEMORY_ID.findall(flat)
    p = {normalize_text(i) for i in ids} if ids else set(list_items(prediction))
    r = set(list_items(reference))
    if not p and not r:
        return 1.0
    return len(p & r) / len(p | r)
