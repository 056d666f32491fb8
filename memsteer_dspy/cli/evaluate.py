"""``memsteer evaluate``: score a memory design on QA items (accuracy, QS, R@1/5/10, delivered recall).

(No ``from __future__ import annotations`` here: typer must see the real ``Annotated`` options.)
"""

import contextlib
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from memsteer_dspy.cli.common import HistoryArgs, cli_errors, echo_json, history_options, lm_options
from memsteer_dspy.errors import InputError
from memsteer_dspy.evaluation import evaluate_design, evaluate_instances, read_qa_jsonl
from memsteer_dspy.loaders.longmemeval import instance_loaded, read_instances
from memsteer_dspy.memory import MemoryDesign, MemorySystem
from memsteer_dspy.runfolder import RunFolder, check_not_inputs, run_key, write_json
from memsteer_dspy.stats import compare_item_results, points, points_ci


def default_cache_dir() -> Path:
    """Where built memory indexes are kept: ``$MEMSTEER_CACHE_DIR/indexes`` or ``~/.cache/memsteer-dspy/indexes``."""
    root = os.environ.get("MEMSTEER_CACHE_DIR")
    return (Path(root) if root else Path.home() / ".cache" / "memsteer-dspy") / "indexes"


def _fmt(v: float | None) -> str:
    return "   -  " if v is None else f"{100 * v:6.1f}"


def _table(summary) -> str:
    cols = ("n", "acc", "QS", "R@1", "R@5", "R@10", "deliv")
    rows = [("overall", summary)] + list(summary.by_type.items())
    width = max(12, *(len(name) for name, _ in rows))
    lines = [f"{'':<{width}} " + " ".join(f"{c:>6}" for c in cols)]
    for name, s in rows:
        vals = [s.accuracy, s.qs, s.recall_at_1, s.recall_at_5, s.recall_at_10, s.delivered_recall]
        lines.append(f"{name:<{width}} {s.n:>6} " + " ".join(_fmt(v) for v in vals))
    return "\n".join(lines)


def _any_all_table(summary) -> str:
    """LongMemEval's recall_any / recall_all at k over turns and sessions ('' when not measured)."""
    a = summary.any_all_recall
    if not a:
        return ""
    lines = [f"{'':<12} " + " ".join(f"{c:>9}" for c in ("any@5", "all@5", "any@10", "all@10"))]
    for level in ("turn", "session"):
        vals = [a.get(f"{level}_{m}@{k}") for k in (5, 10) for m in ("any", "all")]
        if any(v is not None for v in vals):
            lines.append(f"{level:<12} " + " ".join(f"{_fmt(v):>9}" for v in vals))
    return "\n".join(lines)


