"""The fixed answer program every memory design, reference row and third-party system answers with.

One :class:`MemoryAnswerer` reads the design's context and answers; only the context changes from
one design to the next (paper, Section 3.3). It is written for a small LM and runs unchanged on a
strong one:

0. **records are data**: a sentence addressed to an AI reader is withheld
   (:func:`~memsteer_dspy.untrusted.withhold`);
1. **key lines** (:func:`key_lines`, no LM): the context's sentences that share the most words
   with the question, scored by BM25 (bm25s, the same tokenizer as the designs' BM25 index) over
   the context's own sentences, each with its record's date, in context order. They come after
   the context in the prompt, next to where the answer is written;
2. **read** (the answerer LM): :class:`~memsteer_dspy.signatures.answer.AnswerFromMemory` over the
   question, its date, the context and the key lines, always answering; the program abstains
   ("I don't know", no LM call) only when the context is empty.

Measured on the embedded 1.5B model (issue 47): program 1, the context alone, answered "I don't
know" to every RHELM item, those whose evidence the design fully delivered included
(``experiments/results/answerer.md`` has the figures of both programs).
"""

from __future__ import annotations

import re
from typing import Any

import dspy

from memsteer_dspy.memory.context import UNIT_SEPARATOR
from memsteer_dspy.memory.design import BM25Params
from memsteer_dspy.memory.index import BM25Index
from memsteer_dspy.signatures.answer import AnswerFromMemory
from memsteer_dspy.untrusted import withhold

__all__ = ["ABSTAIN", "ANSWER_PROGRAM_VERSION", "KEY_LINES", "MemoryAnswerer", "key_lines"]

ANSWER_PROGRAM_VERSION = 3
"""In the key of every run whose scores hold answers (a folder resumes only under the program it
was made with). 1: one prediction over the context; 2: key lines, and the LM abstains only when no
line is about the question; 3: the LM always answers from the lines, and the program abstains (no
LM call) only for an empty context (on the embedded model program 2 still answered "I don't know"
to 8 of 9 fully delivered RHELM items)."""
ABSTAIN = "I don't know"
KEY_LINES = 6
"""How many of the context's sentences :func:`key_lines` shows."""
MAX_LINE_CHARS = 300

_HEADER = re.compile(r"^\[([^\]]*)\]\s*$")
_ISO_DAY = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
# a sentence ends at . ! or ? before a capital, not after a title ("Dr. Liu", "Mrs. Patel")
_SENTENCE = re.compile(r"(?<!\b[A-Z][a-z]\.)(?<!\bMrs\.)(?<=[.!?])\s+(?=[A-Z0-9\"'“(])|\n+")


def _sentences(context: str) -> list[tuple[str, str]]:
    """(the record's day or "", sentence) for every sentence of a design's context, in order."""
    out: list[tuple[str, str]] = []
    for block in context.split(UNIT_SEPARATOR):
        day = ""
        for line in block.splitlines():
            if head := _HEADER.match(line.strip()):
                found = _ISO_DAY.search(head.group(1))
                day = found.group(0) if found else day
                continue
            for sentence in _SENTENCE.split(line):
                sentence = sentence.strip()
                if len(sentence.split()) >= 3:
                    out.append((day, sentence[:MAX_LINE_CHARS]))
    return out


def key_lines(question: str, context: str, k: int = KEY_LINES) -> str:
    """The ``k`` sentences of ``context`` that share the most (BM25-weighted) words with
    ``question``, in context order, one per line as ``- [day] sentence``; where fewer share a word
    with it (a paraphrase: the design may have found the record by meaning), the context's first
    sentences fill the rest, as the design ranked them. "none" only for an empty context. A small
    LM given 4,000 tokens of context loses the one sentence that answers; given it again next to
    the question, it reads it."""
    sentences = _sentences(context)
    if not sentences:
        return "none"
    index = BM25Index(BM25Params()).build([s for _, s in sentences])
    scores = index.scores(question)
    ranked = sorted(range(len(sentences)), key=lambda i: (-float(scores[i]), i))
    picked = [i for i in ranked[:k] if scores[i] > 0]
    picked += [i for i in range(len(sentences)) if i not in picked][: k - len(picked)]
    picked.sort()
    return "\n".join(
        f"- [{sentences[i][0]}] {sentences[i][1]}" if sentences[i][0] else f"- {sentences[i][1]}"
        for i in picked
    )


class MemoryAnswerer(dspy.Module):
    """Key lines, then the answerer LM's reading (see the module docstring). ``lm`` is the
    answerer LM (None until one is given); the one predictor, ``read``, is what prompt tuning
    (``memsteer tune-prompts``) tunes."""

    def __init__(
        self, lm: Any = None, *, key_line_count: int = KEY_LINES, read_context: bool = True
    ):
        super().__init__()
        self.read = dspy.Predict(AnswerFromMemory)
        self.read.lm = lm
        self.key_line_count = key_line_count
        # False: the reader gets the key lines only (a prompt a small LM can hold), not the whole
        # context; measured against True by experiments/answerer.py (--programs 3,4)
        self.read_context = read_context

    @property
    def lm(self) -> Any:
        return self.read.lm

    @lm.setter
    def lm(self, value: Any) -> None:
        self.read.lm = value

    def forward(self, question: str, question_date: str, context: str) -> dspy.Prediction:
        context = withhold(context)  # records are data: no instruction to an AI reader is read
        lines = key_lines(question, context, self.key_line_count)
        if lines == "none":  # nothing was delivered: abstain, no LM call
            return dspy.Prediction(answer=ABSTAIN, key_lines=lines)
        shown = context if self.read_context else "(only its key lines, below)"
        out = self.read(
            question=question, question_date=question_date, context=shown, key_lines=lines
        )
        return dspy.Prediction(answer=str(out.answer or "").strip(), key_lines=lines)
