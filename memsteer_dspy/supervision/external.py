"""Another generator's QA items through MemSteer's checks, written as a ``generate`` folder.

The paper's generation study (Table 4) runs Ragas-QA with and without the same verification as
MemSteer. :func:`check_external` takes any generator's items — a question, a reference answer and
the record ids it was written from (e.g. :func:`memsteer_dspy.systems.ragas_testset.ragas_items`)
— and runs, per item, the audit and blind read of the MemSteer pipeline
(:class:`~memsteer_dspy.supervision.quality.FidelityChecker`: the item's evidence records plus
graph neighbours as distractors, its answer tied to the evidence sentences it shares most words
with, exactly as ``memsteer assess --fidelity`` checks official items). With ``checks=False``
every item with evidence in the history is kept (the "without checks" row).

The folder it writes is read like a ``memsteer generate`` output: ``train.jsonl`` / ``val.jsonl``
(:class:`~memsteer_dspy.records.QAItem` lines, split 2:1 by item), ``rejected.jsonl``,
``summary.json`` (candidates, accepted, kept fraction, rejections by reason, LM calls and tokens of
the checks), so ``memsteer assess --steering``, the QA-quality judge and ``memsteer optimize
--qa`` take it as they take MemSteer's. The folder is keyed by the items, the checks and the LMs
(:class:`~memsteer_dspy.runfolder.RunFolder`); every checked item is logged in ``checked.jsonl``
as it finishes, so a rerun resumes with the first item not checked. An LM failure rejects its item
with reason ``lm_error``; nothing is raised for one item.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dspy

from memsteer_dspy.bundles import BundleConfig
from memsteer_dspy.graph import RecordGraph
from memsteer_dspy.records import AnswerType, History, QAItem
from memsteer_dspy.runfolder import RunFolder, run_key, write_atomic
from memsteer_dspy.supervision.outputs import _question_date, split_by_bundle
from memsteer_dspy.supervision.quality import (
    FidelityChecker,
    bundle_around,
    evidence_plan,
    given_item_bundle_config,
)

CHECKED = "checked.jsonl"
VERSION = 1


@dataclass(frozen=True)
class ExternalItem:
    """One item of another generator: its question, reference answer and evidence record ids."""

    id: str
    question: str
    answer: str
    evidence_ids: tuple[str, ...]
    kind: str = ""


def _usable(item: ExternalItem, history: History) -> str | None:
    """Why the item cannot be checked at all (no evidence, evidence not in the history, no
    answer), or None."""
    if not item.question.strip():
        return "external:no_question"
    if not item.answer.strip():
        return "external:no_answer"
    if not item.evidence_ids:
        return "external:no_evidence"
    if any(rid not in history for rid in item.evidence_ids):
        return "external:evidence_not_in_history"
    if len(item.evidence_ids) > 4:
        return "external:over_four_records"
    return None


def check_external(
    history: History,
    items: Sequence[ExternalItem],
    lms: Mapping[str, dspy.BaseLM],
    out: str | Path,
    *,
    method: str,
    checks: bool = True,
    seed: int = 0,
    train_fraction: float = 2 / 3,
    bounded: bool = False,
    lean: bool = True,
    graph: RecordGraph | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Check ``items`` (another generator's, named ``method``) with MemSteer's audit and blind
    read (``lms``: ``auditor`` and ``blind_reader``) and write the kept ones as a ``generate``
    folder ``out``; returns its summary (see the module doc)."""
    out = Path(out)
    key = run_key(
        "external_checks",
        history=history,
        qa=[(it.id, it.question, it.answer, list(it.evidence_ids)) for it in items],
        lms={r: lms[r] for r in ("auditor", "blind_reader")} if checks else None,
        options={
            "method": method,
            "checks": checks,
            "seed": seed,
            "train_fraction": train_fraction,
            "bounded": bounded,
            "lean": lean,
            "version": VERSION,
        },
    )
    started = time.perf_counter()
    with RunFolder.open(out, key, extra={"user": history.user_id, "method": method}) as folder:
        log = folder.log(CHECKED)
        done = {row["id"]: row for row in log.read()}
        checker = FidelityChecker(lms, max_demos=0, bounded=bounded, lean=lean) if checks else None
        graph = graph or (RecordGraph.build(history) if checks else None)
        config = given_item_bundle_config()
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(items), initial=len(done), desc=f"check ({method})", unit="item")
        try:
            for i, item in enumerate(items):
                if item.id in done:
                    continue
                # the item's own index: a resumed run shuffles its blind read as a whole run does
                row = _check_one(item, history, checker, graph, config, seed * 7919 + i)
                log.append(row)
                done[item.id] = row
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        rows = [done[it.id] for it in items if it.id in done]
        summary = _write(out, history, items, rows, method, checks, seed, train_fraction)
        summary["wall_seconds_this_session"] = round(time.perf_counter() - started, 1)
        folder.add_usage(summary["tokens_by_role"])
        return summary


