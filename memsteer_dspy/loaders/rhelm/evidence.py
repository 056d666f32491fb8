"""RHELM evidence resolution: an official ``supporting_evidence`` string → record ids.

:class:`EvidenceResolver` maps the evidence for session turns, emails and document sections to the
ids the loader gives: as written where it can, else by ranking the candidates against the question
and answer; :class:`EvidenceResolution` says how each one resolved.
"""

from __future__ import annotations

import difflib
import html
import math
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memsteer_dspy.loaders.rhelm.documents import PREAMBLE, _plain_heading
from memsteer_dspy.loaders.rhelm.reading import _address_of, _name_of
from memsteer_dspy.records import History, Record, RecordKind

#: ``UnresolvedEvidence.reason`` for email/attachment evidence when ``external=False``: the
#: evidence is valid, its source is just not part of the loaded history.
EXTERNAL_NOT_LOADED = "external source not loaded (external=False)"
#: Lowest ``difflib`` similarity (0–1, on normalized heading text) at which an evidence heading
#: is taken to mean a heading of the same file that it does not match exactly.
FUZZY_HEADING_THRESHOLD = 0.8
_CONV_EVIDENCE = re.compile(r"^(\d{4}-\d{2}-\d{2})\s*:\s*(\d+)$")
_EMAIL_EVIDENCE = re.compile(r"^Emails?_(\d{4}-\d{2}-\d{2})\s*(?::\s*(.*))?$", re.DOTALL)

_STOP = set(
    "the a an and or of to in on at for with by from as is are was were be been it its this that "
    "these those my me i you your we our they their he she his her what which who whom when where "
    "how did do does have has had not no yes any all about after before during between into than "
    "then there so if but also can could would should will just email emails".split()
)


def _tokens(text: str) -> set[str]:
    return {
        t
        for t in re.findall(r"[a-z0-9]+", _fold(text))
        if (len(t) > 2 or t.isdigit()) and t not in _STOP
    }


def _fold(text: str) -> str:
    """Casefold, NFKC, ASCII quotes/dashes, collapsed whitespace."""
    t = unicodedata.normalize("NFKC", html.unescape(text))
    t = t.translate(
        str.maketrans({"‘": "'", "’": "'", "“": '"', "”": '"', "–": "-", "—": "-", "\xa0": " "})
    )
    return re.sub(r"\s+", " ", t).strip().casefold()


def _norm_heading(text: str) -> str:
    """Heading text for matching: no leading ``#``s, Markdown syntax, case or punctuation noise."""
    t = _fold(_plain_heading(re.sub(r"^\s*#+\s*", "", text)))
    t = re.sub(r"[\"'*_`]", "", t)
    return re.sub(r"\s+", " ", t).strip(" .:;-")


def _strip_numbering(text: str) -> str:
    """``4. structured shopping list`` / ``ii. methods`` / ``section 2: x`` → the words only."""
    return re.sub(
        r"^((section|part|step|day)\s+)?([0-9]+(\.[0-9]+)*|[ivxlc]+|[a-z])[.):]\s*", "", text
    ).strip()


@dataclass(frozen=True)
class EvidenceResolution:
    """How one official evidence string mapped to record ids."""

    raw: str
    #: The record ids it names (empty when it did not resolve).
    ids: list[str]
    #: How: ``exact``, ``turn_list``, ``email_index``, ``email_recipient``, ``email_header``,
    #: ``email_ranked``, ``document_header``, ``document_ranked``, ``heading_normalized``,
    #: ``heading_unnumbered``, ``heading_number``, ``heading_prefix``, ``heading_fuzzy``,
    #: ``heading_in_text`` (``+ranked`` where several candidates were ranked, ``file_stem+``
    #: where the file name needed its extension fixed), or ``external`` (not loaded).
    method: str
    #: Ranking score or fuzzy similarity, where the method used one.
    score: float | None = None
    #: Why it (or part of a turn list) did not resolve.
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"raw": self.raw, "ids": self.ids, "method": self.method}
        if self.score is not None:
            d["score"] = round(self.score, 3)
        if self.reason:
            d["reason"] = self.reason
        return d


