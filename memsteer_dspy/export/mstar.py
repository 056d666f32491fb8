"""Supervision for M* (wbopan/mstar, formats as of commit d5b5a6ff: ``mstar/datasets.py``,
``mstar/benchmarks/locomo.py``; ``mstar/evolution/types.py`` as of 3baf20c2).

M* evolves a knowledge-base program. Its datasets are Python loaders registered with
``@register_dataset(name)`` (``mstar.datasets``) that return
``Dataset(train, val, test, compare_fn, available_categories, extra_scorers, category_key)`` of
``DataItem(raw_text, question, expected_answer, metadata)``: train items with ``raw_text`` are
ingested into the knowledge base, val items are questions scored against ``expected_answer``.
:func:`export_mstar` writes

* ``records.jsonl`` — one line per record: ``{"id", "raw_text", "timestamp", "kind"}`` (the
  train items; ``raw_text`` is :func:`~memsteer_dspy.export.common.record_raw_text`);
* ``qa.jsonl`` — one line per QA item: ``{"id", "question", "answer", "qa_category",
  "evidence_ids", "span_ids", "split", "question_date"}`` (the val items);
* ``memsteer_<name>.py`` — the loader module to copy into ``mstar/benchmarks/`` (and import from
  its ``__init__.py``); it reads the two files above from ``data_dir`` (default: this export
  folder) with the standard library only;
* ``README.md`` — the steps and the command line.

The loader keeps M*'s LoCoMo conventions: ``TokenF1Scorer`` as ``compare_fn`` with an ``em``
extra scorer, ``category_key="qa_category"``, ``category`` selects one QA category, and
``test=[]`` so ``--test-size`` carves the held-out test set from val.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from memsteer_dspy.errors import InputError
from memsteer_dspy.export.common import (
    ExportItem,
    check_export_folder,
    jsonl,
    record_raw_text,
    unresolved_evidence,
    write_atomic,
)
from memsteer_dspy.records import History

MSTAR_COMMIT = "d5b5a6ffeeb129feaf312fcf32d711fdcbc83254"

LOADER_TEMPLATE = '''"""M* dataset {name!r}: MemSteer supervision exported by `memsteer export --to mstar`.

Train items are the user's records (timestamped text, ingested into the knowledge base); val items
are the verified QA items (metadata: qa_category, evidence_ids, span_ids, split, question_date).
Copy this file into mstar/benchmarks/ and add `import mstar.benchmarks.{module} as {module}` to
mstar/benchmarks/__init__.py. Generated from {n_records} records and {n_qa} QA items of user {user!r}.
"""

from __future__ import annotations

import json
from pathlib import Path

from mstar.datasets import register_dataset
from mstar.evolution.evaluator import ExactMatchScorer, TokenF1Scorer
from mstar.evolution.types import DataItem, Dataset

DATA_DIR = Path({data_dir!r})


def _read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@register_dataset({name!r})
def load_{ident}(*, category: str | None = None, data_dir: str | None = None, splits: str = "train,val") -> Dataset:
    """Records as train items; QA items of the given supervision `splits` as val items.

    Args:
        category: keep only the QA items of this qa_category (None = all).
        data_dir: the folder holding records.jsonl and qa.jsonl (default: where they were exported).
        splits: which MemSteer splits become M* val items (comma-separated: train, val, official).
    """
    folder = Path(data_dir) if data_dir else DATA_DIR
    records = _read_jsonl(folder / "records.jsonl")
    qa = _read_jsonl(folder / "qa.jsonl")
    wanted = {{s.strip() for s in str(splits).split(",") if s.strip()}}
    qa = [q for q in qa if q["split"] in wanted]
    categories = sorted({{q["qa_category"] for q in qa}})
    if category is not None:
        if category not in categories:
            raise ValueError(f"unknown category {{category!r}}. Available: {{', '.join(categories)}}")
        qa = [q for q in qa if q["qa_category"] == category]
    train = [
        DataItem(raw_text=r["raw_text"], question="", expected_answer="",
                 metadata={{"record_id": r["id"], "timestamp": r["timestamp"], "kind": r["kind"]}})
        for r in records
    ]
    val = [
        DataItem(raw_text="", question=q["question"], expected_answer=q["answer"],
                 metadata={{"qa_id": q["id"], "qa_category": q["qa_category"], "evidence_ids": q["evidence_ids"],
                           "span_ids": q["span_ids"], "split": q["split"], "question_date": q["question_date"]}})
        for q in qa
    ]
    return Dataset(
        train=train, val=val, test=[], compare_fn=TokenF1Scorer(), available_categories=categories,
        extra_scorers={{"em": ExactMatchScorer()}}, category_key="qa_category",
    )
'''

README_TEMPLATE = """# MemSteer supervision for M* (dataset `{name}`)

