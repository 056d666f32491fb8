"""What every loader returns: a History, its QA items (where the format has them) and a report
of what could not be used (unresolved evidence ids, skipped lines)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memsteer_dspy.errors import InputError
from memsteer_dspy.records import History, QAItem


@dataclass(frozen=True)
class UnresolvedEvidence:
    """An evidence string of a QA item that could not be mapped to any record id."""

    qa_id: str
    raw: str
    reason: str


@dataclass(frozen=True)
class SkippedInput:
    """A line or object skipped under ``on_error='skip'``, with why."""

    file: str
    line: int | None
    reason: str


@dataclass
class Loaded:
    history: History
    qa_items: list[QAItem] = field(default_factory=list)
    unresolved: list[UnresolvedEvidence] = field(default_factory=list)
    skipped: list[SkippedInput] = field(default_factory=list)

    @property
    def evidence_resolved_fraction(self) -> float | None:
        """Items whose evidence all resolved / items with evidence (None without such items)."""
        with_evidence = [
            q for q in self.qa_items if q.evidence_ids or q.metadata.get("raw_evidence")
        ]
        if not with_evidence:
            return None
        bad = {u.qa_id for u in self.unresolved}
        return sum(q.id not in bad for q in with_evidence) / len(with_evidence)

    def report(self) -> dict[str, Any]:
        """The ingest summary (what ``memsteer ingest --json`` prints)."""
        from collections import Counter

        stats = self.history.stats()
        return {
            **stats,
            "qa_items": len(self.qa_items),
            "qa_by_type": dict(
                Counter(q.question_type or "unknown" for q in self.qa_items).most_common()
            ),
            "evidence_resolved_fraction": self.evidence_resolved_fraction,
            "unresolved_evidence": [
                {"qa_id": u.qa_id, "raw": u.raw, "reason": u.reason} for u in self.unresolved
            ],
            "skipped": [{"file": s.file, "line": s.line, "reason": s.reason} for s in self.skipped],
        }


def read_json_file(path: Path) -> Any:
    """Parse a UTF-8 JSON file; a missing, non-UTF-8 or malformed file raises an
    :class:`InputError` naming the file (and the line of a JSON error)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError("file not found", file=path) from None
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {exc.start})", file=path) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON: {exc.msg}", file=path, line=exc.lineno) from None
