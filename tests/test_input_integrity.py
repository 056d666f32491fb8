"""Inputs of any size and any shape: linear span splitting, streaming ingest, strict types,
LoCoMo's missing fields and ``--on-error skip`` covering every per-line problem (issue #13)."""

from __future__ import annotations

import json
import random
import re

import pytest
from script_helpers import argv

from memsteer_dspy import records
from memsteer_dspy.errors import InputError
from memsteer_dspy.records import split_spans


class _CountingPattern:
    """A compiled regex that counts the characters it is asked to look at (its operation count)."""

    def __init__(self, pattern: re.Pattern, counter: list[int], limit: int):
        self._p, self._c, self._limit = pattern, counter, limit

    def _span(self, string, pos=0, endpos=None):
        end = len(string) if endpos is None else min(endpos, len(string))
        self._c[0] += max(0, end - pos)
        if self._c[0] > self._limit:  # stop a quadratic splitter early instead of hanging
            raise AssertionError(f"more than {self._limit} characters scanned: not linear")

    def search(self, string, pos=0, endpos=None):
        self._span(string, pos, endpos)
        return self._p.search(string, pos, len(string) if endpos is None else endpos)

    def finditer(self, string, pos=0, endpos=None):
        self._span(string, pos, endpos)
        return self._p.finditer(string, pos, len(string) if endpos is None else endpos)

    def __getattr__(self, name):
        return getattr(self._p, name)


def _prose(n_chars: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    words = (
        'Dr. Liu met J. Smith at 5 p.m. e.g. we went home version 3.5 costs $12.50 "quoted."'
        " (aside) Yes! Why? U.S. ok. Then The A x.y.z."
    ).split()
    out, size = [], 0
    while size < n_chars:
        w = rng.choice(words)
        if rng.random() < 0.15:
            w += rng.choice([".", "!", "?", "."])
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n_chars]


def _reference_cuts(line: str) -> list[int]:
    """The sentence cutter as it was before the linear rewrite (quadratic, kept as the oracle)."""
    cuts = []
    for m in records._BOUNDARY.finditer(line):
        head = line[: m.start()].rstrip("\"')]")
        word = records._LAST_WORD.search(head)
        if word and (word.group(1).lower() in records._ABBREVIATIONS or len(word.group(1)) == 1):
            continue
        cuts.append(m.end())
    return cuts


@pytest.mark.parametrize("seed", range(20))
def test_sentence_cuts_identical_to_the_previous_cutter(seed):
    # span ids key caches and generated QA: the rewrite must cut exactly where the old one did
    line = _prose(3000, seed)
    assert records._sentence_cuts(line) == _reference_cuts(line)