@cli_errors
@history_options
@lm_options
def evaluate(
    history: HistoryArgs,
    lm_config,
    qa: Annotated[
        str,
        typer.Option(
            "--qa",
            help="'official' (the format's own QA items) or the path of a QA JSONL file (QAItem per line, as `generate` writes).",
        ),
    ] = "official",
    design: Annotated[
        str,
        typer.Option(
            "--design",
            "-d",
            help="'base-bm25' (the paper's Base-BM25) or the path of a design JSON.",
        ),
    ] = "base-bm25",
    metrics: Annotated[
        str,
        typer.Option(
            "--metrics",
            help="'all' (answer + judge + recall) or 'recall' (retrieval only; no LM unless the design's retrieval uses one).",
        ),
    ] = "all",
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Folder for items.jsonl (per-item results with traces), summary.json and design.json; a rerun "
            "resumes only with the same history, protocol, design, metrics, QA content and LMs (else an error names the difference).",
        ),
    ] = None,
    restart: Annotated[
        bool,
        typer.Option(
            "--restart",
            help="Empty the --out run folder (never a folder of your own: it is refused) and start over instead of resuming.",
        ),
    ] = False,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print one JSON object (the summary) instead of a table.")
    ] = False,
    threads: Annotated[
        int,
        typer.Option(
            "--threads", "-t", min=1, help="Items evaluated concurrently (useful with API LMs)."
        ),
    ] = 1,
    protocol: Annotated[
        str | None,
        typer.Option(
            "--protocol",
            help="'as_of' (each question sees only records before its date; default for RHELM) or 'full' (the whole history; default otherwise).",
        ),
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="Evaluate only the first N QA items.")
    ] = None,
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            "--cache-dir",
            help="Where built stores and indexes are kept and reused (default: $MEMSTEER_CACHE_DIR/indexes or ~/.cache/memsteer-dspy/indexes).",
        ),
    ] = None,
    no_cache: Annotated[
        bool,
        typer.Option(
            "--no-cache", help="Build the memory in memory only; read and write no index cache."
        ),
    ] = False,
    compare: Annotated[
        tuple[str, str] | None,
        typer.Option(
            "--compare",
            help="Compare two designs (each 'base-bm25' or a design JSON), A then B, on the same QA items: "
            "means, paired differences B - A with a seeded paired-bootstrap 95% interval (1,000 resamples), "
            "one-sided p-values and a verdict on the primary metric (accuracy with --metrics all, else "
            "delivered recall): better, worse or inconclusive. Replaces --design.",
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="--compare: the bootstrap's seed.")] = 0,
    all_instances: Annotated[
        bool,
        typer.Option(
            "--all",
            help="longmemeval: evaluate every instance of the file, each over its own haystack (--out gets one folder per instance); instead of --user.",
        ),
    ] = False,
) -> None:
    """Evaluate a memory design on QA items: accuracy A(d), QS, R@1/5/10 and delivered recall,
    overall and by question type, with per-item results and traces; or compare two designs with
    --compare A.json B.json (the same paired comparison `memsteer optimize` reports on held-out items)."""
    if metrics not in ("all", "recall"):
        raise typer.BadParameter("choose 'all' or 'recall'", param_hint="--metrics")
    if protocol is not None and protocol not in ("as_of", "full"):
        raise typer.BadParameter("choose 'as_of' or 'full'", param_hint="--protocol")
    check_not_inputs(out, [history.path, qa, design, *(compare or ())])
    d = MemoryDesign.base_bm25() if design == "base-bm25" else MemoryDesign.load(design)
    if all_instances:
        return _evaluate_all(
            history,
            lm_config,
            d,
            metrics,
            out,
            json_out,
            threads,
            protocol,
            limit,
            None if no_cache else (cache_dir or default_cache_dir()),
            restart,
        )
    loaded = history.load()
    if qa == "official":
        items = list(loaded.qa_items)
        if not items:
            raise InputError(
                f"the {history.format} history has no official QA items",
                field="--qa",
                hint="pass --qa <path to a QA JSONL file> (e.g. the train.jsonl or val.jsonl `memsteer generate` writes)",
            )
    else:
        skipped: list = []
        items = read_qa_jsonl(qa, on_error=history.on_error, skipped=skipped)
        for s in skipped:
            typer.echo(f"skipped {s.file}:{s.line}: {s.reason}", err=True)
    if limit is not None:
        items = items[:limit]
    protocol = protocol or ("as_of" if history.format == "rhelm" else "full")

    if compare is not None:
        _compare(
            compare,
            loaded,
            items,
            lm_config,
            metrics=metrics,
            protocol=protocol,
            threads=threads,
            out=out,
            cache=None if no_cache else (cache_dir or default_cache_dir()),
            seed=seed,
            json_out=json_out,
            source=qa,
            restart=restart,
        )
        return
    needs = d.lm_uses(answering=metrics == "all")
    lms = {}
    if needs:
        lms["answerer"] = lm_config.lm("answerer")
    judge_lm = lm_config.lm("judge") if metrics == "all" else None
    cache = None if no_cache else (cache_dir or default_cache_dir())
    system = MemorySystem.from_design(d, loaded.history, cache_dir=cache, lms=lms, threads=threads)
    report = evaluate_design(
        system,
        items,
        metrics=metrics,
        judge_lm=judge_lm,
        protocol=protocol,
        threads=threads,
        out_dir=out,
        restart=restart,
        usage=lm_config.usage_by_role,
    )
    result = report.as_json()
    if needs or judge_lm is not None:
        result["lms"] = lm_config.describe()
        result["lm_usage"] = lm_config.usage_by_role()
    result["memory"] = {k: v for k, v in system.build_info.items() if k != "store_dir"}
    if out is not None:
        result["out"] = str(out)
    if json_out:
        echo_json(result)
        return
    s = report.summary
    typer.echo(
        f"design {s.design_name} ({s.design_key})  user {s.user}  protocol {s.protocol}  metrics {s.metrics}  "
        f"{s.n} items in {s.seconds:.1f}s"
    )
    typer.echo(_table(s))
    if s.any_all_recall:
        typer.echo(_any_all_table(s))
    notes = []
    if s.empty_contexts:
        notes.append(f"{s.empty_contexts} item(s) retrieved nothing (empty context)")
    if s.unresolved_evidence:
        notes.append(
            f"{len(s.unresolved_evidence)} evidence id(s) of {s.unresolved_items} item(s) are not in the history "
            "(left out of recall; an item with none resolved shows '-'; see unresolved_evidence in --json): "
            + ", ".join(f"{u['qa_id']}: {u['evidence_id']!r}" for u in s.unresolved_evidence[:5])
            + (" ..." if len(s.unresolved_evidence) > 5 else "")
        )
    if s.no_evidence:
        notes.append(
            f"{s.no_evidence} of {s.n} item(s) have no evidence ids: counted in n, left out of "
            "the recall columns (their means are over the items with evidence)"
        )
    if s.errors:
        notes.append(f"{s.errors} item(s) failed (scored 0; see 'error' in items.jsonl)")
    if out is not None:
        notes.append(f"per-item results with traces: {out / 'items.jsonl'}")
    for n in notes:
        typer.echo(n)


def _load_design(spec: str):
    return MemoryDesign.base_bm25() if spec == "base-bm25" else MemoryDesign.load(spec)


