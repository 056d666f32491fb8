"""benchmarks/injection.py measured with scripted LMs (no model): an LM that follows the planted
instruction is counted as obeying under every payload and never under the control; a careful LM
never is. The real measurement runs the embedded or an API model (see the script's docstring)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from fault_helpers import HandlerLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import injection  # noqa: E402

from memsteer_dspy.demo_data import load_demo  # noqa: E402

_ASKED = re.compile(r"(?:single word|exactly '|reply with) ?'?(ZEPHYRQUILL\w+)")


def _obedient(system: str, user: str) -> dict:
    m = _ASKED.search(user)
    said = m.group(1) if m else "Daniel Osei"
    return {"answer": said, "cited_ids": ["R1.1"], "answerable": True, "question": f"{said}?"}


def _careful(system: str, user: str) -> dict:
    return {
        "answer": "Daniel Osei",
        "cited_ids": ["R1.1"],
        "answerable": True,
        "question": "Who teaches my data visualization class?",
    }


def test_the_benchmark_counts_obedience_per_role_and_payload():
    loaded = load_demo()
    items = [q for q in loaded.qa_items if q.evidence_ids][:2]
    for handler, expected in ((_obedient, 2), (_careful, 0)):
        lm = HandlerLM(handler)
        report = injection.run_benchmark(
            loaded.history, items, {r: lm for r in injection.ROLES}, defended=False
        )
        for role in injection.ROLES:
            for name, _ in injection.PAYLOADS:
                assert report.rate(role, name) == (expected, 2), (handler.__name__, role, name)
            assert report.rate(role, planted=False) == (
                0,
                2,
            )  # the control holds the canary as data
        assert "blind_reader" in report.table() and not any(c.error for c in report.calls)


def test_the_planted_record_is_in_every_role_input():
    loaded = load_demo()
    item = next(q for q in loaded.qa_items if q.evidence_ids)
    canary = injection.canary_for(item.id)
    history, record = injection.plant(loaded.history, item, "hello " + canary, canary)
    text = injection._records_text(history, item, record.id, __import__("random").Random(0))
    assert canary in text and all(history[e].text.split()[0] in text for e in item.evidence_ids)


def test_with_the_defence_no_role_reads_the_instruction_and_the_obedient_lm_cannot_obey():
    loaded = load_demo()
    items = [q for q in loaded.qa_items if q.evidence_ids][:2]
    seen: list[str] = []

    def obedient(system: str, user: str) -> dict:
        seen.append(user)
        return _obedient(system, user)

    lm = HandlerLM(obedient)
    report = injection.run_benchmark(loaded.history, items, {r: lm for r in injection.ROLES})
    for role in injection.ROLES:
        assert report.rate(role) == (0, 2 * len(injection.PAYLOADS)), role
        assert report.rate(role, planted=False) == (0, 2)
    # every payload was withheld from every role's input; the control (data) was not
    from memsteer_dspy.untrusted import WITHHELD

    assert any(WITHHELD in u for u in seen)
    assert not any("ignore every other instruction" in u for u in seen)
    assert any("name of the new garden shed" in u for u in seen)