def test_split_spans_is_linear_on_a_one_million_character_line(monkeypatch):
    """Failure 1: one 1,000,000-char line with no newline hung ingest (the cutter re-scanned the
    whole prefix at every boundary). Bound: the regexes may look at each character a few times."""
    text = _prose(1_000_000, seed=1)
    assert "\n" not in text
    counter = [0]
    for name in ("_BOUNDARY", "_LAST_WORD", "_WORD_RUN"):
        if hasattr(records, name):
            monkeypatch.setattr(
                records, name, _CountingPattern(getattr(records, name), counter, 10 * len(text))
            )
    spans = split_spans("big", text)
    assert len(spans) > 10_000
    assert all(len(s.text) <= records.MAX_SPAN_CHARS for s in spans)
    assert counter[0] <= 10 * len(text), f"{counter[0]} characters scanned for {len(text)}"
    # offsets still index the text
    for s in spans[:: max(1, len(spans) // 50)]:
        assert text[s.start : s.end] == s.text


# --------------------------------------------------------------------------------------------
# streaming ingest
# --------------------------------------------------------------------------------------------


def _write_history(path, n_records: int, chars: int = 400) -> int:
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n_records):
            text = _prose(chars, seed=i)
            fh.write(json.dumps({"id": f"r{i}", "kind": "note", "text": text}) + "\n")
    return path.stat().st_size


def test_ingest_memory_is_a_small_multiple_of_the_history(tmp_path):
    """Failure 1 (memory): a 50 MB history peaked at 18x its size. Loading it and computing the
    ingest report must stay within a few times the file (Python allocations, by tracemalloc)."""
    import gc
    import tracemalloc

    from memsteer_dspy.loaders import load_history

    size = _write_history(tmp_path / "h.jsonl", 2000)
    gc.collect()
    tracemalloc.start()
    try:
        loaded = load_history("jsonl", tmp_path / "h.jsonl")
        report = loaded.report()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report["records"] == 2000 and report["spans"] > 2000
    print(f"ingest peak {peak / size:.2f}x the file ({size / 1e6:.1f} MB)")
    assert peak < 6 * size, f"peak {peak / 1e6:.1f} MB for a {size / 1e6:.1f} MB history"


# --------------------------------------------------------------------------------------------
# --on-error skip covers every per-line problem (failure 5)
# --------------------------------------------------------------------------------------------


def _bad_lines_file(path):
    lines = [
        json.dumps({"id": "a", "kind": "note", "text": "First."}).encode(),
        json.dumps({"id": "b", "kind": "note", "text": "Second."}).encode(),
        json.dumps({"id": "a", "kind": "note", "text": "Again a."}).encode(),  # duplicate id
        b'{"id": "c", "kind": "note", "text": "caf\xe9 latin-1"}',  # not UTF-8
        b"{not json",
        json.dumps({"id": "d", "kind": "note"}).encode(),  # no text
        json.dumps({"id": "e", "kind": "note", "text": "Last."}).encode(),
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")


def test_on_error_skip_skips_duplicates_and_non_utf8_lines(tmp_path):
    from memsteer_dspy.loaders import load_history

    _bad_lines_file(tmp_path / "h.jsonl")
    loaded = load_history("jsonl", tmp_path / "h.jsonl", on_error="skip")
    assert [r.id for r in loaded.history.records] == ["a", "b", "e"]
    assert loaded.history["a"].text == "First."  # the first of the duplicates is kept
    by_line = {s.line: s.reason for s in loaded.skipped}
    assert sorted(by_line) == [3, 4, 5, 6]
    assert "duplicate record id 'a'" in by_line[3] and "h.jsonl:1," in by_line[3]
    assert "not UTF-8" in by_line[4]
    assert "invalid JSON" in by_line[5]
    assert "text" in by_line[6]


def test_without_skip_the_first_bad_line_is_named(tmp_path):
    from memsteer_dspy.loaders import load_history

    _bad_lines_file(tmp_path / "h.jsonl")
    with pytest.raises(InputError) as exc:
        load_history("jsonl", tmp_path / "h.jsonl")
    assert exc.value.line == 3 and exc.value.record == "a" and "duplicate" in exc.value.message
    (tmp_path / "u.jsonl").write_bytes(
        b'{"id": "x", "kind": "note", "text": "ok"}\n{"id": "y", "text": "\xff"}\n'
    )
    with pytest.raises(InputError) as exc:
        load_history("jsonl", tmp_path / "u.jsonl")
    assert exc.value.line == 2 and "not UTF-8" in exc.value.message


def test_ingest_cli_lists_every_skipped_line(tmp_path):
    from typer.testing import CliRunner

    from memsteer_dspy.cli import app

    _bad_lines_file(tmp_path / "h.jsonl")
    res = CliRunner().invoke(
        app,
        argv("ingest --format jsonl --path {} --on-error skip --json", tmp_path / "h.jsonl"),
    )
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["records"] == 3
    assert [s["line"] for s in report["skipped"]] == [3, 4, 5, 6]


# --------------------------------------------------------------------------------------------
# strict types (failure 4)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "field", "value", "expected"),
    [
        ("retrieve", "top_k", True, "integer"),
        ("retrieve", "top_k", "10", "integer"),
        ("retrieve", "top_k", 10.0, "integer"),
        ("context", "show_ids", 1, "true or false"),
        ("context", "show_dates", "yes", "true or false"),
        ("retrieve", "bm25_weight", "0.5", "number"),
        ("retrieve", "bm25_weight", False, "number"),
    ],
)
def test_design_types_are_strict(section, field, value, expected):
    from memsteer_dspy.memory import MemoryDesign

    data = json.loads(MemoryDesign.base_bm25().to_json())
    if field not in data[section]:
        pytest.skip(f"{section}.{field} is not a field of this design version")
    data[section][field] = value
    with pytest.raises(InputError) as exc:
        MemoryDesign.from_json(json.dumps(data), source="d.json")
    assert exc.value.field == f"{section}.{field}"
    assert expected in exc.value.message and "d.json" in str(exc.value)


def test_design_accepts_integers_for_numbers_and_keeps_its_key():
    from memsteer_dspy.memory import MemoryDesign

    base = MemoryDesign.base_bm25()
    data = json.loads(base.to_json())
    assert MemoryDesign.from_json(json.dumps(data)).key() == base.key()
    if "bm25_weight" in data["retrieve"]:
        data["retrieve"]["bm25_weight"] = 1
        assert MemoryDesign.from_json(json.dumps(data)).retrieve.bm25_weight == 1


def _locomo(tmp_path, *, qa=None, date="1:56 pm on 8 May, 2023", turns=None):
    sample = {
        "sample_id": "s1",
        "conversation": {
            "speaker_a": "Ann",
            "speaker_b": "Bo",
            "session_1_date_time": date,
            "session_1": turns
            or [
                {"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted a cat named Miso."},
                {"speaker": "Bo", "dia_id": "D1:2", "text": "Lovely, when?"},
            ],
        },
        "qa": qa
        if qa is not None
        else [{"question": "Cat's name?", "answer": "Miso", "evidence": ["D1:1"], "category": 4}],
    }
    path = tmp_path / "locomo.json"
    path.write_text(json.dumps([sample]))
    return path


def test_locomo_item_without_answer_is_reported_not_loaded_as_empty(tmp_path):
    from memsteer_dspy.loaders import load_history

    qa = [
        {"question": "Cat's name?", "answer": "Miso", "evidence": ["D1:1"], "category": 4},
        {"question": "Who replied?", "evidence": ["D1:2"], "category": 4},
    ]
    loaded = load_history("locomo", _locomo(tmp_path, qa=qa))
    assert [q.id for q in loaded.qa_items] == ["s1:qa0"]
    assert any("qa[1]" in s.reason and "answer" in s.reason for s in loaded.skipped)
    assert all(q.answer for q in loaded.qa_items)


def test_locomo_unparseable_session_date_is_an_error_or_reported(tmp_path):
    from memsteer_dspy.loaders import load_history

    path = _locomo(tmp_path, date="sometime in spring")
    with pytest.raises(InputError) as exc:
        load_history("locomo", path)
    assert exc.value.field == "conversation.session_1_date_time"
    loaded = load_history("locomo", path, on_error="skip")
    assert all(r.timestamp is None for r in loaded.history.records)
    assert any("session_1_date_time" in s.reason for s in loaded.skipped)


def test_locomo_null_text_is_an_error_not_the_string_none(tmp_path):
    from memsteer_dspy.loaders import load_history

    turns = [
        {"speaker": "Ann", "dia_id": "D1:1", "text": "Hello there."},
        {"speaker": "Bo", "dia_id": "D1:2", "text": None},
    ]
    path = _locomo(tmp_path, turns=turns)
    with pytest.raises(InputError) as exc:
        load_history("locomo", path)
    assert exc.value.field == "conversation.session_1[1].text"
    loaded = load_history("locomo", path, on_error="skip")
    assert [r.id for r in loaded.history.records] == ["D1:1"]
    assert not any("None" in r.text for r in loaded.history.records)
