"""RHELM conversations: one record a turn of ``conversations/<Persona>/conversation_YYYY_MM_DD.json``.

Id ``<session date>:<turn>``, kind ``conversation_turn``, thread ``conversation:<date>``; the
format is described in :mod:`memsteer_dspy.loaders.rhelm`.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from memsteer_dspy.errors import InputError
from memsteer_dspy.loaders.rhelm.reading import _display_name, _Errors, _read_text, _rel
from memsteer_dspy.records import Record, RecordKind

_CONVERSATION_FILE = re.compile(r"conversation_(\d{4})_(\d{2})_(\d{2})\.json$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _conversation_turns(path: Path, data: Path, persona: str, errors: _Errors) -> list[Record]:
    """The turns of one session file as records (an unusable file or turn goes to ``errors``)."""
    rel = _rel(path, data)
    try:
        text = _read_text(path)
    except InputError as exc:
        errors(exc)
        return []
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        errors(
            InputError(
                f"invalid JSON: {exc.msg}",
                file=path,
                line=exc.lineno,
                hint="fix the JSON, or load with on_error='skip' to leave the session out",
            )
        )
        return []
    if not isinstance(obj, dict):
        errors(
            InputError(
                f"expected a JSON object, got {type(obj).__name__}",
                file=path,
                hint="a session file is {character, date, conversation: [turns]}",
            )
        )
        return []
    session = obj.get("date")
    if not isinstance(session, str) or not _DATE.match(session.strip()):
        errors(
            InputError(
                f"missing or malformed session date {session!r}",
                file=path,
                field="date",
                hint="a session needs 'date': 'YYYY-MM-DD'",
            )
        )
        return []
    session = session.strip()
    turns = obj.get("conversation")
    if not isinstance(turns, list):
        errors(
            InputError(
                "missing 'conversation' list of turns",
                file=path,
                field="conversation",
                hint="a session file is {character, date, conversation: [turns]}",
            )
        )
        return []
    author = _display_name(str(obj.get("character") or persona))
    records: list[Record] = []
    for i, turn in enumerate(turns):
        where = f"conversation[{i}]"
        if not isinstance(turn, dict):
            errors(
                InputError(
                    f"turn is a {type(turn).__name__}, not an object", file=path, field=where
                )
            )
            continue
        missing = [k for k in ("turn", "timestamp", "user", "assistant") if k not in turn]
        if missing:
            errors(
                InputError(
                    f"turn lacks {', '.join(repr(m) for m in missing)}",
                    file=path,
                    field=f"{where}.{missing[0]}",
                    hint="each turn needs turn, timestamp, user and assistant",
                )
            )
            continue
        try:
            number = int(turn["turn"])
        except (TypeError, ValueError):
            errors(
                InputError(
                    f"turn number {turn['turn']!r} is not an integer",
                    file=path,
                    field=f"{where}.turn",
                )
            )
            continue
        try:
            timestamp = datetime.fromisoformat(str(turn["timestamp"]))
        except ValueError:
            errors(
                InputError(
                    f"timestamp {turn['timestamp']!r} is not ISO 8601",
                    file=path,
                    field=f"{where}.timestamp",
                    hint="write it as YYYY-MM-DDTHH:MM:SS",
                )
            )
            continue
        metadata: dict[str, Any] = {"source": rel, "session_date": session, "turn": number}
        if turn.get("message_type"):
            metadata["message_type"] = turn["message_type"]
        if turn.get("research_document"):
            metadata["research_document"] = str(turn["research_document"])
        records.append(
            Record(
                id=f"{session}:{number}",
                kind=RecordKind.CONVERSATION_TURN,
                text=f"User: {str(turn['user']).strip()}\nAssistant: {str(turn['assistant']).strip()}",
                timestamp=timestamp,
                author=author,
                thread_id=f"conversation:{session}",
                position=number,
                metadata=metadata,
            )
        )
    return records
