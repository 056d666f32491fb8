"""Assessing supervision: the QA-quality judge, and the fidelity of the verification checks.

* :func:`assess_quality` — the paper's QA-quality assessment (Tables 4–5): an LLM judge scores each
  generated item on four criteria (premise support, question clarity, answer support, evidence
  support) against its evidence records; an item scores 1 only if all four hold. Reported as a
  percentage per generation method.
* :func:`assess_fidelity` — can the checks be trusted with this LM? The audit and blind recovery
  run over human-annotated QA (official items, each in a bundle of its evidence records plus graph
  neighbours) and over corrupted copies: the answer swapped with another item's, or the evidence
  replaced by unrelated records. Reported: the fraction of true items accepted and of corrupted
  items rejected.

One item's failure (an LM error) is recorded with its reason and scored 0; it never stops a run.
"""

from __future__ import annotations

import json
import random
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import dspy

from memsteer_dspy.bundles import Bundle, BundleConfig, Task, bundle_from_records
from memsteer_dspy.graph import RecordGraph
from memsteer_dspy.normalize import normalize_text
from memsteer_dspy.records import History, QAItem
from memsteer_dspy.signatures.plan import AnswerPlan, EvidenceUse, Fact
from memsteer_dspy.signatures.quality import JudgeQAQuality
from memsteer_dspy.supervision.limits import bounded_signature
from memsteer_dspy.supervision.program import Outcome, Pipeline, RoleCost, _Generator

__all__ = [
    "CRITERIA",
    "FidelityChecker",
    "QualityJudge",
    "assess_fidelity",
    "assess_quality",
    "bundle_around",
    "evidence_plan",
    "format_fidelity",
    "format_quality",
    "given_item_bundle_config",
]

CRITERIA = ("premise_support", "clarity", "answer_support", "evidence_support")


class QualityJudge(dspy.Module):
    """The QA-quality judge: four criteria for one item against its evidence records."""

    def __init__(
        self,
        lm: dspy.BaseLM | None = None,
        *,
        max_retries: int = 2,
        adapter: dspy.Adapter | None = None,
        bounded: bool = False,
    ):
        super().__init__()
        self.judge = dspy.Predict(bounded_signature(JudgeQAQuality) if bounded else JudgeQAQuality)
        if lm is not None:
            self.judge.lm = lm
        self.max_retries = max_retries
        self.adapter = adapter or dspy.JSONAdapter()

    def forward(self, item: QAItem, history: History) -> dspy.Prediction:
        """``dspy.Prediction(score=0|1, criteria={...}, rationale=..., error=None|str)``."""
        ids = [rid for rid in item.evidence_ids if rid in history]
        if not ids:
            return dspy.Prediction(
                score=0,
                criteria=dict.fromkeys(CRITERIA, False),
                rationale="",
                error="no evidence record of the item is in the history",
            )
        view = bundle_from_records(history, ids, BundleConfig(record_token_cap=600)).view()
        last = None
        for attempt in range(self.max_retries + 1):
            config = {"max_tokens": 300} | (
                {"rollout_id": attempt, "temperature": 0.7} if attempt else {}
            )
            try:
                with dspy.context(adapter=self.adapter):
                    out = self.judge(
                        question=item.question,
                        answer=item.answer,
                        answer_type=str(item.answer_type),
                        records=view.text,
                        config=config,
                    )
            except Exception as exc:
                last = exc
                continue
            criteria = {c: bool(getattr(out, c)) for c in CRITERIA}
            return dspy.Prediction(
                score=int(all(criteria.values())),
                criteria=criteria,
                rationale=str(out.rationale),
                error=None,
            )
        return dspy.Prediction(
            score=0,
            criteria=dict.fromkeys(CRITERIA, False),
            rationale="",
            error=f"lm_error: {type(last).__name__}: {str(last)[:200]}",
        )


