"""Running supervision construction end to end, resumably: ``memsteer generate``.

:func:`generate_supervision` plans candidates with a :class:`~memsteer_dspy.bundles.BundleSampler`
(candidate ``i`` is a pure function of the history, config, seed and ``i`` — with a steered
profile its task also follows the items accepted before its batch, read back from the log on a
resume), runs the chosen generator on each, removes near-duplicate questions, and writes the
output folder:

=======================  ==========================================================================
``run.json``             the same-run key (history, settings, LMs) and the sessions with their usage
``candidates.jsonl``     the progress log: one line per finished candidate, appended and synced
``train.jsonl``          accepted items (QAItem JSON + top-level ``facts``) in the train split
``val.jsonl``            accepted items in the validation split (disjoint bundles)
``rejected.jsonl``       every rejected or skipped candidate with ``stage`` and ``reason``
``summary.json``         candidates, accepted, kept_fraction, rejected_by_stage, lm_calls,
                         tokens_per_accepted, kept_by_task (tried / accepted per task
                         kind), wall_seconds, stopped_by (n, candidates, time_budget or
                         interrupted), …
``dataset/``             the accepted items as a ``datasets.DatasetDict`` (train / validation)
``graph-*.json.gz``      the record graph, keyed by the history fingerprint
=======================  ==========================================================================

Everything but ``candidates.jsonl`` is derived from it and rewritten atomically, so a run stopped at
any point (Ctrl-C included) leaves a consistent folder, and rerunning the same command continues
with the first candidate not in the log: nothing is done twice, nothing is lost.

The run's settings are in :mod:`~memsteer_dspy.supervision.config`, what it writes in
:mod:`~memsteer_dspy.supervision.outputs`.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import dspy

from memsteer_dspy.bundles import (
    AcceptedMix,
    BundleSampler,
    Candidate,
    Task,
)
from memsteer_dspy.graph import GraphParams, RecordGraph
from memsteer_dspy.records import History
from memsteer_dspy.runfolder import RunFolder
from memsteer_dspy.supervision.config import (
    METHODS,
    GenerationConfig,
    generation_key,
    small_lm_default_config,
    small_lm_generation_config,
)
from memsteer_dspy.supervision.outputs import (
    LOG_NAME,
    CandidateRecord,
    SupervisionSet,
    _Deduper,
    _Outputs,
    accepted_distribution,
    build_item,
    format_kept,
    format_summary,
    item_line,
    kept_by_task,
    load_qa_jsonl,
    read_log,
    split_by_bundle,
)
from memsteer_dspy.supervision.outputs import (
    _question_word as _question_word,
)
from memsteer_dspy.supervision.program import (
    LEAN_VERSION as LEAN_VERSION,  # importable from here as before the split
)
from memsteer_dspy.supervision.program import (
    PROMPT_VERSION as PROMPT_VERSION,
)
from memsteer_dspy.supervision.program import (
    Outcome,
    make_generator,
)

__all__ = [
    "METHODS",
    "CandidateRecord",
    "GenerationConfig",
    "SupervisionSet",
    "generate_supervision",
    "load_qa_jsonl",
    "read_log",
    "small_lm_default_config",
    "small_lm_generation_config",
    # importable from here before the split as well
    "LOG_NAME",
    "ProgressHook",
    "accepted_distribution",
    "build_item",
    "format_kept",
    "format_summary",
    "generation_key",
    "item_line",
    "kept_by_task",
    "split_by_bundle",
]


ProgressHook = Callable[[CandidateRecord, dict[str, int]], None]


def _accepted_items(log: list[CandidateRecord]) -> list[dict[str, Any]]:
    return [r.item for r in log if r.status == "accepted" and r.item]


def _mix(log: list[CandidateRecord]) -> AcceptedMix:
    """What the accepted items so far cover, and what each kind of task yielded (the sampler
    steers toward what they lack; with ``steer_by_yield``, toward what it can also get)."""
    items = _accepted_items(log)
    tried = [r for r in log if r.status != "skipped"]

    def yields(kind: Callable[[Task], Any]) -> dict:
        asked = Counter(kind(r.task) for r in tried)
        kept = Counter(kind(r.task) for r in tried if r.status == "accepted")
        return {k: (kept[k] + 1) / (n + 2) for k, n in asked.items() if k is not None}

    return AcceptedMix(
        answer_types=dict(Counter(str(i["answer_type"]) for i in items)),
        evidence_counts=dict(Counter(len(i["evidence_ids"]) for i in items)),
        answer_type_yield=yields(lambda t: t.answer_type),
        evidence_yield=yields(lambda t: t.evidence_count),
    )


_SHORT = {
    "entity": "ent",
    "number": "num",
    "date": "date",
    "list": "list",
    "text": "text",
    "boolean": "bool",
}


def _progress_text(counts: Mapping[str, int], log: list[CandidateRecord]) -> str:
    """The progress line: outcomes so far, then the accepted items by answer type and evidence count."""
    text = ", ".join(f"{k} {v}" for k, v in counts.items())
    mix = _mix(log)
    if mix.answer_types:
        text += " | " + " ".join(
            f"{_SHORT.get(k, k)} {v}" for k, v in sorted(mix.answer_types.items())
        )
        text += " | " + " ".join(f"{k}rec {v}" for k, v in sorted(mix.evidence_counts.items()))
    return text


def generate_supervision(
    history: History,
    lms: Mapping[str, dspy.BaseLM],
    out_dir: str | Path,
    config: GenerationConfig | None = None,
    *,
    lm_description: Mapping[str, str] | None = None,
    graph: RecordGraph | None = None,
    progress: bool | ProgressHook = True,
    restart: bool = False,
    usage: Callable[[], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Generate QA–evidence supervision for ``history`` into ``out_dir`` (resuming a run there).

    ``lms`` maps the roles planner, question_writer, auditor and blind_reader to LMs. Stops when
    ``config.n`` items are accepted or ``config.candidate_limit`` candidates are done. Returns the
    summary (also written to ``summary.json``). Ctrl-C stops the run with a consistent folder and
    re-raises ``KeyboardInterrupt``.

    ``out_dir`` is a :class:`~memsteer_dspy.runfolder.RunFolder` keyed by :func:`generation_key`:
    resuming with another history, method, seed, checks, bundle/graph settings or LM raises a
    :class:`~memsteer_dspy.runfolder.RunMismatchError` naming the field; ``restart`` starts over.
    ``usage`` (e.g. ``LMConfig.usage_by_role``) feeds the folder's usage ledger; without it the
    ledger sums the candidates' own per-role costs.
    """
    config = config or GenerationConfig()
    lm_description = dict(
        lm_description or {r: getattr(lm, "model", type(lm).__name__) for r, lm in lms.items()}
    )
    out = Path(out_dir)
    folder = RunFolder.open(
        out,
        generation_key(history, config, lms),
        restart=restart,
        legacy_files=(LOG_NAME, "train.jsonl"),
        extra={"user": history.user_id},
    )
    started = time.perf_counter()
    prior_wall = sum(s.get("wall_seconds", 0.0) for s in folder.state["sessions"][:-1])
    folder.session.update(n=config.n, max_candidates=config.candidate_limit, lm=lm_description)
    session_usage: dict[str, Counter[str]] = {}

    def save_state() -> None:
        folder.add_usage(
            usage() if usage is not None else {r: dict(c) for r, c in session_usage.items()}
        )
        folder.save()

    save_state()
    if graph is None:
        graph = RecordGraph.cached(history, out, GraphParams(**config.graph))
    sampler = BundleSampler(
        graph,
        config.bundle,
        seed=config.seed,
        max_candidates=config.candidate_limit,
        method="random" if config.method == "naive" else "graph",
    )
    generator = make_generator(
        config.method,
        lms,
        checks=config.checks,
        max_retries=config.max_retries,
        max_demos=config.demo_limit,
        bounded=config.bounded,
        cold_start=config.cold_start,
        user_name=history.user_id,
        lean=config.lean,
        anchored=config.anchored,
        own_words=config.own_words,
        bridges=config.bundle.bridges,
        bridge_events=config.bundle.bridge_events,
        updates=config.bundle.updates,
        pairs=config.bundle.pairs,
        writer_examples=config.writer_examples,
    )
    log = read_log(out)
    done = {r.index for r in log}
    deduper = _Deduper(config.dedup_threshold)
    for r in log:
        if r.status == "accepted" and r.item:
            deduper.add(r.item["id"], r.item["question"], r.item["answer"], r.item["evidence_ids"])
            cand = sampler.candidate(r.index, task=r.task) if r.index < len(sampler) else None
            if cand is not None and cand.bundle is not None and r.outcome:
                generator.add_demo(cand.bundle, cand.task, Outcome.model_validate(r.outcome))
    writer = folder.log(LOG_NAME)
    outputs = _Outputs(out, history, config, lm_description)
    counts: Counter[str] = Counter()
    for r in log:
        counts["accepted" if r.status == "accepted" else (r.stage or r.status)] += 1
    accepted = counts["accepted"]
    pending = [i for i in range(len(sampler)) if i not in done]

    bar = None
    hook = progress if callable(progress) else None
    if progress is True:
        from tqdm import tqdm

        bar = tqdm(
            total=len(sampler),
            initial=len(done),
            desc=f"generate ({config.method})",
            unit="cand",
            dynamic_ncols=True,
        )
        bar.set_postfix_str(_progress_text(counts, log))

    def run_batch(indices: list[int]) -> None:
        """Run candidates stage by stage; each is recorded as soon as it is finished."""
        cands = [sampler.candidate(i, mix=_mix(log)) for i in indices]
        ready = [c for c in cands if c.bundle is not None]
        for c in cands:
            if c.bundle is None:
                record(c, None, 0.0)

        def on_call(stage: str, done: int, total: int) -> None:
            if bar is not None:
                bar.set_postfix_str(f"{stage} {done}/{total} | {_progress_text(counts, log)}")

        def on_done(i: int, outcome: Outcome) -> None:
            # a candidate's own time: the seconds of its LM calls (batch-mates interleave)
            record(ready[i], outcome, sum(c.seconds for c in outcome.usage.values()))

        items = [(c.bundle, c.task, config.seed * 100_003 + c.index) for c in ready]
        generator.run_batch(items, on_call, on_done)

    def run_one(index: int) -> tuple[Candidate, Outcome | None, float]:
        t0 = time.perf_counter()
        cand = sampler.candidate(index, mix=_mix(list(log)))
        if cand.bundle is None:
            return cand, None, time.perf_counter() - t0
        outcome = generator(
            bundle=cand.bundle, task=cand.task, shuffle_seed=config.seed * 100_003 + index
        ).outcome
        return cand, outcome, time.perf_counter() - t0

    last_write = 0.0

    def record(cand: Candidate, outcome: Outcome | None, seconds: float) -> None:
        nonlocal accepted, last_write
        base = {
            "index": cand.index,
            "method": config.method,
            "seed_record": cand.seed_id,
            "task": cand.task,
            "seconds": round(seconds, 2),
        }
        if outcome is None:
            rec = CandidateRecord(
                status="skipped",
                stage="bundle",
                reason=f"bundle:{cand.skip_reason}",
                detail=f"no bundle from seed {cand.seed_id}",
                **base,
            )
        else:
            base.update(
                bundle_id=cand.bundle.id,
                bundle_record_ids=cand.bundle.record_ids,
                question=outcome.question,
                answer=outcome.plan.answer if outcome.plan else None,
                usage=outcome.usage,
            )
            if outcome.status == "accepted":
                item_id = f"gen-{config.method}-s{config.seed}-{cand.index:05d}"
                item = build_item(
                    history,
                    cand,
                    outcome,
                    method=config.method,
                    seed=config.seed,
                    lm_description=lm_description,
                    item_id=item_id,
                )
                dup = deduper.duplicate_of(item.question, item.answer, item.evidence_ids)
                if dup is not None:
                    rec = CandidateRecord(
                        status="rejected",
                        stage="dedup",
                        reason="dedup:near_duplicate",
                        detail=f"near-duplicate of {dup}",
                        outcome=outcome.model_dump(mode="json"),
                        **base,
                    )
                else:
                    deduper.add(item.id, item.question, item.answer, item.evidence_ids)
                    generator.add_demo(cand.bundle, cand.task, outcome)
                    rec = CandidateRecord(
                        status="accepted",
                        item=item.model_dump(mode="json"),
                        outcome=outcome.model_dump(mode="json"),
                        **base,
                    )
                    accepted += 1
            else:
                rec = CandidateRecord(
                    status="rejected",
                    stage=outcome.stage,
                    reason=outcome.reason,
                    detail=outcome.detail,
                    outcome=outcome.model_dump(mode="json"),
                    **base,
                )
        writer.append(rec.model_dump_json())
        log.append(rec)
        for role, cost in rec.usage.items():
            c = session_usage.setdefault(role, Counter())
            c["calls"] += cost.calls
            c["failed_calls"] += cost.failed_calls
            c["prompt_tokens"] += cost.prompt_tokens
            c["completion_tokens"] += cost.completion_tokens
        counts["accepted" if rec.status == "accepted" else (rec.stage or rec.status)] += 1
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(_progress_text(counts, log))
        if hook is not None:
            hook(rec, dict(counts))
        now = time.perf_counter()
        if now - last_write > 5.0:
            outputs.write(
                sorted(log, key=lambda r: r.index), prior_wall + now - started, dataset=False
            )
            last_write = now

    def out_of_time() -> bool:
        budget = config.time_budget_s
        return budget is not None and prior_wall + time.perf_counter() - started >= budget

    interrupted = failed = False
    try:
        if config.threads <= 1:
            queue = list(pending)
            while queue and accepted < config.n and not out_of_time():
                size = min(config.batch_size, max(1, 2 * (config.n - accepted)))
                batch, queue = queue[:size], queue[size:]
                run_batch(batch)
        else:
            with ThreadPoolExecutor(max_workers=config.threads) as pool:
                queue = iter(pending)
                running: dict[Future, int] = {}
                try:
                    while True:
                        while (
                            len(running) < config.threads
                            and accepted + len(running) < config.n + config.threads
                        ):
                            if accepted >= config.n or out_of_time():
                                break
                            index = next(queue, None)
                            if index is None:
                                break
                            running[pool.submit(run_one, index)] = index
                        if not running:
                            break
                        finished, _ = wait(running, return_when=FIRST_COMPLETED)
                        for fut in finished:
                            running.pop(fut)
                            record(*fut.result())
                except BaseException:
                    # unfinished candidates are not logged; a rerun does them again
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise
    except KeyboardInterrupt:
        interrupted = True
        raise
    except BaseException:
        failed = True
        raise
    finally:
        if bar is not None:
            bar.close()
        try:
            save_state()
            final = sorted(log, key=lambda r: r.index)
            stopped_by = (
                "interrupted"
                if interrupted or failed
                else "n"
                if accepted >= config.n
                else "candidates"
                if len(log) >= len(sampler) or not out_of_time()
                else "time_budget"
            )
            summary = outputs.write(
                final,
                prior_wall + time.perf_counter() - started,
                dataset=not failed,
                stopped_by=stopped_by,
            )
            summary["interrupted"] = interrupted
        except OSError:
            if not failed:
                raise
            # the error already propagating (e.g. disk full) is the one reported; every derived file
            # is rebuilt from the log on the next run, and atomic writes left none half-written
        finally:
            folder.close()
    return summary
