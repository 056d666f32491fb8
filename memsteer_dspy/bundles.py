"""Material bundles: path-based expansion from seeds over the record graph (paper Section 3.2).

"Path-based expansion from a seed samples a connected subgraph, whose records form a
context-budgeted material bundle B with source-span references for identifying jointly supporting
facts and evidence records."

* :func:`sample_seeds` picks seed records that cover the history's sources (record kinds), time
  (months) and threads — never all from one conversation — preferring records whose spans carry
  names, numbers, dates and places (:func:`informativeness`).
* :func:`expand_bundle` walks typed edges from a seed, choosing each next record among the walked
  records' neighbours with probability proportional to the edge weight, until the bundle has its
  records or its token budget (``memsteer_dspy.tokens.count_tokens``) is used.
* :class:`Task` asks for a question type and an evidence count (1–4 records); :func:`sample_task`
  draws one.
* :class:`BundleSampler` ties these together: candidate ``i`` of a run is a pure function of
  (history, graph, config, seed, i), so a resumed run rebuilds exactly the same candidates.

A bundle renders its records as quoted data, one labelled span per line (``[<span id>] text``),
which is what every LLM role reads.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise, zip_longest
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from memsteer_dspy.graph import EdgeType, RecordGraph
from memsteer_dspy.records import History, Record, Span, states_nothing
from memsteer_dspy.tokens import count_tokens
from memsteer_dspy.untrusted import WITHHELD, instruction_like

__all__ = [
    "QUESTION_TYPES",
    "Bundle",
    "BundleConfig",
    "BundleRecord",
    "BundleView",
    "BundleSampler",
    "Candidate",
    "Task",
    "expand_bundle",
    "concrete_records",
    "informativeness",
    "random_bundle",
    "sample_seeds",
    "sample_task",
    "steered_task",
    "task_for_count",
    "answer_kinds",
    "answer_options",
    "pair_options",
    "bridge_event",
    "bridge_options",
    "update_options",
    "update_values",
    "stating_spans",
    "task_options",
    "AnswerOption",
    "plain_text",
    "small_lm_bundle_config",
    "ANCHORED_SAMPLING",
    "UNDATED_EVENT_KINDS",
]

QUESTION_TYPES: dict[str, str] = {
    "fact": "a single fact stated in one record (who, what, where, which)",
    "temporal": "when something happened (the answer is a date: a record's date or a date it mentions), "
    "or the order or time between events",
    "aggregation": "a count, total or list gathered across the evidence records",
    "multi-hop": "a fact found by linking one record's fact to another's",
    "comparison": "which of two things is larger, earlier, more, or different",
}
# Which question types suit how many evidence records.
_TYPES_BY_COUNT: dict[int, tuple[str, ...]] = {
    1: ("fact", "temporal"),
    2: ("multi-hop", "temporal", "comparison", "aggregation"),
    3: ("aggregation", "multi-hop"),
    4: ("aggregation",),
}


# Which answer types suit each question type (a task that targets an answer type draws its
# question type among these).
ANSWER_TYPES_BY_QUESTION: dict[str, tuple[str, ...]] = {
    "fact": ("entity", "number"),
    "temporal": ("date",),
    "aggregation": ("number", "list"),
    "multi-hop": ("entity",),
    "comparison": ("entity",),
}
# How the planner is told the answer type a task targets.
ANSWER_TYPE_TEXT: dict[str, str] = {
    "entity": "a name of a person, place, organisation or thing",
    "number": "a number (a count, amount, price, duration or quantity)",
    "date": "a date",
    "list": "a list of two or more names or things",
    "text": "a short phrase",
    "boolean": "yes or no",
}


class BundleConfig(BaseModel):
    """How bundles are built.

    ``token_budget`` bounds the rendered bundle (cl100k tokens). A bundle has
    ``max(min_records, evidence_count + 1)`` records, at most ``max_records``, so every task has
    at least one distractor record. ``record_token_cap`` keeps only a record's leading spans
    that fit that many tokens (None keeps whole records; a small LM reads better with ~200).
    ``evidence_weights`` is the chance of each evidence count; ``question_types`` restricts the
    types drawn. ``edge_types`` are the edges expansion may walk.
    """

    model_config = ConfigDict(extra="forbid")

    token_budget: int = Field(default=2500, ge=100)
    min_records: int = Field(default=3, ge=1)
    max_records: int = Field(default=6, ge=1)
    record_token_cap: int | None = Field(default=None, ge=20)
    evidence_weights: dict[int, float] = Field(
        default_factory=lambda: {1: 0.45, 2: 0.35, 3: 0.15, 4: 0.05}
    )
    question_types: list[str] | None = None
    edge_types: list[EdgeType] = Field(default_factory=lambda: list(EdgeType))
    min_seed_informativeness: float = 1.0
    answer_type_weights: dict[str, float] | None = Field(
        default=None,
        description="Target mix of answer types (entity, number, date, list, …). Set, each task "
        "targets an answer type, and the sampler steers tasks toward the kinds (and evidence "
        "counts) the accepted items lack; None: no target, tasks as drawn from evidence_weights.",
    )
    steer_to_bundle: bool = Field(
        default=True,
        description="With answer_type_weights: a task targets only answer types its bundle's "
        "sentences hold (answer_kinds: a number, a name other than the user's, a list); the "
        "target mix is then steered among those.",
    )
    steer_by_yield: bool = Field(
        default=False,
        description="With answer_type_weights: each kind's steered weight is also multiplied by "
        "what that kind has yielded so far on this run, (accepted + 1) / (tried + 2) of the tasks "
        "that asked for it (per answer type and per evidence count), so a kind the LM rarely gets "
        "through the checks is asked for less instead of more as it falls further behind.",
    )
    steer_to_options: bool = Field(
        default=False,
        description="With steer_to_bundle: the answer types a bundle holds are those of its answer "
        "options (answer_options), what an anchored planner can choose from, instead of those its "
        "sentences suggest (answer_kinds, which also counts a stray number or a capitalised word).",
    )
    skip_unconcrete: bool = Field(
        default=False,
        description="A candidate whose bundle has fewer records with concrete detail (names, "
        "numbers, dates, places: concrete_records) than its task's evidence records is skipped "
        "as no candidate (bundle:nothing_concrete), before any LM call, instead of being tried and "
        "rejected by the lean pre-filter.",
    )
    user_turns_only: bool = Field(
        default=False,
        description="A conversation turn shows only the user's message, not the assistant's reply "
        "(other records are whole). Questions are about the user's own life: on the embedded "
        "model the assistant's sentences gave answers such as the number of suggestions it made, "
        "and half of a turn's tokens, read by every role.",
    )
    steer_to_pairs: bool = Field(
        default=False,
        description="With steer_to_options: a task of two or more evidence records targets the "
        "answer types of the bundle's two-record options (pair_options: an answer one record "
        "writes that another record writes too), and asks for one record where the bundle has "
        "none. Measured on the embedded model, two-record tasks planned from one-record options "
        "kept none of 60.",
    )
    updates: bool = Field(
        default=False,
        description="With steer_to_pairs: a two-record task may also be answered by a knowledge "
        "update (update_options): the value a later record writes for what an earlier record "
        "wrote another value of ('When is my dental cleaning now?' of a confirmation and its "
        "rescheduling).",
    )
    bridges: bool = Field(
        default=False,
        description="With steer_to_pairs: a two-record task may also be answered by a bridge "
        "(bridge_options): an answer one record writes, asked by what another record of the same "
        "day tells ('Who helped me set up the displays on the day the winter storm hit?'), the "
        "way most of RHELM's official multi-record questions are asked.",
    )
    yield_power: float = Field(
        default=1.0,
        ge=1.0,
        le=4.0,
        description="With steer_by_yield: the power the yield is raised to. The lag term can "
        "raise a kind that has nothing accepted by exp(4 x its target share) (4.1x for two-record "
        "items), more than a yield of 1/21 takes away (measured: all 19 two-record tasks of a "
        "40-candidate run failed and still took half the draws); at 2 a kind that keeps failing "
        "loses its draws within about ten tries.",
    )


def small_lm_bundle_config(**overrides) -> BundleConfig:
    """Bundles a small embedded LM handles: three records of at most ~150 tokens each, and one-
    or two-record tasks (measured on RHELM with the 1.5B model). ``steered=True`` (default) aims
    the tasks at :data:`STEERED_MIX` (every answer type, a third two-record items) and steers toward
    the kinds the accepted items lack; ``steered=False`` is the earlier 80/20 one-/two-record draw
    without answer-type targets."""
    values = {
        "record_token_cap": 150,
        "min_records": 3,
        "max_records": 3,
        "evidence_weights": {1: 0.8, 2: 0.2},
    }
    if overrides.pop("steered", True):
        values.update(STEERED_MIX)
    values.update(overrides)
    return BundleConfig(**values)


MIN_CONCRETE_DETAIL = 2.0
"""The :func:`informativeness` a record needs to count as concrete (:func:`concrete_records`)."""

# How an anchored planner's candidates are sampled (GenerationConfig.anchored): tasks steered to
# the answer types the bundle's options hold, two-record tasks to answers two records write,
# conversation turns shown by the user's message, seeds with concrete detail (a seed below it only
# when none is left), and bundles with nothing concrete skipped. (Measured: with the user's side
# of a turn and seeds of detail 1, 2 of a run's first 4 bundles had no concrete record.)
ANCHORED_SAMPLING: dict[str, bool | float] = {
    "steer_to_options": True,
    "steer_to_pairs": True,
    "bridges": True,
    "updates": True,
    "user_turns_only": True,
    "skip_unconcrete": True,
    "min_seed_informativeness": MIN_CONCRETE_DETAIL,
}

# The small profile's target mix when steered: every answer kind, and a third multi-record items.
STEERED_MIX: dict = {
    "evidence_weights": {1: 0.65, 2: 0.35},
    "answer_type_weights": {"entity": 0.35, "number": 0.25, "date": 0.25, "list": 0.15},
}


class Task(BaseModel):
    """What the planner is asked for: a question type, how many evidence records it needs, and
    (optionally) the answer type it should aim for."""

    model_config = ConfigDict(frozen=True)

    question_type: str
    evidence_count: int = Field(ge=1, le=4)
    answer_type: str | None = None

    @property
    def description(self) -> str:
        text = QUESTION_TYPES.get(self.question_type, self.question_type)
        if self.answer_type:
            text += (
                f"; the answer should be {ANSWER_TYPE_TEXT.get(self.answer_type, self.answer_type)}"
            )
        return text


class BundleRecord(BaseModel):
    """One record of a bundle: its identity, provenance fields and the spans it shows."""

    id: str
    kind: str
    date: str | None = None
    author: str | None = None
    thread_id: str | None = None
    title: str | None = None
    spans: list[Span]
    truncated: bool = False

    def render(self, label: str | None = None) -> str:
        """The record as quoted lines: a header, then ``[<label>.<n>] text`` per span (with no
        ``label``, the full span ids)."""
        head = [self.kind]
        if self.date:
            head.append(self.date)
        if self.author:
            head.append(f"by {self.author}")
        if self.title:
            head.append(f"title: {self.title}")
        name = label or self.id
        lines = [f"### {name} ({'; '.join(head)})"]
        lines += [f"[{f'{label}.{s.index}' if label else s.id}] {s.text}" for s in self.spans]
        if self.truncated:
            lines.append("[…]")
        return "\n".join(lines)


_LABEL = re.compile(r"^\[?\s*R\s*(\d+)\s*(?:[.#:]\s*(?:S\s*)?(\d+))?\s*\]?$", re.I)


@dataclass(frozen=True)
class BundleView:
    """A bundle rendered for an LLM role: records in a given order, labelled ``R1``, ``R2``, …
    and spans ``R1.1``, ``R1.2``, … (short labels a small LM copies reliably), with the maps back
    to record and span ids."""

    text: str
    record_labels: dict[str, str]  # label -> record id
    span_ids: frozenset[str]

    def label_of(self, record_id: str) -> str | None:
        return next((lab for lab, rid in self.record_labels.items() if rid == record_id), None)

    def span_label(self, span_id: str) -> str:
        record_id, _, n = span_id.rpartition("#")
        label = self.label_of(record_id)
        return f"{label}.{n}" if label else span_id

    def resolve_span(self, ref: str) -> str | None:
        """The span id a label (``R2.3``) or a full span id names; None if it names none."""
        ref = str(ref).strip().strip("[]").strip()
        if ref in self.span_ids:
            return ref
        m = _LABEL.match(ref)
        if m and m.group(2) and f"R{m.group(1)}" in self.record_labels:
            span_id = f"{self.record_labels[f'R{m.group(1)}']}#{int(m.group(2))}"
            return span_id if span_id in self.span_ids else None
        return None

    def resolve_record(self, ref: str) -> str | None:
        """The record id a label (``R2``, or a span label ``R2.3``) or a full id names."""
        ref = str(ref).strip().strip("[]").strip()
        if ref in self.record_labels.values():
            return ref
        m = _LABEL.match(ref)
        if m and f"R{m.group(1)}" in self.record_labels:
            return self.record_labels[f"R{m.group(1)}"]
        span = self.resolve_span(ref)
        return span.rpartition("#")[0] if span else None


class Bundle(BaseModel):
    """A context-budgeted material bundle: connected records with span ids."""

    id: str
    seed_id: str
    method: Literal["graph", "random", "given"] = "graph"
    records: list[BundleRecord]
    path: list[tuple[str, str, str]] = Field(
        default_factory=list, description="(from, to, edge type) walked."
    )
    tokens: int = 0

    @property
    def record_ids(self) -> list[str]:
        return [r.id for r in self.records]

    def record(self, record_id: str) -> BundleRecord | None:
        return next((r for r in self.records if r.id == record_id), None)

    def spans(self) -> list[Span]:
        return [s for r in self.records for s in r.spans]

    def span(self, span_id: str) -> Span | None:
        return next((s for s in self.spans() if s.id == span_id), None)

    def render(self, order: Sequence[str] | None = None) -> str:
        """The records as quoted data with full span ids, in ``order`` (record ids) or bundle order."""
        recs = self.records if order is None else [self.record(i) for i in order if self.record(i)]
        return "\n\n".join(r.render() for r in recs)

    def view(self, order: Sequence[str] | None = None) -> BundleView:
        """The records labelled ``R1``… in ``order`` (record ids; default bundle order)."""
        recs = self.records if order is None else [r for i in order if (r := self.record(i))]
        labels = {f"R{i}": r.id for i, r in enumerate(recs, 1)}
        text = "\n\n".join(r.render(f"R{i}") for i, r in enumerate(recs, 1))
        return BundleView(
            text=text, record_labels=labels, span_ids=frozenset(s.id for r in recs for s in r.spans)
        )

    def subset(self, record_ids: Iterable[str]) -> Bundle:
        keep = set(record_ids)
        recs = [r for r in self.records if r.id in keep]
        return self.model_copy(update={"records": recs, "tokens": _render_tokens(recs)})


class Candidate(BaseModel):
    """One planned candidate of a run: its index, seed, task and bundle (or why it was skipped)."""

    index: int
    seed_id: str
    task: Task
    bundle: Bundle | None = None
    skip_reason: str | None = None


# --------------------------------------------------------------------------------------------
# seeds
# --------------------------------------------------------------------------------------------

_MONTHS = r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*"
_DATE = re.compile(
    rf"\b{_MONTHS}\b\.?\s*\d{{1,2}}|\b\d{{4}}-\d{{2}}-\d{{2}}\b|\b\d{{1,2}}/\d{{1,2}}\b", re.I
)
_WEEKDAY = re.compile(r"\b(?:mon|tues|wednes|thurs|fri|satur|sun)day\b", re.I)
_NUMBER = re.compile(
    r"\b\d+(?:[.,]\d+)?\b|\b(?:two|three|four|five|six|seven|eight|nine|ten|twelve|dozen)\b", re.I
)
_NAME = re.compile(r"(?<=[a-z,;:] )[A-Z][a-z]+(?:\s+[A-Z][a-z]+)*")
_PLACE = re.compile(r"\b(?:in|at|to|from|near)\s+(?:the\s+)?[A-Z][a-z]+")
_SPEAKER = re.compile(r"^(?:User|Assistant|Sender|Recipient|Subject|Summary):\s*")


_URL = re.compile(r"https?://\S+|\[[^\]]*\]\([^)]*\)")
_MARKUP = re.compile(r"^[#>*\-\s]*(?:\d+[.)]\s*)?")


def plain_text(text: str) -> str:
    """A span's words without links, markup, list numbers and speaker prefixes."""
    return _MARKUP.sub("", _SPEAKER.sub("", _URL.sub(" ", text)))


