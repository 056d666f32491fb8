"""RHELM's official QA: ``QA_final/low_score_qa_<Persona>_all_validated.jsonl`` → QA items.

Each item's answer type is inferred from its answer (:func:`infer_answer_type`) and its
``supporting_evidence`` is resolved to record ids (:class:`~.evidence.EvidenceResolver`).
"""

from __future__ import annotations

import json
import re
from datetime import date
from pathlib import Path

from memsteer_dspy.errors import InputError
from memsteer_dspy.loaders.base import UnresolvedEvidence
from memsteer_dspy.loaders.rhelm.evidence import EvidenceResolver
from memsteer_dspy.loaders.rhelm.reading import _Errors, _read_text, _rel
from memsteer_dspy.records import AnswerType, History, QAItem

_NUMBER_WORDS = (
    "zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|"
    "fifteen|sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|"
    "eighty|ninety|hundred|once|twice"
)
_NUMBER = re.compile(
    rf"^(about |approximately |around |~|≈)?[$€£]?(\d[\d,]*(\.\d+)?(/\d+)?|({_NUMBER_WORDS})([- ]({_NUMBER_WORDS}))?)"
    r"\s*(%|[a-zA-Z°/]+){0,1}( [a-zA-Z]+)?( \([^)]*\))?$",
    re.IGNORECASE,
)
_MONTHS = "january|february|march|april|may|june|july|august|september|october|november|december"
_MON = rf"({_MONTHS}|jan|feb|mar|apr|jun|jul|aug|sept?|oct|nov|dec)\.?"
_DATE_ANSWER = re.compile(
    rf"^((mon|tues|wednes|thurs|fri|satur|sun)day,? )?("
    rf"\d{{4}}-\d{{2}}-\d{{2}}"
    rf"|{_MON} \d{{1,2}}(st|nd|rd|th)?(,? \d{{4}})?"
    rf"|\d{{1,2}}(st|nd|rd|th)? (of )?{_MON}(,? \d{{4}})?"
    rf"|{_MON},? \d{{4}}"
    rf"|\d{{1,2}}/\d{{1,2}}/\d{{2,4}})$",
    re.IGNORECASE,
)
# A colon or a finite verb makes a comma-separated answer a clause, not a list.
_CLAUSE = re.compile(
    r":|\b(is|are|was|were|has|have|had|did|does|do|covers|titled|includes)\b", re.I
)
QUOTES = "'\"‘’“”"
_SENTENCE_START = re.compile(
    r"^(you|i|it|there|they|he|she|we|this|that|no,|yes,)\b", re.IGNORECASE
)


def infer_answer_type(answer: str) -> AnswerType:
    """The answer type of an official RHELM answer, from its text alone (RHELM gives none).

    Surrounding quotes, spaces and a final period are ignored. In order: ``boolean`` if it starts
    with yes/no and has at most 8 words; ``date`` if it is only a date (ISO, ``April 4, 2024``,
    ``4 April``, ``March 2024``, optionally a weekday); ``number`` if it is only a count or
    quantity (``3``, ``Two``, ``28 minutes``, ``40,000 steps``, ``6/10``, ``$1,200``, optionally
    with a parenthesis); ``text`` if it reads as a sentence (starts with a pronoun) or is longer
    than 30 words; ``entity`` if it was quoted (a title) and has at most 12 words; ``list`` if it
    splits on ``;``, ``,`` or ``and`` into two or more short parts (at most 6 words each; a comma
    before a year does not split; no colon or verb such as *is*/*has*); ``entity`` if it is a short name or phrase (at most 6 words, no
    sentence punctuation; ``Dr.``/initials are fine); otherwise ``text``.
    """
    a = re.sub(r"\s+", " ", answer).strip()
    quoted = False
    while a and (a[0] in QUOTES or a[-1] in QUOTES or a[-1] in ".!"):
        quoted = quoted or a[0] in QUOTES
        a = a.strip("".join(QUOTES)).rstrip(".!").strip()
    if not a:
        return AnswerType.TEXT
    words = a.split()
    if re.match(r"^(yes|no)\b", a, re.IGNORECASE):
        return AnswerType.BOOLEAN if len(words) <= 8 else AnswerType.TEXT
    if _DATE_ANSWER.match(a):
        return AnswerType.DATE
    if _NUMBER.match(a):
        return AnswerType.NUMBER
    if _SENTENCE_START.match(a) or len(words) > 30:
        return AnswerType.TEXT
    if quoted and len(words) <= 12:
        return AnswerType.ENTITY
    unsplit = re.sub(r",\s*(?=\d{4}\b)", " ", a)
    parts = [p.strip() for p in re.split(r";|,(?: and | & | or )?| and | & ", unsplit) if p.strip()]
    if len(parts) >= 2 and all(len(p.split()) <= 6 for p in parts) and not _CLAUSE.search(a):
        return AnswerType.LIST
    plain = re.sub(r"\b([A-Z][a-z]{0,3}|[A-Z])\.", "", a)  # Dr. / St. / R.
    if len(words) <= 6 and not re.search(r"[.;:!?](\s|$)", plain):
        return AnswerType.ENTITY
    return AnswerType.TEXT


