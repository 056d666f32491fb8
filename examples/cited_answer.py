"""Compose two memsteer-dspy signatures into a new DSPy program: a cited, self-checked answer.

``CitedAnswer`` reuses the blind reader's signature (``BlindRead``: answer from labelled records
and cite the sentences) and the answer-verification signature (``VerifyAnswer``: check a draft
against a context and correct it) in a way the suite itself never does: the verifier sees only
the sentences the reader cited, so an answer that its own citations do not support is corrected
or withdrawn. It runs under DSPy's ``ChatAdapter`` (the suite's roles use the ``JSONAdapter``);
ChatAdapter falls back to JSON by itself when a small model's reply cannot be parsed.

    python examples/cited_answer.py                                   # embedded model, demo history
    python examples/cited_answer.py --lm openai/gpt-4.1-mini --question "What time does the Columbia Gorge Half Marathon start?"
    python examples/cited_answer.py --history my_history.jsonl --question "..." --k 5

Records come from Base-BM25 retrieval over the history (native JSONL; default: the bundled demo
history). Prints the answer, the draft, whether the cited sentences support it, and the citations.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import dspy

from memsteer_dspy.records import Record
from memsteer_dspy.signatures.answer import VerifyAnswer
from memsteer_dspy.signatures.blind_read import BlindRead

DEMO = Path(__file__).resolve().parent.parent / "memsteer_dspy" / "data" / "demo" / "records.jsonl"
DEFAULT_QUESTION = "Which restaurant did we book for our anniversary dinner in Lisbon?"


def label_records(records: list[Record]) -> tuple[str, dict[str, str]]:
    """Quote records with sentence labels (``R2.3`` = record 2, sentence 3), as the suite's roles
    read them; returns the quoted text and label → sentence."""
    blocks, sentences = [], {}
    for i, r in enumerate(records, start=1):
        when = r.timestamp.date().isoformat() if r.timestamp else "undated"
        lines = [f"[R{i}] {when} ({r.kind})"]
        for s in r.spans:
            label = f"R{i}.{s.index}"
            sentences[label] = s.text
            lines.append(f"{label} {s.text}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks), sentences


def expand_citations(cited_ids: list[str], sentences: dict[str, str]) -> list[str]:
    """The sentence labels cited, in order: a record label (``R2``, what the embedded 1.5B model
    cites under ChatAdapter) stands for all of that record's sentences; unknown labels are dropped."""
    out: dict[str, None] = {}
    for c in cited_ids:
        c = str(c).strip()
        if c in sentences:
            out.setdefault(c, None)
        else:
            for label in sentences:
                if label.startswith(f"{c}."):
                    out.setdefault(label, None)
    return list(out)


class CitedAnswer(dspy.Module):
    """BlindRead answers with citations; VerifyAnswer checks the draft against the cited sentences."""

    def __init__(self):
        super().__init__()
        self.read = dspy.Predict(BlindRead)
        self.verify = dspy.Predict(VerifyAnswer)

    def forward(
        self,
        question: str,
        records: list[Record],
        answer_type: str = "text",
        question_date: str = "unknown",
    ):
        quoted, sentences = label_records(records)
        read = self.read(question=question, answer_type=answer_type, records=quoted)
        cited = expand_citations(read.cited_ids, sentences)
        if not read.answerable or not cited:
            return dspy.Prediction(answer="I don't know", draft=read.answer, supported=False, citations=cited,
                                   cited_text="")  # fmt: skip
        cited_text = "\n".join(f"{c} {sentences[c]}" for c in cited)
        check = self.verify(
            question=question,
            question_date=question_date,
            context=cited_text,
            draft_answer=read.answer,
        )
        return dspy.Prediction(answer=check.answer, draft=read.answer, supported=bool(check.supported),
                               citations=cited, cited_text=cited_text)  # fmt: skip


def retrieve(history_path: Path, question: str, k: int) -> list[Record]:
    """The top ``k`` records for ``question`` under Base-BM25 (no LM)."""
    from memsteer_dspy.loaders import load_history
    from memsteer_dspy.memory import MemoryDesign, MemorySystem

    history = load_history("jsonl", history_path).history
    system = MemorySystem.from_design(MemoryDesign.base_bm25(), history)
    return [history[rid] for rid in system.retrieve(question).ranked_records(k)]


def run(
    question: str, lm, *, history_path: Path = DEMO, k: int = 3, answer_type: str = "text"
) -> dspy.Prediction:
    records = retrieve(history_path, question, k)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        return CitedAnswer()(question=question, records=records, answer_type=answer_type)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--lm",
        default="local/qwen2.5-coder-1.5b",
        help="any memsteer LM string (default: the embedded model)",
    )
    ap.add_argument(
        "--history",
        type=Path,
        default=DEMO,
        help="native JSONL history (default: the demo history)",
    )
    ap.add_argument("--question", default=DEFAULT_QUESTION)
    ap.add_argument(
        "--answer-type",
        default="text",
        choices=["entity", "number", "date", "text", "list", "boolean"],
    )
    ap.add_argument("--k", type=int, default=3, help="records retrieved for the question")
    args = ap.parse_args(argv)
    from memsteer_dspy.lm import load_lm_config

    lm = load_lm_config(None, lm=args.lm).lm("answerer")
    pred = run(args.question, lm, history_path=args.history, k=args.k, answer_type=args.answer_type)
    print(json.dumps({"question": args.question, "answer": pred.answer, "draft": pred.draft,
                      "supported": pred.supported, "citations": pred.citations, "cited_text": pred.cited_text},
                     indent=2, ensure_ascii=False))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