def span_features(text: str) -> dict[str, int]:
    """Counts of names, numbers, dates and places in one span (links, markup, list numbers and
    spans under five words carry none)."""
    text = plain_text(text)
    if len(text.split()) < 5:
        return {"names": 0, "numbers": 0, "dates": 0, "places": 0}
    return {
        "names": len(_NAME.findall(text)),
        "numbers": len(_NUMBER.findall(text)),
        "dates": len(_DATE.findall(text)) + len(_WEEKDAY.findall(text)),
        "places": len(_PLACE.findall(text)),
    }


def informativeness(spans: Iterable[Span]) -> float:
    """How much checkable detail the spans carry: per span, one point per kind of detail
    (name, number, date, place) it mentions, summed over the record's best three spans."""
    scores = sorted(
        (sum(1 for v in span_features(s.text).values() if v) for s in spans), reverse=True
    )
    return float(sum(scores[:3]))


def concrete_records(bundle: Bundle, min_detail: float = MIN_CONCRETE_DETAIL) -> list[str]:
    """The bundle's records with something a concrete question can name: names, numbers, dates
    or places worth at least ``min_detail`` points of :func:`informativeness` over the spans the
    roles see."""
    return [r.id for r in bundle.records if informativeness(r.spans) >= min_detail]


_ASSISTANT_TURN = re.compile(r"^\s*Assistant\s*:", re.I)


