"""Sampling bundles: seeds (:func:`sample_seeds`), tasks (:func:`sample_task`,
:func:`steered_task`, :func:`task_for_count`), the spans a record shows (user side, withheld
instructions: :mod:`memsteer_dspy.untrusted`), expansion over the record graph
(:func:`expand_bundle`, :func:`random_bundle`, :func:`bundle_from_records`) and
:class:`BundleSampler`, which ties them together.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from memsteer_dspy.bundles.config import (
    _TYPES_BY_COUNT,
    ANSWER_TYPES_BY_QUESTION,
    BundleConfig,
    Task,
)
from memsteer_dspy.bundles.options import (
    DAY_TRIES,
    answer_kinds,
    answer_options,
    bridge_options,
    pair_options,
    update_options,
)
from memsteer_dspy.bundles.text import concrete_records, informativeness
from memsteer_dspy.bundles.view import Bundle, BundleRecord, Candidate, _render_tokens
from memsteer_dspy.graph import RecordGraph
from memsteer_dspy.records import History, Record, Span
from memsteer_dspy.tokens import count_tokens
from memsteer_dspy.untrusted import WITHHELD, instruction_like

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

    Each pick chooses a record kind with probability ∝ (records of that kind) ** ``seed_kind_power``
    (default 0.5: √), then the least
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
    counts = [sum(len(t) for m in groups[k].values() for t in m.values()) for k in kinds]
    power = config.seed_kind_power
    # √ exactly as before the option (a resumed run redraws the same seeds)
    kind_weights = [math.sqrt(c) if power == 0.5 else c**power for c in counts]
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


def _bundle_id(seed_id: str, record_ids: Iterable[str]) -> str:
    h = hashlib.sha256("\x1f".join([seed_id, *sorted(record_ids)]).encode()).hexdigest()[:10]
    return f"b-{h}"


def bundle_size(task: Task, config: BundleConfig) -> int:
    return min(config.max_records, max(config.min_records, task.evidence_count + 1))


def _seed_records(
    history: History, seed_id: str, config: BundleConfig
) -> tuple[list[BundleRecord], int, str | None]:
    """A bundle's start: the seed as its first record and the tokens it renders to, or the reason
    no bundle can start from it (``empty``: no spans; ``over_budget``: alone over the budget)."""
    seed = history.get(seed_id)
    if seed is None:
        raise KeyError(f"seed {seed_id!r} is not a record of the history")
    first = _bundle_record(seed, config)
    if not first.spans:
        return [], 0, "empty"
    used = _render_tokens([first])
    if used > config.token_budget:
        return [], 0, "over_budget"
    return [first], used, None


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
    records, used, reason = _seed_records(history, seed_id, config)
    if reason is not None:
        return None, reason
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
    records, used, reason = _seed_records(history, seed_id, config)
    if reason is not None:
        return None, reason
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
            if not bridge_options(
                records, self.history.user_id, limit=1, events=self.config.bridge_events
            ):
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
            pairs = (
                pair_options(bundle.records, self.history.user_id, limit=None)
                if self.config.pairs
                else []
            )
            if self.config.bridges:
                pairs += bridge_options(
                    bundle.records,
                    self.history.user_id,
                    limit=None,
                    events=self.config.bridge_events,
                )
            if self.config.updates:
                pairs += update_options(bundle.records, self.history.user_id, limit=None)
            return {o.answer_type for o in pairs}
        if self.config.steer_to_options:
            options = answer_options(bundle.records, self.history.user_id, limit=None)
            return {o.answer_type for o in options}
        return answer_kinds(bundle.records, self.history.user_id)
