"""What every export shares: a record as timestamped text, and QA items with their split."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from memsteer_dspy.errors import InputError
from memsteer_dspy.records import History, QAItem, Record


def record_raw_text(record: Record) -> str:
    """A record as one self-contained text: ``[2024-03-02 09:15] (email, from Ana, "Trip moved")``
    (``[2024-03-02]`` for a record dated without a time)
    then the record's text, so an optimizer that ingests raw text keeps the date, kind, author
    and title the memory designs here index."""
    head = []
    ts = record.timestamp
    if ts is not None:  # a date-only source (midnight) is not given a time it never had
        midnight = (ts.hour, ts.minute, ts.second) == (0, 0, 0)
        head.append(
            f"[{ts.date().isoformat() if midnight else ts.isoformat(sep=' ', timespec='minutes')}]"
        )
    details = [record.kind]
    if record.author:
        details.append(f"from {record.author}")
    if record.title:
        details.append(json.dumps(record.title, ensure_ascii=False))
    head.append(f"({', '.join(details)})")
    return " ".join(head) + "\n" + record.text


@dataclass(frozen=True)
class ExportItem:
    """A QA item and the split it came from (``train`` / ``val`` of the supervision, or
    ``official``)."""

    item: QAItem
    split: str

    @property
    def category(self) -> str:
        return self.item.question_type or str(self.item.answer_type)


def qa_export_items(train: list[QAItem], val: list[QAItem]) -> list[ExportItem]:
    """The supervision's items in order, train first, each tagged with its split."""
    return [ExportItem(q, "train") for q in train] + [ExportItem(q, "val") for q in val]


EXPORT_MARKER = "export.json"


def check_export_folder(out: Path) -> None:
    """Refuse to export into a file, or into a non-empty folder that is not an earlier export
    (it has no ``export.json``): the export replaces its own files (``records.jsonl``,
    ``README.md``, ...), which in another folder would be the user's."""
    if out.exists() and not out.is_dir():
        raise InputError(
            "the output folder is a file",
            file=out,
            field="--out",
            hint="pass an --out folder that does not exist yet",
        )
    if out.is_dir() and not (out / EXPORT_MARKER).is_file():
        names = sorted(p.name for p in out.iterdir())
        if names:
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            raise InputError(
                f"the folder is not an earlier export (no {EXPORT_MARKER}) and holds {shown}; an "
                "export replaces its files, so nothing was written",
                file=out,
                field="--out",
                hint="pass an --out folder that does not exist yet, or an earlier export's folder",
            )


def unresolved_evidence(history: History, items: list[ExportItem]) -> list[dict[str, str]]:
    """Evidence ids of the exported items that are no record of ``history``."""
    return [
        {"qa_id": e.item.id, "evidence_id": rid}
        for e in items
        for rid in e.item.evidence_ids
        if rid not in history
    ]


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def jsonl(rows) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