def user_side(record: Record) -> list[Span]:
    """A conversation turn's spans up to the assistant's reply (the user's message); every span of
    any other record, or of a turn without a user part."""
    spans = list(record.spans)
    if record.kind != "conversation_turn":
        return spans
    cut = next((i for i, s in enumerate(spans) if i and _ASSISTANT_TURN.match(s.text)), None)
    return spans if cut is None else spans[:cut]


def _visible_spans(
    record: Record, cap: int | None, user_only: bool = False
) -> tuple[list[Span], bool]:
    """The leading spans of ``record`` that fit ``cap`` tokens (all of them without a cap); with
    ``user_only``, of a conversation turn only the user's message (:func:`user_side`). A sentence
    addressed to an AI reader is shown withheld (:mod:`memsteer_dspy.untrusted`): no role reads
    it, and no answer comes from it."""
    spans = [
        s.model_copy(update={"text": WITHHELD}) if instruction_like(s.text) else s
        for s in (user_side(record) if user_only else record.spans)
    ]
    cut = len(spans) < len(record.spans)
    if cap is None:
        return list(spans), cut
    kept, used = [], 0
    for s in spans:
        n = count_tokens(s.text) + 8
        if kept and used + n > cap:
            return kept, True
        kept.append(s)
        used += n
    if cut:
        return kept, True
    return kept, False


def _month(record: Record) -> str:
    return record.timestamp.strftime("%Y-%m") if record.timestamp else "undated"


