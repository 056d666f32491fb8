"""The native history format: JSON Lines, one record per line.

Each line is one :class:`~memsteer_dspy.records.Record` object::

    {"id": "chat-2024-03-02:4", "kind": "conversation_turn", "text": "User: ...\\nAssistant: ...",
     "timestamp": "2024-03-02T09:15:00", "author": "Maya", "thread_id": "chat-2024-03-02",
     "position": 4, "references": [], "metadata": {"topic": "travel"}}

Only ``id``, ``kind`` and ``text`` are required. ``path`` may be a ``.jsonl`` file or a folder
holding ``records.jsonl`` and, optionally, ``qa.jsonl`` (one :class:`QAItem` per line).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memsteer_dspy.errors import DuplicateRecordError, InputError
from memsteer_dspy.loaders.base import Loaded, SkippedInput, UnresolvedEvidence
from memsteer_dspy.records import History, QAItem, Record, check_record_dict


def iter_json_lines(
    path: Path, on_error: str, skipped: list[SkippedInput]
) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, object)`` for each non-blank line of a JSONL file, streaming (one
    line in memory at a time, whatever the file's size).

    A line that is not UTF-8 or not valid JSON raises an :class:`InputError` naming ``file:line``
    (or, with ``on_error='skip'``, is recorded in ``skipped`` and left out).
    """
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below; a generator cannot use `with` across yields cleanly
    except FileNotFoundError:
        raise InputError("file not found", file=path) from None
    except IsADirectoryError:
        raise InputError("expected a file, found a folder", file=path) from None
    with fh:
        for n, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                reason = f"not UTF-8 text (byte {exc.start} of the line: {exc.reason})"
                if on_error == "skip":
                    skipped.append(SkippedInput(str(path), n, reason))
                    continue
                raise InputError(
                    reason,
                    file=path,
                    line=n,
                    hint="re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8), or use --on-error skip",
                ) from None
            if not line.strip():
                continue
            try:
                yield n, json.loads(line)
            except json.JSONDecodeError as exc:
                # json's own messages may end in "at" ("Unterminated string starting at")
                reason = f"invalid JSON: {exc.msg.removesuffix(' at')} at column {exc.colno}"
                if on_error == "skip":
                    skipped.append(SkippedInput(str(path), n, reason))
                    continue
                raise InputError(
                    reason,
                    file=path,
                    line=n,
                    hint="each line must be one JSON object; use --on-error skip to skip bad lines",
                ) from None


def read_records(
    path: Path, *, on_error: str = "raise", skipped: list[SkippedInput]
) -> list[Record]:
    """Records of a JSONL file. With ``on_error='skip'`` every per-line problem (not UTF-8, not
    JSON, not a valid record, a record id already seen) is recorded in ``skipped`` and left out;
    otherwise it raises naming the line (a duplicate id also names the first line)."""
    records = []
    first_line: dict[str, int] = {}
    for n, obj in iter_json_lines(path, on_error, skipped):
        try:
            record = check_record_dict(obj, file=str(path), line=n)
        except InputError as exc:
            if on_error == "skip":
                skipped.append(
                    SkippedInput(
                        str(path), n, exc.message + (f" (field {exc.field!r})" if exc.field else "")
                    )
                )
                continue
            raise
        if record.id in first_line:
            reason = f"duplicate record id {record.id!r} (first at {path}:{first_line[record.id]}, again at {path}:{n})"
            if on_error == "skip":
                skipped.append(SkippedInput(str(path), n, reason))
                continue
            raise DuplicateRecordError(
                reason,
                file=path,
                line=n,
                record=record.id,
                hint="record ids must be unique within one history; "
                "use --on-error skip to keep the first",
            )
        first_line[record.id] = n
        records.append(
            record.model_copy(update={"metadata": {**record.metadata, "source": f"{path}:{n}"}})
        )
    return records


# Top-level keys that QA files written by this project carry beside the QAItem fields: a
# generated item's facts (``memsteer generate`` writes them at the top level), and its plan, audit
# and provenance (kept in ``metadata``; accepted at the top level too). They are kept in metadata.
QA_EXTRA_FIELDS = ("facts", "plan", "audit", "provenance")


