"""The supervision MemSteer-Opt runs on: generated train/val QA files, or official QA split.

* a folder with ``train.jsonl`` and ``val.jsonl`` (QAItem lines, as ``memsteer generate`` writes);
* ``official`` — the benchmark's own QA items split per persona into 40% train and 20% validation
  (the paper's Official-QA reference, Appendix A.3), seeded; the remaining 40% are the held-out
  test split (:func:`official_test`), never used for feedback or selection. Generated and official
  supervision go through exactly the same loop.

A generated supervision folder gets its held-out test split from a ``--test`` QA file, or by
default a seeded share (30%) of its items carved out by bundle (:func:`carve_test`), so no test
question shares a bundle with a train or validation question.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

from memsteer_dspy.errors import InputError
from memsteer_dspy.loaders.jsonl import read_qa_items
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


def official_test(items: list[QAItem], *, seed: int = 0) -> list[QAItem]:
    """The official items :func:`split_official` leaves out (per persona, same seed): the test split."""
    train, val = split_official(items, seed=seed)
    used = {q.id for q in [*train, *val]}
    return [q for q in items if q.id not in used]


TEST_FRACTION = 0.3


def bundle_of(item: QAItem) -> str:
    """The bundle a generated item came from (its own id when it has no provenance)."""
    return str((item.metadata.get("provenance") or {}).get("bundle_id") or item.id)


def carve_test(
    train: list[QAItem], val: list[QAItem], *, fraction: float = TEST_FRACTION, seed: int = 0
) -> tuple[list[QAItem], list[QAItem], list[QAItem]]:
    """Take about ``fraction`` of the items, whole bundles at a time in a seeded order, out of
    ``train`` and ``val`` as a held-out test split; returns (train, val, test). Each side keeps at
    least one item."""
    if not 0 < fraction < 1:
        raise InputError(
            f"the test fraction must be between 0 and 1, not {fraction}", field="--test-fraction"
        )
    groups: dict[str, list[QAItem]] = {}
    for q in [*train, *val]:
        groups.setdefault(bundle_of(q), []).append(q)
    order = sorted(groups, key=lambda b: hashlib.sha256(f"test:{seed}:{b}".encode()).hexdigest())
    target = round(fraction * (len(train) + len(val)))
    test_ids: set[str] = set()
    for b in order:
        if len(test_ids) >= target:
            break
        test_ids.update(q.id for q in groups[b])
    new_train = [q for q in train if q.id not in test_ids]
    new_val = [q for q in val if q.id not in test_ids]
    if not new_train or not new_val:
        raise InputError(
            f"carving {fraction:.0%} of {len(train) + len(val)} items out as a test split leaves "
            f"{len(new_train)} train / {len(new_val)} validation items",
            field="--test-fraction",
            hint="generate more supervision, or pass --test PATH with held-out items",
        )
    test = list({q.id: q for q in [*train, *val] if q.id in test_ids}.values())
    return new_train, new_val, test


def read_supervision(folder: str | Path) -> tuple[list[QAItem], list[QAItem]]:
    """Read ``train.jsonl`` and ``val.jsonl`` from a supervision folder (the two must not share
    an item id)."""
    folder = Path(folder)
    out = []
    for name in ("train.jsonl", "val.jsonl"):
        path = folder / name
        if not path.is_file():
            raise InputError(
                f"the supervision folder has no {name}",
                file=folder,
                hint="pass --supervision official, or a folder `memsteer generate` wrote (train.jsonl and val.jsonl)",
            )
        items = read_qa_items(path, on_error="raise", skipped=[])
        if not items:
            raise InputError(
                f"{name} has no QA items",
                file=path,
                hint="generate supervision first (memsteer generate)",
            )
        out.append(items)
    train_ids = {q.id for q in out[0]}
    shared = [q.id for q in out[1] if q.id in train_ids]
    if shared:
        shown = ", ".join(repr(i) for i in shared[:5]) + (" ..." if len(shared) > 5 else "")
        raise InputError(
            f"{len(shared)} item id(s) are in both train.jsonl and val.jsonl ({shown}): selecting on "
            "items the feedback was drawn from would overstate every design",
            file=folder / "val.jsonl",
            record=shared[0],
            hint="keep each item in one split (memsteer generate writes disjoint ones)",
        )
    return out[0], out[1]


def ids_digest(items: list[QAItem]) -> str:
    """A short hash of the item ids (what a resumed run checks it still optimizes on)."""
    h = hashlib.sha256("\n".join(q.id for q in items).encode("utf-8"))
    return h.hexdigest()[:16]
