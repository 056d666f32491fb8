"""The demo's stages: supervision, the steering check, optimization and the held-out evaluation.

Each stage writes to its own subfolder of the demo's output and resumes there;
:class:`_CostBook` keeps what evaluating one design spent.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from memsteer_dspy.demo.results import DemoResult, DesignRow, StageReport, _pct
from memsteer_dspy.demo.settings import DemoSettings
from memsteer_dspy.memory.design import MemoryDesign
from memsteer_dspy.optimize.defaults import ResolvedDefaults
from memsteer_dspy.records import QAItem
from memsteer_dspy.runfolder import write_atomic

USAGE_KEYS = ("calls", "cache_hits", "prompt_tokens", "completion_tokens", "total_tokens")


def _usage(lm_config: Any) -> dict[str, float]:
    total: dict[str, float] = dict.fromkeys((*USAGE_KEYS, "cost_usd"), 0)
    for u in lm_config.usage_by_role().values():
        for k in USAGE_KEYS:
            total[k] += int(u.get(k, 0) or 0)
        total["cost_usd"] += float(u.get("cost_usd") or 0.0)
    return total


class _CostBook:
    """The LM calls, tokens and seconds spent evaluating one design, kept in ``cost.json`` and
    added to after every finished item, so a resumed evaluation reports the whole cost."""

    def __init__(self, path: Path, lm_config: Any):
        self.path = path
        self.lm_config = lm_config
        self.totals: dict[str, float | None] = {k: 0 for k in (*USAGE_KEYS, "seconds")}
        self.totals["cost_usd"] = None  # nothing priced yet
        if path.exists():
            try:
                saved = json.loads(path.read_text(encoding="utf-8"))
                self.totals.update({k: saved.get(k, v) for k, v in self.totals.items()})
            except (json.JSONDecodeError, AttributeError):
                pass  # a torn file from an interrupted write: start the book afresh
        self.items = 0
        self._mark()

    def _mark(self) -> None:
        self._usage = _usage(self.lm_config)
        self._t = time.perf_counter()

    def book(self, *, item: bool = True) -> None:
        """Add what was spent since the last booking: after a finished item (``item``), or at
        the end, when only LM usage is added (a fully resumed evaluation adds no time)."""
        now = _usage(self.lm_config)
        for k in USAGE_KEYS:
            self.totals[k] += now[k] - self._usage[k]
        if now["cost_usd"] != self._usage["cost_usd"]:
            spent = now["cost_usd"] - self._usage["cost_usd"]
            self.totals["cost_usd"] = (self.totals.get("cost_usd") or 0.0) + spent
        self.items += item
        if self.items:
            self.totals["seconds"] = round(
                self.totals["seconds"] + time.perf_counter() - self._t, 3
            )
        self._mark()
        write_atomic(self.path, json.dumps(self.totals, indent=2) + "\n")


def _slug(label: str) -> str:
    return label.lower().replace(" ", "-")


def _supervision(history, lm_config, folder: Path, settings: DemoSettings, say, result: DemoResult):
    """Stage 1: generate (or resume) QA–evidence supervision; returns (train, val)."""
    from memsteer_dspy.bundles import BundleConfig, small_lm_bundle_config
    from memsteer_dspy.supervision.program import GENERATION_ROLES
    from memsteer_dspy.supervision.run import (
        GenerationConfig,
        SupervisionSet,
        generate_supervision,
        read_log,
        small_lm_default_config,
    )

    t0 = time.perf_counter()
    profile = settings.bundle_profile
    if profile == "auto":
        profile = "small" if lm_config.in_process("planner") else "full"
    # length limits in the output schemas, for LMs that decode under them (in-process llama.cpp)
    bounded = lm_config.in_process(*GENERATION_ROLES)
    fields = {
        "bounded": bounded,
        "n": settings.n_supervision,
        "max_candidates": settings.max_candidates,
        "time_budget_s": settings.supervision_seconds,
        "seed": settings.seed,
        "threads": settings.threads,
        "batch_size": min(4, settings.max_candidates),
    }
    # in-process LMs on small bundles get the pipeline measured cheapest on the embedded model
    # (lean prompts, anchored planner); any other LM the paper's prompts
    # (and the question-writer examples `generate` shows such an LM by default)
    if profile == "small" and bounded:
        config = small_lm_default_config(history, **fields)
    else:
        bundle = small_lm_bundle_config() if profile == "small" else BundleConfig()
        config = GenerationConfig(**fields, bundle=bundle)
    done = read_log(folder)
    accepted_before = sum(r.status == "accepted" for r in done)
    summary_file = folder / "summary.json"
    spent = summary_file.exists() and (
        json.loads(summary_file.read_text(encoding="utf-8")).get("stopped_by") == "time_budget"
    )
    finished = accepted_before >= config.n or len(done) >= config.candidate_limit or spent
    within = (
        f" within {config.time_budget_s / 60:g} min" if config.time_budget_s is not None else ""
    )
    say(
        f"[1/4] supervision: MemSteer generates up to {config.n} verified QA items from at most "
        f"{config.candidate_limit} candidates{within} ({profile} bundles"
        + ("; lean prompts, anchored planner" if config.anchored else "")
        + (
            f"; {len(config.writer_examples)} question-writer examples"
            if config.writer_examples
            else ""
        )
        + f") -> {folder}"
        + (f"  [{len(done)} candidates already done]" if done else "")
    )
    lms = {role: lm_config.lm(role) for role in GENERATION_ROLES}

    def hook(rec, counts) -> None:
        if say.fn is not None:
            say.fn(
                f"  candidate {rec.index}: {rec.status}"
                + (f" ({rec.reason})" if rec.reason else "")
            )

    summary = generate_supervision(
        history,
        lms,
        folder,
        config,
        lm_description=lm_config.describe(),
        progress=True if say.bars else (hook if say.fn is not None else False),
    )
    sup = SupervisionSet.load(folder)
    result.supervision = {
        "folder": str(folder),
        "accepted": summary.get("accepted", 0),
        "candidates": summary.get("candidates", 0),
        "skipped_bundles": summary.get("skipped_bundles", 0),
        "train": len(sup.train),
        "val": len(sup.val),
        "kept_fraction": summary.get("kept_fraction"),
        "rejected_by_stage": summary.get("rejected_by_stage", {}),
        "lm_calls": sum(summary.get("lm_calls", {}).values()),
        "wall_seconds": summary.get("wall_seconds"),
        "pipeline": "lean-anchor" if config.anchored else "v1",
        "stopped_by": summary.get("stopped_by"),
    }
    status = "reused" if finished else ("resumed" if done else "ran")
    result.stages.append(
        StageReport(
            name="supervision",
            status=status,
            seconds=round(time.perf_counter() - t0, 1),
            detail=f"{len(sup)} accepted of {summary.get('candidates', 0)} candidates "
            f"({len(sup.train)} train / {len(sup.val)} val)"
            + (
                "; stopped by its time budget" if summary.get("stopped_by") == "time_budget" else ""
            ),
        )
    )
    say(f"  supervision: {result.stages[-1].detail}")
    return sup.train, sup.val


def _steering(
    history, reference, folder: Path, d0: MemoryDesign, panel: Path | None, cache: Path, say, result
) -> None:
    """Stage 1b: the steering panel (patches of the demo's Base-BM25) on the accepted items and on
    the hand-written ones, retrieval only (``memsteer assess --steering``): whether the generated
    items can tell designs apart. It selects nothing; the optimizer never sees the hand-written
    items' scores."""
    from memsteer_dspy.supervision.run import SupervisionSet
    from memsteer_dspy.supervision.steering import (
        STEERING_FILE,
        SteeringReport,
        load_panel,
        save_steering,
        steering_of_folder,
    )

    t0 = time.perf_counter()
    designs = load_panel(panel, base=d0)
    keys = [d.key() for d in designs.values()]
    saved, status = folder / STEERING_FILE, "ran"
    report = (
        SteeringReport.model_validate_json(saved.read_text("utf-8")) if saved.exists() else None
    )
    if report is not None and (
        [r.design_key for r in report.panel] != keys
        or report.n_generated != len(SupervisionSet.load(folder))
    ):
        report = None  # another panel or more items since: measure again
    if report is None:
        report = steering_of_folder(
            history,
            folder,
            list(reference),
            protocol="full",
            panel=designs,
            cache_dir=cache,
            reference_source="the hand-written items",
        )
        save_steering(folder, report)
    else:
        status = "reused"
    head = report.headline()
    result.supervision["steering"] = head
    tau = head["kendall_tau"]
    detail = (
        f"panel of {len(report.panel)} designs: validation items separate {head['separated_in'].get('validation', 0)}"
        f" scores; Kendall tau vs the hand-written ranking {'undefined' if tau is None else f'{tau:+.2f}'}; "
        f"Base-BM25 R@10 {100 * (head['base_r10_generated'] or 0):.1f} generated vs "
        f"{100 * (head['base_r10_reference'] or 0):.1f} hand-written"
    )
    result.stages.append(
        StageReport(
            name="steering",
            status=status,
            seconds=round(time.perf_counter() - t0, 1),
            detail=detail,
        )
    )
    say(f"  steering: {detail}")


def _optimize(
    history,
    train,
    val,
    d0: MemoryDesign,
    lm_config,
    folder: Path,
    settings: DemoSettings,
    resolved: ResolvedDefaults,
    tracker,
    cache: Path,
    say,
    result: DemoResult,
) -> MemoryDesign:
    """Stage 2: MemSteer-Opt from Base-BM25 (resumable); returns the best design."""
    from memsteer_dspy.optimize.loop import MemSteerOpt, OptimizeConfig

    t0 = time.perf_counter()
    if not train or not val:
        reason = (
            f"generation accepted {len(train) + len(val)} QA item(s) ({len(train)} train / {len(val)} val), "
            "and MemSteer-Opt needs at least one of each"
        )
        say(f"[2/4] optimization: skipped: {reason}")
        result.notes.append(
            f"optimization skipped: {reason}; the best design is Base-BM25. Rerun with a larger "
            "--size, or a stronger --lm for generation."
        )
        result.optimization = {"ran": False, "reason": reason}
        result.stages.append(StageReport(name="optimization", status="skipped", detail=reason))
        return d0
    v = resolved.values
    config = OptimizeConfig(
        iterations=settings.iterations,
        objective=v["objective"],
        feedback="stratified",
        seed=settings.seed,
        per_stage=settings.per_stage,
        feedback_tokens=v["feedback_tokens"],
        protocol="full",
        threads=settings.threads,
        max_resamples=settings.max_resamples,
        stop_at_max=True,
        proposer_output=v["proposer_output"],
        accept=v["accept"],
        guard=v["guard"],
        guard_margin=v["guard_margin"],
        val_from=v["val_from"],
        max_eval_lm_calls=v["max_eval_lm_calls"],
        resolved=resolved.line(),
    )

    def on_event(event: dict[str, Any]) -> None:
        primary = "delivered_recall" if event["objective"] == "recall" else "accuracy"
        cand, best = event["candidate"], event["best"]
        c = getattr(cand, primary, None) if cand is not None else None
        b = getattr(best, primary, None) if best is not None else None
        name = "delivered recall" if primary == "delivered_recall" else "accuracy"
        line = (
            f"  iteration {event['iteration']}/{event['total']}: {event['status']}, candidate {name} "
            f"{_pct(c)}, best {_pct(b)} ({event['cost_total'].short()})"
        )
        if event.get("changes"):
            line += "  [" + "; ".join(event["changes"])[:160] + "]"
        elif event.get("reason") and event["status"] not in ("baseline", "accepted"):
            line += f"  ({str(event['reason'])[:160]})"
        say(line)

    opt = MemSteerOpt(
        history,
        train,
        val,
        folder,
        config=config,
        lms=lm_config.lm,
        init_design=d0,
        tracker=tracker,
        cache_dir=cache,
        usage=lm_config.usage_by_role,
        on_event=on_event,
        run_params={
            "supervision": str(Path(folder).parent / "supervision"),
            "lm": lm_config.describe(),
            "demo_size": settings.size,
            "context_budget": settings.context_budget,
        },
    )
    done = len(opt.read_trajectory()) if (folder / "trajectory.jsonl").exists() else 0
    say(
        f"[2/4] optimization: MemSteer-Opt from Base-BM25, {config.iterations} iterations, objective "
        f"{config.objective}, on {len(train)} train / {len(val)} val items -> {folder}"
        + (f"  [{done - 1} iterations already done]" if done else "")
    )
    res = opt.run()
    best = res.best_design
    best_entry = next(e for e in reversed(res.entries) if e.accepted)
    changes = [c for e in res.entries if e.accepted for c in e.changes]
    result.optimization = {
        "ran": True,
        "folder": str(folder),
        "objective": config.objective,
        "iterations": len(res.entries) - 1,
        "accepted_path": res.accepted_path,
        "baseline": res.baseline_score.short(),
        "best": res.best_score.short(),
        "best_design_key": best.key(),
        "best_iteration": best_entry.iteration,
        "changes": changes,
        "statuses": [e.status for e in res.entries],
        "cost": res.entries[-1].cost_total.model_dump(),
        "parent_run_id": res.parent_run_id,
        "stopped": res.stopped,
        "resolved": resolved.line(),
    }
    status = "reused" if done and done > config.iterations else ("resumed" if done else "ran")
    result.stages.append(
        StageReport(
            name="optimization",
            status=status,
            seconds=round(time.perf_counter() - t0, 1),
            detail=f"{len(res.entries) - 1} iterations, accepted path {res.accepted_path}; "
            f"validation {res.baseline_score.short()} -> {res.best_score.short()}"
            + ("; stopped early: validation at its maximum" if res.stopped else ""),
        )
    )
    return best.model_copy(update={"name": best.name or "best"})


def _evaluate(
    label: str,
    design: MemoryDesign,
    history,
    items: list[QAItem],
    answered: list[QAItem],
    lm_config,
    folder: Path,
    settings: DemoSettings,
    tracker,
    cache: Path,
    say,
    result: DemoResult,
    *,
    step: int,
) -> None:
    """Stage 3/4: score one design on the hand-written set: R@k on every item, accuracy and QS
    on ``answered``; books its LM cost and logs an MLflow run."""
    from memsteer_dspy.evaluation import evaluate_design
    from memsteer_dspy.memory.system import MemorySystem

    t0 = time.perf_counter()
    book = _CostBook(folder / "cost.json", lm_config)
    before = _items_done(folder / "answer" / "items.jsonl") + _items_done(
        folder / "recall" / "items.jsonl"
    )
    say(
        f"[{step}/4] evaluation of {label} (design {design.key()}): R@10 on {len(items)} hand-written "
        f"items, accuracy and QS on {len(answered)} -> {folder}"
        + (f"  [{before} item results already on disk]" if before else "")
    )
    answerer = lm_config.lm("answerer")
    if settings.answer_max_tokens is not None:  # the same cap for every design compared
        answerer = answerer.copy(max_tokens=settings.answer_max_tokens)
    lms = {"answerer": answerer}
    system = MemorySystem.from_design(
        design, history, cache_dir=cache, lms=lms, threads=settings.threads
    )
    bar = say.bar(len(items) + len(answered), f"evaluate {label}", initial=0)

    def on_item(r) -> None:
        book.book()
        if bar is not None:
            bar.update(1)
        elif say.fn is not None and r.metrics == "all":  # answered items only: recall is instant
            verdict = "failed: " + r.error if r.error else ("correct" if r.correct else "incorrect")
            say.fn(f"  {r.qa_id} ({r.question_type}): {verdict}")

    try:
        recall = evaluate_design(
            system,
            items,
            metrics="recall",
            protocol="full",
            threads=settings.threads,
            out_dir=folder / "recall",
            on_item=on_item,
        )
        if bar is not None:
            bar.update(len(items) - bar.n)  # items resumed from disk
        answer = None
        if answered:
            answer = evaluate_design(
                system,
                answered,
                metrics="all",
                judge_lm=lm_config.lm("judge"),
                protocol="full",
                threads=settings.threads,
                out_dir=folder / "answer",
                on_item=on_item,
            )
        if bar is not None:
            bar.update(bar.total - bar.n)
    finally:
        if bar is not None:
            bar.close()
    book.book(item=False)
    rs = recall.summary
    a = answer.summary if answer is not None else None
    cost = book.totals
    row = DesignRow(
        label=label,
        design_name=design.name,
        design_key=design.key(),
        accuracy=a.accuracy if a else None,
        qs=a.qs if a else None,
        n_answered=a.n if a else 0,
        recall_at_10=rs.recall_at_10,
        delivered_recall=rs.delivered_recall,
        n_recall=rs.n,
        lm_calls=int(cost["calls"]),
        cache_hits=int(cost["cache_hits"]),
        tokens=int(cost["total_tokens"]),
        seconds=round(float(cost["seconds"]), 1),
        errors=rs.errors + (a.errors if a else 0),
        cost_usd=cost.get("cost_usd"),
        item_correct={
            i.qa_id: None if i.correct is None else float(i.correct)
            for i in (answer.items if answer is not None else [])
        },
        item_recall={i.qa_id: i.recall_at_10 for i in recall.items},
        item_delivered={i.qa_id: i.delivered_recall for i in recall.items},
    )
    result.rows.append(row)
    if row.errors:
        result.notes.append(
            f"{row.errors} evaluation item(s) of {label} failed and scored 0 (see 'error' in {folder}/*/items.jsonl)"
        )
    n_new = len(items) + len(answered) - before
    status = "reused" if n_new <= 0 else ("resumed" if before else "ran")
    result.stages.append(
        StageReport(
            name=f"eval {label}",
            status=status,
            seconds=round(time.perf_counter() - t0, 1),
            detail=(
                f"accuracy {_pct(row.accuracy)}, QS {_pct(row.qs)} on {row.n_answered}; "
                if answered
                else ""
            )
            + f"R@10 {_pct(row.recall_at_10)}, delivered recall {_pct(row.delivered_recall)} on {row.n_recall}"
            + ("" if answered else " (no item answered)"),
        )
    )
    say(f"  {label}: {result.stages[-1].detail}")
    _track_evaluation(tracker, folder, label, design, row, settings)


def _items_done(path: Path) -> int:
    if not path.exists():
        return 0
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def _track_evaluation(
    tracker, folder: Path, label: str, design: MemoryDesign, row: DesignRow, settings: DemoSettings
) -> None:
    """One MLflow run per evaluated design (resumed by the run id kept in the folder)."""
    from memsteer_dspy.tracking import flatten

    if not tracker.active:
        return
    marker = folder / "mlflow_run_id"
    previous = marker.read_text().strip() if marker.exists() else None
    rid = tracker.start_run(
        f"demo-eval-{_slug(label)}",
        resume_run_id=previous,
        tags={"memsteer.kind": "demo-evaluation", "memsteer.design": label},
    )
    if not rid:
        return
    write_atomic(marker, rid + "\n")
    params = {
        "label": label,
        "design_key": row.design_key,
        "demo_size": settings.size,
        "context_budget": settings.context_budget,
        "n_answered": row.n_answered,
        "n_recall": row.n_recall,
    }
    params.update(
        {
            f"design.{k}": v
            for k, v in flatten(design.model_dump(mode="json", exclude={"name"})).items()
        }
    )
    tracker.log_params(rid, params)
    tracker.log_metrics(
        rid,
        {
            "accuracy": row.accuracy,
            "qs": row.qs,
            "recall_at_10": row.recall_at_10,
            "delivered_recall": row.delivered_recall,
            "lm_calls": row.lm_calls,
            "lm_tokens": row.tokens,
            "wall_seconds": row.seconds,
            "lm_cost_usd": row.cost_usd,
        },
    )
    for sub in ("answer", "recall"):
        summary = folder / sub / "summary.json"
        if summary.exists():
            tracker.log_artifact(rid, summary, sub)
    tracker.end_run(rid)