def read_qa_items(
    path: str | Path, *, on_error: str = "raise", skipped: list[SkippedInput] | None = None
) -> list[QAItem]:
    """The one reader of QA files: official ``qa.jsonl``, the ``train.jsonl`` / ``val.jsonl``
    ``memsteer generate`` writes, a ``--qa`` or ``--test`` file. One QAItem object a line, read
    as the records are (:func:`iter_json_lines`): a problem raises an :class:`InputError` naming
    the file, line, field and item id, or with ``on_error='skip'`` is recorded in ``skipped`` and
    the line left out.

    The keys of :data:`QA_EXTRA_FIELDS` are moved into ``metadata``; any other key that is not a
    QAItem field is an error naming it (a misspelt ``evidence_id`` would otherwise leave the item
    without evidence). A QA id already seen is an error naming both lines (skip keeps the first).
    """
    path = Path(path)
    skipped = skipped if skipped is not None else []
    fields = set(QAItem.model_fields)
    items: list[QAItem] = []
    first_line: dict[str, int] = {}
    for n, obj in iter_json_lines(path, on_error, skipped):
        try:
            item = _qa_item(obj, path, n, fields)
            if item.id in first_line:
                raise InputError(
                    f"duplicate QA id {item.id!r} (first at {path}:{first_line[item.id]})",
                    file=path,
                    line=n,
                    record=item.id,
                    hint="QA ids must be unique within one file",
                )
        except InputError as exc:
            if on_error == "skip":
                where = f" (field {exc.field!r})" if exc.field else ""
                skipped.append(SkippedInput(str(path), n, exc.message + where))
                continue
            raise
        first_line[item.id] = n
        items.append(item)
    return items


def _qa_item(obj: Any, path: Path, n: int, fields: set[str]) -> QAItem:
    if not isinstance(obj, dict):
        raise InputError(
            f"expected a JSON object, got {type(obj).__name__}",
            file=path,
            line=n,
            hint="each line must be one QA item object",
        )
    qa_id = obj.get("id") if isinstance(obj.get("id"), str) else None
    unknown = [k for k in obj if k not in fields and k not in QA_EXTRA_FIELDS]
    if unknown:
        raise InputError(
            "not a QA item field",
            file=path,
            line=n,
            field=str(unknown[0]),
            record=qa_id,
            hint=f"a QA line holds {', '.join(QAItem.model_fields)} (and {', '.join(QA_EXTRA_FIELDS)}, "
            "kept in metadata); put anything else inside metadata",
        )
    core = {k: v for k, v in obj.items() if k in fields}
    extra = {k: obj[k] for k in QA_EXTRA_FIELDS if k in obj}
    if extra:
        meta = core.get("metadata")
        if meta is not None and not isinstance(meta, dict):
            raise InputError(
                "metadata must be a JSON object", file=path, line=n, field="metadata", record=qa_id
            )
        core["metadata"] = {**extra, **(meta or {})}
    try:
        return QAItem.model_validate(core)
    except Exception as exc:  # pydantic.ValidationError
        errs = exc.errors() if hasattr(exc, "errors") else []
        err = errs[0] if errs else {"msg": str(exc), "loc": ()}
        field = ".".join(str(p) for p in err.get("loc", ())) or None
        raise InputError(
            err["msg"],
            file=path,
            line=n,
            field=field,
            record=qa_id,
            hint="a QA line needs id, question and answer (see QAItem; `memsteer generate` writes them)",
        ) from None


def load_jsonl(path: str | Path, *, user: str | None = None, on_error: str = "raise") -> Loaded:
    """Load a native JSONL history (a file, or a folder with records.jsonl [+ qa.jsonl])."""
    path = Path(path)
    qa_path = None
    if path.is_dir():
        records_path = path / "records.jsonl"
        if not records_path.exists():
            raise InputError(
                "folder has no records.jsonl",
                file=path,
                hint="point --path at a .jsonl file, or at a folder holding records.jsonl (and qa.jsonl)",
            )
        qa_path = path / "qa.jsonl" if (path / "qa.jsonl").exists() else None
    else:
        records_path = path
    skipped: list[SkippedInput] = []
    records = read_records(records_path, on_error=on_error, skipped=skipped)
    user = user or (path.name if path.is_dir() else path.stem)
    history = History(user, records, source=str(records_path))
    qa = read_qa_items(qa_path, on_error=on_error, skipped=skipped) if qa_path else []
    unresolved = [
        UnresolvedEvidence(q.id, e, "no record with this id")
        for q in qa
        for e in q.evidence_ids
        if e not in history
    ]
    return Loaded(history, qa, unresolved, skipped)