Exported by `memsteer export --to mstar` from user `{user}`: {n_records} records (M* train items,
ingested as knowledge) and {n_qa} QA items (M* val items). Formats follow wbopan/mstar at commit
{commit}.

1. Copy `{module}.py` into `src/mstar/benchmarks/` and add to `src/mstar/benchmarks/__init__.py`:

       import mstar.benchmarks.{module} as {module}

2. Run the evolution with every record ingested (`--eval-train-ratio -1`), holding out a test set
   from the QA items (`--test-size N`; without it M* copies val as test, which is not a held-out
   result):

       python -m mstar.evolution --dataset {name} --eval-train-ratio -1 --test-size {test_size} \\
           --output-dir outputs/{name}

   Loader arguments go after the flags as `key=value`: `data_dir=/path/to/this/folder` when the
   folder moved, `splits=val` to score on the supervision's val split only.
"""


def _identifier(name: str) -> str:
    ident = re.sub(r"\W+", "_", name).strip("_").lower()
    if not ident or ident[0].isdigit():
        ident = "d_" + ident
    return ident


def export_mstar(
    history: History, items: list[ExportItem], out: str | Path, *, name: str | None = None
) -> dict:
    """Write the M* files for ``history`` and ``items`` into ``out`` (see the module docstring);
    returns a summary (paths and counts)."""
    out = Path(out).resolve()
    check_export_folder(out)
    name = name or f"memsteer_{history.user_id}"
    ident = _identifier(name)
    module = ident if ident.startswith("memsteer") else f"memsteer_{ident}"
    if not items:
        raise InputError(
            "no QA items to export",
            field="--supervision",
            hint="pass a folder `memsteer generate` wrote, or --supervision official",
        )
    records = [
        {
            "id": r.id,
            "raw_text": record_raw_text(r),
            "timestamp": r.timestamp.isoformat() if r.timestamp else None,
            "kind": r.kind,
        }
        for r in history
    ]
    qa = [
        {
            "id": e.item.id,
            "question": e.item.question,
            "answer": e.item.answer,
            "qa_category": e.category,
            "evidence_ids": list(e.item.evidence_ids),
            "span_ids": list(e.item.span_ids),
            "split": e.split,
            "question_date": e.item.question_date.isoformat() if e.item.question_date else None,
        }
        for e in items
    ]
    fill = {
        "name": name,
        "module": module,
        "ident": ident,
        "user": history.user_id,
        "data_dir": str(out),
        "n_records": len(records),
        "n_qa": len(qa),
        "commit": MSTAR_COMMIT,
        "test_size": max(1, len(qa) // 3),
    }
    write_atomic(out / "records.jsonl", jsonl(records))
    write_atomic(out / "qa.jsonl", jsonl(qa))
    write_atomic(out / f"{module}.py", LOADER_TEMPLATE.format(**fill))
    write_atomic(out / "README.md", README_TEMPLATE.format(**fill))
    summary = {
        "to": "mstar",
        "dataset": name,
        "loader": str(out / f"{module}.py"),
        "records": len(records),
        "qa_items": len(qa),
        "out": str(out),
        "follows": f"wbopan/mstar@{MSTAR_COMMIT}",
        "unresolved_evidence": unresolved_evidence(history, items),
    }
    write_atomic(out / "export.json", json.dumps(summary, indent=2) + "\n")
    return summary
