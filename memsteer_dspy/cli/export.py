"""``memsteer export``: hand MemSteer supervision (and a tuned design) to M* or MemEvolve.

(No ``from __future__ import annotations`` here: typer must see the real ``Annotated`` options.)
"""

from pathlib import Path
from typing import Annotated

import typer

from memsteer_dspy.cli.common import HistoryArgs, cli_errors, echo_json, history_options
from memsteer_dspy.errors import InputError
from memsteer_dspy.export import export_memevolve, export_mstar, qa_export_items
from memsteer_dspy.export.common import ExportItem
from memsteer_dspy.memory import MemoryDesign
from memsteer_dspy.optimize.splits import read_supervision
from memsteer_dspy.runfolder import check_not_inputs

TARGETS = ("mstar", "memevolve")


@cli_errors
@history_options
def export(
    history: HistoryArgs,
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="Target optimizer: 'mstar' (wbopan/mstar dataset loader + data) or 'memevolve' (EvolveLab memory provider + tasks).",
        ),
    ],
    supervision: Annotated[
        str,
        typer.Option(
            "--supervision",
            "-s",
            help="A folder with train.jsonl and val.jsonl (as `memsteer generate` writes), or 'official' (the format's own QA items).",
        ),
    ],
    out: Annotated[
        Path,
        typer.Option(
            "--out", "-o", help="Folder to write the export into (created; files are replaced)."
        ),
    ],
    design: Annotated[
        str,
        typer.Option(
            "--design",
            "-d",
            help="memevolve: 'base-bm25' or the path of a design JSON (e.g. the best_design.json `memsteer optimize` writes).",
        ),
    ] = "base-bm25",
    name: Annotated[
        str | None,
        typer.Option(
            "--name", help="mstar: the dataset name to register (default memsteer_<user>)."
        ),
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the export summary as JSON.")
    ] = False,
) -> None:
    """Export the history and its supervision for another memory optimizer: M* (train items =
    records, val items = QA) or MemEvolve (a provider serving a MemoryDesign, QA as tasks). The
    folder's README.md says how to plug it in."""
    if to not in TARGETS:
        raise typer.BadParameter(f"choose one of {', '.join(TARGETS)}", param_hint="--to")
    check_not_inputs(out, [history.path, supervision, design])
    loaded = history.load()
    if supervision == "official":
        if not loaded.qa_items:
            raise InputError(
                f"the {history.format} history has no official QA items",
                field="--supervision",
                hint="pass a folder with train.jsonl and val.jsonl (memsteer generate writes one)",
            )
        items = [ExportItem(q, "official") for q in loaded.qa_items]
    else:
        items = qa_export_items(*read_supervision(supervision))
    if to == "mstar":
        summary = export_mstar(loaded.history, items, out, name=name)
    else:
        d = MemoryDesign.base_bm25() if design == "base-bm25" else MemoryDesign.load(design)
        summary = export_memevolve(loaded.history, d, items, out)
    unresolved = summary.get("unresolved_evidence") or []
    if unresolved:
        shown = ", ".join(f"{u['qa_id']}: {u['evidence_id']!r}" for u in unresolved[:5])
        typer.secho(
            f"warning: {len(unresolved)} evidence id(s) are not records of the history and were "
            f"exported as they are: {shown}{' ...' if len(unresolved) > 5 else ''}",
            fg=typer.colors.YELLOW,
            err=True,
        )
    if json_out:
        echo_json(summary)
        return
    typer.echo(
        f"exported {summary['records']} records and {summary['qa_items']} QA items for {to} to {summary['out']}"
    )
    typer.echo(
        f"formats follow {summary['follows']}; next steps: {Path(summary['out']) / 'README.md'}"
    )