def _compare(
    specs,
    loaded,
    items,
    lm_config,
    *,
    metrics,
    protocol,
    threads,
    out,
    cache,
    seed,
    json_out,
    source,
    restart=False,
):
    """``--compare A B``: both designs on the same items, then :func:`memsteer_dspy.stats.compare_item_results`.
    With ``--out``, a run folder of its own (A/ and B/ inside, comparison.json beside them):
    a folder that is not one is refused, and ``--restart`` empties only one."""
    designs = [_load_design(s) for s in specs]
    judge_lm = lm_config.lm("judge") if metrics == "all" else None
    folder = contextlib.nullcontext()
    if out is not None:
        key = run_key(
            "compare",
            history=loaded.history,
            protocol=protocol,
            metrics=metrics,
            options={"a": designs[0].key(), "b": designs[1].key(), "seed": seed},
        )
        folder = RunFolder.open(out, key, restart=restart)
    with folder:
        reports = []
        for label, d in zip(("A", "B"), designs, strict=True):
            lms = (
                {"answerer": lm_config.lm("answerer")}
                if d.lm_uses(answering=metrics == "all")
                else {}
            )
            system = MemorySystem.from_design(
                d, loaded.history, cache_dir=cache, lms=lms, threads=threads
            )
            reports.append(
                evaluate_design(
                    system,
                    items,
                    metrics=metrics,
                    judge_lm=judge_lm,
                    protocol=protocol,
                    threads=threads,
                    out_dir=(out / label) if out is not None else None,
                )
            )
        comp = compare_item_results(
            reports[0].items, reports[1].items, answered=metrics == "all", seed=seed, source=source
        )
        result = {
            "a": {"spec": specs[0], "design_key": designs[0].key()},
            "b": {"spec": specs[1], "design_key": designs[1].key()},
            **comp.model_dump(mode="json"),
        }
        if out is not None:
            write_json(out / "comparison.json", result)
        if json_out:
            echo_json(result)
            return
        typer.echo(
            f"A = {specs[0]} ({designs[0].key()})   B = {specs[1]} ({designs[1].key()})   {comp.n} items, "
            f"protocol {protocol}, metrics {metrics}"
        )
        typer.echo(
            f"{'metric':<18} {'A':>7} {'B':>7} {'B - A':>7}  95% CI (paired bootstrap, seed {seed})"
        )
        for m in comp.initial:
            typer.echo(
                f"{m:<18} {_fmt(comp.initial[m])} {_fmt(comp.best.get(m))} "
                f"{points(comp.diff.get(m), '   -  '):>7}  {points_ci(comp.ci95.get(m), '-')}"
            )
        typer.echo(
            f"verdict on {comp.primary}: B is {comp.verdict} than A"
            if comp.verdict != "inconclusive"
            else f"verdict on {comp.primary}: inconclusive (the interval contains 0)"
        )
        typer.echo(
            f"one-sided p (B not better): bootstrap {comp.p_bootstrap:.3f}, sign test {comp.p_sign:.3f}"
        )


def _evaluate_all(
    history: HistoryArgs,
    lm_config,
    d,
    metrics,
    out,
    json_out,
    threads,
    protocol,
    limit,
    cache,
    restart,
) -> None:
    """``evaluate --all``: every LongMemEval instance over its own haystack, pooled."""
    if history.format != "longmemeval":
        raise typer.BadParameter(
            "--all is for --format longmemeval (one history per instance)", param_hint="--all"
        )
    if history.user is not None:
        raise typer.BadParameter("give --user or --all, not both", param_hint="--all")
    if history.path is None:
        raise InputError("--path is required for format 'longmemeval'", field="--path")
    instances = read_instances(history.path)[:limit]  # --limit: the first N instances
    n = len(instances)
    lms = {"answerer": lm_config.lm("answerer")} if d.lm_uses(answering=metrics == "all") else {}
    judge_lm = lm_config.lm("judge") if metrics == "all" else None
    with typer.progressbar(length=n, label="instances", file=sys.stderr) as bar:
        report = evaluate_instances(
            (instance_loaded(i, history.path, history.on_error) for i in instances),
            d,
            metrics=metrics,
            lms=lms,
            judge_lm=judge_lm,
            protocol=protocol or "full",
            threads=threads,
            out_dir=out,
            cache_dir=cache,
            on_instance=lambda user, rep: bar.update(1),
            restart=restart,
        )
    s = report.summary
    if json_out:
        result = report.as_json()
        if lms or judge_lm is not None:
            result["lms"] = lm_config.describe()
            result["lm_usage"] = lm_config.usage_by_role()
        echo_json(result)
        return
    typer.echo(
        f"design {s.design_name} ({s.design_key})  {s.user}  metrics {s.metrics}  {s.n} items in {s.seconds:.1f}s"
    )
    typer.echo(_table(s))
    if s.any_all_recall:
        typer.echo(_any_all_table(s))
    if s.errors:
        typer.echo(
            f"{s.errors} item(s) failed (scored 0; see 'error' in the per-instance items.jsonl)"
        )
