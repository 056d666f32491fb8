"""LongMemEval (``longmemeval_s`` / ``_m`` / ``_oracle`` JSON of xiaowu0162/LongMemEval).

The file is a JSON list of instances::

    {"question_id", "question_type", "question", "answer", "question_date",
     "haystack_session_ids", "haystack_dates", "haystack_sessions", "answer_session_ids"}

``haystack_sessions[i]`` is session ``haystack_session_ids[i]``, dated ``haystack_dates[i]``
(``"2023/05/20 (Sat) 02:21"``): a list of ``{role, content}`` turns; the turns that hold the answer
carry ``has_answer: true``. Ids ending in ``_abs`` are abstention questions (the answer is not in
the history).

Every instance has its own haystack, so one instance is one user: ``user`` is the
``question_id`` (optional when the file holds a single instance). Each turn is one record, id
``<session_id>:<turn>`` (``turn`` from 1), kind ``conversation_turn``, thread = the session id,
author = the role, text ``User: ...`` / ``Assistant: ...``, dated by its session. The instance's
question is one QA item whose evidence is its ``has_answer`` turns; ``metadata`` keeps the
``answer_session_ids`` (for session-level recall, :func:`memsteer_dspy.evaluation.session_recall`),
whether it is an abstention question, and the raw ``question_date``.
:func:`iter_longmemeval` yields every instance in turn (``memsteer evaluate --all``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from memsteer_dspy.errors import InputError
from memsteer_dspy.loaders.base import Loaded, SkippedInput, UnresolvedEvidence, read_json_file
from memsteer_dspy.records import AnswerType, History, QAItem, Record, RecordKind

__all__ = [
    "instance_loaded",
    "iter_longmemeval",
    "load_longmemeval",
    "parse_longmemeval_date",
    "read_instances",
]

REQUIRED = ("question_id", "question", "answer", "haystack_session_ids", "haystack_sessions")
_WEEKDAY = re.compile(r"\s*\([A-Za-z]{3}\)\s*")


def parse_longmemeval_date(value: Any, *, file: Path, record: str, field: str) -> datetime | None:
    """``"2023/05/20 (Sat) 02:21"`` → ``datetime(2023, 5, 20, 2, 21)``; None for an empty value."""
    if value in (None, ""):
        return None
    text = _WEEKDAY.sub(" ", str(value)).strip()
    for fmt in ("%Y/%m/%d %H:%M", "%Y/%m/%d", "%Y-%m-%d %H:%M", "%Y-%m-%d"):
        try:
            return datetime.strptime(text, fmt)
        except ValueError:
            continue
    raise InputError(
        f"unreadable date {value!r}",
        file=file,
        record=record,
        field=field,
        hint="LongMemEval dates look like '2023/05/20 (Sat) 02:21'",
    )


def read_instances(path: str | Path) -> list[dict[str, Any]]:
    """The instances of a LongMemEval JSON file (a list; a single object is one instance)."""
    path = Path(path)
    data = read_json_file(path)
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise InputError("expected a JSON list of LongMemEval instances", file=path)
    for i, inst in enumerate(data):
        if not isinstance(inst, dict):
            raise InputError(
                f"instance {i} is a {type(inst).__name__}, not an object", file=path, field=f"[{i}]"
            )
        missing = [k for k in REQUIRED if k not in inst]
        if missing:
            raise InputError(
                f"instance {i} lacks {', '.join(missing)}",
                file=path,
                record=str(inst.get("question_id", i)),
                field=missing[0],
                hint="is this a longmemeval_s / _m / _oracle file?",
            )
    return data


def instance_loaded(inst: dict[str, Any], path: Path, on_error: str = "raise") -> Loaded:
    """One instance (an element of :func:`read_instances`) as a ``Loaded``."""
    qid = str(inst["question_id"])
    sessions, session_ids = inst["haystack_sessions"], inst["haystack_session_ids"]
    if not isinstance(sessions, list) or not isinstance(session_ids, list):
        raise InputError(
            "haystack_sessions and haystack_session_ids must be lists",
            file=path,
            record=qid,
            field="haystack_sessions",
        )
    dates = inst.get("haystack_dates") or [None] * len(session_ids)
    if not isinstance(dates, list):
        raise InputError(
            "haystack_dates must be a list", file=path, record=qid, field="haystack_dates"
        )
    if not (len(sessions) == len(session_ids) == len(dates)):
        raise InputError(
            f"{len(session_ids)} session ids, {len(sessions)} sessions and {len(dates)} dates: they must match",
            file=path,
            record=qid,
            field="haystack_session_ids",
        )
    skipped: list[SkippedInput] = []
    records: list[Record] = []
    evidence: list[str] = []
    session_of_turns: dict[str, str] = {}
    for s, (sid, turns, when) in enumerate(zip(session_ids, sessions, dates, strict=True)):
        sid = str(sid)
        ts = parse_longmemeval_date(when, file=path, record=qid, field=f"haystack_dates[{s}]")
        if not isinstance(turns, list):
            raise InputError(
                "session is not a list of turns",
                file=path,
                record=qid,
                field=f"haystack_sessions[{s}]",
            )
        for t, turn in enumerate(turns, start=1):
            where = f"haystack_sessions[{s}][{t - 1}]"
            if (
                not isinstance(turn, dict)
                or not isinstance(turn.get("content"), str)
                or not turn.get("role")
            ):
                if on_error == "skip":
                    skipped.append(
                        SkippedInput(str(path), None, f"{qid} {where}: turn lacks role or content")
                    )
                    continue
                raise InputError(
                    "turn lacks 'role' or 'content'", file=path, record=qid, field=where
                )
            rid = f"{sid}:{t}"
            role = str(turn["role"])
            records.append(
                Record(
                    id=rid,
                    kind=RecordKind.CONVERSATION_TURN,
                    text=f"{role.capitalize()}: {turn['content']}",
                    timestamp=ts,
                    author=role,
                    thread_id=sid,
                    position=t,
                    metadata={
                        "source": f"{path}:{qid}.{where}",
                        "session_id": sid,
                        "session_date": when,
                        "has_answer": bool(turn.get("has_answer")),
                    },
                )
            )
            session_of_turns[rid] = sid
            if turn.get("has_answer"):
                evidence.append(rid)
    history = History(qid, records, source=str(path))

    answer = inst["answer"]
    answer_type = (
        AnswerType.NUMBER
        if isinstance(answer, int | float) and not isinstance(answer, bool)
        else AnswerType.TEXT
    )
    qdate = parse_longmemeval_date(
        inst.get("question_date"), file=path, record=qid, field="question_date"
    )
    given = inst.get("answer_session_ids") or []
    answer_sessions = [str(a) for a in (given if isinstance(given, list) else [given])]
    qtype = inst.get("question_type")
    if qtype is not None and not isinstance(qtype, str | int | float):
        raise InputError(
            f"question_type is a {type(qtype).__name__}, not a string",
            file=path,
            record=qid,
            field="question_type",
        )
    unresolved = [
        UnresolvedEvidence(qid, a, "answer session not in the haystack")
        for a in answer_sessions
        if a not in set(map(str, session_ids))
    ]
    item = QAItem(
        id=qid,
        question=str(inst["question"]),
        answer=str(answer),
        answer_type=answer_type,
        evidence_ids=evidence,
        question_date=qdate.date() if qdate else None,
        question_type=None if qtype is None else str(qtype),
        source="official",
        metadata={
            "answer_session_ids": answer_sessions,
            "abstention": qid.endswith("_abs"),
            "question_date": inst.get("question_date"),
            "sessions": len(session_ids),
        },
    )
    return Loaded(history, [item], unresolved, skipped)


def iter_longmemeval(path: str | Path, *, on_error: str = "raise") -> Iterator[Loaded]:
    """Every instance of the file as its own ``Loaded`` (one history, one QA item), in file order."""
    path = Path(path)
    for inst in read_instances(path):
        yield instance_loaded(inst, path, on_error)


def load_longmemeval(
    path: str | Path, *, user: str | None = None, on_error: str = "raise"
) -> Loaded:
    """Load one LongMemEval instance (``user`` = its ``question_id``) as a History with its QA item."""
    path = Path(path)
    instances = read_instances(path)
    ids = [str(i["question_id"]) for i in instances]
    shown = ", ".join(ids[:8]) + (f", ... ({len(ids)} in all)" if len(ids) > 8 else "")
    if user is None:
        if len(instances) != 1:
            raise InputError(
                f"the file holds {len(instances)} instances; choose one with --user <question_id>",
                file=path,
                field="--user",
                hint=f"available: {shown}; `memsteer evaluate --all` evaluates every instance",
            )
        return instance_loaded(instances[0], path, on_error)
    if user not in ids:
        raise InputError(
            f"no instance {user!r}", file=path, field="question_id", hint=f"available: {shown}"
        )
    return instance_loaded(instances[ids.index(user)], path, on_error)