def _official_qa(
    data: Path, persona: str, history: History, external: bool, errors: _Errors
) -> tuple[list[QAItem], list[UnresolvedEvidence]]:
    path = data / "QA_final" / f"low_score_qa_{persona}_all_validated.jsonl"
    if not path.is_file():
        return [], []
    try:
        text = _read_text(path)
    except InputError as exc:
        errors(exc)
        return [], []
    resolver = EvidenceResolver(history, external=external)
    items: list[QAItem] = []
    unresolved: list[UnresolvedEvidence] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            errors(InputError(f"invalid JSON: {exc.msg}", file=path, line=n))
            continue
        missing = [
            k for k in ("id", "question", "answer") if not isinstance(obj, dict) or k not in obj
        ]
        if missing:
            errors(
                InputError(
                    f"QA item lacks {missing[0]!r}",
                    file=path,
                    line=n,
                    field=missing[0],
                    hint="each line is {id, question, answer, question_date, question_type, "
                    "supporting_evidence, characteristics}",
                )
            )
            continue
        qa_id = str(obj["id"])
        raw_evidence = obj.get("supporting_evidence") or []
        if isinstance(raw_evidence, str):
            raw_evidence = [raw_evidence]
        question, answer = str(obj["question"]), str(obj["answer"])
        question_date = None
        if obj.get("question_date"):
            try:
                question_date = date.fromisoformat(str(obj["question_date"]).strip()[:10])
            except ValueError:
                errors(
                    InputError(
                        f"question_date {obj['question_date']!r} is not YYYY-MM-DD",
                        file=path,
                        line=n,
                        field="question_date",
                        record=qa_id,
                    )
                )
                continue
        evidence_ids: list[str] = []
        resolutions = []
        problems: list[UnresolvedEvidence] = []
        for raw in raw_evidence:
            res = resolver.resolve(str(raw), question=question, answer=answer)
            resolutions.append(res.as_dict())
            evidence_ids.extend(res.ids)
            if res.reason:  # nothing, or only part of a turn list, resolved
                problems.append(UnresolvedEvidence(qa_id=qa_id, raw=str(raw), reason=res.reason))
        try:
            item = QAItem(
                id=qa_id,
                question=question,
                answer=answer,
                answer_type=infer_answer_type(answer),
                evidence_ids=list(dict.fromkeys(evidence_ids)),
                question_date=question_date,
                question_type=obj.get("question_type"),
                source="official",
                metadata={
                    "persona": persona,
                    "characteristics": list(obj.get("characteristics") or []),
                    "raw_evidence": list(raw_evidence),
                    "evidence_resolution": resolutions,
                    "source": f"{_rel(path, data)}:{n}",
                },
            )
        except ValueError as exc:  # pydantic: e.g. an empty question
            errors(InputError(f"unusable QA item: {exc}", file=path, line=n, record=qa_id))
            continue
        items.append(item)
        unresolved.extend(problems)
    return items, unresolved
