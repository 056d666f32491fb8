"""History loaders. Each returns a :class:`~memsteer_dspy.loaders.base.Loaded`: the History, the
QA items where the format has them, unresolved evidence and skipped input.

==========  ===========================================================================
format      reads
==========  ===========================================================================
``jsonl``   native records, one JSON object a line (:mod:`.jsonl`)
``rhelm``   one persona of the RHELM benchmark (:mod:`.rhelm`)
``locomo``  one sample of a ``locomo10.json``-shaped file (:mod:`.locomo`)
``hf``      any ``datasets`` dataset with a column mapping (:mod:`.hf`)
``longmemeval``  one instance of a LongMemEval ``_s``/``_m``/``_oracle`` file (:mod:`.longmemeval`)
``atm``     ATM-Bench's emails and image/video captions with a QA file (:mod:`.atm`)
==========  ===========================================================================
"""

from __future__ import annotations

from pathlib import Path

from memsteer_dspy.errors import InputError
from memsteer_dspy.loaders.atm import load_atm
from memsteer_dspy.loaders.base import Loaded, SkippedInput, UnresolvedEvidence
from memsteer_dspy.loaders.hf import load_hf
from memsteer_dspy.loaders.jsonl import load_jsonl
from memsteer_dspy.loaders.locomo import load_locomo
from memsteer_dspy.loaders.longmemeval import load_longmemeval
from memsteer_dspy.loaders.rhelm import default_rhelm_root, list_personas, load_rhelm

__all__ = ["Loaded", "SkippedInput", "UnresolvedEvidence", "load_history"]


def load_history(
    format: str,
    path: str | Path | None,
    *,
    user: str | None = None,
    external: bool = True,
    on_error: str = "raise",
    columns: str | dict[str, str] | None = None,
    split: str | None = None,
) -> Loaded:
    """Load a history in ``format`` from ``path`` (see the module docstring for the formats)."""
    if format == "rhelm":
        root = Path(path) if path is not None else default_rhelm_root()
        if root is None:
            raise InputError(
                "RHELM data not found",
                field="--path",
                hint="pass --path <rhelm folder> or set MEMSTEER_RHELM_ROOT",
            )
        if user is None:
            raise InputError(
                "choose a persona with --user",
                file=root,
                field="--user",
                hint=f"available: {', '.join(list_personas(root))}",
            )
        return load_rhelm(root, user, external=external, on_error=on_error)
    if path is None:
        raise InputError(f"--path is required for format {format!r}", field="--path")
    if format == "jsonl":
        return load_jsonl(path, user=user, on_error=on_error)
    if format == "locomo":
        return load_locomo(path, user=user, on_error=on_error)
    if format == "hf":
        return load_hf(path, columns=columns, split=split, user=user, on_error=on_error)
    if format == "longmemeval":
        return load_longmemeval(path, user=user, on_error=on_error)
    if format == "atm":
        return load_atm(path, user=user, on_error=on_error)
    raise InputError(
        f"unknown format {format!r}",
        field="--format",
        hint="choose jsonl, rhelm, locomo, hf, longmemeval or atm",
    )