class EvidenceResolver:
    """Maps RHELM ``supporting_evidence`` strings to record ids of one persona's history.

    Conversation turns: ``2024-08-26:7``; lists ``2024-06-26:13,17,18`` (a bare number keeps the
    previous date) and ``2024-05-28:9,2024-05-28:10``.

    Emails (``Emails_<date>:...``; the date names the email file): ``Email N`` → the N-th email of
    that date (the record id itself); ``Email to <name>`` → the email to that recipient;
    ``Header: ... From: A To: B`` → the email from A to B; a bare ``Email``/``Header``/``Body`` →
    the email of that date that best fits the question and answer (``email_ranked``; a file with
    one email needs no ranking). Where a filter leaves several emails, the best fit wins too.

    Document sections (``<file>:<heading>``), loosest last: the exact id; ``Header``/``Title`` →
    the document's first section; the heading after normalization (case, Markdown, quotes,
    leading ``#``, a ``Header:`` prefix); the same without numbering (``Lemon Bars`` ~ ``4. Lemon
    Bars``); a bare number or label (``1``, ``II``, ``Section 5``, ``Table 1``) → the heading so
    numbered; a heading that starts with the text (``Required Permissions`` ~ ``Required
    Permissions (Advance ...)``); the most similar heading if the similarity reaches
    :data:`FUZZY_HEADING_THRESHOLD` (``heading_fuzzy``, score kept); a bold label, table cell or
    list item inside a section (``heading_in_text``). A file name without or with the wrong
    extension is matched on its stem; a file name alone means the section that best fits the
    question and answer. Where several sections qualify (a repeated heading), the best fit wins.
    """

    def __init__(self, history: History, *, external: bool = True) -> None:
        self.history = history
        self.external = external
        self._emails_by_day: dict[str, list[Record]] = {}
        self._sections_by_file: dict[str, list[Record]] = {}
        for r in history.records:
            if r.kind == RecordKind.EMAIL:
                self._emails_by_day.setdefault(
                    r.id.split(":", 1)[0].removeprefix("Emails_"), []
                ).append(r)
            elif r.kind == RecordKind.DOCUMENT_SECTION:
                self._sections_by_file.setdefault(r.metadata["document"], []).append(r)
        self._by_stem = {Path(f).stem.casefold(): f for f in self._sections_by_file}

    # -- entry point -------------------------------------------------------------------------
    def resolve(self, raw: str, *, question: str = "", answer: str = "") -> EvidenceResolution:
        e = raw.strip()
        context = (question, answer)
        if e.startswith("Email"):
            if not self.external:
                return EvidenceResolution(raw, [], "external", reason=EXTERNAL_NOT_LOADED)
            return self._email(raw, e, context)
        if re.match(r"^\d{4}-\d{2}-\d{2}\s*:", e):
            return self._turns(raw, e)
        if not self.external:
            return EvidenceResolution(raw, [], "external", reason=EXTERNAL_NOT_LOADED)
        return self._document(raw, e, context)

    # -- conversation turns ------------------------------------------------------------------
    def _turns(self, raw: str, e: str) -> EvidenceResolution:
        ids, missing = [], []
        day: str | None = None
        for piece in (p.strip() for p in e.split(",")):
            if not piece:
                continue
            m = _CONV_EVIDENCE.match(piece)
            if m:
                day, turn = m.group(1), int(m.group(2))
            elif piece.isdigit() and day is not None:
                turn = int(piece)
            else:
                missing.append(piece)
                continue
            rid = f"{day}:{turn}"
            (ids if rid in self.history else missing).append(rid)
        reason = f"no conversation turn {', '.join(missing)}" if missing else None
        method = "exact" if ids == [e] else "turn_list"
        return EvidenceResolution(raw, list(dict.fromkeys(ids)), method, reason=reason)

    # -- emails ------------------------------------------------------------------------------
    def _email(self, raw: str, e: str, context: tuple[str, str]) -> EvidenceResolution:
        m = _EMAIL_EVIDENCE.match(e)
        if m is None:
            return EvidenceResolution(
                raw, [], "email", reason="not of the form Emails_<YYYY-MM-DD>:<part>"
            )
        day, part = m.group(1), (m.group(2) or "").strip()
        emails = self._emails_by_day.get(day)
        if not emails:
            return EvidenceResolution(raw, [], "email", reason=f"no email file dated {day}")
        n = re.fullmatch(r"(?:Email|Message)\s*#?\s*(\d+)", part, re.IGNORECASE)
        if n:
            k = int(n.group(1))
            rid = f"Emails_{day}:Email {k}"
            if rid in self.history:
                return EvidenceResolution(raw, [rid], "email_index")
            return EvidenceResolution(
                raw, [], "email_index", reason=f"the email file of {day} has no email {k}"
            )
        candidates, method = list(emails), "email_ranked"
        to = re.fullmatch(r"Email\s+to\s+(.+)", part, re.IGNORECASE)
        header = re.search(r"From:\s*(.*?)\s*(?:To:\s*(.*))?$", part, re.IGNORECASE | re.DOTALL)
        if to:
            candidates = [r for r in emails if _party_matches(to.group(1), r, "recipient")]
            method = "email_recipient"
        elif header:
            candidates = [
                r
                for r in emails
                if _party_matches(header.group(1), r, "sender")
                and (not header.group(2) or _party_matches(header.group(2), r, "recipient"))
            ]
            method = "email_header"
        if not candidates:
            return EvidenceResolution(raw, [], method, reason=f"no email of {day} matches {part!r}")
        if len(candidates) == 1:
            return EvidenceResolution(raw, [candidates[0].id], method)
        best, score = _best_match(candidates, context)
        return EvidenceResolution(raw, [best.id], method, score=score)

    # -- document sections -------------------------------------------------------------------
    def _document(self, raw: str, e: str, context: tuple[str, str]) -> EvidenceResolution:
        name, sep, heading = e.partition(":")
        name = name.strip()
        file = name if name in self._sections_by_file else None
        method_prefix = ""
        if file is None:
            stem = re.sub(r"\.(md|html?)$", "", name, flags=re.IGNORECASE).casefold()
            file = self._by_stem.get(stem)
            method_prefix = "file_stem+"
        if file is None:
            return EvidenceResolution(raw, [], "document", reason=f"no attachment named {name!r}")
        sections = self._sections_by_file[file]
        heading = heading.strip()
        if not sep or not heading:
            best, score = _best_match(sections, context)
            return EvidenceResolution(
                raw, [best.id], method_prefix + "document_ranked", score=score
            )
        exact = f"{file}:{heading}"
        if exact in self.history:
            # a repeated heading ("Notes", "Notes (2)"): the repeat that fits the question best
            repeats = [s for s in sections if s.id == exact or _is_repeat_of(s.id, exact)]
            if len(repeats) > 1:
                best, score = _best_match(repeats, context)
                return EvidenceResolution(
                    raw, [best.id], method_prefix + "exact+ranked", score=score
                )
            return EvidenceResolution(raw, [exact], method_prefix + "exact")
        if _fold(heading) in ("header", "headers", "title", "heading"):
            return EvidenceResolution(raw, [sections[0].id], method_prefix + "document_header")
        found = self._heading(sections, heading, context)
        if found is not None:
            return EvidenceResolution(raw, [found[0].id], method_prefix + found[1], score=found[2])
        return EvidenceResolution(
            raw, [], "document", reason=f"no section of {file} is headed {heading!r}"
        )

    def _heading(
        self, sections: list[Record], heading: str, context: tuple[str, str]
    ) -> tuple[Record, str, float | None] | None:
        """The section of ``file`` that ``heading`` names, trying ever looser readings."""
        want = _norm_heading(re.sub(r"^\s*header\s*:\s*(?=\S)", "", heading, flags=re.IGNORECASE))
        if not want:
            return None
        headed = [s for s in sections if s.metadata["heading"] != PREAMBLE]
        norms = [_norm_heading(s.metadata["heading"]) for s in headed]

        def pick(hits: list[Record], method: str) -> tuple[Record, str, float | None]:
            if len(hits) == 1:
                return hits[0], method, None
            best, score = _best_match(hits, context)
            return best, method + "+ranked", score

        # 1. the same heading once case, Markdown, quotes and spacing are normalized
        hits = [s for s, h in zip(headed, norms, strict=True) if h == want]
        if hits:
            return pick(hits, "heading_normalized")
        # 2. the same words without the numbering ("4. Shopping List" ~ "Shopping List")
        bare = _strip_numbering(want)
        hits = [
            s for s, h in zip(headed, norms, strict=True) if bare and _strip_numbering(h) == bare
        ]
        if hits:
            return pick(hits, "heading_unnumbered")
        # 3. only a number or label ("1", "II", "Section 5"): the heading numbered so
        label = _LABEL_ONLY.fullmatch(want)
        if label:
            word, number = label.group(1), label.group(2)
            hits = [
                s
                for s, h in zip(headed, norms, strict=True)
                if _heading_number(h) == (word, number)
            ]
            hits = hits or [
                s for s, h in zip(headed, norms, strict=True) if _heading_number(h)[1] == number
            ]
            if hits:
                return pick(hits, "heading_number")
        # 4. a heading that starts with the given text ("Table 2" ~ "Table 2: Assigned ...")
        hits = [
            s
            for s, h in zip(headed, norms, strict=True)
            if re.match(re.escape(want) + r"(\W|$)", h)
        ]
        if hits:
            return pick(hits, "heading_prefix")
        # 5. a similar heading (typos, small rewordings), above a threshold
        ratios = [difflib.SequenceMatcher(None, want, h).ratio() for h in norms]
        if ratios and max(ratios) >= FUZZY_HEADING_THRESHOLD:
            best = max(ratios)
            return headed[ratios.index(best)], "heading_fuzzy", best
        # 6. a bold label, table cell or list item inside a section ("**Workflow Rationale:**")
        texts = [_norm_text(s.text) for s in sections]
        line_start = re.compile(r"(^|\n)[\s|>#*+-]*" + re.escape(want) + r"(\W|$)")
        hits = [s for s, t in zip(sections, texts, strict=True) if line_start.search(t)]
        hits = hits or [
            s
            for s, t in zip(sections, texts, strict=True)
            if re.search(r"(^|\W)" + re.escape(want) + r"(\W|$)", t)
        ]
        if hits:
            return pick(hits, "heading_in_text")
        return None


