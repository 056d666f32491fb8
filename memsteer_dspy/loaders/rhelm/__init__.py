"""RHELM: one persona's conversations, emails and attachments, with the official QA.

RHELM (Realistic, Heterogeneous and Evolving Long-horizon Memory) is one of the two benchmarks of
the MemSteer paper. A persona's history is three sources under ``data/``:

* ``conversations/<Persona>/conversation_YYYY_MM_DD.json`` — one session a file. Each turn (a
  user message and the assistant's reply) is one record, id ``<session date>:<turn>``
  (``2024-08-26:7``), kind ``conversation_turn``, thread ``conversation:<date>``, text
  ``User: ...\\nAssistant: ...``. A turn that uploads a document (``research_document``) refers
  to that document's sections.
* ``emails/<Persona>/NN_email_YYYY_MM_DD.txt`` — emails separated by lines of ``=``, each with
  ``Sender:``, ``Recipient:``, ``Subject:``, ``Summary:`` and an optional body. Each email is one
  record, id ``Emails_<YYYY-MM-DD>:Email <k>`` (``k`` = 1-based position in the file; a second
  file of the same date would continue the numbering), the form the official evidence uses, so
  ``Emails_2024-10-03:Email 1`` resolves as written; the file date is its timestamp. Emails with
  the same subject once ``Re:``/``Fwd:`` prefixes are stripped share a thread
  (``email-thread:<id of the first>``); a reply refers to the email it answers.
* ``attachments/<Persona>/NN_{notes,report}_task_<hash>.{md,html}`` — documents. Each section
  (a Markdown ATX heading, or an HTML ``h1``–``h6``, up to the next heading of any level) is one
  record, id ``<file name>:<heading text>`` as the official evidence writes it; text before the
  first heading is the section ``<file name>:(preamble)``; a repeated heading in one file gets
  `` (2)``, `` (3)``... Attachments have no date of their own: a document is dated with the email
  file of the same ``NN`` and refers to those emails; where that email file is missing, with the
  conversation that uploads it, else the ``NN``-th conversation session.

Every record's ``metadata["source"]`` says where it came from, relative to ``data/``
(``emails/<Persona>/01_email_2024_01_01.txt:8``, ``attachments/<Persona>/<file>:<line>``, the
session file for a turn). ``external=False`` loads conversations only (RHELM's "without external
sources" setting).

The official QA (``data/QA_final/low_score_qa_<Persona>_all_validated.jsonl``) become
:class:`~memsteer_dspy.records.QAItem` s. Their ``supporting_evidence`` strings are normalized to
record ids (:class:`EvidenceResolver`); how each one resolved is kept in
``metadata["evidence_resolution"]`` and anything that does not resolve is reported in
``Loaded.unresolved``. Under ``external=False``, evidence in emails or attachments is reported
there with the reason :data:`EXTERNAL_NOT_LOADED`; the QA item is kept (the official protocol
evaluates every item in both settings).

The package's modules: :mod:`~.reading` (files, the ``on_error`` policy), :mod:`~.conversations`,
:mod:`~.emails`, :mod:`~.documents` (attachments), :mod:`~.evidence` (evidence resolution) and
:mod:`~.qa` (the official QA); the loader itself and where the data is are here.
"""

from __future__ import annotations

import difflib
import os
import re
from datetime import date
from pathlib import Path

from memsteer_dspy.errors import InputError
from memsteer_dspy.loaders.base import Loaded
from memsteer_dspy.loaders.rhelm.conversations import _CONVERSATION_FILE, _conversation_turns
from memsteer_dspy.loaders.rhelm.documents import _ATTACHMENT_FILE, _document_records
from memsteer_dspy.loaders.rhelm.documents import PREAMBLE as PREAMBLE
from memsteer_dspy.loaders.rhelm.emails import _EMAIL_FILE, _email_file, _EmailFile, _thread_emails
from memsteer_dspy.loaders.rhelm.evidence import (
    EXTERNAL_NOT_LOADED,
    FUZZY_HEADING_THRESHOLD,
    EvidenceResolution,
    EvidenceResolver,
)
from memsteer_dspy.loaders.rhelm.qa import QUOTES as QUOTES
from memsteer_dspy.loaders.rhelm.qa import _official_qa, infer_answer_type
from memsteer_dspy.loaders.rhelm.reading import _Errors
from memsteer_dspy.records import History, Record

__all__ = [
    "EXTERNAL_NOT_LOADED",
    "FUZZY_HEADING_THRESHOLD",
    "EvidenceResolution",
    "EvidenceResolver",
    "default_rhelm_root",
    "infer_answer_type",
    "list_personas",
    "load_rhelm",
]


# --------------------------------------------------------------------------------------------
# Where the data is
# --------------------------------------------------------------------------------------------


def default_rhelm_root() -> Path | None:
    """The RHELM folder: ``$MEMSTEER_RHELM_ROOT``, else ``../shared/benchmarks/rhelm`` relative
    to the current directory, else relative to the repository root. None where none exists."""
    candidates: list[Path] = []
    env = os.environ.get("MEMSTEER_RHELM_ROOT")
    if env:
        candidates.append(Path(env))
    candidates.append(Path.cwd().parent / "shared" / "benchmarks" / "rhelm")
    repo_root = Path(__file__).resolve().parents[3]  # rhelm/ loaders/ memsteer_dspy/ <repo>
    candidates.append(repo_root.parent / "shared" / "benchmarks" / "rhelm")
    for c in candidates:
        if _find_data_dir(c) is not None:
            return c
    return None


