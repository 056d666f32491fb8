"""The blind-answer agreement rules (paper Appendix A.4), as a table of cases."""

from __future__ import annotations

import pytest

from memsteer_dspy.normalize import (
    AnswerParseError,
    Quantity,
    answers_match,
    coerce_answer_type,
    list_items,
    list_jaccard,
    normalize_answer,
    parse_answer,
)
from memsteer_dspy.records import AnswerType

MATCH_TABLE = [
    # text / entity: case, punctuation, articles, whitespace, accents
    ("text", "The MacBook Air.", "macbook air", True),
    ("text", "  an   apple pie ", "Apple Pie", True),
    ("entity", "Café Luna", "cafe luna", True),
    ("entity", "Dr. Liu", "dr liu", True),
    ("text", "MacBook Pro", "MacBook Air", False),
    ("text", "", "", False),
    ("text", "unknown", "Paris", False),
    # number: value and unit, words, separators
    ("number", "3.5 km", "3.50 kilometers", True),
    ("number", "three", "3", True),
    ("number", "twenty-five people", "25", True),
    ("number", "$1,200", "1200 dollars", True),
    ("number", "1.2k", "1200", True),
    ("number", "25%", "25 percent", True),
    ("number", "3 hours", "three hrs", True),
    ("number", "a dozen", "12", True),
    ("number", "one hundred and two", "102", True),
    ("number", "$2.5m", "2,500,000 USD", True),
    ("number", "5m", "5 meters", True),
    ("number", "3.5 km", "3500 m", False),
    ("number", "3 km", "3 miles", False),
    ("number", "4", "3", False),
    ("number", "about 7 minutes", "7 min", True),
    ("number", "3 or 4", "3", False),
    # date: ISO, partial dates keep their precision
    ("date", "March 3, 2024", "2024-03-03", True),
    ("date", "3rd March 2024", "2024-03-03", True),
    ("date", "03/04/2024", "2024-03-04", True),
    ("date", "Monday, March 4th, 2024", "2024-03-04", True),
    ("date", "2024-03-03T10:15:00", "2024-03-03", True),
    ("date", "March 2024", "2024-03", True),
    ("date", "March 2024", "2024-03-01", False),
    ("date", "March 3", "--03-03", True),
    # a date without a year agrees with a full date of that month and day, either way round
    ("date", "2024-05-13", "May 13", True),
    ("date", "May 13", "2024-05-13", True),
    ("date", "2024-05-14", "May 13", False),
    ("date", "March 3", "2023-04-03", False),
    ("date", "2023", "2023", True),
    ("date", "March 3, 2024", "March 4, 2024", False),
    # list: set equality of normalized items
    ("list", "apples, pears and plums", "Plums; Apples; pears", True),
    ("list", "- apples\n- pears", "pears, apples", True),
    ("list", "apples, pears", "apples, pears, plums", False),
    ("list", '["Rome", "Paris"]', "Paris and Rome", True),
    # boolean: exact after mapping
    ("boolean", "Yes, she did.", "true", True),
    ("boolean", "No", "false", True),
    ("boolean", "yes", "no", False),
    ("boolean", "maybe", "yes", False),
]


@pytest.mark.parametrize(("answer_type", "prediction", "reference", "expected"), MATCH_TABLE)
def test_answers_match_table(answer_type, prediction, reference, expected):
    assert answers_match(prediction, reference, answer_type) is expected
    # agreement is symmetric
    assert answers_match(reference, prediction, answer_type) is expected


NORMALIZE_TABLE = [
    ("text", "  The  Blue-Car! ", "blue car"),
    ("number", "3.50 kilometres", "3.5 km"),
    ("number", "seven", "7"),
    ("number", "$40", "40 usd"),
    ("date", "Jan 5th, 2025", "2025-01-05"),
    ("date", "May 2023", "2023-05"),
    ("list", "b, a and c", "a; b; c"),
    ("boolean", "True", "yes"),
    ("boolean", "nope", "no"),
    # unparseable text falls back to text normalization instead of raising
    ("number", "several", "several"),
    ("date", "last week", "last week"),
]


@pytest.mark.parametrize(("answer_type", "text", "expected"), NORMALIZE_TABLE)
def test_normalize_answer_table(answer_type, text, expected):
    assert normalize_answer(text, answer_type) == expected


@pytest.mark.parametrize(
    ("answer_type", "text"),
    [
        ("number", "several"),
        ("number", "between 3 and 4"),
        ("number", ""),
        ("date", "last week"),
        ("date", "5 km"),
        ("date", "2024-13-01"),
        ("boolean", "perhaps"),
        ("list", " , ; "),
        ("text", "   ...  "),
    ],
)
def test_parse_answer_rejects_text_of_another_type(answer_type, text):
    with pytest.raises(AnswerParseError):
        parse_answer(text, answer_type)


def test_parse_answer_returns_typed_values():
    assert parse_answer("3.5 km", "number") == Quantity(3.5, "km")
    assert parse_answer("2 years", AnswerType.NUMBER) == Quantity(2, "year")
    assert parse_answer("72°F", "number") == Quantity(72, "degree_f")
    assert parse_answer("a, b", "list") == frozenset({"a", "b"})
    assert parse_answer("no", "boolean") is False
    assert parse_answer("The Plaza", "entity") == "plaza"


def test_unknown_answer_type_is_a_value_error():
    with pytest.raises(ValueError, match="unknown answer type"):
        coerce_answer_type("color")
    assert coerce_answer_type(" Date ") is AnswerType.DATE


def test_list_items_and_jaccard():
    assert list_items("1. eggs\n2. milk\n3. the bread") == ["eggs", "milk", "bread"]
    assert list_items(["Eggs", "milk and bread"]) == ["eggs", "milk", "bread"]
    assert list_jaccard("eggs, milk", "milk, eggs, bread") == pytest.approx(2 / 3)
    assert list_jaccard("", "") == 1.0
    assert list_jaccard("eggs", "") == 0.0
    assert list_jaccard(["a", "b"], "c") == 0.0