_LABEL_ONLY = re.compile(r"(?:(section|part|step|chapter|phase|table|day)\s+)?([0-9]+|[ivxlc]+)")


def _heading_number(heading: str) -> tuple[str | None, str | None]:
    """The leading label of a normalized heading: ``section 1: x`` → ("section", "1"), ``ii. x``
    → (None, "ii"), ``4. x`` → (None, "4")."""
    m = re.match(
        r"(?:(section|part|step|chapter|phase|table|day)\s+)?([0-9]+|[ivxlc]+)(?=[.):\s-]|$)",
        heading,
    )
    return (m.group(1), m.group(2)) if m else (None, None)


def _norm_text(text: str) -> str:
    """Section text folded like headings, line by line (for finding a label inside it)."""
    return "\n".join(re.sub(r"[\"'*_`]", "", ln).strip() for ln in _fold_lines(text))


def _fold_lines(text: str) -> list[str]:
    return [_fold(ln) for ln in text.splitlines()]


def _is_repeat_of(record_id: str, first_id: str) -> bool:
    """Is ``record_id`` the id a repeated heading got (``<first_id> (2)``, ``(3)``...)?"""
    return re.fullmatch(re.escape(first_id) + r" \(\d+\)", record_id) is not None


def _party_matches(wanted: str, record: Record, role: str) -> bool:
    """Does ``wanted`` (a name, ``Name <address>`` or address) name the sender/recipient?"""
    address = _address_of(wanted)
    if address and address == record.metadata.get(f"{role}_address"):
        return True
    name = _fold(_name_of(wanted))
    have = _fold(record.metadata.get(f"{role}_name", ""))
    return bool(name) and (name == have or name in have or (len(have) > 3 and have in name))


def _best_match(candidates: Sequence[Record], context: tuple[str, str]) -> tuple[Record, float]:
    """The candidate that best fits a QA item's ``(question, answer)``; ties → the first.

    The score sums, over the words a candidate shares with the question and answer, each word's
    inverse frequency among the candidates (answer words count double), plus a large bonus when
    the answer quotes the candidate's title (an email subject or a section heading).
    """
    question, answer = context
    q_tokens, a_tokens = _tokens(question), _tokens(answer)
    folded_answer = _fold(answer)
    token_sets = [_tokens(c.text) for c in candidates]
    df: dict[str, int] = {}
    for ts in token_sets:
        for t in ts & (q_tokens | a_tokens):
            df[t] = df.get(t, 0) + 1
    n = len(candidates)
    best_i, best = 0, -1.0
    for i, (c, ts) in enumerate(zip(candidates, token_sets, strict=True)):
        score = sum(
            math.log(1 + n / df[t]) * (2 if t in a_tokens else 1)
            for t in ts & (q_tokens | a_tokens)
        )
        title = _fold(c.title or "")
        if len(title) > 3 and title in folded_answer:
            score += 100.0
        if score > best:
            best_i, best = i, score
    return candidates[best_i], best
