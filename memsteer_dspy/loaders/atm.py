"""ATM-Bench, the text side (JingbiaoMei/ATM-Bench, ``docs/data.md``).

``path`` is a folder laid out like the ATM-Bench repository (any depth below it is searched):

* QA files ``atm-bench*.json`` — a JSON array, or ``{"qas": [...]}``, of
  ``{id, question, answer, evidence_ids}`` (NIAH pool files add ``niah_evidence_ids``, kept in
  metadata). ``user`` picks the file by stem (``atm-bench``, ``atm-bench-hard``); default
  ``atm-bench``, or the only one. QA files under a ``niah`` folder are not offered.
* ``emails.json`` — a list of ``{id, timestamp, short_summary, detail}``: one ``email`` record
  each, id = its ``id``, text ``Subject: <short_summary>`` then the detail.
* ``batch_results.json`` (image and video processor outputs) — entries with ``image_path`` or
  ``video_path``, ``timestamp``, ``location_name``, ``short_caption``, ``caption``, ``ocr_text``,
  ``tags``: one ``image`` / ``video`` record each whose id is the media file's stem (ATM-Bench's
  evidence id), text = caption, OCR text, tags and place. The file may be a list or an object
  keyed by path.

Evidence ids that name no loaded record are reported in ``Loaded.unresolved``. Answers that list
two or more memory ids are typed ``list`` so QS gives ATM-Bench's Jaccard partial credit
(:func:`memsteer_dspy.normalize.list_jaccard`).
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any

from memsteer_dspy.errors import InputError
from memsteer_dspy.loaders.base import Loaded, SkippedInput, UnresolvedEvidence, read_json_file
from memsteer_dspy.records import AnswerType, History, QAItem, Record, RecordKind, utc_naive

__all__ = ["MEMORY_ID", "atm_qa_files", "load_atm", "parse_atm_timestamp"]

# ATM-Bench's memory item ids: YYYYMMDD_HHMMSS (image/video stems) and emailNNNN.
MEMORY_ID = re.compile(r"\b(\d{8}_\d{6}|email\d+)\b", re.IGNORECASE)
_NUMBER = re.compile(r"^\s*[-+]?\d+(?:[.,]\d+)?\s*$")


def parse_atm_timestamp(value: Any) -> datetime | None:
    """ATM timestamps: ``2024-01-01 12:34:56``, EXIF ``2024:01:01 12:34:56``, ISO 8601; None if
    empty or unreadable (the raw value stays in the record's metadata)."""
    if not value:
        return None
    text = str(value).strip()
    if re.match(r"^\d{4}:\d{2}:\d{2}", text):
        text = text[:10].replace(":", "-") + text[10:]
    try:
        ts = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return utc_naive(ts)


def atm_qa_files(root: Path) -> dict[str, Path]:
    """QA files under ``root`` by stem (NIAH pools excluded)."""
    found: dict[str, Path] = {}
    for p in sorted(root.rglob("atm-bench*.json")):
        if "niah" not in {part.lower() for part in p.relative_to(root).parts[:-1]}:
            found.setdefault(p.stem, p)
    return found


def _email_records(path: Path, on_error: str, skipped: list[SkippedInput]) -> list[Record]:
    data = read_json_file(path)
    if not isinstance(data, list):
        raise InputError(
            "expected a JSON list of emails {id, timestamp, short_summary, detail}", file=path
        )
    out = []
    for i, e in enumerate(data):
        if not isinstance(e, dict) or not e.get("id"):
            if on_error == "skip":
                skipped.append(SkippedInput(str(path), None, f"[{i}]: email without an id"))
                continue
            raise InputError("email without an 'id'", file=path, field=f"[{i}].id")
        summary, detail = (
            str(e.get("short_summary") or "").strip(),
            str(e.get("detail") or "").strip(),
        )
        text = "\n".join(t for t in (f"Subject: {summary}" if summary else "", detail) if t)
        if not text:
            if on_error == "skip":
                skipped.append(SkippedInput(str(path), None, f"[{i}]: email {e['id']} has no text"))
                continue
            raise InputError(
                "email has neither short_summary nor detail",
                file=path,
                record=str(e["id"]),
                field=f"[{i}]",
            )
        out.append(
            Record(
                id=str(e["id"]).strip(),
                kind=RecordKind.EMAIL,
                text=text,
                timestamp=parse_atm_timestamp(e.get("timestamp")),
                metadata={
                    "source": f"{path}:[{i}]",
                    "subject": summary,
                    "raw_timestamp": e.get("timestamp"),
                },
            )
        )
    return out


def _media_text(e: dict[str, Any]) -> str:
    tags = e.get("tags") or []
    tags = ", ".join(map(str, tags)) if isinstance(tags, list) else str(tags)
    parts = [
        ("Caption", e.get("caption") or e.get("short_caption")),
        ("Text in it", e.get("ocr_text")),
        ("Tags", tags),
        ("Place", e.get("location_name")),
    ]
    return "\n".join(f"{label}: {str(v).strip()}" for label, v in parts if v and str(v).strip())


def _media_records(path: Path, on_error: str, skipped: list[SkippedInput]) -> list[Record]:
    data = read_json_file(path)
    entries = list(data.values()) if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise InputError("expected a list (or an object) of media entries", file=path)
    out = []
    for i, e in enumerate(entries):
        media = (e.get("image_path") or e.get("video_path")) if isinstance(e, dict) else None
        if not media:
            if on_error == "skip":
                skipped.append(
                    SkippedInput(str(path), None, f"[{i}]: entry without image_path or video_path")
                )
                continue
            raise InputError(
                "entry has neither 'image_path' nor 'video_path'", file=path, field=f"[{i}]"
            )
        kind = "image" if e.get("image_path") else "video"
        text = _media_text(e)
        if not text:
            if on_error == "skip":
                skipped.append(
                    SkippedInput(
                        str(path), None, f"[{i}]: {media} has no caption, OCR text or tags"
                    )
                )
                continue
            raise InputError(
                "media entry has no caption, OCR text or tags",
                file=path,
                record=Path(media).stem,
                field=f"[{i}]",
            )
        out.append(
            Record(
                id=Path(str(media)).stem,
                kind=kind,
                text=text,
                timestamp=parse_atm_timestamp(e.get("timestamp")),
                metadata={
                    "source": f"{path}:[{i}]",
                    "media_path": str(media),
                    "title": e.get("short_caption") or None,
                    "location_name": e.get("location_name"),
                    "tags": e.get("tags") or [],
                    "raw_timestamp": e.get("timestamp"),
                },
            )
        )
    return out


def _answer_type(answer: str) -> AnswerType:
    if len(MEMORY_ID.findall(answer)) >= 2:
        return AnswerType.LIST
    if _NUMBER.match(answer):
        return AnswerType.NUMBER
    return AnswerType.TEXT


def _qa_items(path: Path, history: History, on_error: str, skipped: list[SkippedInput]):
    data = read_json_file(path)
    if isinstance(data, dict) and isinstance(data.get("qas"), list):
        data = data["qas"]
    if not isinstance(data, list):
        raise InputError(
            "expected a JSON list of QA entries, or an object with a 'qas' list", file=path
        )
    items, unresolved = [], []
    seen: set[str] = set()
    for i, q in enumerate(data):
        if not isinstance(q, dict) or not q.get("id") or not q.get("question") or "answer" not in q:
            if on_error == "skip":
                skipped.append(
                    SkippedInput(str(path), None, f"[{i}]: QA entry lacks id, question or answer")
                )
                continue
            raise InputError(
                "QA entry lacks 'id', 'question' or 'answer'",
                file=path,
                field=f"[{i}]",
                record=str(q["id"]) if isinstance(q, dict) and q.get("id") else None,
            )
        qid = str(q["id"])
        if qid in seen:
            raise InputError(f"duplicate QA id {qid!r}", file=path, record=qid, field=f"[{i}].id")
        seen.add(qid)
        raw = q.get("evidence_ids") or []
        if not isinstance(raw, list):
            raise InputError(
                "evidence_ids must be a list", file=path, record=qid, field=f"[{i}].evidence_ids"
            )
        evidence = []
        for e in map(str, raw):
            if e in history:
                evidence.append(e)
            else:
                unresolved.append(UnresolvedEvidence(qid, e, "no email or media item with this id"))
        answer = str(q["answer"])
        extra = {
            k: v for k, v in q.items() if k not in ("id", "question", "answer", "evidence_ids")
        }
        items.append(
            QAItem(
                id=qid,
                question=str(q["question"]),
                answer=answer,
                answer_type=_answer_type(answer),
                evidence_ids=list(dict.fromkeys(evidence)),
                question_type=q.get("qtype") or q.get("question_type") or q.get("type"),
                source="official",
                metadata={"raw_evidence": [str(e) for e in raw], **extra},
            )
        )
    return items, unresolved


def load_atm(path: str | Path, *, user: str | None = None, on_error: str = "raise") -> Loaded:
    """Load ATM-Bench's text memory (emails, image/video captions) and one QA file from ``path``."""
    root = Path(path)
    if not root.is_dir():
        raise InputError(
            "not a folder",
            file=root,
            field="--path",
            hint="point --path at the ATM-Bench folder (holding data/ and output/)",
        )
    skipped: list[SkippedInput] = []
    records: list[Record] = []
    for p in sorted(root.rglob("emails.json")):
        records += _email_records(p, on_error, skipped)
    for p in sorted(root.rglob("batch_results.json")):
        records += _media_records(p, on_error, skipped)
    if not records:
        raise InputError(
            "no emails.json or batch_results.json under this folder",
            file=root,
            hint="ATM-Bench's text memory is data/raw_memory/email/emails.json and output/{image,video}/*/batch_results.json",
        )
    qa_files = atm_qa_files(root)
    qa_path = None
    if user is not None:
        if user not in qa_files:
            raise InputError(
                f"no QA file {user}.json",
                file=root,
                field="--user",
                hint=f"available: {', '.join(qa_files) or 'none'}",
            )
        qa_path = qa_files[user]
    elif "atm-bench" in qa_files:
        qa_path = qa_files["atm-bench"]
    elif len(qa_files) == 1:
        qa_path = next(iter(qa_files.values()))
    elif qa_files:
        raise InputError(
            "several QA files; choose one with --user",
            file=root,
            field="--user",
            hint=f"available: {', '.join(qa_files)}",
        )
    history = History(root.name, records, source=str(root))
    items, unresolved = _qa_items(qa_path, history, on_error, skipped) if qa_path else ([], [])
    return Loaded(history, items, unresolved, skipped)
