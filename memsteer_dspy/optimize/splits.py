"""The supervision MemSteer-Opt runs on: generated train/val QA files, or official QA split.

* a folder with ``train.jsonl`` and ``val.jsonl`` (QAItem lines, as ``memsteer generate`` writes);
* ``official`` — the benchmark's own QA items split per persona into 40% train and 20% validation
  (the paper's Official-QA reference, Appendix A.3), seeded; the remaining 40% are not used by the
  optimizer. Generated and official supervision go through exactly the same loop.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

from memsteer_dspy.errors import InputError
from memsteer_dspy.records import QAItem

TRAIN_FRACTION = 0.4
VAL_FRACTION = 0.2


def split_official(
    items: list[QAItem],
    *,
    seed: int = 0,
    train_fraction: float = TRAIN_FRACTION,
    val_fraction: float = VAL_FRACTION,
) -> tuple[list[QAItem], list[QAItem]]:
    """Split official QA items into (train, val), per persona (``metadata['persona']``), seeded."""
    groups: dict[str, list[QAItem]] = {}
    for q in items:
        groups.setdefault(str(q.metadata.get("persona", "")), []).append(q)
    train: list[QAItem] = []
    val: list[QAItem] = []
    for persona in sorted(groups):
        group = sorted(groups[persona], key=lambda q: q.id)
        random.Random(f"official-split:{seed}:{persona}").shuffle(group)
        n_train = round(len(group) * train_fraction)
        n_val = round(len(group) * val_fraction)
        train.extend(group[:n_train])
        val.extend(group[n_train : n_train + n_val])
    return train, val


def read_supervision(folder: str | Path) -> tuple[list[QAItem], list[QAItem]]:
    """Read ``train.jsonl`` and ``val.jsonl`` from a supervision folder."""
    from memsteer_dspy.loaders.jsonl import read_qa_items

    folder = Path(folder)
    out = []
    for name in ("train.jsonl", "val.jsonl"):
        path = folder / name
        if not path.is_file():
            raise InputError(
                f"the supervision folder has no {name}", file=folder,
                hint="pass --supervision official, or a folder `memsteer generate` wrote (train.jsonl and val.jsonl)",
            )  # fmt: skip
        items = read_qa_items(path, on_error="raise", skipped=[])
        if not items:
            raise InputError(
                f"{name} has no QA items",
                file=path,
                hint="generate supervision first (memsteer generate)",
            )
        out.append(items)
    return out[0], out[1]


def ids_digest(items: list[QAItem]) -> str:
    """A short hash of the item ids (what a resumed run checks it still optimizes on)."""
    h = hashlib.sha256("\n".join(q.id for q in items).encode("utf-8"))
    return h.hexdigest()[:16]