def sample_seeds(
    history: History, n: int, rng: random.Random, config: BundleConfig | None = None
) -> list[str]:
    """``n`` seed record ids covering sources, time and threads.

    Each pick chooses a record kind with probability ∝ √(records of that kind), then the least
    used month of that kind, then the least used thread in that month, then a record of that
    thread weighted by informativeness (records below ``min_seed_informativeness`` only when
    nothing else is left). Records repeat only after every eligible record has been used once.
    """
    config = config or BundleConfig()
    info: dict[str, float] = {}
    groups: dict[str, dict[str, dict[str, list[Record]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for r in history.records:
        spans, _ = _visible_spans(r, config.record_token_cap, config.user_turns_only)
        if not spans:
            continue
        info[r.id] = informativeness(spans)
        groups[r.kind][_month(r)][r.thread_id or r.id].append(r)
    if not info:
        return []
    informative = {rid for rid, v in info.items() if v >= config.min_seed_informativeness}
    fresh: dict[str, int] = defaultdict(int)  # informative records not used yet, per kind
    for kind, months in groups.items():
        fresh[kind] = sum(
            r.id in informative for m in months.values() for t in m.values() for r in t
        )
    used: dict[str, int] = defaultdict(int)
    month_use: dict[tuple[str, str], int] = defaultdict(int)
    thread_use: dict[str, int] = defaultdict(int)
    kinds = sorted(groups)
    kind_weights = [
        math.sqrt(sum(len(t) for m in groups[k].values() for t in m.values())) for k in kinds
    ]
    seeds: list[str] = []
    while len(seeds) < n:
        kind = rng.choices(kinds, weights=kind_weights)[0]
        months = sorted(groups[kind], key=lambda m: (month_use[(kind, m)], rng.random()))
        picked = None
        for month in months:
            threads = groups[kind][month]
            order = sorted(threads, key=lambda t: (thread_use[t], rng.random()))
            for thread in order:
                recs = threads[thread]
                min_used = min(used[r.id] for r in recs)
                pool = [r for r in recs if used[r.id] == min_used]
                good = [r for r in pool if r.id in informative]
                if not good and fresh[kind] > 0:
                    continue  # informative records not used yet remain elsewhere
                pool = good or pool
                weights = [1.0 + info[r.id] for r in pool]
                picked = rng.choices(pool, weights=weights)[0]
                month_use[(kind, month)] += 1
                thread_use[thread] += 1
                break
            if picked is not None:
                break
        if (
            picked is None
        ):  # every thread of this kind skipped: take the most informative least-used
            pool = [r for m in groups[kind].values() for t in m.values() for r in t]
            picked = min(pool, key=lambda r: (used[r.id], -info[r.id], r.id))
        if used[picked.id] == 0 and picked.id in informative:
            fresh[kind] -= 1
        used[picked.id] += 1
        seeds.append(picked.id)
    return seeds


def sample_task(rng: random.Random, config: BundleConfig | None = None) -> Task:
    """Draw an evidence count from ``evidence_weights`` and a question type suited to it."""
    config = config or BundleConfig()
    counts = sorted(c for c, w in config.evidence_weights.items() if w > 0)
    count = rng.choices(counts, weights=[config.evidence_weights[c] for c in counts])[0]
    types = [
        t
        for t in _TYPES_BY_COUNT.get(count, ("aggregation",))
        if config.question_types is None or t in config.question_types
    ]
    if not types:
        types = list(config.question_types or ["fact"])
    return Task(question_type=rng.choice(types), evidence_count=count)


def steered(
    target: dict, accepted: dict | None, yields: dict | None = None, power: float = 1.0
) -> dict:
    """``target`` weights (normalised) raised for kinds the ``accepted`` counts lack: each weight
    is multiplied by ``exp(4 · (target share − accepted share))``, so a kind that falls behind is
    drawn more often until it catches up, and one ahead less.

    With ``yields`` (kind → the kept share of the tasks that asked for it, see
    :attr:`AcceptedMix.answer_type_yield`) each weight is also multiplied by its kind's yield (0.5,
    the prior, for a kind not tried yet): the expected catch-up per candidate, not the lag alone,
    so a kind that keeps failing on this LM stops taking the budget its lag would claim; ``power``
    raises the yield to that power first."""
    total_w = sum(w for w in target.values() if w > 0)
    counts = accepted or {}
    n = sum(counts.get(k, 0) for k in target)
    out = {}
    for k, w in target.items():
        if w <= 0:
            continue
        want = w / total_w
        have = counts.get(k, 0) / n if n else want
        out[k] = want * math.exp(4 * (want - have))
        if yields is not None:
            out[k] *= yields.get(k, 0.5) ** power
    return out


@dataclass(frozen=True)
class AcceptedMix:
    """What the accepted items so far cover: counts by answer type and by evidence count; and what
    each kind of task has yielded, ``(accepted + 1) / (tried + 2)`` of the candidates whose task
    asked for that answer type / evidence count (kinds not tried yet are absent)."""

    answer_types: dict[str, int]
    evidence_counts: dict[int, int]
    answer_type_yield: dict[str, float] = field(default_factory=dict)
    evidence_yield: dict[int, float] = field(default_factory=dict)


def steered_task(
    rng: random.Random,
    config: BundleConfig,
    mix: AcceptedMix | None = None,
    max_evidence: int | None = None,
    answer_kinds: Iterable[str] | None = None,
) -> Task:
    """A task aimed at the profile's target mix (``answer_type_weights`` and ``evidence_weights``),
    steered toward the kinds ``mix`` (the accepted items so far) lacks: first the evidence count
    (at most ``max_evidence``), then an answer type that suits a question type for that count (one
    of ``answer_kinds`` when given and possible: what the bundle can answer, :func:`answer_kinds`),
    then that question type."""
    assert config.answer_type_weights is not None
    weights = config.evidence_weights
    if max_evidence is not None and any(c <= max_evidence for c, w in weights.items() if w > 0):
        weights = {c: w for c, w in weights.items() if c <= max_evidence}
    by_yield = config.steer_by_yield and mix is not None
    counts = steered(
        weights,
        mix.evidence_counts if mix else None,
        mix.evidence_yield if by_yield else None,
        config.yield_power,
    )
    keys = sorted(counts)
    count = rng.choices(keys, weights=[counts[c] for c in keys])[0]
    return task_for_count(rng, config, count, mix, answer_kinds)


def task_for_count(
    rng: random.Random,
    config: BundleConfig,
    count: int,
    mix: AcceptedMix | None = None,
    answer_kinds: Iterable[str] | None = None,
) -> Task:
    """The steered answer type and question type of a task with ``count`` evidence records (see
    :func:`steered_task`)."""
    assert config.answer_type_weights is not None
    types = [
        t
        for t in _TYPES_BY_COUNT.get(count, ("aggregation",))
        if config.question_types is None or t in config.question_types
    ] or ["fact"]
    suited = {a for t in types for a in ANSWER_TYPES_BY_QUESTION.get(t, ())}
    if answer_kinds is not None:
        suited = (suited & set(answer_kinds)) or suited
    by_yield = config.steer_by_yield and mix is not None
    weights = steered(
        config.answer_type_weights,
        mix.answer_types if mix else None,
        mix.answer_type_yield if by_yield else None,
        config.yield_power,
    )
    options = sorted(a for a in weights if a in suited) or sorted(suited) or ["entity"]
    answer = rng.choices(options, weights=[weights.get(a, 1.0) for a in options])[0]
    fitting = [t for t in types if answer in ANSWER_TYPES_BY_QUESTION.get(t, ())] or types
    return Task(question_type=rng.choice(fitting), evidence_count=count, answer_type=answer)


_YEAR = re.compile(r"\b(?:19|20)\d\d\b")
# whole month and weekday names only: _MONTHS's open suffix would take "Mark" for March
_CALENDAR_WORDS = re.compile(
    r"^(?:january|february|march|april|may|june|july|august|september|october|november|december"
    r"|(?:mon|tues|wednes|thurs|fri|satur|sun)day)$",
    re.I,
)
_ENUMERATION = re.compile(
    r"\b[\w'-]+(?: [\w'-]+)?, [\w'-]+(?: [\w'-]+)?,? (?:and|or) [\w'-]+", re.I
)


def _span_names(text: str, user: set[str]) -> list[str]:
    """The names in a span's plain text that are not the user's, without month and weekday words."""
    names = []
    for name in _NAME.findall(text):
        words = [w for w in name.split() if not _CALENDAR_WORDS.match(w)]
        if words and not {w.lower() for w in words} <= user:
            names.append(" ".join(words))
    return names


def _user_words(user_name: str | None) -> set[str]:
    return {w.lower() for w in (user_name or "").replace("_", " ").split()}


def answer_kinds(records: Iterable[BundleRecord], user_name: str | None = None) -> set[str]:
    """The answer types the records' own sentences can supply: ``number`` (a number that is not
    part of a date or a year), ``entity`` (a name that is not the user's, a month or a weekday),
    ``list`` (an enumeration "a, b and c", or two such names in one record) and ``date`` (always:
    every record has its date).

    A task steered toward a kind its bundle does not hold cannot be planned: measured on the
    embedded model, "number" tasks on bundles without a number came back as a blind-read mismatch,
    and "entity" tasks on chats that name nobody but the user as ``answer_is_user``."""
    user = _user_words(user_name)
    kinds = {"date"}
    for record in records:
        names: set[str] = set()
        for span in record.spans:
            text = plain_text(span.text)
            if count_numbers(text):
                kinds.add("number")
            names.update(_span_names(text, user))
            if _ENUMERATION.search(text):
                kinds.add("list")
        if names:
            kinds.add("entity")
        if len(names) >= 2:
            kinds.add("list")
    return kinds


MAX_ANSWER_OPTIONS = 8


@dataclass(frozen=True)
class AnswerOption:
    """A reference answer the program reads off one sentence of a bundle: what an anchored planner
    chooses from instead of writing its own answer (see :func:`answer_options`). A two-record
    option (:func:`pair_options`) also names the sentences of other records that write the same
    answer (``also``)."""

    span_id: str
    answer: str
    answer_type: str
    also: tuple[str, ...] = ()
    bridge: str | None = None
    earlier: str | None = None

    @property
    def span_ids(self) -> tuple[str, ...]:
        """The option's sentences: its own, then those of its other records (a bridge's event
        sentence, an update's earlier sentence last)."""
        extra = tuple(s for s in (self.bridge, self.earlier) if s)
        return (self.span_id, *self.also, *extra)


# a whole run of capitalised words ("Amelia Torres", "Dr. Desai"), where _NAME (made for telling
# kinds apart) takes "Torres" alone from a table cell "| Amelia Torres |"
# "Amelia", "MacBook", "GreenLeaf", "Co-op" (a whole hyphenated word: "Alberta Co" of "Alberta
# Co-op" was an option, and the blind reader's "Alberta Co-op" did not match it)
_NAME_WORD = r"[A-Z][A-Za-z]*[a-z][A-Za-z]*(?:-[A-Za-z]+)*\b"
_NAME_RUN = re.compile(rf"\b(?:(?:Dr|Ms|Mr|Mrs)\.\s+)?{_NAME_WORD}(?:\s+{_NAME_WORD})*")
_LEADING_WORDS = frozenset(
    "a an the and but so if as at by for from in into on to with after before when while this that "
    "my our your his her their dear hi hey hello thanks thank".split()
)
_MID_SENTENCE = re.compile(r"(?<=[a-z,] )[A-Z][a-z]+")
_TABLE_RULE = re.compile(r"^\|?[\s:|-]*-{3}[\s:|-]*$")


_VERB_OR_LINK = frozenset("is are was were be of like including such also".split())


def _list_answer(enumeration: str) -> str:
    """An enumeration without the word before its first item that _ENUMERATION took along
    ("for tea, scones and jam", "is comfortable, organized and welcoming")."""
    first, _, rest = enumeration.partition(",")
    words = first.split()
    if len(words) > 1 and words[0].lower() in _LEADING_WORDS | _VERB_OR_LINK:
        words = words[1:]
    return f"{' '.join(words)},{rest}"


_UNIT = re.compile(r"\s+([a-z]{3,})\b(?![-'’])")  # not "child" of "2 child-sized pitchers"
_NOT_UNITS = frozenset(
    "and but for from with the that this than into onto over are was were".split()
)


# a clock time ("6:30", "9:00 PM", "7 am"): _NUMBER would take its "30" or "00" for a count
_CLOCK_TIME = re.compile(
    r"\b\d{1,2}(?::\d{2})+(?:\s*[ap]\.?m\b\.?)?|\b\d{1,2}\s*[ap]\.?m\b\.?", re.I
)
# what makes a number part of a name, a code or an address, not a count: a capitalised word or a
# code before it ("VIZ 110", "Terrell Hall 214", "#3"), a word that numbers things ("room 214",
# "flight 1492"), or a capitalised word after it ("800 Series", "4418 SE Lincoln St")
_IDENTIFIER_BEFORE = re.compile(
    r"(?:(?<=[a-z,;] )[A-Z][A-Za-z]*|\b[A-Z]{2,}|#|\b(?i:no|room|suite|apt|apartment|unit|gate|"
    r"flight|seat|route|bus|exit|platform|order|invoice|ticket|version|model|number)\.?)\s*$"
)
_IDENTIFIER_AFTER = re.compile(r"\s+(?:[A-Z]{2,}\b|[A-Z][a-z])")


def count_numbers(text: str) -> list[re.Match[str]]:
    """The numbers of a sentence's plain text that count something: not part of a date, a year or
    a clock time, nor of a name, a code or an address (:data:`_IDENTIFIER_BEFORE`). The matches
    are those of the text with dates, years and times blanked out (same offsets).

    Measured on the demo's history and the cost runs (embedded 1.5B model): every number option
    of a course code, a product model, a room or a house number ("VIZ 110", "Bosch 800 Series",
    "4418 SE Lincoln St") was lost to the blind reader, or kept as a bad item ("How many … is the
    address?" → 4418), and the minutes of a clock time ("6:30" → 30) were never stated as a
    count."""
    masked = _YEAR.sub(_blank, _DATE.sub(_blank, _CLOCK_TIME.sub(_blank, text)))
    return [
        m
        for m in _NUMBER.finditer(masked)
        if not (
            m.group(0)[0].isdigit()
            and (
                _IDENTIFIER_BEFORE.search(masked, 0, m.start())
                or _IDENTIFIER_AFTER.match(masked, m.end())
            )
        )
    ]


def _blank(m: re.Match[str]) -> str:
    return " " * len(m.group(0))


def _with_unit(text: str, number: re.Match[str]) -> str:
    """A number with the word it counts ("12 children", "2 hours"): a sentence with two numbers
    then offers two different answers, not "2" the planner may take for the other one."""
    unit = _UNIT.match(text, number.end())
    if unit and unit.group(1) not in _NOT_UNITS:
        return f"{number.group(0)} {unit.group(1)}"
    return number.group(0)


def _option_names(text: str, user: set[str], mid_sentence: set[str]) -> list[str]:
    """The names of a span's plain text for answer options: whole runs of capitalised words that
    are not the user's name, a month or a weekday; a single word at the start of the sentence
    ("Thank", "Sofia") only when the bundle also writes it inside a sentence."""
    names = []
    for m in _NAME_RUN.finditer(text):
        words = [w for w in m.group(0).split() if not _CALENDAR_WORDS.match(w)]
        while len(words) > 1 and words[0].lower() in _LEADING_WORDS:  # "With Elena", "Dear Sofia"
            words = words[1:]
        if not words or {w.lower() for w in words} <= user:
            continue
        before = text[: m.start()].rstrip(" \"'“”‘’([*_-")
        initial = not before or before[-1] in ".!?:;|"
        if initial and len(words) == 1 and words[0] not in mid_sentence:
            continue
        names.append(" ".join(words))
    return names


def whole_word(text: str) -> re.Pattern[str]:
    """``text`` as a whole word or phrase, any case: not inside a longer word or a hyphenated
    compound ("2" is not in "2-hour", "Mila" not in "Milan")."""
    return re.compile(rf"(?<![\w-]){re.escape(text)}(?![\w-])", re.I)


def _in_title(title: str | None, name: str) -> bool:
    """Whether a record's title writes ``name`` as a whole word: the name is the record's topic
    ("Reflections as a Montessori Educator", "Current Status"), not a detail one of its sentences
    tells, and a question can only say which record it means by naming it. Measured on the
    nineteenth cost run (embedded 1.5B model): all six entity options taken from their record's
    title were rejected (asked as "What is … the Montessori Method?", or read back as another
    word of the title), and no kept item's answer was in its title."""
    return bool(title) and whole_word(name).search(title) is not None


# what joins the names of a series: "Lila, Mrs. Patel, Mr. Kim, and Ms. Rivera", "Sofia and Mark"
_SERIES_JOIN = r"(?:\s*,\s*(?:(?:and|or|&)\s+)?|\s+(?:and|or|&)\s+)"


def _in_name_series(text: str, name: str, names: Sequence[str]) -> bool:
    """Whether ``name`` stands next to another of the sentence's ``names`` in a series ("to Lila,
    Mrs. Patel, Mr. Kim, and Ms. Rivera", "Sofia and Mark came by"): a question whose answer is one
    name of a series has several right answers. Measured: the sixteenth cost run kept "Who do I
    want to send a quick update to?" → Lila, one of four, and the blind reader's mismatches on
    entity tasks were mostly another name of the same sentence."""
    others = sorted({n for n in names if n != name}, key=len, reverse=True)
    if not others:
        return False
    other = "|".join(re.escape(n) for n in others)
    me = re.escape(name)
    series = (
        rf"(?<![\w-]){me}{_SERIES_JOIN}(?:{other})(?![\w-])"
        rf"|(?<![\w-])(?:{other}){_SERIES_JOIN}{me}(?![\w-])"
    )
    return re.search(series, text) is not None


# a date a sentence writes ("September 23", "Sept. 23rd, 2024"): whole month names or their
# abbreviations only (_DATE's open suffix would take "Mark 12" for a date)
_MENTIONED_DATE = re.compile(
    r"\b(?:January|February|March|April|May|June|July|August|September|October|November|December"
    r"|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)\.?\s+\d{1,2}(?:st|nd|rd|th)?\b"
    r"(?:,?\s+\d{4}\b)?"
)
_SUBJECT_LINE = re.compile(r"^\s*Subject\s*:", re.I)
EVENT_SPAN_WINDOW = 6
"""How many of a record's first stating sentences :func:`event_span` chooses among."""


# "We went to Stoneworks NW yesterday": the event is not on the record's date (the demo's second
# measured run accepted "When did we visit Stoneworks NW?" with the message's date, a day late).
_SHIFTED_DAY = re.compile(
    r"\b(?:yesterday|tomorrow|(?:last|next) (?:night|week|weekend|month|year|time|monday|tuesday|"
    r"wednesday|thursday|friday|saturday|sunday)|the (?:day|night|week) (?:before|after)|"
    r"the other day|(?:a|one|two|three|four|five|six|\d+|a few|several|couple of) "
    r"(?:days?|weeks?|months?|years?) (?:ago|from now|later|earlier))\b",
    re.I,
)


# a reply's or a forward's subject names the thread's first message, not what the reply tells
_REPLY_SUBJECT = re.compile(r"^\s*Subject\s*:\s*(?:re|fwd?|aw)\s*:", re.I)
# a sentence telling something that happened: a past-tense verb, or an event of the record's day
_HAPPENED = re.compile(
    r"\b(?:[a-z]+[^\We]ed|went|spent|took|woke|met|sent|got|had|was|were|made|came|saw|bought|paid|"
    r"told|said|gave|found|felt|left|ate|ran|wrote|brought|began|drove|flew|sat|kept|did|heard|"
    r"thought|won|lost|chose|broke|caught|taught|built|grew|held|led|sold|threw|today|tonight|"
    r"this (?:morning|afternoon|evening))\b",
    re.I,
)


UNDATED_EVENT_KINDS = frozenset({"document_section"})
"""Record kinds whose date is not the date of what their sentences tell: a report's or a plan's
section carries the document's date ("When did the module structure section start?" was accepted
with a course outline's date, "When did Form peer-led study groups …?" with a report's), so its
own date is no answer option; the dates its sentences write still are."""


def event_span(stating: Sequence[Span]) -> Span | None:
    """The sentence a record's own date is cited from, as the event a "When …?" question asks
    about: an email's subject line (not a reply's or a forward's, "Re: I'm in Denver in April!",
    which names the first message's topic), else among the first :data:`EVENT_SPAN_WINDOW`
    sentences the one naming the most kinds of detail (names, numbers, places) that writes no date
    of its own (whose question would have that date for its answer) and tells something that
    happened (:data:`_HAPPENED`: a past-tense verb, or "today", "this morning"), the earliest on a
    tie. A sentence that
    puts its event on another day ("yesterday", "last week", "two days ago") is never one, and
    neither is any later one (what follows "We went to Stoneworks NW yesterday" — "Alpine Mist
    looked great in the showroom" — tells the same day): the record's date is not their event's.
    None when no sentence is left.

    The first sentence was measured to be a poor event on the embedded model: "When did I like
    the idea of focusing on a small corner or shelf?" (an opinion of the assistant's idea). So were,
    in the demo's runs and cost runs 19–21, a sentence naming no detail ("Perfect, I'll send it."
    → "When is my midterm critique due?", all 8 lost), a reply's subject (3 of 4 lost, and the
    kept one asked when Julia wrote "about her trip") and a state or a habit ("Harbor Grey is
    matte and hides stains" → "When is Harbor Grey matte …?", kept in every demo; "Sam keeps
    telling me to switch to his dentist"): a record's date answers "When did …?" about an
    event."""
    window = []
    for span in stating[:EVENT_SPAN_WINDOW]:
        if _SHIFTED_DAY.search(plain_text(span.text)):
            break
        window.append(span)
    subject = next((s for s in window if _SUBJECT_LINE.match(s.text)), None)
    if subject is not None and not _REPLY_SUBJECT.match(subject.text):
        return subject

    def score(span: Span) -> int:
        f = span_features(span.text)
        return -1 if f["dates"] else sum(1 for k in ("names", "numbers", "places") if f[k])

    events = [
        s
        for s in window
        if s is not subject and score(s) > 0 and _HAPPENED.search(plain_text(s.text))
    ]
    return max(events, key=score, default=None)  # max keeps the first of equal scores


def stating_spans(record: BundleRecord) -> list[Span]:
    """The record's sentences that state something: not a heading, a separator or a link line
    (:func:`~memsteer_dspy.records.states_nothing`), nor a table's header row, which names columns,
    not things (the row above a rule ``|---|---|``), nor a question ("Could you help me tell Lila
    …?": the user asking the assistant states nothing that happened, and its clause made the
    question "Could I help me think through how to gently let Lila …").
    """
    header = {a.id for a, b in pairwise(record.spans) if _TABLE_RULE.match(b.text.strip())}
    return [
        s
        for s in record.spans
        if not states_nothing(s.text)
        and s.id not in header
        and not s.text.rstrip().endswith("?")
        and s.text != WITHHELD
    ]


def answer_options(
    records: Sequence[BundleRecord],
    user_name: str | None = None,
    answer_type: str | None = None,
    limit: int | None = MAX_ANSWER_OPTIONS,
) -> list[AnswerOption]:
    """The answers the records' own sentences supply, found the way :func:`answer_kinds` finds
    their kinds: each name that is not the user's, stands in no series of names
    (:func:`_in_name_series`) and is not in its record's title (:func:`_in_title`; ``entity``),
    each number that is not part of a date or a year (``number``), each enumeration "a, b and c"
    (``list``), each date a sentence writes, and each record's own date (``date``, cited from :func:`event_span`; not for a
    document section, :data:`UNDATED_EVENT_KINDS`).

    With ``answer_type``, only that kind's options when the records hold one (else every kind).
    At most ``limit`` (None: all), taken in turn from each record so that none crowds the others
    out; the same answer once. Measured on the embedded 1.5B model, a planner that writes its own
    answer wrote one that is in no sentence it cites, or is not stated there, or is its
    demonstration's, in a third of its plans; one that picks an option cannot."""
    user = _user_words(user_name)
    mid_sentence = {
        w for r in records for s in r.spans for w in _MID_SENTENCE.findall(plain_text(s.text))
    }
    per_record: list[list[AnswerOption]] = []
    for record in records:
        found: list[AnswerOption] = []
        stating = stating_spans(record)
        dated = record.date and record.kind not in UNDATED_EVENT_KINDS
        event = event_span(stating) if dated and stating else None
        if event is not None:
            found.append(AnswerOption(event.id, record.date, "date"))
        for span in stating:
            text = plain_text(span.text)
            found += [
                AnswerOption(span.id, m.group(0), "date") for m in _MENTIONED_DATE.finditer(text)
            ]
            found += [
                AnswerOption(span.id, _list_answer(m.group(0)), "list")
                for m in _ENUMERATION.finditer(text)
            ]
            names = _option_names(text, user, mid_sentence)
            found += [
                AnswerOption(span.id, name, "entity")
                for name in names
                if _says_more_than(text, name)
                and not _in_name_series(text, name, names)
                and not _in_title(record.title, name)
            ]
            found += [
                AnswerOption(span.id, number, "number")
                for m in count_numbers(text)
                if _says_more_than(text, number := _with_unit(m.string, m))
            ]
        per_record.append(found)
    if answer_type and any(o.answer_type == answer_type for found in per_record for o in found):
        per_record = [[o for o in found if o.answer_type == answer_type] for found in per_record]
    options: list[AnswerOption] = []
    seen: set[str] = set()
    queues = [iter(found) for found in per_record]
    while queues:
        for queue in list(queues):  # each record's next answer not offered yet, in turn
            option = next((o for o in queue if o.answer.lower() not in seen), None)
            if option is None:
                queues.remove(queue)
                continue
            seen.add(option.answer.lower())
            options.append(option)
            if len(options) == limit:
                return options
    return options


# The kinds of answer a second record can write again word for word: a name ("Sofia") or a
# number with its unit ("12 children"). Dates and enumerations are not: a record's date is in its
# header, not in a sentence, and two records rarely enumerate the same items in the same words.
PAIR_ANSWER_TYPES = ("entity", "number")


def pair_options(
    records: Sequence[BundleRecord],
    user_name: str | None = None,
    answer_type: str | None = None,
    limit: int | None = MAX_ANSWER_OPTIONS,
) -> list[AnswerOption]:
    """The two-record answers of a bundle: each answer option of one record (:func:`answer_options`:
    a name that is not the user's, a number with its unit) that a sentence of another record also
    writes, as a whole word, with that sentence in ``also`` — the answer a question needs both
    records for when it asks by what each of them says about it ("Who brought in ginger tea and
    helped me settle in with the new supplement?" → Sofia).

    Measured on the embedded 1.5B model, two-record tasks planned from one-record options kept
    none of 60 over four runs: the planner named one record, or its question asked what one record
    says and the blind reader cited that one only. ``answer_type`` and ``limit`` as in
    :func:`answer_options`; the records of each pair in bundle order, the same answer once.

    Neither sentence may be an email's address line, and the two may not be the same words (a
    reply's quoted header or subject): each record alone then answers, and the question had
    nothing of the second record to ask by ("Who sent the email …, and also From, who <…>?").
    Measured: such pairs were 5 of the 9 two-record candidates of demo-11 and 2 of 7 in each of
    the nineteenth and twentieth cost runs, and none was kept."""
    stating = {r.id: [(s, plain_text(s.text)) for s in stating_spans(r)] for r in records}
    span_text = {s.id: text for spans in stating.values() for s, text in spans}
    raw_text = {s.id: s.text for spans in stating.values() for s, _ in spans}
    order = {r.id: n for n, r in enumerate(records)}
    options: list[AnswerOption] = []
    seen: set[str] = set()
    for option in answer_options(records, user_name, limit=None):
        if option.answer_type not in PAIR_ANSWER_TYPES or option.answer.lower() in seen:
            continue
        if answer_type and answer_type in PAIR_ANSWER_TYPES and option.answer_type != answer_type:
            continue
        own = option.span_id.rpartition("#")[0]
        word = whole_word(option.answer)
        if not _says_more(span_text[option.span_id], word) or _ADDRESS_LINE.match(
            raw_text[option.span_id]
        ):
            continue
        other = next(
            (
                span.id
                for rid in sorted(stating, key=order.__getitem__)
                if rid != own
                for span, text in stating[rid]
                if word.search(text)
                and _says_more(text, word)
                and not _ADDRESS_LINE.match(span.text)
                and not _same_sentence(span.text, raw_text[option.span_id])
            ),
            None,
        )
        if other is None:
            continue
        seen.add(option.answer.lower())
        first, second = sorted((option.span_id, other), key=lambda s: order[s.rpartition("#")[0]])
        options.append(AnswerOption(first, option.answer, option.answer_type, also=(second,)))
        if len(options) == limit:
            break
    return options


# An email's address lines ("From: Raj Mehta <raj.mehta@outlook.com>") name a sender or recipient
# and nothing a question can ask by; a reply repeats its thread's address and subject lines.
_ADDRESS_LINE = re.compile(r"^\s*(?:From|To|Cc|Bcc|Sender|Recipients?)\s*:", re.I)
_REPLY_PREFIX = re.compile(r"^\s*(?:subject\s*:\s*)?(?:(?:re|fwd?|aw)\s*:\s*)*", re.I)


def _same_sentence(a: str, b: str) -> bool:
    """Whether two sentences are the same words (a reply's "Subject: Re: …" and its original's)."""
    return " ".join(_REPLY_PREFIX.sub("", a).lower().split()) == " ".join(
        _REPLY_PREFIX.sub("", b).lower().split()
    )


PAIR_MIN_WORDS = 3
"""The words besides its answer each sentence of a two-record option must write."""
OPTION_MIN_WORDS = 2
"""The words besides its answer a name's or number's sentence must write to be an option ("We
planted 3 rows" is; a table row "| Samuel Lin | Planter |" is not: its sentence ask was "who")."""


def _says_more(text: str, answer: re.Pattern[str], words: int = PAIR_MIN_WORDS) -> bool:
    """Whether a sentence writes at least :data:`PAIR_MIN_WORDS` words besides the answer: what a
    question can ask by. A list item or a heading that is only the name ("- Sketch Summaries")
    gave the two-record ask "who, and also who"."""
    return len(re.findall(r"[A-Za-z]{2,}", answer.sub(" ", text))) >= words


def _says_more_than(text: str, answer: str) -> bool:
    return _says_more(text, whole_word(answer), OPTION_MIN_WORDS)


def task_options(
    records: Sequence[BundleRecord],
    task: Task,
    user_name: str | None = None,
    limit: int | None = MAX_ANSWER_OPTIONS,
    *,
    bridges: bool = False,
    updates: bool = False,
) -> list[AnswerOption]:
    """What an anchored planner chooses from for ``task``: the two-record answers for a task of
    two or more evidence records, where the bundle has any — the knowledge updates
    (:func:`update_options`, with ``updates``), the bridges (:func:`bridge_options`, with
    ``bridges``) and the pairs (:func:`pair_options`) in turn — and otherwise the one-record
    answers (:func:`answer_options`)."""
    if task.evidence_count >= 2:
        kinds = [
            update_options(records, user_name, task.answer_type, limit) if updates else [],
            bridge_options(records, user_name, task.answer_type, limit) if bridges else [],
            pair_options(records, user_name, task.answer_type, limit),
        ]
        mixed = [o for row in zip_longest(*kinds) for o in row if o is not None]
        if mixed:
            return mixed[:limit] if limit is not None else mixed
    return answer_options(records, user_name, task.answer_type, limit)


# The kinds of value a later record updates: a date ("moved to March 27") or a count with its unit.
UPDATE_ANSWER_TYPES = ("date", "number")
_TOPIC_WORD = re.compile(r"[A-Za-z][A-Za-z'’-]{3,}")
_NOT_TOPIC = frozenset(
    "this that with from have will your about their there they them then than what when which "
    "would could should been were into also just some more next week weeks today tomorrow "
    "morning afternoon evening night please thanks thank sure know like want need hope".split()
)
UPDATE_MIN_SHARED = 2
"""Topic words an earlier and a later sentence share for the later one's value to update the
earlier one's (``cleaning``, ``exam``, ``Voss`` of a dental confirmation and its rescheduling)."""


def _topic(text: str) -> set[str]:
    """A sentence's topic words, lowercased and without a plural "s": no calendar word, no short
    or common word."""
    words = (w.lower().rstrip("'’") for w in _TOPIC_WORD.findall(text))
    return {
        w[:-1] if w.endswith("s") and not w.endswith("ss") else w
        for w in words
        if w not in _NOT_TOPIC and w not in _LEADING_WORDS and not _CALENDAR_WORDS.match(w)
    }


def update_values(sentence: str, kind: str) -> list[str]:
    """The values of ``kind`` a sentence writes that an update can replace: the dates (without a
    weekday), or the counted numbers with their unit."""
    return _values(plain_text(sentence), kind)


def _values(text: str, kind: str) -> list[str]:
    if kind == "date":
        return [m.group(0) for m in _MENTIONED_DATE.finditer(text)]
    return [v for m in count_numbers(text) if " " in (v := _with_unit(m.string, m))]


def _same_value(a: str, b: str) -> bool:
    def key(v: str) -> str:
        return re.sub(r",?\s+\d{4}$|(?<=\d)(?:st|nd|rd|th)\b", "", v).lower()

    return key(a) == key(b)


def update_options(
    records: Sequence[BundleRecord],
    user_name: str | None = None,
    answer_type: str | None = None,
    limit: int | None = MAX_ANSWER_OPTIONS,
) -> list[AnswerOption]:
    """The knowledge updates of a bundle: a value (a date a sentence writes, or a count with its
    unit) that a later record's sentence writes for what an earlier record's sentence wrote
    another value of — the two sentences share :data:`UPDATE_MIN_SHARED` topic words, and the
    earlier record never writes the later value. The answer is the later value; ``earlier`` is
    the earlier sentence. The question asks for the current value ("When is my dental cleaning
    now?"), so it needs both records: the later one for the answer, the earlier one to know it
    changed; a memory that keeps or delivers only the first answers with the stale value, the
    failure RHELM's and the demo's knowledge-update questions test. ``answer_type`` and ``limit``
    as in :func:`answer_options`; the later value once."""
    dated = [r for r in records if r.date and r.kind not in UNDATED_EVENT_KINDS]
    kinds = [answer_type] if answer_type in UPDATE_ANSWER_TYPES else list(UPDATE_ANSWER_TYPES)
    options: list[AnswerOption] = []
    seen: set[str] = set()
    for later in dated:
        for earlier in (r for r in dated if r.date < later.date):
            before = [(s, plain_text(s.text)) for s in stating_spans(earlier)]
            earlier_text = " ".join(t for _, t in before)
            for span in stating_spans(later):
                text = plain_text(span.text)
                for kind in kinds:
                    for value in _values(text, kind):
                        if value.lower() in seen or any(
                            _same_value(value, v) for v in _values(earlier_text, kind)
                        ):
                            continue
                        topic = _topic(text)
                        old = next(
                            (
                                s
                                for s, t in before
                                if _values(t, kind) and len(_topic(t) & topic) >= UPDATE_MIN_SHARED
                            ),
                            None,
                        )
                        if old is None:
                            continue
                        seen.add(value.lower())
                        options.append(AnswerOption(span.id, value, kind, earlier=old.id))
                        if len(options) == limit:
                            return options
    return options


# The kinds of answer a bridge asks for: "When did I …, on the day …?" is the record's own date.
BRIDGE_ANSWER_TYPES = ("entity", "number", "list")
_SUBJECT = re.compile(r"^\s*Subject\s*:\s*(.+)$", re.I)
# an upload tag or a bracketed note in a user's message: "[Upload 36_notes_task_9353f783] I …"
_TAG = re.compile(r"\[[^\]]*\]")
# "just as we finished …", "after we finished …": the event, not its relation to another
_SUBORDINATE = re.compile(r"^(?:just\s+)?(?:as|when|while|after|once|since)\s+", re.I)
_SUBJECT_START = re.compile(
    r"^(?:I|I['’]\w+|we|my|our|he|she|they|it|a|an|the|someone|everyone|"
    r"(?!Just\b)[A-Z][a-z]+(?<!ing)(?<!ed))\b"
)
# the words a cut event phrase may not end on ("… a few keywords for the")
_DANGLING = frozenset(
    "a an the this that these those my our your his her their its of for to with in on at by from "
    "and or but as into onto about after before while when so".split()
)
# What starts an event sentence and says only when, which the bridge's "on the day" says already.
_DAY_OPENER = re.compile(
    r"^(?:(?:so|and|well|honestly|actually|also|oh),?\s+)?(?:(?:early |late )?(?:this|today|tonight)"
    r"(?: (?:morning|afternoon|evening))?|today|tonight|earlier(?: today)?|just now),?\s+",
    re.I,
)
BRIDGE_MAX_SHARED = 2
"""A bridge's event shares fewer topic words than this with the answer's sentence: it is another
event of the day, not the same one told twice ("What device did I use to send a quick note to
Lila on the day I wanted to send a quick update to Lila?", the first bridge run)."""
DAY_TRIES = 12
"""How many records of the seed's day :meth:`BundleSampler._day_bundle` tries for a bridge."""
BRIDGE_EVENT_WORDS = 10
"""A bridge's event is told in at most this many words of its sentence's first clause."""


def bridge_event(sentence: str) -> str:
    """What a bridge's event sentence tells, as the words after "on the day": its first clause
    without an opening "This morning," (the day is the bridge's point), at most
    :data:`BRIDGE_EVENT_WORDS` words. ``"This morning, just as we finished setting up for the Open
    House, a sudden winter storm rolled in"`` → ``"just as we finished setting up for the Open
    House"``."""
    if subject := _SUBJECT.match(sentence):  # an email dated by its subject line
        return f'of the email "{subject.group(1).strip()}"'
    text = _TAG.sub("", plain_text(sentence)).strip()
    text = _SUBORDINATE.sub("", _DAY_OPENER.sub("", text))
    clause = re.split(r"[;:—–]|,\s+", text)[0]
    words = clause.split()[:BRIDGE_EVENT_WORDS]
    while words and words[-1].lower().strip(",.!") in _DANGLING:  # "… keywords for the"
        words.pop()
    return " ".join(words).rstrip(" ,.!")


def _tells_event(phrase: str) -> bool:
    """Whether a bridge's event phrase has a subject to tell something with (``I just got back
    from a full day in Eugene``, not ``felt especially peaceful in my bedroom``) and four words.
    An email's subject line is no bridge: the writer quoted it whole ("… on the day of the email
    'Update on Elena's Symptoms – December 15'?" was too long, and an echo)."""
    words = phrase.split()
    return len(words) >= 4 and bool(_SUBJECT_START.match(phrase)) and "email" not in words[:3]


def bridge_options(
    records: Sequence[BundleRecord],
    user_name: str | None = None,
    answer_type: str | None = None,
    limit: int | None = MAX_ANSWER_OPTIONS,
) -> list[AnswerOption]:
    """The bridged answers of a bundle: each one-record answer option (:func:`answer_options`: a
    name, a number, a list) with, as its ``bridge``, the event sentence (:func:`event_span`) of
    another record of the same day — the question asks for the answer "on the day" that other
    event happened, so it needs both records, as RHELM's official multi-record questions do ("Who
    shared the evening meal with me on the day Sofia completed her model rocket launch?").

    The answer record's date is not in the question: the other record's event says which day.
    The event sentence must not write the answer (it would answer alone) and must not be the
    answer's own sentence; a document section (:data:`UNDATED_EVENT_KINDS`) dates nothing. Each
    answer once, the records in turn so that none crowds the others out; ``answer_type`` and
    ``limit`` as in :func:`answer_options`.

    Measured on the embedded model: two-record *pair* options (an answer two records write) kept
    none of their candidates in most runs: two records rarely write one name in sentences that
    each say something else, and the blind reader cited one of them."""
    dated = [r for r in records if r.date and r.kind not in UNDATED_EVENT_KINDS]
    events = {r.id: e for r in dated if (st := stating_spans(r)) and (e := event_span(st))}
    span_text = {s.id: s.text for r in dated for s in r.spans}
    options: list[AnswerOption] = []
    seen: set[str] = set()
    for option in answer_options(dated, user_name, limit=None):
        if option.answer_type not in BRIDGE_ANSWER_TYPES or option.answer.lower() in seen:
            continue
        if answer_type in BRIDGE_ANSWER_TYPES and option.answer_type != answer_type:
            continue
        own = option.span_id.rpartition("#")[0]
        if _ADDRESS_LINE.match(span_text[option.span_id]):  # "From: Amelia Torres <…>"
            continue
        day = next(r.date for r in dated if r.id == own)
        word = whole_word(option.answer)
        topic = _topic(plain_text(span_text[option.span_id]))
        bridge = next(
            (
                e
                for r in dated
                if r.id != own
                and r.date == day
                and (e := events.get(r.id)) is not None
                and not word.search(plain_text(e.text))
                and _tells_event(event := bridge_event(e.text))
                and len(_topic(event) & topic) < BRIDGE_MAX_SHARED
            ),
            None,
        )
        if bridge is None:
            continue
        seen.add(option.answer.lower())
        options.append(
            AnswerOption(option.span_id, option.answer, option.answer_type, bridge=bridge.id)
        )
        if len(options) == limit:
            break
    return options


# --------------------------------------------------------------------------------------------
# expansion
# --------------------------------------------------------------------------------------------


def _bundle_record(record: Record, config: BundleConfig) -> BundleRecord:
    spans, truncated = _visible_spans(record, config.record_token_cap, config.user_turns_only)
    return BundleRecord(
        id=record.id,
        kind=record.kind,
        date=record.timestamp.date().isoformat() if record.timestamp else None,
        author=record.author,
        thread_id=record.thread_id,
        title=record.title,
        spans=spans,
        truncated=truncated,
    )


def _render_tokens(records: Sequence[BundleRecord]) -> int:
    """Tokens of the records as an LLM role reads them (labelled ``R1``, ``R2``, …)."""
    return count_tokens("\n\n".join(r.render(f"R{i}") for i, r in enumerate(records, 1)))


def _bundle_id(seed_id: str, record_ids: Iterable[str]) -> str:
    h = hashlib.sha256("\x1f".join([seed_id, *sorted(record_ids)]).encode()).hexdigest()[:10]
    return f"b-{h}"


def bundle_size(task: Task, config: BundleConfig) -> int:
    return min(config.max_records, max(config.min_records, task.evidence_count + 1))


def expand_bundle(
    graph: RecordGraph,
    seed_id: str,
    size: int,
    rng: random.Random,
    config: BundleConfig | None = None,
) -> tuple[Bundle | None, str | None]:
    """Walk typed edges from ``seed_id`` into a connected bundle of up to ``size`` records.

    Returns ``(bundle, None)``, or ``(None, reason)`` when no bundle can be made: the seed alone
    is over the token budget (``over_budget``) or has no spans (``empty``). A bundle smaller than
    ``size`` (the seed's component is small or the budget is used up) is returned as is; callers
    check it has enough records for their task.
    """
    config = config or BundleConfig()
    history = graph.history
    seed = history.get(seed_id)
    if seed is None:
        raise KeyError(f"seed {seed_id!r} is not a record of the history")
    first = _bundle_record(seed, config)
    if not first.spans:
        return None, "empty"
    records = [first]
    used = _render_tokens(records)
    if used > config.token_budget:
        return None, "over_budget"
    members = {seed_id}
    path: list[tuple[str, str, str]] = []
    rejected: set[str] = set()
    types = [t.value for t in config.edge_types]
    while len(records) < size:
        frontier: dict[str, tuple[float, str, str]] = {}
        for rid in [r.id for r in records]:
            for nbr, kind, weight in graph.neighbours(rid, types):
                if nbr in members or nbr in rejected:
                    continue
                if nbr not in frontier or weight > frontier[nbr][0]:
                    frontier[nbr] = (weight, rid, kind)
        if not frontier:
            break
        options = sorted(frontier)
        pick = rng.choices(options, weights=[max(frontier[o][0], 1e-3) for o in options])[0]
        rec = _bundle_record(history[pick], config)
        cost = count_tokens(rec.render(f"R{len(records) + 1}")) + 2
        if not rec.spans or used + cost > config.token_budget:
            rejected.add(pick)
            continue
        records.append(rec)
        members.add(pick)
        used += cost
        weight, src, kind = frontier[pick]
        path.append((src, pick, kind))
    bundle = Bundle(
        id=_bundle_id(seed_id, members),
        seed_id=seed_id,
        method="graph",
        records=records,
        path=path,
        tokens=_render_tokens(records),
    )
    return bundle, None


def random_bundle(
    history: History,
    seed_id: str,
    size: int,
    rng: random.Random,
    config: BundleConfig | None = None,
) -> tuple[Bundle | None, str | None]:
    """The naive baseline's material: the seed plus records picked at random (no graph)."""
    config = config or BundleConfig()
    seed = history.get(seed_id)
    if seed is None:
        raise KeyError(f"seed {seed_id!r} is not a record of the history")
    first = _bundle_record(seed, config)
    if not first.spans:
        return None, "empty"
    records = [first]
    used = _render_tokens(records)
    if used > config.token_budget:
        return None, "over_budget"
    ids = [r.id for r in history.records if r.id != seed_id]
    for rid in rng.sample(ids, min(len(ids), size * 4)):
        if len(records) >= size:
            break
        rec = _bundle_record(history[rid], config)
        cost = count_tokens(rec.render(f"R{len(records) + 1}")) + 2
        if rec.spans and used + cost <= config.token_budget:
            records.append(rec)
            used += cost
    return Bundle(
        id=_bundle_id(seed_id, [r.id for r in records]),
        seed_id=seed_id,
        method="random",
        records=records,
        tokens=_render_tokens(records),
    ), None


def bundle_from_records(
    history: History, record_ids: Sequence[str], config: BundleConfig | None = None
) -> Bundle:
    """A bundle of exactly the given records (fidelity checks build bundles from QA evidence)."""
    config = config or BundleConfig()
    records = [_bundle_record(history[rid], config) for rid in record_ids]
    return Bundle(
        id=_bundle_id(record_ids[0], record_ids),
        seed_id=record_ids[0],
        method="given",
        records=records,
        tokens=_render_tokens(records),
    )


class BundleSampler:
    """The candidates of one run: candidate ``i`` is a pure function of (inputs, seed, i).

    ``method="graph"`` expands bundles over the record graph; ``method="random"`` picks the
    non-seed records at random (the naive baseline).
    """

    def __init__(
        self,
        graph: RecordGraph,
        config: BundleConfig | None = None,
        *,
        seed: int = 0,
        max_candidates: int = 100,
        method: Literal["graph", "random"] = "graph",
    ):
        self.graph = graph
        self.history = graph.history
        self.config = config or BundleConfig()
        self.seed = seed
        self.method = method
        self.seeds = sample_seeds(
            self.history, max_candidates, random.Random(f"seeds:{seed}"), self.config
        )
        self._days: dict[str, list[str]] | None = None  # date → record ids, for _day_bundle

    def __len__(self) -> int:
        return len(self.seeds)

    def candidate(
        self, index: int, mix: AcceptedMix | None = None, task: Task | None = None
    ) -> Candidate:
        """Candidate ``index``. With a target mix in the config its task is steered by ``mix``
        (the accepted items so far) and drawn from its own generator, so the bundle depends only
        on the index and the evidence count; pass the logged ``task`` to rebuild a candidate."""
        rng = random.Random(f"candidate:{self.seed}:{index}")
        seed_id = self.seeds[index]
        steer = task is None and self.config.answer_type_weights is not None
        if self.config.answer_type_weights is None:
            drawn = sample_task(rng, self.config)  # drawn even when given: the bundle's rng follows
            task = task or drawn
        elif task is None:
            task_rng = random.Random(f"task:{self.seed}:{index}")
            task = steered_task(task_rng, self.config, mix)
        size = bundle_size(task, self.config)
        if self.method == "random":
            bundle, reason = random_bundle(self.history, seed_id, size, rng, self.config)
        else:
            bundle, reason = expand_bundle(self.graph, seed_id, size, rng, self.config)
        if (
            self.config.bridges
            and self.method == "graph"
            and bundle is not None
            and task.evidence_count > 1
            and not self._bundle_kinds(bundle, task.evidence_count)
        ):  # a record of the seed's day in place of the last: a bridge (depends on the count only)
            bundle = self._day_bundle(bundle, index) or bundle
        if steer and bundle is not None and task.evidence_count > 1:
            # ask for no more evidence records than the bundle has records with concrete detail
            concrete = len(concrete_records(bundle))
            if 1 <= concrete < task.evidence_count:
                fewer = steered_task(task_rng, self.config, mix, max_evidence=concrete)
                # only where the bundle stays the same: a resumed run rebuilds it from this task
                if bundle_size(fewer, self.config) == size:
                    task = fewer
        if steer and self.config.steer_to_pairs and bundle is not None and task.evidence_count > 1:
            # a two-record task only where one answer is written by two records (pair_options)
            if not self._bundle_kinds(bundle, task.evidence_count):
                fewer = steered_task(task_rng, self.config, mix, max_evidence=1)
                if bundle_size(fewer, self.config) == size:  # the same bundle, as above
                    task = fewer
        if (
            steer
            and self.config.steer_to_bundle
            and bundle is not None
            and task.answer_type not in (kinds := self._bundle_kinds(bundle, task.evidence_count))
        ):
            # ask for an answer the bundle's sentences hold: the bundle depends on the evidence
            # count only, so a resumed run rebuilds the same bundle from the logged task
            task = task_for_count(task_rng, self.config, task.evidence_count, mix, kinds)
        if bundle is not None and len(bundle.records) < task.evidence_count:
            bundle, reason = None, "too_few_records"
        if (
            self.config.skip_unconcrete
            and bundle is not None
            and len(concrete_records(bundle)) < task.evidence_count
        ):
            bundle, reason = None, "nothing_concrete"
        return Candidate(index=index, seed_id=seed_id, task=task, bundle=bundle, skip_reason=reason)

    def _day_bundle(self, bundle: Bundle, index: int) -> Bundle | None:
        """``bundle`` with its last record replaced by another record of the seed's day whose event
        can bridge (:func:`bridge_options`), or None when no record of that day gives the bundle a
        bridge and two concrete records. The day's record is drawn from the candidate's own
        generator, so a resumed run rebuilds the same bundle."""
        seed = bundle.records[0]
        if not seed.date or len(bundle.records) < 2:
            return None
        if self._days is None:
            days: dict[str, list[str]] = {}
            for r in self.history.records:
                if r.timestamp is not None:
                    days.setdefault(r.timestamp.date().isoformat(), []).append(r.id)
            self._days = days
        members = {r.id for r in bundle.records}
        pool = sorted(rid for rid in self._days.get(seed.date, []) if rid not in members)
        rng = random.Random(f"day:{self.seed}:{index}")
        keep = bundle.records[:-1]
        for rid in rng.sample(pool, min(len(pool), DAY_TRIES)):
            record = _bundle_record(self.history[rid], self.config)
            records = [*keep, record]
            if not record.spans or _render_tokens(records) > self.config.token_budget:
                continue
            if not bridge_options(records, self.history.user_id, limit=1):
                continue
            if len(concrete_records(bundle.model_copy(update={"records": records}))) < 2:
                continue
            path = [*bundle.path[: len(keep) - 1], (seed.id, rid, "day")]
            return Bundle(
                id=_bundle_id(seed.id, [r.id for r in records]),
                seed_id=seed.id,
                method="graph",
                records=records,
                path=path,
                tokens=_render_tokens(records),
            )
        return None

    def _bundle_kinds(self, bundle: Bundle, evidence_count: int = 1) -> set[str]:
        """The answer types ``bundle`` can answer with ``evidence_count`` records (see
        :attr:`BundleConfig.steer_to_options` and :attr:`BundleConfig.steer_to_pairs`)."""
        if self.config.steer_to_pairs and evidence_count > 1:
            pairs = pair_options(bundle.records, self.history.user_id, limit=None)
            if self.config.bridges:
                pairs += bridge_options(bundle.records, self.history.user_id, limit=None)
            if self.config.updates:
                pairs += update_options(bundle.records, self.history.user_id, limit=None)
            return {o.answer_type for o in pairs}
        if self.config.steer_to_options:
            options = answer_options(bundle.records, self.history.user_id, limit=None)
            return {o.answer_type for o in options}
        return answer_kinds(bundle.records, self.history.user_id)
