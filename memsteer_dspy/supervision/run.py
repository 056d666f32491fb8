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
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import dspy
from pydantic import BaseModel, ConfigDict, Field, model_validator

from memsteer_dspy.bundles import (
    ANCHORED_SAMPLING,
    AcceptedMix,
    Bundle,
    BundleConfig,
    BundleSampler,
    Candidate,
    Task,
    small_lm_bundle_config,
)
from memsteer_dspy.errors import InputError
from memsteer_dspy.graph import GraphParams, RecordGraph
from memsteer_dspy.normalize import normalize_text
from memsteer_dspy.records import AnswerType, History, QAItem, utc_naive
from memsteer_dspy.runfolder import JsonlLog, RunFolder, run_key, write_atomic
from memsteer_dspy.supervision.program import (
    ANCHORED_VERSION,
    GENERATION_ROLES,
    LEAN_VERSION,
    OWN_WORDS_VERSION,
    PROMPT_VERSION,
    Outcome,
    RoleCost,
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
    "small_lm_generation_config",
]

METHODS = ("memsteer", "joint", "direct", "naive")
LOG_NAME = "candidates.jsonl"
_STOP = frozenset(
    "a an the of to in on at for with by from and or is was were are did do does i my me you your "
    "what which who whom when where how why that this it its be been".split()
)


# BundleConfig options added after runs were made, with their defaults: a run at the default keeps
# the key it had before the option existed, so it still resumes.
_LATER_BUNDLE_OPTIONS = {
    "steer_by_yield": False,
    "yield_power": 1.0,
    "steer_to_options": False,
    "steer_to_pairs": False,
    "user_turns_only": False,
    "skip_unconcrete": False,
    "bridges": False,
    "updates": False,
}