def _check_one(
    item: ExternalItem,
    history: History,
    checker: FidelityChecker | None,
    graph: RecordGraph | None,
    config: BundleConfig,
    shuffle_seed: int,
) -> dict[str, Any]:
    row: dict[str, Any] = {"id": item.id, "usage": {}}
    why = _usable(item, history)
    if why is not None:
        return {**row, "status": "rejected", "stage": "input", "reason": why}
    if checker is None:
        return {**row, "status": "accepted"}
    rng = random.Random(f"external:{item.id}")
    bundle = bundle_around(graph, list(item.evidence_ids), config, rng)
    plan = evidence_plan(bundle, item.question, item.answer, "text", list(item.evidence_ids))
    (outcome,) = checker.check([(bundle, plan, item.question, shuffle_seed)])
    usage = {r: c.model_dump() for r, c in outcome.usage.items()}
    row.update(usage=usage, bundle=bundle.record_ids, status=outcome.status)
    if outcome.status != "accepted":
        row.update(stage=outcome.stage, reason=outcome.reason, detail=outcome.detail)
    if outcome.blind is not None:
        row["blind_answer"] = outcome.blind.answer
    return row


def _qa_item(item: ExternalItem, history: History, method: str, seed: int) -> QAItem:
    return QAItem(
        id=item.id,
        question=item.question,
        answer=item.answer,
        answer_type=AnswerType.TEXT,
        evidence_ids=list(item.evidence_ids),
        question_date=_question_date(history, list(item.evidence_ids)),
        question_type=item.kind or None,
        source="generated",
        metadata={"provenance": {"method": method, "seed": seed, "bundle_id": item.id}},
    )


def _write(
    out: Path,
    history: History,
    items: Sequence[ExternalItem],
    rows: list[dict[str, Any]],
    method: str,
    checks: bool,
    seed: int,
    train_fraction: float,
) -> dict[str, Any]:
    by_id = {it.id: it for it in items}
    kept = [
        _qa_item(by_id[r["id"]], history, method, seed) for r in rows if r["status"] == "accepted"
    ]
    train, val = split_by_bundle(kept, train_fraction, seed)
    write_atomic(out / "train.jsonl", "".join(q.to_json() + "\n" for q in train))
    write_atomic(out / "val.jsonl", "".join(q.to_json() + "\n" for q in val))
    rejected = [r for r in rows if r["status"] != "accepted"]
    write_atomic(
        out / "rejected.jsonl",
        "".join(json.dumps({**r, **_item_fields(by_id[r["id"]])}) + "\n" for r in rejected),
    )
    usage: dict[str, Counter[str]] = {}
    for r in rows:
        for role, cost in (r.get("usage") or {}).items():
            c = usage.setdefault(role, Counter())
            for k in ("calls", "failed_calls", "prompt_tokens", "completion_tokens"):
                c[k] += int(cost.get(k, 0))
    tokens = sum(c["prompt_tokens"] + c["completion_tokens"] for c in usage.values())
    summary = {
        "method": method,
        "checks": checks,
        "items": len(items),
        "candidates": len(rows),
        "accepted": len(kept),
        "kept_fraction": round(len(kept) / len(rows), 4) if rows else None,
        "train": len(train),
        "val": len(val),
        "rejected_by_reason": dict(Counter(r.get("reason") or "?" for r in rejected).most_common()),
        "tokens_by_role": {r: dict(c) for r, c in usage.items()},
        "checks_tokens": tokens,
        "multi_record": sum(len(q.evidence_ids) > 1 for q in kept),
    }
    write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


def _item_fields(item: ExternalItem) -> dict[str, Any]:
    return {
        "question": item.question,
        "answer": item.answer,
        "evidence_ids": list(item.evidence_ids),
        "kind": item.kind,
    }
