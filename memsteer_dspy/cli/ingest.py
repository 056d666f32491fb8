"""``memsteer ingest``: load a history, print what it holds and how well its QA evidence resolves."""

from typing import Annotated

import typer

from memsteer_dspy.cli.common import HistoryArgs, cli_errors, echo_json, history_options


@cli_errors
@history_options
def ingest(
    history: HistoryArgs,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print one JSON object instead of text.")
    ] = False,
    show_unresolved: Annotated[
        int,
        typer.Option(
            "--show-unresolved", help="How many unresolved evidence ids to list in text mode."
        ),
    ] = 20,
) -> None:
    """Load a history and print records by kind, spans, dates, threads, QA items and evidence resolution."""
    loaded = history.load()
    report = loaded.report()
    if json_out:
        echo_json(report)
        return
    frac = report["evidence_resolved_fraction"]
    lines = [
        f"user          {report['user']}  (fingerprint {report['fingerprint']})",
        f"records       {report['records']}  "
        + ", ".join(f"{k}: {v}" for k, v in report["records_by_kind"].items()),
        f"spans         {report['spans']}",
        f"threads       {report['threads']}",
        f"date range    {' .. '.join(report['date_range']) if report['date_range'] else 'undated'}",
        f"QA items      {report['qa_items']}  "
        + ", ".join(f"{k}: {v}" for k, v in report["qa_by_type"].items()),
    ]
    if frac is not None:
        n_items = sum(
            1 for q in loaded.qa_items if q.evidence_ids or q.metadata.get("raw_evidence")
        )
        ok = round(frac * n_items)
        lines.append(
            f"evidence      {ok}/{n_items} items fully resolved to record ids ({frac:.1%})"
        )
    unresolved = report["unresolved_evidence"]
    if unresolved:
        lines.append(f"unresolved    {len(unresolved)} evidence id(s):")
        lines += [
            f"  {u['qa_id']}: {u['raw']!r} ({u['reason']})" for u in unresolved[:show_unresolved]
        ]
        if len(unresolved) > show_unresolved:
            lines.append(f"  ... {len(unresolved) - show_unresolved} more (use --json for all)")
    if report["skipped"]:
        lines.append(f"skipped       {len(report['skipped'])} malformed input(s):")
        lines += [
            f"  {s['file']}{':' + str(s['line']) if s['line'] else ''}: {s['reason']}"
            for s in report["skipped"]
        ]
    typer.echo("\n".join(lines))