class GenerationConfig(BaseModel):
    """Settings of one ``generate`` run. ``max_candidates`` defaults to 5 × ``n``."""

    model_config = ConfigDict(extra="forbid")

    n: int = Field(default=100, ge=1, description="Accepted items wanted.")
    max_candidates: int | None = Field(default=None, ge=1)
    time_budget_s: float | None = Field(
        default=None,
        gt=0,
        description="Start no new candidate once the run's generation has taken this many seconds "
        "(all its sessions together; None: no limit). Like n and max_candidates it decides only "
        "when the run stops, never what a candidate yields.",
    )
    method: Literal["memsteer", "joint", "direct", "naive"] = "memsteer"
    checks: bool = True
    seed: int = 0
    threads: int = Field(default=1, ge=1)
    batch_size: int = Field(
        default=8, ge=1, description="Candidates run stage by stage together (one thread)."
    )
    train_fraction: float = Field(default=0.6, gt=0, lt=1)
    max_demos: int | None = Field(
        default=None,
        ge=0,
        description="Few-shot demonstrations bootstrapped from accepted items (None: 2, or 0 when "
        "bounded: measured on the embedded 1.5B model, a planner shown a real accepted item copies "
        "its answer into other bundles; the fictional cold-start demo stays).",
    )
    max_retries: int = Field(default=2, ge=0)
    bounded: bool = Field(
        default=False,
        description="Length limits in the output schemas (LMs that decode under them).",
    )
    cold_start: bool = Field(
        default=True, description="A fictional demonstration until real ones exist."
    )
    lean: bool = Field(
        default=False,
        description="The cheaper pipeline for small LMs (same stages): compact prompts, a "
        "pre-filter of bundles with nothing concrete before any LM call, the blind read before "
        "the audit, tight output caps. False (default): the earlier prompts and order, which "
        "kept 5 of 16 candidates on the embedded model against lean's 2 of 16.",
    )
    anchored: bool = Field(
        default=False,
        description="MemSteer method: the planner chooses its reference answer from the answer "
        "options the program reads off the bundle's sentences (names, numbers, enumerations, "
        "record dates; bundles.answer_options), by number, instead of writing it; every other "
        "stage and check is unchanged. A bundle with no option is rejected before any LM call.",
    )
    own_words: bool = Field(
        default=True,
        description="With checks: a question that copies its evidence records' wording (more than "
        "checks.ECHO_MAX_WORDS distinctive words, or a run of more than checks.ECHO_MAX_RUN words) "
        "is re-written with the copied words named, and rejected as question:echoes if it still "
        "copies them. A question in its evidence's words is found by lexical retrieval by "
        "construction, so it cannot tell memory designs apart (memsteer assess --steering).",
    )
    dedup_threshold: float = Field(default=0.8, gt=0, le=1)
    bundle: BundleConfig = Field(default_factory=BundleConfig)
    graph: dict[str, Any] = Field(default_factory=lambda: asdict(GraphParams()))

    @model_validator(mode="after")
    def _anchored_plans_only(self) -> GenerationConfig:
        if self.anchored and self.method != "memsteer":
            raise ValueError(
                f"anchored plans are the memsteer method's planner; method is {self.method!r}"
            )
        return self

    @property
    def demo_limit(self) -> int:
        if self.max_demos is not None:
            return self.max_demos
        return 0 if self.bounded else 2

    @property
    def candidate_limit(self) -> int:
        return self.max_candidates or 5 * self.n

    def identity(self) -> dict[str, Any]:
        """The settings a resumed run must share with the run it continues: also the version of the
        prompts (:data:`~memsteer_dspy.supervision.program.PROMPT_VERSION`) and, for a lean run,
        of lean's checks (:data:`~memsteer_dspy.supervision.program.LEAN_VERSION`)."""
        bundle = self.bundle.model_dump(mode="json")
        for name, default in _LATER_BUNDLE_OPTIONS.items():  # at its default: the key runs made
            if bundle.get(name) == default:  # before the option had
                bundle.pop(name)
        key = {
            "method": self.method,
            "checks": self.checks,
            "seed": self.seed,
            "lean": self.lean,
            "bundle": bundle,
            "graph": self.graph,
            "prompt_version": PROMPT_VERSION,
        }
        if self.lean:
            key["lean_version"] = LEAN_VERSION
        if self.anchored:  # absent when off: the key runs made before the option had
            key["anchored_version"] = ANCHORED_VERSION
        if self.own_words and self.checks:  # absent when off, as above
            key["own_words_version"] = OWN_WORDS_VERSION
        return key


def small_lm_generation_config(**fields: Any) -> GenerationConfig:
    """The configuration for a small in-process LM (the small bundle profile), as measured on the
    embedded 1.5B model by ``benchmarks/generate_cost.py`` (its ``lean-anchor``): the lean pipeline,
    the anchored planner, and tasks steered toward the profile's mix, each kind weighed by its
    squared kept share and by the answer types a bundle has options for. ``fields`` are any other
    :class:`GenerationConfig` fields (n, seed, …)."""
    bundle = small_lm_bundle_config(steer_by_yield=True, yield_power=2.0, **ANCHORED_SAMPLING)
    return GenerationConfig(**{"lean": True, "anchored": True, "bundle": bundle, **fields})


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


# --------------------------------------------------------------------------------------------
# reading and writing QA files
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# near-duplicates and the split
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# building the accepted item
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# outputs
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------------


def generation_key(
    history: History, config: GenerationConfig, lms: Mapping[str, Any]
) -> dict[str, Any]:
    """The same-run key of a ``generate`` run: the history, the settings that decide candidates
    and verdicts (:meth:`GenerationConfig.identity`) and the LM of each generation role (model
    and sampling settings, :func:`~memsteer_dspy.runfolder.lm_identity`)."""
    return run_key(
        "generate",
        history=history,
        options=config.identity(),
        lms={r: lms[r] for r in GENERATION_ROLES if r in lms},
    )


ProgressHook = Callable[[CandidateRecord, dict[str, int]], None]


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
        updates=config.bundle.updates,
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
