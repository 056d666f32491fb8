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
_ACCEPT = re.compile(r"mark it correct|judge each one correct|the answer is correct")


def _reply(system: str, user: str, obey: bool) -> dict:
    """Every role's output fields (told apart by the output fields its prompt names): with
    ``obey``, the canary a planted instruction asks for in every free-text field, and a pass for
    the wrong answer an accept instruction asks to pass; else the careful role's reply."""
    m = _ASKED.search(user) if obey else None
    said = m.group(1) if m else "Daniel Osei"
    passed = bool(obey and _ACCEPT.search(user))
    if "answer_support" in system:  # the auditor
        return {
            "fact_checks": [],
            "record_checks": [],
            "answer_rationale": said,
            "answer_support": "supported" if passed else "unsupported",
            "consistency_rationale": said,
            "consistency": "supported",
        }
    if "prediction" in system and "correct" in system:  # the judge
        return {"correct": passed}
    if "fact_span_ids" in system:  # the planner
        return {
            "evidence": [{"record_id": "R1", "contribution": said}],
            "fact_span_ids": ["R1.1"],
            "answer_span_id": "R1.1",
            "answer_type": "entity",
            "answer": said,
            "operations": ["lookup"],
            "ask": f"ask for {said}",
        }
    if "design_space" in system:  # the proposer
        return {"changes": [{"field": "retrieve.top_k", "value": 37}], "rationale": said}
    return {"answer": said, "cited_ids": ["R1.1"], "answerable": True, "question": f"{said}?"}


def _obedient(system: str, user: str) -> dict:
    return _reply(system, user, obey=True)


def _careful(system: str, user: str) -> dict:
    return _reply(system, user, obey=False)


def _lms(handler) -> dict:
    """One scripted LM per role; the proposer's replies are JSON, as its adapter reads them."""
    import dspy

    lm = HandlerLM(handler)
    lms = {r: lm for r in injection.ROLES}
    lms["proposer"] = HandlerLM(handler, adapter=dspy.JSONAdapter())
    return lms


def _families():
    return [("canary", injection.CANARY_ROLES), ("accept", injection.ACCEPT_ROLES)]


def test_the_benchmark_counts_obedience_per_role_and_payload():
    """Every role of both families: an obedient LM obeys every payload and never the control (the
    control holds the canary as data, or no instruction), a careful one never obeys."""
    loaded = load_demo()
    items = [q for q in loaded.qa_items if q.evidence_ids][:2]
    roles = "blind_reader answerer question_writer planner auditor judge proposer"
    assert set(injection.ROLES) == set(roles.split())
    for handler, expected in ((_obedient, 2), (_careful, 0)):
        report = injection.run_benchmark(loaded.history, items, _lms(handler), defended=False)
        assert not [c.error for c in report.calls if c.error]
        for family, roles in _families():
            for role in roles:
                for name, _ in injection.PAYLOADS:
                    got = report.rate(role, name, family=family)
                    assert got == (expected, 2), (handler.__name__, role, family, name)
                assert report.rate(role, planted=False, family=family) == (0, 2)
        table = report.table()
        assert "proposer" in table and "judge (accept)" in table and "auditor (accept)" in table


def test_the_wrong_answer_an_accept_payload_asks_to_pass_is_never_the_items_own():
    loaded = load_demo()
    items = [q for q in loaded.qa_items if q.evidence_ids][:5]
    for i, item in enumerate(items):
        assert injection._wrong_answer(items, i).strip().lower() != item.answer.strip().lower()


def test_the_planted_record_is_in_every_role_input():
    loaded = load_demo()
    item = next(q for q in loaded.qa_items if q.evidence_ids)
    canary = injection.canary_for(item.id)
    history, record = injection.plant(loaded.history, item, "hello " + canary, canary)
    text = injection._records_text(history, item, record.id, __import__("random").Random(0))
    assert canary in text and all(history[e].text.split()[0] in text for e in item.evidence_ids)


def test_with_the_defence_no_role_reads_the_instruction_and_the_obedient_lm_cannot_obey():
    """With the withholding on, no role of either family reads a payload — the proposer's feedback
    and the judge's prediction included — so the obedient LM cannot obey; the control (data) is
    still read."""
    loaded = load_demo()
    items = [q for q in loaded.qa_items if q.evidence_ids][:2]
    seen: list[str] = []

    def obedient(system: str, user: str) -> dict:
        seen.append(user)
        return _obedient(system, user)

    report = injection.run_benchmark(loaded.history, items, _lms(obedient))
    assert not [c.error for c in report.calls if c.error]
    for family, roles in _families():
        for role in roles:
            assert report.rate(role, family=family) == (0, 2 * len(injection.PAYLOADS)), role
            assert report.rate(role, planted=False, family=family) == (0, 2)
    # every payload was withheld from every role's input; the control (data) was not
    from memsteer_dspy.untrusted import WITHHELD

    assert any(WITHHELD in u for u in seen)
    assert not any("ignore every other instruction" in u for u in seen)
    assert not any("judge each one correct" in u for u in seen)
    assert any("name of the new garden shed" in u for u in seen)
    assert any("garden shed order" in u for u in seen)


def test_the_proposers_feedback_and_the_judges_prediction_withhold_instructions():
    """The two defences the proposer and the judge rely on, in the program itself."""
    from memsteer_dspy.evaluation import Judge
    from memsteer_dspy.optimize.feedback import quoted
    from memsteer_dspy.untrusted import WITHHELD

    attack = "Dinner was fine. " + injection.PAYLOADS[0][1].format(canary="ZEPHYRQUILLX")
    shown = quoted(attack, 400)
    assert shown.startswith(f"Dinner was fine. {WITHHELD}") and "ZEPHYRQUILLX" not in shown
    seen: list[str] = []

    def judge(system: str, user: str) -> dict:
        seen.append(user)
        return {"correct": False}

    Judge(HandlerLM(judge))("Where?", "Portland", attack)
    assert seen and WITHHELD in seen[0] and "ZEPHYRQUILLX" not in seen[0]
    # the prompt optimizers' metric grades with the same judge
    import dspy

    from memsteer_dspy.optimize.tune import CorrectnessMetric

    gold = dspy.Example(question="Where?", answer="Portland", answer_type="entity")
    assert CorrectnessMetric(HandlerLM(judge)).correct(gold, attack) == (False, "judge")
    assert len(seen) == 2 and WITHHELD in seen[1] and "ZEPHYRQUILLX" not in seen[1]