def _folder_items(folder: Path) -> tuple[str, list[QAItem]]:
    from memsteer_dspy.supervision.run import SupervisionSet

    sup = SupervisionSet.load(folder)
    items = sup.train + sup.val
    method = None
    summary = folder / "summary.json"
    if summary.exists():
        method = json.loads(summary.read_text(encoding="utf-8")).get("method")
    if method is None and items:
        method = items[0].metadata.get("provenance", {}).get("method")
    return method or folder.name, items


def assess_quality(
    history: History,
    folders: Iterable[str | Path],
    lm: dspy.BaseLM,
    *,
    limit: int = 50,
    seed: int = 0,
    bounded: bool = False,
) -> dict[str, Any]:
    """Judge up to ``limit`` items of each ``generate`` output folder; the percentage of items
    scoring 1, and of each criterion, per method. ``bounded``: length limits in the output schema
    (for in-process LMs, see :mod:`memsteer_dspy.supervision.limits`)."""
    judge = QualityJudge(lm, bounded=bounded)
    by_method: dict[str, Any] = {}
    for folder in folders:
        folder = Path(folder)
        method, items = _folder_items(folder)
        rng = random.Random(f"quality:{seed}:{folder}")
        sample = rng.sample(items, min(limit, len(items)))
        rows = []
        for item in sample:
            p = judge(item=item, history=history)
            rows.append(
                {
                    "id": item.id,
                    "question": item.question,
                    "answer": item.answer,
                    "score": p.score,
                    "criteria": p.criteria,
                    "rationale": p.rationale,
                    "error": p.error,
                }
            )
        n = len(rows)
        key = method if method not in by_method else f"{method} ({folder})"
        by_method[key] = {
            "folder": str(folder),
            "items": n,
            "quality_pct": round(100 * sum(r["score"] for r in rows) / n, 1) if n else None,
            "criteria_pct": {
                c: round(100 * sum(r["criteria"][c] for r in rows) / n, 1) if n else None
                for c in CRITERIA
            },
            "errors": sum(r["error"] is not None for r in rows),
            "judged": rows,
        }
    return {"by_method": by_method}


