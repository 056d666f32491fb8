"""Question-writer demonstrations from hand-written questions of *another* history (``generate
--writer-examples K``): labelled few-shot examples, as ``dspy.LabeledFewShot`` gives a predictor.
The source is a JSONL history with its QA (``records.jsonl`` + ``qa.jsonl``): by default the
package's fictional one (``data/writer_examples``: twelve one-record questions of a made-up user,
so that neither the demo's hand-written questions nor a benchmark's, the references supervision is
measured against, are shown to the writer), never the history generated for (its questions would
be copied).

The embedded question writer, told "in your own words", mostly copies its evidence sentence (the
own-words check then rejects it as ``question:echoes``: 12 of 40 candidates of the bridge3-elena
run). A hand-written question shows the other way: "Who is teaching my data visualization class?"
for "Instructor: Daniel Osei (VIZ 110: Data Visualization…)". Each example is put in the writer's
own input format — the record cut to its sentence and the sentences around it, the program's
sentence ask (:func:`~memsteer_dspy.supervision.asks.sentence_ask`), the fact, the answer — with
the hand-written question as its output, so the writer sees an ask become a question in other
words. Only one-record questions that pass the own-words check
(:func:`~memsteer_dspy.supervision.question_checks.echoes`) against their record, with short
answers of the kinds the anchored planner chooses, are used.

Measured against RHELM's official questions as the source (personas other than the target's):
their one-record questions are long and lean on context from other records ("During the period
when my primary camera was unavailable, which model did I rely on …?"), and a date question cannot
be placed on its sentence reliably — a writer shown them would write detail its record does not
hold (``unknown_detail``). Hence a history of plain hand-written questions as the source.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Collection, Sequence
from importlib import resources
from pathlib import Path

import dspy
from pydantic import BaseModel, ConfigDict

from memsteer_dspy.bundles import BundleConfig, bundle_from_records
from memsteer_dspy.errors import InputError
from memsteer_dspy.records import History, QAItem, Record
from memsteer_dspy.supervision.asks import first_person, sentence_ask
from memsteer_dspy.supervision.question_checks import _stems, echoes

WRITER_EXAMPLE_TYPES = ("entity", "number", "text", "date")
"""The answer kinds an example may have, drawn in this order (one each, then round again)."""
MAX_QUESTION_WORDS = 25
"""An example question's most words: the writer's own limit (``too_long``)."""
MAX_ANSWER_WORDS = 5
MIN_SHARED_STEMS = 2
"""A date question (its answer is its record's date, not in a sentence) is placed on the sentence
sharing the most word stems with it, and on none sharing fewer than this many."""
CONTEXT_SPANS = 1
"""Sentences kept on each side of the example's sentence (the record is cut to them: the writer's
prompt carries every example on every call)."""


class WriterExample(BaseModel):
    """One demonstration for the question writer (:class:`signatures.question.WriteQuestion`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str
    """``<user>/<QA id>``."""
    records: str
    ask: str
    facts: list[str]
    answer: str
    answer_type: str
    question: str

    def example(self) -> dspy.Example:
        return dspy.Example(
            records=self.records,
            ask=self.ask,
            facts=list(self.facts),
            answer=self.answer,
            answer_type=self.answer_type,
            avoid="none",
            question=self.question,
        ).with_inputs("records", "ask", "facts", "answer", "answer_type", "avoid")


def examples_key(examples: Sequence[WriterExample]) -> dict[str, str | list[str]]:
    """What a run's key records of its examples: their sources and a digest of their content (an
    example rebuilt differently from the same question is another setting)."""
    blob = json.dumps([e.model_dump(mode="json") for e in examples], sort_keys=True)
    return {
        "sources": [e.source for e in examples],
        "sha256": hashlib.sha256(blob.encode()).hexdigest()[:16],
    }


def _word_in(answer: str, text: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(answer)}(?!\w)", text, re.I) is not None


def example_of(user: str, item: QAItem, record: Record) -> WriterExample | None:
    """``item`` as a writer demonstration, or None where it does not make a clean one (a long
    question or answer, an answer kind the planner does not choose, a question that echoes its
    record or names its answer, no sentence it is about)."""
    answer, kind, question = item.answer.strip().rstrip("."), str(item.answer_type), item.question
    if kind not in WRITER_EXAMPLE_TYPES or not answer or len(answer.split()) > MAX_ANSWER_WORDS:
        return None
    if not question.rstrip().endswith("?") or len(question.split()) > MAX_QUESTION_WORDS:
        return None
    if _word_in(answer, question) or echoes(question, record.text, answer) is not None:
        return None
    date = record.timestamp.date().isoformat() if record.timestamp else None
    if kind == "date" and answer != date:  # only questions answered by their record's date
        return None
    bundle = bundle_from_records(History(user, [record]), [record.id], BundleConfig())
    spans = bundle.spans()
    if kind == "date":
        asked = _stems(question)
        shared = [len(asked & _stems(s.text)) for s in spans]
        best = max(range(len(spans)), key=shared.__getitem__, default=None)
        at = best if best is not None and shared[best] >= MIN_SHARED_STEMS else None
    else:
        at = next((i for i, s in enumerate(spans) if _word_in(answer, s.text)), None)
    if at is None:
        return None
    sentence = spans[at].text
    kept = spans[max(0, at - CONTEXT_SPANS) : at + CONTEXT_SPANS + 1]
    cut = record.model_copy(update={"text": " ".join(s.text for s in kept)})
    view = bundle_from_records(History(user, [cut]), [cut.id], BundleConfig()).view()
    fact = f"(in a record dated {date}): {sentence}" if kind == "date" and date else sentence
    return WriterExample(
        source=f"{user}/{item.id}",
        records=view.text,
        ask=first_person(sentence_ask(sentence, answer, kind), keep_quoted=True),
        facts=[fact],
        answer=answer,
        answer_type=kind,
        question=question,
    )


SMALL_LM_WRITER_EXAMPLES = 4
"""Question-writer examples the small-LM pipeline shows by default (one of each answer kind;
measured: ``experiments/results/steering.md``, the v20 and v21 runs)."""


def default_writer_examples(
    history: History, seed: int, k: int = SMALL_LM_WRITER_EXAMPLES
) -> list[WriterExample]:
    """The small-LM pipeline's examples: ``k`` from the packaged fictional history, refused when
    ``history`` is that history (``generate`` without ``--writer-examples-from``, ``demo``)."""
    return writer_examples(
        packaged_examples_path(), k, seed=seed, not_records=[r.id for r in history.records]
    )


def packaged_examples_path() -> Path:
    """The package's fictional example history (``data/writer_examples``)."""
    folder = resources.files("memsteer_dspy") / "data" / "writer_examples"
    if not isinstance(folder, Path) or not (folder / "qa.jsonl").is_file():
        raise InputError(
            f"the packaged question-writer examples are missing ({folder})",
            field="writer_examples",
            hint="reinstall memsteer-dspy as a regular or editable package, or give "
            "--writer-examples-from",
        )
    return folder


def writer_examples(
    path: str | Path,
    k: int,
    *,
    seed: int = 0,
    not_history: str | Path | None = None,
    not_records: Collection[str] = (),
) -> list[WriterExample]:
    """``k`` writer demonstrations from the JSONL history with QA at ``path``: one of each answer
    kind in turn (:data:`WRITER_EXAMPLE_TYPES`), chosen by ``seed``. ``not_history`` and
    ``not_records`` are the history generated for (its file, its record ids): a source that is that
    file, or shares half its records with it, is refused."""
    from memsteer_dspy.loaders.jsonl import load_jsonl

    if k <= 0:
        return []
    path = Path(path)
    loaded = load_jsonl(path)
    same_file = not_history is not None and _same_history(path, Path(not_history))
    ids = {r.id for r in loaded.history.records}
    if same_file or len(ids & set(not_records)) * 2 >= len(ids):
        raise InputError(
            "the question-writer examples come from the history generated for",
            file=path,
            field="writer_examples",
            hint="its own questions would be copied into its supervision, and they may be the "
            "reference it is measured against: give another history's questions "
            "(--writer-examples-from), or generate without examples (--writer-examples 0)",
        )
    records = {r.id: r for r in loaded.history.records}
    pool = []
    for item in sorted(loaded.qa_items, key=lambda q: q.id):
        if len(item.evidence_ids) == 1 and (record := records.get(item.evidence_ids[0])):
            if (made := example_of(loaded.history.user_id, item, record)) is not None:
                pool.append(made)
    random.Random(seed).shuffle(pool)
    chosen: list[WriterExample] = []
    while len(chosen) < k:
        before = len(chosen)
        for kind in WRITER_EXAMPLE_TYPES:
            left = [e for e in pool if e.answer_type == kind and e not in chosen]
            if len(chosen) < k and left:
                chosen.append(left[0])
        if len(chosen) == before:
            raise InputError(
                f"only {len(chosen)} usable question-writer examples in {path}, {k} asked for",
                file=path,
                field="writer_examples",
                hint="a usable example is a one-record question with a short entity, number, text "
                "or date answer its record states, not copying the record's words; ask for fewer",
            )
    return chosen


def _same_history(a: Path, b: Path) -> bool:
    def records_file(p: Path) -> Path:
        return (p / "records.jsonl" if p.is_dir() else p).resolve()

    return records_file(a) == records_file(b)