def _find_data_dir(root: Path) -> Path | None:
    for d in (root / "data", root):
        if (d / "conversations").is_dir():
            return d
    return None


def _data_dir(root: str | Path) -> Path:
    root = Path(root)
    data = _find_data_dir(root)
    if data is None:
        raise InputError(
            "not a RHELM folder: no 'data/conversations' (or 'conversations') inside",
            file=root,
            hint="pass the RHELM root (the folder holding 'data/') or its 'data' folder, "
            "or set MEMSTEER_RHELM_ROOT",
        )
    return data


def list_personas(root: str | Path) -> list[str]:
    """The persona names of a RHELM folder (``root`` may be the RHELM root or its ``data``)."""
    data = _data_dir(root)
    return sorted(p.name for p in (data / "conversations").iterdir() if p.is_dir())


# --------------------------------------------------------------------------------------------
# The loader
# --------------------------------------------------------------------------------------------


def _sorted_files(folder: Path, pattern: re.Pattern[str]) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and pattern.search(p.name))


def load_rhelm(
    root: str | Path, persona: str, *, external: bool = True, on_error: str = "raise"
) -> Loaded:
    """Load one RHELM persona as a History plus its official QA items.

    ``root`` is the RHELM folder or its ``data`` folder. ``external=False`` loads conversations
    only. ``on_error='skip'`` leaves out an unreadable file, turn or email and reports it in
    ``Loaded.skipped`` instead of raising :class:`~memsteer_dspy.errors.InputError`.
    """
    errors = _Errors(on_error)
    data = _data_dir(root)
    rhelm_root = data.parent if data.name == "data" else data
    personas = list_personas(data)
    if persona not in personas:
        close = difflib.get_close_matches(persona, personas, n=1)
        raise InputError(
            f"no RHELM persona {persona!r}" + (f" (did you mean {close[0]!r}?)" if close else ""),
            file=data / "conversations",
            field="persona",
            hint=f"available personas: {', '.join(personas)}",
        )

    sessions = _sorted_files(data / "conversations" / persona, _CONVERSATION_FILE)
    turns: list[Record] = []
    for path in sessions:
        turns.extend(_conversation_turns(path, data, persona, errors))

    emails: list[Record] = []
    sections: list[Record] = []
    if external:
        email_files: dict[int, _EmailFile] = {}
        per_day: dict[date, int] = {}
        for path in _sorted_files(data / "emails" / persona, _EMAIL_FILE):
            m = _EMAIL_FILE.search(path.name)
            day = date(int(m.group(2)), int(m.group(3)), int(m.group(4))) if m else None
            ef = _email_file(path, data, errors, numbered_from=per_day.get(day, 0))
            if ef is not None:
                per_day[ef.day] = per_day.get(ef.day, 0) + ef.blocks
                email_files.setdefault(ef.index, ef)
                emails.extend(ef.records)
        emails = _thread_emails(emails)
        email_ids: dict[int, list[str]] = {}
        for r in emails:
            email_ids.setdefault(r.metadata["email_file_index"], []).append(r.id)
        uploaded: dict[str, date] = {}
        for t in turns:
            doc = t.metadata.get("research_document")
            if doc and t.timestamp is not None:
                uploaded.setdefault(Path(doc).stem, date.fromisoformat(t.metadata["session_date"]))
        session_days = sorted(
            {
                date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
                for p in sessions
                if (m := _CONVERSATION_FILE.search(p.name))
            }
        )
        for path in _sorted_files(data / "attachments" / persona, _ATTACHMENT_FILE):
            nn = int(path.name.split("_", 1)[0])
            if nn in email_files:
                day, source = email_files[nn].day, "email"
            elif path.stem in uploaded:
                day, source = uploaded[path.stem], "uploading_conversation"
            elif 0 < nn <= len(session_days):
                day, source = session_days[nn - 1], "nth_conversation"
            else:
                day, source = None, "none"
            sections.extend(
                _document_records(path, data, day, source, email_ids.get(nn, []), errors)
            )
        # A turn that uploads a document refers to that document's sections.
        by_doc: dict[str, list[str]] = {}
        for s in sections:
            by_doc.setdefault(Path(s.metadata["document"]).stem, []).append(s.id)
        turns = [
            t.model_copy(update={"references": by_doc[Path(t.metadata["research_document"]).stem]})
            if t.metadata.get("research_document")
            and Path(t.metadata["research_document"]).stem in by_doc
            else t
            for t in turns
        ]

    history = History(
        persona, _unique(turns + emails + sections, data, errors), source=str(rhelm_root)
    )
    qa_items, unresolved = _official_qa(data, persona, history, external, errors)
    return Loaded(history=history, qa_items=qa_items, unresolved=unresolved, skipped=errors.skipped)


def _unique(records: list[Record], data: Path, errors: _Errors) -> list[Record]:
    """Records with a new id; a repeated id (a turn number used twice in one session, two session
    files of one date) is an InputError naming both places, or skipped under ``on_error='skip'``."""
    seen: dict[str, Record] = {}
    out = []
    for r in records:
        first = seen.get(r.id)
        if first is None:
            seen[r.id] = r
            out.append(r)
            continue
        where = str(r.metadata.get("source", ""))
        file, _, line = where.rpartition(":") if re.search(r":\d+$", where) else (where, "", "")
        errors(
            InputError(
                f"duplicate record id {r.id!r} (first at {first.metadata.get('source')})",
                file=data / file if file else None,
                line=int(line) if line else None,
                record=r.id,
                hint="record ids must be unique; fix the turn number or remove the duplicate file",
            )
        )
    return out
