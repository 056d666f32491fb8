"""Records from a Hugging Face ``datasets`` dataset, given a column mapping.

``columns`` maps Record fields to dataset columns, e.g.
``{"id": "msg_id", "text": "body", "timestamp": "sent_at", "thread_id": "conversation"}`` (or
the string form ``"id=msg_id,text=body,..."``). ``id`` and ``text`` are required; a field left
unmapped whose column has the field's own name is used as is; ``kind`` defaults to ``note``;
other columns go into ``metadata``. Nothing is downloaded: ``path`` is a dataset saved with
``save_to_disk``, a local data file or folder that ``load_dataset`` reads (json, jsonl, csv,
parquet), or an in-memory ``datasets.Dataset``.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import Any

from memsteer_dspy.errors import InputError
from memsteer_dspy.loaders.base import Loaded, SkippedInput
from memsteer_dspy.records import History, Record, check_record_dict

RECORD_FIELDS = ("id", "kind", "text", "timestamp", "author", "thread_id", "position", "references")
_BUILDERS = {
    ".json": "json",
    ".jsonl": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".txt": "text",
}


def parse_columns(columns: str | dict[str, str] | None) -> dict[str, str]:
    if columns is None:
        return {}
    if isinstance(columns, dict):
        mapping = dict(columns)
    else:
        mapping = {}
        for part in filter(None, (p.strip() for p in columns.split(","))):
            field, sep, column = part.partition("=")
            if not sep or not field.strip() or not column.strip():
                raise InputError(
                    f"bad column mapping {part!r}",
                    field="--columns",
                    hint="write field=column pairs, e.g. 'id=msg_id,text=body'",
                )
            mapping[field.strip()] = column.strip()
    unknown = set(mapping) - set(RECORD_FIELDS)
    if unknown:
        raise InputError(
            f"unknown record field(s) {sorted(unknown)}",
            field="--columns",
            hint=f"mappable fields: {', '.join(RECORD_FIELDS)}",
        )
    return mapping


def _open_dataset(path: str | Path, split: str | None):
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - a core dependency
        raise InputError("the 'datasets' package is not installed") from exc
    if isinstance(path, datasets.Dataset):
        return path, "<in-memory dataset>"
    p = Path(path)
    if not p.exists():
        raise InputError(
            "no such file or folder",
            file=p,
            hint="give a dataset saved with save_to_disk or a local data file; nothing is downloaded",
        )
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    if p.is_dir() and ((p / "dataset_info.json").exists() or (p / "dataset_dict.json").exists()):
        ds = datasets.load_from_disk(str(p))
    elif p.is_file():
        builder = _BUILDERS.get(p.suffix.lower())
        if builder is None:
            raise InputError(
                f"cannot read {p.suffix!r} files", file=p, hint=f"use one of {sorted(_BUILDERS)}"
            )
        ds = datasets.load_dataset(builder, data_files=str(p))
    else:
        ds = datasets.load_dataset(str(p))
    if isinstance(ds, datasets.DatasetDict):
        names = list(ds)
        if split is None:
            split = "train" if "train" in ds else names[0] if len(names) == 1 else None
        if split not in ds:
            raise InputError(
                f"no split {split!r}", file=p, field="--split", hint=f"splits: {', '.join(names)}"
            )
        ds = ds[split]
    return ds, str(p)


def _value(v: Any) -> Any:
    if isinstance(v, datetime):
        return v.isoformat()
    return v


def load_hf(
    path,
    *,
    columns: str | dict[str, str] | None = None,
    split: str | None = None,
    user: str | None = None,
    on_error: str = "raise",
) -> Loaded:
    """Load records from a ``datasets`` dataset with a column mapping."""
    ds, where = _open_dataset(path, split)
    mapping = parse_columns(columns)
    present = set(ds.column_names)
    for field in RECORD_FIELDS:
        if field not in mapping and field in present:
            mapping[field] = field
    for field in ("id", "text"):
        if field not in mapping:
            raise InputError(
                f"no column for the required field {field!r}",
                file=where,
                field=field,
                hint=f"map one with --columns {field}=<column>; columns: {', '.join(ds.column_names)}",
            )
    missing = {f: c for f, c in mapping.items() if c not in present}
    if missing:
        raise InputError(
            f"mapped column(s) not in the dataset: {missing}",
            file=where,
            field="--columns",
            hint=f"columns: {', '.join(ds.column_names)}",
        )
    meta_columns = [c for c in ds.column_names if c not in mapping.values()]
    skipped: list[SkippedInput] = []
    records: list[Record] = []
    for i, row in enumerate(ds):
        obj: dict[str, Any] = {f: _value(row[c]) for f, c in mapping.items() if row[c] is not None}
        obj["id"] = str(obj.get("id", ""))
        obj.setdefault("kind", "note")
        if isinstance(obj.get("references"), str):
            obj["references"] = [r.strip() for r in obj["references"].split(",") if r.strip()]
        obj["metadata"] = {"source": f"{where}[{i}]", **{c: _value(row[c]) for c in meta_columns}}
        try:
            records.append(check_record_dict(obj, file=where, line=None))
        except InputError as exc:
            reason = f"row {i}: {exc.message}" + (f" (field {exc.field!r})" if exc.field else "")
            if on_error == "skip":
                skipped.append(SkippedInput(where, None, reason))
                continue
            raise InputError(
                f"row {i}: {exc.message}",
                file=where,
                field=exc.field,
                record=obj["id"] or None,
                hint=exc.hint,
            ) from None
    return Loaded(History(user or Path(where).stem, records, source=where), [], [], skipped)
