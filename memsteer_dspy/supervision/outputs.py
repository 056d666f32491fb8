"""What a ``memsteer generate`` run writes and reads back: the candidate log's lines
(:class:`CandidateRecord`, :func:`read_log`), the accepted items (:func:`build_item`,
:func:`item_line`, :func:`load_qa_jsonl`), near-duplicate removal and the train/val split
(:func:`split_by_bundle`), the output folder's files and summary (:class:`SupervisionSet`,
:func:`format_summary`), and the accepted mix by task and question form.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from memsteer_dspy.bundles import (
    Bundle,
    Candidate,
    Task,
)
from memsteer_dspy.errors import InputError
from memsteer_dspy.normalize import normalize_text
from memsteer_dspy.records import AnswerType, History, QAItem, utc_naive
from memsteer_dspy.runfolder import JsonlLog, write_atomic
from memsteer_dspy.supervision.config import GenerationConfig
from memsteer_dspy.supervision.program import (
    GENERATION_ROLES,
    Outcome,
    RoleCost,
)

LOG_NAME = "candidates.jsonl"
_STOP = frozenset(
    "a an the of to in on at for with by from and or is was were are did do does i my me you your "
    "what which who whom when where how why that this it its be been".split()
)


class CandidateRecord(BaseModel):
    """One line of the progress log: a finished candidate with everything needed to rebuild the
    outputs (the accepted item, or the rejection's stage and reason)."""

    index: int
    status: Literal["accepted", "rejected", "skipped"]
    stage: str | None = None
    reason: str | None = None
    detail: str | None = None
    method: str
    seed_record: str
    task: Task
    bundle_id: str | None = None
    bundle_record_ids: list[str] = Field(default_factory=list)
    question: str | None = None
    answer: str | None = None
    item: dict[str, Any] | None = None
    outcome: dict[str, Any] | None = None
    usage: dict[str, RoleCost] = Field(default_factory=dict)
    seconds: float = 0.0
    finished_at: str = Field(
        default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds")
    )


def item_line(item: QAItem) -> dict[str, Any]:
    """An accepted item as written to train/val.jsonl: QAItem fields plus top-level ``facts``."""
    obj = item.model_dump(mode="json")
    obj["facts"] = obj["metadata"].get("facts", [])
    return obj


def load_qa_jsonl(path: str | Path) -> list[QAItem]:
    """Read QA items from a JSONL file written by ``memsteer generate`` (or any QAItem JSONL):
    the one QA reader, :func:`memsteer_dspy.loaders.jsonl.read_qa_items` (a top-level ``facts``
    list is kept in ``metadata["facts"]``; an unknown top-level key is an error naming the line
    and field)."""
    from memsteer_dspy.loaders.jsonl import read_qa_items

    return read_qa_items(Path(path))


@dataclass
class SupervisionSet:
    """Generated QA–evidence supervision: disjoint train and validation items."""

    train: list[QAItem] = field(default_factory=list)
    val: list[QAItem] = field(default_factory=list)

    @classmethod
    def load(cls, out_dir: str | Path) -> SupervisionSet:
        out = Path(out_dir)
        missing = [n for n in ("train.jsonl", "val.jsonl") if not (out / n).exists()]
        if missing:
            raise InputError(
                f"no {', '.join(missing)} in {out}",
                file=out,
                hint="point at a folder written by `memsteer generate --out`",
            )
        return cls(load_qa_jsonl(out / "train.jsonl"), load_qa_jsonl(out / "val.jsonl"))

    def __len__(self) -> int:
        return len(self.train) + len(self.val)


def read_log(out_dir: str | Path) -> list[CandidateRecord]:
    """The finished candidates of a run, one per index, in index order. A torn last line (a run
    killed mid-write) is cut off; see :class:`~memsteer_dspy.runfolder.JsonlLog`."""
    seen: dict[int, CandidateRecord] = {}
    for obj in JsonlLog(Path(out_dir) / LOG_NAME).read():
        r = CandidateRecord.model_validate(obj)
        seen.setdefault(r.index, r)
    return sorted(seen.values(), key=lambda r: r.index)


def _terms(question: str) -> frozenset[str]:
    return frozenset(w for w in normalize_text(question).split() if w not in _STOP)


class _Deduper:
    """Near-duplicate questions: content-word Jaccard ≥ threshold, or the same answer and evidence
    with Jaccard ≥ half the threshold."""

    def __init__(self, threshold: float):
        self.threshold = threshold
        self.seen: list[tuple[frozenset[str], str, frozenset[str], str]] = []

    def duplicate_of(self, question: str, answer: str, evidence: list[str]) -> str | None:
        terms, ans, ev = _terms(question), normalize_text(answer), frozenset(evidence)
        for other_terms, other_ans, other_ev, other_id in self.seen:
            union = terms | other_terms
            jac = len(terms & other_terms) / len(union) if union else 1.0
            if jac >= self.threshold or (
                ans == other_ans and ev == other_ev and jac >= self.threshold / 2
            ):
                return other_id
        return None

    def add(self, item_id: str, question: str, answer: str, evidence: list[str]) -> None:
        self.seen.append((_terms(question), normalize_text(answer), frozenset(evidence), item_id))


def split_by_bundle(
    items: list[QAItem], train_fraction: float, seed: int
) -> tuple[list[QAItem], list[QAItem]]:
    """Disjoint train/val: whole bundles go to one side, in a seeded order, until train holds
    ``train_fraction`` of the items."""
    groups: dict[str, list[QAItem]] = {}
    for it in items:
        groups.setdefault(it.metadata.get("provenance", {}).get("bundle_id", it.id), []).append(it)
    order = sorted(groups, key=lambda b: hashlib.sha256(f"{seed}:{b}".encode()).hexdigest())
    target = round(train_fraction * len(items))
    train: list[QAItem] = []
    val: list[QAItem] = []
    for b in order:
        g = groups[b]
        if len(train) + len(g) <= target or (not train and target > 0):
            train.extend(g)
        else:
            val.extend(g)
    key = {it.id: i for i, it in enumerate(items)}
    return sorted(train, key=lambda it: key[it.id]), sorted(val, key=lambda it: key[it.id])


def _question_date(history: History, evidence_ids: list[str]) -> date | None:
    """The day after the latest evidence record: asked then, every evidence record is in the past
    (RHELM's protocol answers from records strictly before the question date)."""
    days = [
        utc_naive(history[rid].timestamp)
        for rid in evidence_ids
        if rid in history and history[rid].timestamp
    ]
    return (max(days).date() + timedelta(days=1)) if days else None


def build_item(
    history: History,
    candidate: Candidate,
    outcome: Outcome,
    *,
    method: str,
    seed: int,
    lm_description: Mapping[str, str],
    item_id: str,
) -> QAItem:
    """The accepted candidate as a :class:`QAItem` (``source="generated"``) with facts, plan,
    audit verdicts, blind answer and provenance in ``metadata``."""
    plan = outcome.plan
    assert plan is not None and outcome.question
    bundle: Bundle = candidate.bundle  # type: ignore[assignment]
    facts = [{"span_id": f.span_id, "statement": f.statement} for f in plan.facts]
    evidence_ids = plan.evidence_ids
    span_ids = list(
        dict.fromkeys(
            [f.span_id for f in plan.facts] + ([plan.answer_span_id] if plan.answer_span_id else [])
        )
    )
    return QAItem(
        id=item_id,
        question=outcome.question,
        answer=plan.answer,
        answer_type=AnswerType(plan.answer_type),
        evidence_ids=evidence_ids,
        span_ids=span_ids,
        question_date=_question_date(history, evidence_ids),
        question_type=outcome.question_type or candidate.task.question_type,
        source="generated",
        metadata={
            "facts": facts,
            "plan": plan.model_dump(mode="json"),
            "audit": outcome.audit.model_dump(mode="json") if outcome.audit else None,
            "blind": outcome.blind.model_dump(mode="json") if outcome.blind else None,
            "repairs": [r.model_dump(mode="json") for r in outcome.repairs],
            "provenance": {
                "method": method,
                "seed": seed,
                "candidate_index": candidate.index,
                "seed_record": candidate.seed_id,
                "task": candidate.task.model_dump(),
                "bundle_id": bundle.id,
                "bundle_record_ids": bundle.record_ids,
                "bundle_tokens": bundle.tokens,
                "user": history.user_id,
                "history_fingerprint": history.fingerprint,
                "lm": {r: lm_description.get(r, "?") for r in GENERATION_ROLES},
                "usage": {r: c.model_dump() for r, c in outcome.usage.items()},
            },
        },
    )


def _dataset_dict(train: list[QAItem], val: list[QAItem]):
    from datasets import Dataset, DatasetDict, Features, Sequence, Value

    features = Features(
        {
            "id": Value("string"),
            "question": Value("string"),
            "answer": Value("string"),
            "answer_type": Value("string"),
            "evidence_ids": Sequence(Value("string")),
            "span_ids": Sequence(Value("string")),
            "question_date": Value("string"),
            "question_type": Value("string"),
            "facts": [{"span_id": Value("string"), "statement": Value("string")}],
            "metadata": Value("string"),
        }
    )

    def rows(items: list[QAItem]) -> dict[str, list]:
        cols: dict[str, list] = {k: [] for k in features}
        for it in items:
            obj = it.model_dump(mode="json")
            for k in (
                "id",
                "question",
                "answer",
                "answer_type",
                "evidence_ids",
                "span_ids",
                "question_date",
                "question_type",
            ):
                cols[k].append(obj[k])
            cols["facts"].append(obj["metadata"].get("facts", []))
            cols["metadata"].append(json.dumps(obj["metadata"], ensure_ascii=False))
        return cols

    return DatasetDict(
        {
            "train": Dataset.from_dict(rows(train), features=features),
            "validation": Dataset.from_dict(rows(val), features=features),
        }
    )


def _summary(
    log: list[CandidateRecord],
    accepted: list[QAItem],
    config: GenerationConfig,
    wall: float,
    lm_description,
) -> dict[str, Any]:
    tried = [r for r in log if r.status != "skipped"]
    rejected = [r for r in log if r.status == "rejected"]
    calls: Counter[str] = Counter()
    tokens: dict[str, Counter[str]] = {}
    for r in log:
        for role, c in r.usage.items():
            calls[role] += c.calls
            t = tokens.setdefault(role, Counter())
            t["prompt_tokens"] += c.prompt_tokens
            t["completion_tokens"] += c.completion_tokens
    n_acc = len(accepted)
    per = (
        {
            role: round((t["prompt_tokens"] + t["completion_tokens"]) / n_acc, 1)
            for role, t in tokens.items()
        }
        if n_acc
        else {}
    )
    if per:
        per["total"] = round(sum(per.values()), 1)
    return {
        "method": config.method,
        "checks": config.checks,
        "seed": config.seed,
        "n_wanted": config.n,
        "max_candidates": config.candidate_limit,
        "candidates": len(tried),
        "skipped_bundles": len(log) - len(tried),
        "accepted": n_acc,
        "kept_fraction": round(n_acc / len(tried), 4) if tried else 0.0,
        "rejected": len(rejected),
        "rejected_by_stage": dict(Counter(r.stage or "?" for r in rejected).most_common()),
        "rejected_by_reason": dict(Counter(r.reason or "?" for r in rejected).most_common()),
        "skipped_by_reason": dict(
            Counter(r.reason or "?" for r in log if r.status == "skipped").most_common()
        ),
        **accepted_distribution(accepted),
        "kept_by_task": kept_by_task(log),
        "repairs": sum(
            len((r.outcome or {}).get("repairs", [])) for r in log if r.status == "accepted"
        ),
        "lm_calls": dict(calls),
        "lm_calls_per_accepted": {role: round(c / n_acc, 2) for role, c in calls.items()}
        if n_acc
        else {},
        "tokens_by_role": {role: dict(t) for role, t in tokens.items()},
        "tokens_per_accepted": per,
        "tokens_estimated": any(c.estimated for r in log for c in r.usage.values()),
        "seconds_per_candidate": round(sum(r.seconds for r in tried) / len(tried), 2)
        if tried
        else 0.0,
        "wall_seconds": round(wall, 1),
        "lm": dict(lm_description),
    }


class _Outputs:
    """Rebuilds every derived file from the log (atomically)."""

    def __init__(self, out_dir: Path, history: History, config: GenerationConfig, lm_description):
        self.out = out_dir
        self.history = history
        self.config = config
        self.lm_description = lm_description

    def write(
        self,
        log: list[CandidateRecord],
        wall: float,
        *,
        dataset: bool,
        stopped_by: str | None = None,
    ) -> dict[str, Any]:
        accepted = [QAItem.model_validate(r.item) for r in log if r.status == "accepted" and r.item]
        train, val = split_by_bundle(accepted, self.config.train_fraction, self.config.seed)
        write_atomic(
            self.out / "train.jsonl",
            "".join(json.dumps(item_line(i), ensure_ascii=False) + "\n" for i in train),
        )
        write_atomic(
            self.out / "val.jsonl",
            "".join(json.dumps(item_line(i), ensure_ascii=False) + "\n" for i in val),
        )
        rejected = []
        for r in log:
            if r.status == "accepted":
                continue
            obj = r.model_dump(mode="json", exclude={"item"})
            rejected.append(json.dumps(obj, ensure_ascii=False) + "\n")
        write_atomic(self.out / "rejected.jsonl", "".join(rejected))
        summary = _summary(log, accepted, self.config, wall, self.lm_description)
        summary["train"], summary["val"] = len(train), len(val)
        if stopped_by is not None:
            summary["stopped_by"] = stopped_by
        write_atomic(
            self.out / "summary.json", json.dumps(summary, indent=2, ensure_ascii=False) + "\n"
        )
        if dataset:
            tmp = self.out / ".dataset.tmp"
            if tmp.exists():
                import shutil

                shutil.rmtree(tmp)
            _dataset_dict(train, val).save_to_disk(str(tmp))
            final = self.out / "dataset"
            if final.exists():
                import shutil

                shutil.rmtree(final)
            tmp.replace(final)
        return summary


def _question_word(question: str) -> str:
    """The question's form: its wh-word ("how many" / "how much" kept whole), else "other"."""
    words = normalize_text(question).split()
    for i, w in enumerate(words[:4]):
        if w == "how" and i + 1 < len(words) and words[i + 1] in ("many", "much", "long", "old"):
            return f"how {words[i + 1]}"
        if w in ("who", "whom", "whose", "what", "when", "where", "which", "why", "how"):
            return w
    return "other"


def accepted_distribution(items: list[QAItem]) -> dict[str, dict[str, int]]:
    """The accepted items by answer type, question type (the task's), question form (wh-word) and
    evidence count (number of evidence records)."""

    def count(values) -> dict[str, int]:
        return dict(Counter(values).most_common())

    return {
        "accepted_by_answer_type": count(str(i.answer_type) for i in items),
        "accepted_by_question_type": count(i.question_type or "?" for i in items),
        "accepted_by_question_word": count(_question_word(i.question) for i in items),
        "accepted_by_evidence_count": count(str(len(i.evidence_ids)) for i in items),
    }


def kept_by_task(log: list[CandidateRecord]) -> dict[str, dict[str, int]]:
    """Candidates tried and accepted per task kind, ``"<answer type>/<evidence count>"`` (``any``
    where the task left the answer type to the planner), most tried first.

    The sampler steers toward the kinds the accepted items lack; this is what each kind yields on
    the LM at hand (on the embedded 1.5B model entity and two-record tasks are kept far less often
    than one-record dates), so a run can tell a mix that was asked for from one that was kept."""
    tried: Counter[str] = Counter()
    kept: Counter[str] = Counter()
    for r in log:
        if r.status == "skipped":
            continue
        kind = f"{r.task.answer_type or 'any'}/{r.task.evidence_count}"
        tried[kind] += 1
        kept[kind] += r.status == "accepted"
    return {k: {"tried": n, "accepted": kept[k]} for k, n in tried.most_common()}


def format_kept(kept: Mapping[str, Mapping[str, int]]) -> str:
    """:func:`kept_by_task` in one line: ``date/1 2/6, entity/1 1/14, …``."""
    return ", ".join(f"{k} {v['accepted']}/{v['tried']}" for k, v in kept.items())


def format_summary(summary: Mapping[str, Any]) -> str:
    """The end-of-run report: kept %, rejections by stage, LM calls and tokens per accepted item
    by role, wall time."""
    lines = [
        f"accepted {summary['accepted']} of {summary['candidates']} candidates "
        f"(kept {100 * summary['kept_fraction']:.1f}%); train {summary.get('train', 0)}, val {summary.get('val', 0)}",
    ]
    if summary.get("skipped_bundles"):
        lines.append(
            f"skipped bundles: {summary['skipped_bundles']} {summary.get('skipped_by_reason', {})}"
        )
    if summary["rejected_by_stage"]:
        lines.append(
            "rejected by stage: "
            + ", ".join(f"{k} {v}" for k, v in summary["rejected_by_stage"].items())
        )
        lines.append(
            "rejected by reason: "
            + ", ".join(f"{k} {v}" for k, v in summary["rejected_by_reason"].items())
        )
    for key, label in (
        ("accepted_by_answer_type", "answer type"),
        ("accepted_by_question_word", "question form"),
        ("accepted_by_evidence_count", "evidence records"),
    ):
        if summary.get(key):
            lines.append(
                f"accepted by {label}: " + ", ".join(f"{k} {v}" for k, v in summary[key].items())
            )
    if summary.get("kept_by_task"):
        lines.append("kept by task (accepted/tried): " + format_kept(summary["kept_by_task"]))
    per_calls = summary.get("lm_calls_per_accepted", {})
    per_tokens = summary.get("tokens_per_accepted", {})
    if per_tokens:
        est = " (estimated)" if summary.get("tokens_estimated") else ""
        lines.append(f"per accepted item{est}:")
        for role in GENERATION_ROLES:
            if role in per_tokens:
                lines.append(
                    f"  {role:<16} {per_calls.get(role, 0):>6.2f} calls  {per_tokens[role]:>9.1f} tokens"
                )
        lines.append(
            f"  {'total':<16} {sum(per_calls.values()):>6.2f} calls  {per_tokens.get('total', 0):>9.1f} tokens"
        )
    lines.append(
        f"wall time {summary['wall_seconds']:.1f}s ({summary.get('seconds_per_candidate', 0):.1f}s per candidate)"
        + ("; stopped by the time budget" if summary.get("stopped_by") == "time_budget" else "")
    )
    return "\n".join(lines)
