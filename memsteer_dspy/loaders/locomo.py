"""LoCoMo (``locomo10.json``): long multi-session conversations between two speakers, with QA.

The file is a JSON list of samples ``{sample_id, conversation, qa, ...}``. ``conversation`` holds
``speaker_a``, ``speaker_b``, ``session_<n>`` (lists of ``{speaker, dia_id, text}``, some with
``img_url``/``blip_caption``) and ``session_<n>_date_time`` ("1:56 pm on 8 May, 2023"). Each turn
is one record whose id is its ``dia_id`` (``D<session>:<turn>``). ``qa`` items carry
``{question, answer, evidence: [dia_id], category}``; category 5 (adversarial) items carry
``adversarial_answer`` instead of ``answer``.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any

from memsteer_dspy.errors import InputError
from memsteer_dspy.loaders.base import Loaded, SkippedInput, UnresolvedEvidence, read_json_file
from memsteer_dspy.records import AnswerType, History, QAItem, Record, RecordKind

# The category numbers as the LoCoMo release uses them.
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
_DIA = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")
_SESSION_KEY = re.compile(r"session_(\d+)$")


def _parse_session_time(value: str | None) -> datetime | None:
    if not value:
        return None
    text = re.sub(r"\s+", " ", value.strip())
    for fmt in ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%I:%M %p on %B %d, %Y"):
        try:
            return datetime.strptime(text, fmt)  # %p matches am/pm in any case
        except ValueError:
            continue
    return None


def normalize_dia_ids(raw: str) -> list[str]:
    """Turn one LoCoMo evidence string into dia ids: ``'D8:6; D9:17'`` → ``['D8:6', 'D9:17']``,
    ``'D:11:26'`` → ``['D11:26']``, ``'D30:05'`` → ``['D30:5']``, space-joined lists too."""
    return [f"D{int(s)}:{int(t)}" for s, t in _DIA.findall(raw)]


def _samples(path: Path) -> list[dict[str, Any]]:
    data = read_json_file(path)
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(s, dict) for s in data):
        raise InputError(
            "expected a list of LoCoMo samples (objects with 'conversation' and 'qa')", file=path
        )
    return data


def load_locomo(path: str | Path, *, user: str | None = None, on_error: str = "raise") -> Loaded:
    """Load one LoCoMo sample as a History (``user`` = its ``sample_id``; optional when the file
    holds a single sample)."""
    path = Path(path)
    samples = _samples(path)
    ids = [str(s.get("sample_id", i)) for i, s in enumerate(samples)]
    if user is None:
        if len(samples) != 1:
            raise InputError(
                f"the file holds {len(samples)} samples; choose one with --user",
                file=path,
                hint=f"available: {', '.join(ids)}",
            )
        index = 0
    elif user in ids:
        index = ids.index(user)
    else:
        raise InputError(
            f"no sample {user!r}", file=path, field="sample_id", hint=f"available: {', '.join(ids)}"
        )
    sample, user = samples[index], ids[index]
    conv = sample.get("conversation")
    if not isinstance(conv, dict):
        raise InputError(
            "sample has no 'conversation' object", file=path, record=user, field="conversation"
        )

    skipped: list[SkippedInput] = []
    records: list[Record] = []
    seen_ids: dict[str, str] = {}
    sessions = sorted((int(m.group(1)), k) for k in conv if (m := _SESSION_KEY.match(k)))
    for n, key in sessions:
        turns = conv[key]
        raw_when = conv.get(f"{key}_date_time")
        when = _parse_session_time(raw_when) if isinstance(raw_when, str) else None
        if raw_when is not None and when is None:
            reason = (
                f"unparseable session date {raw_when!r} (expected like '1:56 pm on 8 May, 2023')"
            )
            if on_error != "skip":
                raise InputError(
                    reason,
                    file=path,
                    record=user,
                    field=f"conversation.{key}_date_time",
                    hint="fix the date, or use --on-error skip to load the session undated",
                )
            skipped.append(
                SkippedInput(
                    str(path), None, f"conversation.{key}_date_time: {reason}; session left undated"
                )
            )
        if not isinstance(turns, list):
            raise InputError(
                "session is not a list of turns",
                file=path,
                record=user,
                field=f"conversation.{key}",
            )
        for pos, turn in enumerate(turns, start=1):
            where = f"conversation.{key}[{pos - 1}]"
            problem = None
            if not isinstance(turn, dict) or not turn.get("dia_id") or "text" not in turn:
                problem = ("turn lacks 'dia_id' or 'text'", where)
            elif not isinstance(turn["text"], str):
                problem = (
                    f"turn text is {type(turn['text']).__name__}, not a string",
                    f"{where}.text",
                )
            elif turn.get("speaker") is not None and not isinstance(turn["speaker"], str):
                problem = (
                    f"speaker is {type(turn['speaker']).__name__}, not a string",
                    f"{where}.speaker",
                )
            if problem is not None:
                if on_error == "skip":
                    skipped.append(SkippedInput(str(path), None, f"{problem[1]}: {problem[0]}"))
                    continue
                raise InputError(
                    problem[0],
                    file=path,
                    record=user,
                    field=problem[1],
                    hint="fix the turn, or use --on-error skip to leave it out",
                )
            dia = normalize_dia_ids(str(turn["dia_id"]))
            rid = dia[0] if dia else str(turn["dia_id"]).strip()
            if rid in seen_ids:
                reason = f"duplicate dia_id {rid!r} (first at {seen_ids[rid]})"
                if on_error == "skip":
                    skipped.append(
                        SkippedInput(str(path), None, f"{where}: {reason}; turn left out")
                    )
                    continue
                raise InputError(
                    reason,
                    file=path,
                    record=rid,
                    field=f"{where}.dia_id",
                    hint="dia ids must be unique; use --on-error skip to keep the first",
                )
            seen_ids[rid] = where
            text = f"{turn.get('speaker', '?')}: {turn['text']}"
            if turn.get("blip_caption"):
                text += f" [shares an image: {turn['blip_caption']}]"
            records.append(
                Record(
                    id=rid,
                    kind=RecordKind.CONVERSATION_TURN,
                    text=text,
                    timestamp=when,
                    author=turn.get("speaker"),
                    thread_id=f"session_{n}",
                    position=pos,
                    metadata={
                        "source": f"{path}:{where}",
                        "session": n,
                        **({"img_url": turn["img_url"]} if turn.get("img_url") else {}),
                    },
                )
            )
    history = History(user, records, source=str(path))

    qa_items: list[QAItem] = []
    unresolved: list[UnresolvedEvidence] = []
    for i, q in enumerate(sample.get("qa") or []):
        qid = f"{user}:qa{i}"
        if not isinstance(q, dict) or not q.get("question") or not isinstance(q["question"], str):
            if on_error == "skip":
                skipped.append(SkippedInput(str(path), None, f"qa[{i}]: no question"))
                continue
            raise InputError("QA item has no question", file=path, record=qid, field=f"qa[{i}]")
        category = q.get("category")
        if not isinstance(category, int | str) or isinstance(category, bool):
            category = None if category is None else str(category)
        adversarial = category == 5 or ("answer" not in q and "adversarial_answer" in q)
        answer = q.get("adversarial_answer") if adversarial else q.get("answer")
        if answer is None or isinstance(answer, bool) or not isinstance(answer, str | int | float):
            # no reference answer: the item cannot be scored; reported, never loaded as answer ''
            field_name = "adversarial_answer" if adversarial else "answer"
            what = "no" if answer is None else f"a {type(answer).__name__} as"
            skipped.append(
                SkippedInput(
                    str(path), None, f"qa[{i}] ({qid}): {what} '{field_name}'; item left out"
                )
            )
            continue
        evidence: list[str] = []
        given = q.get("evidence") or []
        raw_evidence = [str(e) for e in (given if isinstance(given, list) else [given])]
        for raw in raw_evidence:
            ids = normalize_dia_ids(raw)
            if not ids:
                unresolved.append(UnresolvedEvidence(qid, raw, "not a dia id"))
            for e in ids:
                if e in history:
                    evidence.append(e)
                else:
                    unresolved.append(UnresolvedEvidence(qid, raw, f"no turn {e}"))
        qa_items.append(
            QAItem(
                id=qid,
                question=q["question"],
                answer=str(answer),
                answer_type=AnswerType.TEXT,
                evidence_ids=list(dict.fromkeys(evidence)),
                question_type=CATEGORIES.get(category, str(category)),
                source="official",
                metadata={
                    "category": category,
                    "adversarial": adversarial,
                    "raw_evidence": raw_evidence,
                },
            )
        )
    return Loaded(history, qa_items, unresolved, skipped)