def format_quality(report: Mapping[str, Any]) -> str:
    lines = ["QA quality (an item scores 1 only if all four criteria hold)"]
    lines.append(
        f"{'method':<24} {'items':>5} {'quality':>8} " + " ".join(f"{c[:10]:>10}" for c in CRITERIA)
    )
    for method, r in report["by_method"].items():
        q = "-" if r["quality_pct"] is None else f"{r['quality_pct']:.1f}%"
        crit = " ".join(
            f"{'-' if r['criteria_pct'][c] is None else str(r['criteria_pct'][c]) + '%':>10}"
            for c in CRITERIA
        )
        lines.append(f"{method:<24} {r['items']:>5} {q:>8} {crit}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# fidelity
# --------------------------------------------------------------------------------------------


class FidelityChecker(_Generator):
    """The audit and blind read of :class:`~memsteer_dspy.supervision.program.MemSteerGenerator`,
    run on a given bundle, plan and question (no planning, no question writing)."""

    method = "fidelity"

    def __init__(self, lms: Mapping[str, dspy.BaseLM] | None = None, **kwargs: Any):
        super().__init__(lms, **kwargs)
        self._ready()

    def check(
        self,
        items: Sequence[tuple[Bundle, AnswerPlan, str, int]],
        on_call: Callable[[str, int, int], None] | None = None,
        on_done: Callable[[int, Outcome], None] | None = None,
    ) -> list[Outcome]:
        """Audit and blind-read each ``(bundle, plan, question, shuffle seed)``, stage by stage;
        ``on_call`` / ``on_done`` as for :meth:`MemSteerGenerator.run_batch`."""
        return self._drive([self._check_one(*it) for it in items], on_call, on_done)

    def _check_one(
        self, bundle: Bundle, plan: AnswerPlan, question: str, shuffle_seed: int
    ) -> Pipeline:
        usage: dict[str, RoleCost] = {}
        return (
            yield from self._verify(
                bundle, bundle.view(), plan, question, usage, shuffle_seed, [], question_check=False
            )
        )

    def _pipeline(
        self, bundle: Bundle, task: Task, shuffle_seed: int
    ) -> Pipeline:  # pragma: no cover
        raise TypeError("FidelityChecker checks given plans; use check()")


def _best_span(bundle: Bundle, record_id: str, text: str) -> str | None:
    """The span of ``record_id`` sharing the most words with ``text`` (ties: the first)."""
    words = set(normalize_text(text).split())
    rec = bundle.record(record_id)
    if rec is None or not rec.spans:
        return None
    scored = [(len(words & set(normalize_text(s.text).split())), -s.index, s.id) for s in rec.spans]
    return max(scored)[2]


def evidence_plan(
    bundle: Bundle, question: str, answer: str, answer_type, evidence_ids: list[str]
) -> AnswerPlan:
    """The answer plan of a given item (official, or another generator's): one fact per evidence
    record, its sentence sharing the most words with the question and answer."""
    facts = []
    for rid in evidence_ids:
        sid = _best_span(bundle, rid, f"{question} {answer}")
        if sid:
            facts.append(Fact(span_id=sid, statement=bundle.span(sid).text))
    answer_span = next(
        (f.span_id for f in facts if normalize_text(answer) in normalize_text(f.statement)), None
    )
    return AnswerPlan(
        ask=question,
        answer=answer,
        answer_type=str(answer_type),
        answer_span_id=answer_span,
        facts=facts,
        evidence=[
            EvidenceUse(record_id=rid, contribution="holds information the answer needs")
            for rid in evidence_ids
        ],
        operations=["lookup"] if len(evidence_ids) == 1 else ["combine"],
    )


def given_item_bundle_config() -> BundleConfig:
    """The bundles a given item (official, or another generator's) is checked in: records cut to
    400 tokens, 3 to 6 of them."""
    return BundleConfig(record_token_cap=400, min_records=3, max_records=6)


def bundle_around(
    graph: RecordGraph, record_ids: list[str], config: BundleConfig, rng: random.Random
) -> Bundle:
    """The given records plus graph neighbours (distractors) up to ``config.min_records``."""
    ids = list(record_ids)
    neighbours = sorted({n for rid in record_ids for n, _, _ in graph.neighbours(rid)} - set(ids))
    rng.shuffle(neighbours)
    for n in neighbours:
        if len(ids) >= max(config.min_records, len(record_ids) + 1):
            break
        ids.append(n)
    return bundle_from_records(graph.history, ids, config)


def assess_fidelity(
    history: History,
    qa_items: Sequence[QAItem],
    lms: Mapping[str, dspy.BaseLM],
    *,
    limit: int = 20,
    seed: int = 0,
    graph: RecordGraph | None = None,
    config: BundleConfig | None = None,
    bounded: bool = False,
    progress: bool = False,
    lean: bool = False,
) -> dict[str, Any]:
    """Audit + blind read over up to ``limit`` official items (with 1–4 evidence records in the
    history) and their two corruptions; the fraction of true items accepted and of corrupted
    items rejected, with rejections by reason. ``progress`` shows a bar of cases checked (on
    stderr), with the LM call in flight. ``lean`` runs the checks as the lean pipeline does (its
    compact prompts, the blind read first, and an audit of the record contributions, answer
    support and consistency when every fact is its cited sentence's own words)."""
    config = config or given_item_bundle_config()
    graph = graph or RecordGraph.build(history)
    rng = random.Random(f"fidelity:{seed}")
    usable = [
        q
        for q in qa_items
        if q.evidence_ids
        and len(q.evidence_ids) <= 4
        and all(rid in history for rid in q.evidence_ids)
        and q.answer.strip()
    ]
    sample = rng.sample(usable, min(limit, len(usable)))
    checker = FidelityChecker(lms, max_demos=0, bounded=bounded, lean=lean)
    cases: list[tuple[str, QAItem, Bundle, AnswerPlan]] = []
    all_ids = [r.id for r in history.records]
    for item in sample:
        bundle = bundle_around(graph, list(item.evidence_ids), config, rng)
        plan = evidence_plan(
            bundle, item.question, item.answer, item.answer_type, list(item.evidence_ids)
        )
        cases.append(("true", item, bundle, plan))
        others = [o for o in usable if normalize_text(o.answer) != normalize_text(item.answer)]
        same_type = [o for o in others if o.answer_type == item.answer_type] or others
        if same_type:
            swap = rng.choice(same_type)
            swapped = plan.model_copy(
                update={"answer": swap.answer, "answer_type": str(swap.answer_type)}
            )
            cases.append(("answer_swapped", item, bundle, swapped))
        answer_norm = normalize_text(item.answer)
        excluded = set(item.evidence_ids) | {
            n for rid in item.evidence_ids for n, _, _ in graph.neighbours(rid)
        }
        pool = [
            rid
            for rid in all_ids
            if rid not in excluded and answer_norm not in normalize_text(history[rid].text)
        ]
        if len(pool) >= len(item.evidence_ids):
            unrelated = rng.sample(pool, len(item.evidence_ids))
            b2 = bundle_around(graph, unrelated, config, rng)
            plan2 = evidence_plan(b2, item.question, item.answer, item.answer_type, unrelated)
            cases.append(("evidence_replaced", item, b2, plan2))
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(cases), desc="fidelity", unit="case", file=sys.stderr)
    on_call = (
        (lambda stage, done, total: bar.set_postfix_str(f"{stage} {done}/{total}")) if bar else None
    )
    on_done = (lambda i, out: bar.update(1)) if bar else None
    try:
        outcomes = checker.check(
            [(b, p, it.question, seed * 7919 + i) for i, (_, it, b, p) in enumerate(cases)],
            on_call,
            on_done,
        )
    finally:
        if bar is not None:
            bar.close()
    groups: dict[str, dict[str, Any]] = {}
    details = []
    for (kind, item, bundle, plan), out in zip(cases, outcomes, strict=True):
        g = groups.setdefault(kind, {"n": 0, "accepted": 0, "rejected_by_reason": Counter()})
        g["n"] += 1
        if out.status == "accepted":
            g["accepted"] += 1
        else:
            g["rejected_by_reason"][out.reason or "?"] += 1
        details.append(
            {
                "kind": kind,
                "qa_id": item.id,
                "question": item.question,
                "answer": plan.answer,
                "evidence_ids": plan.evidence_ids,
                "bundle": bundle.record_ids,
                "status": out.status,
                "reason": out.reason,
                "detail": out.detail,
                "blind_answer": out.blind.answer if out.blind else None,
            }
        )
    report: dict[str, Any] = {"items": len(sample), "checks": "lean" if lean else "v1"}
    for kind, g in groups.items():
        g["rejected_by_reason"] = dict(g["rejected_by_reason"].most_common())
        if kind == "true":
            g["accepted_fraction"] = round(g["accepted"] / g["n"], 4) if g["n"] else None
        else:
            g["rejected_fraction"] = round(1 - g["accepted"] / g["n"], 4) if g["n"] else None
        report[kind] = g
    report["cases"] = details
    return report


def format_fidelity(report: Mapping[str, Any]) -> str:
    lines = [f"fidelity of the checks on {report['items']} official items"]
    true = report.get("true")
    if true:
        lines.append(
            f"  true items accepted:          {true['accepted']}/{true['n']} "
            f"({100 * (true['accepted_fraction'] or 0):.1f}%)  rejections {true['rejected_by_reason']}"
        )
    for kind in ("answer_swapped", "evidence_replaced"):
        g = report.get(kind)
        if g:
            lines.append(
                f"  {kind + ' rejected:':<30}{g['n'] - g['accepted']}/{g['n']} "
                f"({100 * (g['rejected_fraction'] or 0):.1f}%)  by {g['rejected_by_reason']}"
            )
    return "\n".join(lines)
