"""RHELM attachments: one record a section of a Markdown or HTML document.

A section runs from a heading (Markdown ATX, or HTML ``h1``–``h6``) to the next; its id is
``<file name>:<heading text>``, text before the first heading is ``<file name>:(preamble)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from memsteer_dspy.errors import InputError
from memsteer_dspy.loaders.rhelm.reading import _Errors, _read_text, _rel
from memsteer_dspy.records import Record, RecordKind

PREAMBLE = "(preamble)"
_ATTACHMENT_FILE = re.compile(r"(\d+)_[A-Za-z]+_task_[^.]+\.(md|html?)$", re.IGNORECASE)
_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


@dataclass
class _Section:
    heading: str | None  # None: text before the first heading
    level: int
    line: int
    text: str


def _markdown_sections(text: str) -> list[_Section]:
    """ATX headings (``#``..``######``) outside fenced code start sections; the section's text is
    its Markdown, heading line included."""
    sections: list[_Section] = []
    current: list[str] = []
    heading: str | None = None
    level, start = 0, 1
    fence: str | None = None

    def flush() -> None:
        body = "\n".join(current).strip()
        if heading is not None or body:
            sections.append(_Section(heading, level, start, body))

    for n, line in enumerate(text.splitlines(), start=1):
        f = _FENCE.match(line)
        if f:
            mark = f.group(1)[0]
            if fence is None:
                fence = mark
            elif fence == mark:
                fence = None
        m = _ATX.match(line) if fence is None and not f else None
        if m:
            flush()
            heading, level, start = (m.group(2) or "").strip(), len(m.group(1)), n
            current = [line.rstrip()]
        else:
            current.append(line.rstrip())
    flush()
    return sections


_BLOCK_TAGS = {
    "p",
    "div",
    "section",
    "article",
    "header",
    "footer",
    "ul",
    "ol",
    "table",
    "thead",
    "tbody",
    "tr",
    "blockquote",
    "pre",
    "hr",
    "dl",
    "dt",
    "dd",
    "figure",
    "figcaption",
    "main",
    "nav",
}
_SKIP_TAGS = {"head", "style", "script", "title", "noscript", "template"}
_HEADINGS = {"h1", "h2", "h3", "h4", "h5", "h6"}


class _HTMLSections(HTMLParser):
    """Splits an HTML document into heading sections of plain text (stdlib parser)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.sections: list[_Section] = []
        self._heading: str | None = None
        self._level = 0
        self._line = 1
        self._parts: list[str] = []
        self._in_heading: list[str] | None = None
        self._skip = 0

    def _flush(self) -> None:
        lines = [
            re.sub(r"[ \t\r\f\v]+", " ", ln).strip() for ln in "".join(self._parts).split("\n")
        ]
        body = "\n".join(ln for ln in lines if ln and ln != "|")
        if self._heading is not None:
            body = f"{self._heading}\n{body}".strip()
        if self._heading is not None or body:
            self.sections.append(_Section(self._heading, self._level, self._line, body))
        self._parts = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIP_TAGS:
            self._skip += 1
        elif self._skip:
            return
        elif tag in _HEADINGS:
            self._flush()
            self._in_heading, self._level, self._line = [], int(tag[1]), self.getpos()[0]
        elif tag == "br":
            self._emit("\n")
        elif tag == "li":
            self._emit("\n- ")
        elif tag in ("td", "th"):
            self._emit(" | ")
        elif tag in _BLOCK_TAGS:
            self._emit("\n")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("br", "hr") and not self._skip:
            self._emit("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP_TAGS:
            self._skip = max(0, self._skip - 1)
        elif self._skip:
            return
        elif tag in _HEADINGS and self._in_heading is not None:
            self._heading = re.sub(r"\s+", " ", "".join(self._in_heading)).strip()
            self._in_heading = None
        elif tag in _BLOCK_TAGS or tag == "li":
            self._emit("\n")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self._emit(data)

    def _emit(self, text: str) -> None:
        if self._in_heading is not None:
            self._in_heading.append(text.replace("\n", " "))
        else:
            self._parts.append(text)

    def close(self) -> None:
        super().close()
        if self._in_heading is not None:  # unclosed heading at the end
            self._heading = re.sub(r"\s+", " ", "".join(self._in_heading)).strip()
            self._in_heading = None
        self._flush()


def _html_sections(text: str) -> list[_Section]:
    parser = _HTMLSections()
    parser.feed(text)
    parser.close()
    return parser.sections


def _document_records(
    path: Path,
    data: Path,
    day: date | None,
    date_source: str,
    email_ids: list[str],
    errors: _Errors,
) -> list[Record]:
    rel = _rel(path, data)
    try:
        text = _read_text(path)
    except InputError as exc:
        errors(exc)
        return []
    is_html = path.suffix.lower() in (".html", ".htm")
    sections = _html_sections(text) if is_html else _markdown_sections(text)
    titled = [s for s in sections if s.heading]
    title = _plain_heading(titled[0].heading) if titled else None
    records: list[Record] = []
    seen: dict[str, int] = {}
    path_stack: list[tuple[int, str]] = []
    for position, s in enumerate(sections, start=1):
        label = PREAMBLE if s.heading is None else (s.heading or "(untitled)")
        base = f"{path.name}:{label}"
        seen[base] = seen.get(base, 0) + 1
        rid = base if seen[base] == 1 else f"{base} ({seen[base]})"
        while rid in seen and rid != base:  # "(2)" collides with a real heading
            seen[base] += 1
            rid = f"{base} ({seen[base]})"
        seen.setdefault(rid, 1)
        if s.heading is not None:
            path_stack = [(lv, h) for lv, h in path_stack if lv < s.level]
            path_stack.append((s.level, _plain_heading(s.heading)))
        metadata: dict[str, Any] = {
            "source": f"{rel}:{s.line}",
            "document": path.name,
            "attachment_index": int(path.name.split("_", 1)[0]),
            "heading": _plain_heading(s.heading) if s.heading is not None else PREAMBLE,
            "heading_level": s.level,
            "heading_path": [h for _, h in path_stack] if s.heading is not None else [],
            "title": title,
            "date_source": date_source,
        }
        records.append(
            Record(
                id=rid,
                kind=RecordKind.DOCUMENT_SECTION,
                text=s.text,
                timestamp=datetime(day.year, day.month, day.day) if day else None,
                thread_id=path.name,
                position=position,
                references=list(email_ids),
                metadata=metadata,
            )
        )
    return records


def _plain_heading(heading: str) -> str:
    """Heading text without Markdown emphasis/link syntax (``**A** [b](u)`` → ``A b``)."""
    h = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    h = re.sub(r"(\*\*|__|\*|`)", "", h)
    return re.sub(r"\s+", " ", h).strip()
