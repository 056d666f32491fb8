"""The small protocols the MemSteer-Opt loop is written over, and their implementations.

The loop (:class:`~memsteer_dspy.optimize.loop.MemSteerOpt`) only calls these:

* an :class:`Evaluator` — ``evaluate(design, items, metrics, folder) -> (system, report)``: builds a
  design and scores it on QA items, writing per-item results to ``folder`` (resumable).
  :class:`HistoryEvaluator` serves one history; the experiments' shared design over several
  personas is another evaluator (``experiments/_common.py``: ``SharedEvaluator``), and a Ray-backed
  one that scores a candidate across users in parallel needs nothing else;
* a :class:`Proposer` — ``propose(parent, history, feedback, seen=, iteration=) -> Proposal`` and
  ``observe(entry)``: :class:`LMProposer` (the ``ProposeDesign`` signature) or
  :class:`OptunaProposer` (``random`` / ``tpe`` over :func:`search_space`: the proposer-free
  baselines, which need no feedback, so the loop builds none for them);
* an :class:`AcceptRule` — ``decide(candidate, incumbent) -> Decision``: :class:`StrictAccept`
  (the paper's: strictly better on validation) or :class:`PairedAccept` (a significant paired
  improvement on the validation items, optionally by a margin);
* a :class:`ParentSelector` — ``select(pool, best, rng) -> member``: :class:`HillClimb` (always the
  current best: the paper's single path), :class:`SoftmaxSelector` (M*'s softmax over validation
  score) or :class:`ParetoSelector` (GEPA's per-item Pareto front).

A :class:`Candidate` is what an accept rule and a selector see of a scored design: its validation
:class:`~memsteer_dspy.optimize.objectives.Score` and its per-item primary-metric scores.
"""

from __future__ import annotations

import importlib.util
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from memsteer_dspy.errors import ConfigError, InputError
from memsteer_dspy.memory.design import MemoryDesign
from memsteer_dspy.optimize.objectives import Objective, Score, accept
from memsteer_dspy.optimize.proposer import Proposal, RevisionEntry
from memsteer_dspy.records import History, QAItem
from memsteer_dspy.stats import paired_bootstrap_p, paired_differences, sign_test_p

if TYPE_CHECKING:
    from memsteer_dspy.evaluation import EvaluationReport, ItemResult
    from memsteer_dspy.optimize.loop import TrajectoryEntry
    from memsteer_dspy.optimize.proposer import DesignProposer

SEARCHES = ("hill", "population", "random", "tpe")
ACCEPT_RULES = ("strict", "paired")
PARENT_STRATEGIES = ("softmax", "pareto")
Search = Literal["hill", "population", "random", "tpe"]


# --------------------------------------------------------------------------------------------
# evaluator
# --------------------------------------------------------------------------------------------


@runtime_checkable
class Evaluator(Protocol):
    """Builds ``design`` and scores it on ``items`` (``metrics``: 'recall' or 'all'); per-item
    results go to ``folder/items.jsonl``, and a rerun with the same design resumes from them.
    Returns the system (whatever failure diagnosis needs: ``user_history``, ``design``,
    ``lookup(record_id, ...)``) and an :class:`~memsteer_dspy.evaluation.EvaluationReport`."""

    def evaluate(
        self, design: MemoryDesign, items: list[QAItem], metrics: str, folder: Path
    ) -> tuple[Any, EvaluationReport]: ...


class HistoryEvaluator:
    """Scores designs over one history; keeps the two most recent systems (the current design's
    and one candidate's), and their stores and indexes in ``cache_dir``.

    ``lm`` is a function role -> LM, called only for the roles a design and the metrics need.
    """

    def __init__(
        self, history: History, *, lm: Callable[[str], Any], protocol: str = "full", threads: int = 1,
        cache_dir: str | Path | None = None, answering: bool = True,
    ):  # fmt: skip
        self.history = history
        self.lm = lm
        self.protocol = protocol
        self.threads = threads
        self.cache_dir = cache_dir
        self.answering = answering
        self._systems: dict[tuple[str, bool], Any] = {}

    def system(self, design: MemoryDesign):
        from memsteer_dspy.memory.system import MemorySystem

        key = (design.key(), self.answering)
        if key not in self._systems:
            uses = design.lm_uses(answering=self.answering)
            lms = {"answerer": self.lm("answerer")} if uses else {}
            system = MemorySystem.from_design(design, self.history, cache_dir=self.cache_dir, lms=lms,
                                              threads=self.threads)  # fmt: skip
            while len(self._systems) >= 2:
                self._systems.pop(next(iter(self._systems)))
            self._systems[key] = system
        return self._systems[key]

    def evaluate(self, design: MemoryDesign, items: list[QAItem], metrics: str, folder: Path):
        from memsteer_dspy.evaluation import evaluate_design

        system = self.system(design)
        judge = self.lm("judge") if metrics == "all" else None
        report = evaluate_design(system, items, metrics=metrics, judge_lm=judge, protocol=self.protocol,
                                 threads=self.threads, out_dir=folder)  # fmt: skip
        return system, report


# --------------------------------------------------------------------------------------------
# candidates, acceptance
# --------------------------------------------------------------------------------------------


def item_primary(objective: Objective, r: ItemResult) -> float | None:
    """One item's score under the objective's primary metric (delivered recall, or accuracy)."""
    if objective == "recall":
        return r.delivered_recall
    return float(bool(r.correct)) if (r.correct is not None or r.error is not None) else None


GUARD_METRICS = ("recall_at_1", "recall_at_5", "recall_at_10", "delivered_recall", "accuracy")


def item_metric(metric: str, r: ItemResult) -> float | None:
    """One item's value of a guard metric (``accuracy``: 1/0 when the item was answered)."""
    if metric == "accuracy":
        return float(bool(r.correct)) if (r.correct is not None or r.error is not None) else None
    return getattr(r, metric)


def val_items(train: list[QAItem], val: list[QAItem], config: Any) -> list[QAItem]:
    """The items that select (accept rule, guards, parent choice, best design) under
    ``config.val_from``: the validation items, or (objective ``recall`` only) train + validation.
    Feedback always comes from the training items alone."""
    if config.val_from == "val":
        return val
    if config.val_from != "train+val":
        raise ConfigError(f"--val-from must be 'val' or 'train+val', not {config.val_from!r}")
    if config.objective != "recall":
        raise ConfigError(
            "--val-from train+val needs --objective recall (retrieval-only scoring; selecting on "
            "training items under an accuracy objective would pay an answering call per item)"
        )
    seen = {q.id for q in val}
    return [*val, *(q for q in train if q.id not in seen)]


@dataclass
class Candidate:
    """A scored design as accept rules and parent selectors see it."""

    iteration: int
    design: MemoryDesign
    score: Score
    item_ids: list[str] = field(default_factory=list)
    item_scores: list[float | None] = field(default_factory=list)
    retrieval_lm_calls: float = 0.0
    item_metrics: dict[str, list[float | None]] = field(default_factory=dict)

    @property
    def uses_lm(self) -> bool:
        return self.retrieval_lm_calls > 0


@dataclass
class Decision:
    accepted: bool
    reason: str = ""
    stats: dict[str, Any] = field(default_factory=dict)


class AcceptRule(Protocol):
    name: str

    def decide(self, candidate: Candidate, incumbent: Candidate) -> Decision: ...


class StrictAccept:
    """The paper's rule: strictly better on validation under the objective (ties rejected)."""

    name = "strict"

    def __init__(self, objective: Objective):
        self.objective = objective

    def decide(self, candidate: Candidate, incumbent: Candidate) -> Decision:
        if accept(self.objective, candidate.score, incumbent.score):
            return Decision(True, "strictly better on validation")
        return Decision(False, f"not better than the current design ({incumbent.score.short()})")


class PairedAccept:
    """Accept only a significant paired improvement on the validation items.

    The candidate's and the incumbent's per-item primary scores (delivered recall under
    ``recall``, correctness otherwise) are paired by item; the candidate is accepted when its mean
    gain is above ``margin`` and the one-sided test (``bootstrap``: paired bootstrap, 1,000
    resamples, seeded; ``sign``: exact sign test) gives p < ``alpha`` (default 0.1). Under
    ``recall-then-accuracy`` the recall screen applies first. Ties and within-noise gains are
    rejected; the statistic is returned for the trajectory.
    """

    name = "paired"

    def __init__(self, objective: Objective, *, alpha: float = 0.1, margin: float = 0.0,
                 test: Literal["bootstrap", "sign"] = "bootstrap", seed: int = 0):  # fmt: skip
        if not 0 < alpha < 1:
            raise ConfigError(f"--accept-alpha must be between 0 and 1, not {alpha}")
        if test not in ("bootstrap", "sign"):
            raise ConfigError(f"the paired test must be 'bootstrap' or 'sign', not {test!r}")
        self.objective, self.alpha, self.margin, self.test, self.seed = (
            objective,
            alpha,
            margin,
            test,
            seed,
        )

    def decide(self, candidate: Candidate, incumbent: Candidate) -> Decision:
        if self.objective == "recall-then-accuracy" and accept(
            "recall", incumbent.score, candidate.score
        ):
            return Decision(False, "worse recall than the current design")
        if candidate.item_ids != incumbent.item_ids:
            raise ValueError("paired acceptance needs both designs scored on the same items")
        a, b = incumbent.item_scores, candidate.item_scores
        d = paired_differences(a, b)
        gain = float(d.mean()) if len(d) else 0.0
        p = (
            paired_bootstrap_p(a, b, seed=self.seed)
            if self.test == "bootstrap"
            else sign_test_p(a, b)
        )
        stats = {"test": self.test, "p": round(p, 4), "alpha": self.alpha, "gain": round(gain, 4),
                 "margin": self.margin, "n": len(d), "wins": int((d > 0).sum()), "losses": int((d < 0).sum())}  # fmt: skip
        ok = gain > self.margin and p < self.alpha
        why = (f"paired gain {gain:+.3f} (p={p:.3f} by {self.test}, {stats['wins']} wins / "
               f"{stats['losses']} losses over {len(d)} items)")  # fmt: skip
        if ok:
            return Decision(True, f"significant: {why}", stats)
        bar = f"needs p < {self.alpha}" + (f" and gain > {self.margin}" if self.margin else "")
        return Decision(
            False, f"not a significant improvement over the current design: {why}; {bar}", stats
        )


class NonInferiorityGuard:
    """Reject a candidate the accept rule took when it is significantly *below* the current design
    on a guard metric (``--guard recall_at_10``): per guard, the one-sided paired test (bootstrap or
    sign, as for ``--accept paired``) of "the current design is no better than the candidate" over
    the selecting items; p < ``alpha`` means the candidate lost that metric beyond noise.

    With ``margin`` δ set (``--guard-margin``) the burden of proof turns round — a proper
    non-inferiority test: the candidate passes only if the one-sided paired bootstrap shows its
    mean difference above −δ (p of "candidate − current ≤ −δ" below ``alpha``). That is stricter on
    few items (where a real loss is rarely significant), and still passes a design whose ranking is
    unchanged (all differences 0 > −δ).

    Why: the recall objective selects on delivered recall, which a design can raise (smaller units,
    neighbour expansion, a larger top-k) while ranking fewer gold records in its first ten; without
    a guard that trade is accepted and carries to held-out items."""

    def __init__(self, metrics: Sequence[str], *, alpha: float = 0.1,
                 test: Literal["bootstrap", "sign"] = "bootstrap", seed: int = 0,
                 margin: float | None = None):  # fmt: skip
        if margin is not None and not 0 < margin < 1:
            raise ConfigError(f"--guard-margin must be between 0 and 1 (exclusive), not {margin}")
        self.margin = margin
        bad = [m for m in metrics if m not in GUARD_METRICS]
        if bad:
            raise ConfigError(
                f"unknown --guard metric {bad[0]!r}; choose from {', '.join(GUARD_METRICS)}"
            )
        if not 0 < alpha < 1:
            raise ConfigError(
                f"the guard's significance level must be between 0 and 1, not {alpha}"
            )
        self.metrics, self.alpha, self.test, self.seed = (
            list(dict.fromkeys(metrics)),
            alpha,
            test,
            seed,
        )

    def check(self, candidate: Candidate, incumbent: Candidate) -> Decision:
        """Rejected when a guard metric is significantly below; ``stats`` holds every guard's
        difference (candidate - current), p and item count either way, for the trajectory."""
        if candidate.item_ids != incumbent.item_ids:
            raise ValueError("the guard needs both designs scored on the same items")
        stats: dict[str, Any] = {}
        for m in self.metrics:
            a, b = candidate.item_metrics.get(m), incumbent.item_metrics.get(m)
            if a is None or b is None:
                raise ValueError(f"guard metric {m!r} was not recorded for both designs")
            d = paired_differences(b, a)  # candidate - incumbent
            diff = float(d.mean()) if len(d) else 0.0
            if self.margin is not None:  # non-inferiority: is candidate + δ better than current?
                shifted = [None if x is None else x + self.margin for x in a]
                p = paired_bootstrap_p(b, shifted, seed=self.seed)
                stats[f"guard_{m}"] = {"diff": round(diff, 4), "p": round(p, 4), "n": len(d),
                                       "margin": self.margin}  # fmt: skip
                if len(d) and p >= self.alpha:
                    return Decision(False, (
                        f"not shown non-inferior to the current design in {m}: {diff:+.3f} (p={p:.3f} that it "
                        f"is at least {self.margin:.3f} below, paired bootstrap over {len(d)} items; needs p < "
                        f"{self.alpha})"
                    ), stats)  # fmt: skip
                continue
            p = (
                paired_bootstrap_p(a, b, seed=self.seed)
                if self.test == "bootstrap"
                else sign_test_p(a, b)
            )
            stats[f"guard_{m}"] = {"diff": round(diff, 4), "p": round(p, 4), "n": len(d)}
            if p < self.alpha:
                return Decision(False, (
                    f"significantly below the current design in {m}: {diff:+.3f} (p={p:.3f} by {self.test} "
                    f"over {len(d)} items; guard at alpha {self.alpha})"
                ), stats)  # fmt: skip
        return Decision(True, "", stats)


def lm_margin_decision(candidate: Candidate, best_lm_free: Candidate | None, objective: Objective,
                       margin: float) -> Decision | None:  # fmt: skip
    """A design that calls an LM at retrieval must beat the best LM-free design found so far by
    ``margin`` (primary metric); returns the rejection, or None when the rule does not object."""
    if not candidate.uses_lm or best_lm_free is None:
        return None
    c, f = candidate.score.primary(objective), best_lm_free.score.primary(objective)
    if c is None or f is None or c >= f + margin - 1e-9:
        return None
    return Decision(False, (
        f"calls an LM {candidate.retrieval_lm_calls:g}x per question at retrieval, but does not beat the "
        f"best LM-free design (iteration {best_lm_free.iteration}: {f:.3f}) by the --lm-retrieval-margin "
        f"{margin:.3f} (it scores {c:.3f})"
    ), {"lm_free_best": f, "lm_margin": margin})  # fmt: skip


def retrieval_lm_calls(design: MemoryDesign) -> int:
    """LM calls one question costs at retrieval time under ``design`` (query rewrite, decomposition,
    HyDE or multi-query: one call each; an LM listwise rerank: one more). 0 for an LM-free design."""
    r = design.retrieve
    return int(r.query != "raw") + int(r.rerank == "llm")


# --------------------------------------------------------------------------------------------
# parent selection
# --------------------------------------------------------------------------------------------


class ParentSelector(Protocol):
    name: str

    def select(
        self, pool: Sequence[Candidate], best: Candidate, rng: random.Random
    ) -> Candidate: ...


class HillClimb:
    """The paper's single path: always revise the current best design."""

    name = "hill"

    def select(self, pool: Sequence[Candidate], best: Candidate, rng: random.Random) -> Candidate:
        return best


class SoftmaxSelector:
    """M*'s parent choice: P(member) ∝ exp(score / temperature) over the pool's validation scores
    (primary metric). ``temperature`` 0.05 makes a 0.05 better design e times as likely."""

    name = "softmax"

    def __init__(self, objective: Objective, temperature: float = 0.05):
        if temperature <= 0:
            raise ConfigError("the softmax temperature must be > 0")
        self.objective, self.temperature = objective, temperature

    def weights(self, pool: Sequence[Candidate]) -> list[float]:
        s = [c.score.primary(self.objective) or 0.0 for c in pool]
        top = max(s)
        w = [math.exp((x - top) / self.temperature) for x in s]
        total = sum(w)
        return [x / total for x in w]

    def select(self, pool: Sequence[Candidate], best: Candidate, rng: random.Random) -> Candidate:
        return rng.choices(list(pool), weights=self.weights(pool), k=1)[0]


class ParetoSelector:
    """GEPA's parent choice: the members that are best on at least one validation item (items no
    member scores on are left out), less those dominated item by item by another member, sampled
    in proportion to how many items they lead."""

    name = "pareto"

    def front(self, pool: Sequence[Candidate]) -> dict[int, int]:
        """Index in ``pool`` -> number of items it leads (ties lead together)."""
        n = len(pool[0].item_scores) if pool else 0
        lead: dict[int, int] = {}
        for j in range(n):
            vals = [(c.item_scores[j] if c.item_scores[j] is not None else -1.0) for c in pool]
            top = max(vals)
            if top <= 0:  # an item nobody gets right says nothing about who leads
                continue
            for i, v in enumerate(vals):
                if v >= top - 1e-12:
                    lead[i] = lead.get(i, 0) + 1

        def vec(i: int) -> list[float]:
            return [x if x is not None else -1.0 for x in pool[i].item_scores]

        def dominated(i: int) -> bool:
            vi = vec(i)
            for k in lead:
                if k == i:
                    continue
                vk = vec(k)
                if all(a >= b for a, b in zip(vk, vi, strict=True)) and any(
                    a > b for a, b in zip(vk, vi, strict=True)
                ):
                    return True
            return False

        return {i: c for i, c in lead.items() if not dominated(i)}

    def select(self, pool: Sequence[Candidate], best: Candidate, rng: random.Random) -> Candidate:
        front = self.front(pool)
        if not front:
            return best
        idx = sorted(front)
        return pool[rng.choices(idx, weights=[front[i] for i in idx], k=1)[0]]


def parent_selector(
    search: str, parents: str, objective: Objective, temperature: float = 0.05
) -> ParentSelector:
    if search != "population":
        return HillClimb()
    if parents == "softmax":
        return SoftmaxSelector(objective, temperature)
    if parents == "pareto":
        return ParetoSelector()
    raise ConfigError(
        f"unknown parent strategy {parents!r}; choose one of {', '.join(PARENT_STRATEGIES)}"
    )


# --------------------------------------------------------------------------------------------
# proposers
# --------------------------------------------------------------------------------------------


class Proposer(Protocol):
    """Where candidate designs come from. ``uses_feedback``: whether it reads the diagnosis and
    failure cases (the loop builds them only then)."""

    uses_feedback: bool

    def propose(self, parent: MemoryDesign, history: list[RevisionEntry], feedback: str, *,
                seen: dict[str, str], iteration: int) -> Proposal: ...  # fmt: skip

    def observe(self, entry: TrajectoryEntry) -> None: ...


class LMProposer:
    """The ``ProposeDesign`` signature (:class:`DesignProposer`) as a :class:`Proposer`."""

    uses_feedback = True

    def __init__(self, get: Callable[[], DesignProposer]):
        self._get = get

    def propose(self, parent, history, feedback, *, seen, iteration) -> Proposal:
        return self._get()(parent, history, feedback, seen=seen, iteration=iteration)

    def observe(self, entry: TrajectoryEntry) -> None:
        return None


def available_indexes() -> list[str]:
    """Index kinds this machine can build without a model download: 'bm25' always; 'dense' and
    'hybrid' with the packaged MiniLM when the ``dense`` extra (sentence-transformers) is installed."""
    return ["bm25"] + (
        ["dense", "hybrid"] if importlib.util.find_spec("sentence_transformers") else []
    )


FIELD_PRESETS: dict[str, list[str]] = {
    "all": ["text", "author", "date", "subject", "kind", "thread_title"],
    "text": ["text"],
    "text+date": ["text", "date"],
    "text+meta": ["text", "author", "subject", "thread_title"],
}


def search_space(
    trial: Any, base: MemoryDesign, *, indexes: Sequence[str] = ("bm25",)
) -> MemoryDesign:
    """A design sampled through an Optuna ``trial`` (define-by-run, so settings are only sampled
    where their switch is on): store unit and its size, indexed fields, date format, BM25
    parameters, index kind (from ``indexes``), top-k, neighbour expansion, context order. LM-using
    choices (query strategies, LM rerank, fact stores, answer verification) and the context budget
    stay as in ``base``: the baselines search the LM-free space a proposer is compared against."""
    d = base.model_dump(mode="json")
    s, r, c = d["store"], d["retrieve"], d["context"]
    s["unit"] = trial.suggest_categorical("store.unit", ["record", "window", "thread", "section"])
    if s["unit"] == "window":
        s["window_size"] = trial.suggest_int("store.window_size", 2, 8)
        s["window_stride"] = trial.suggest_int("store.window_stride", 1, s["window_size"])
    if s["unit"] == "section":
        s["section_max_tokens"] = trial.suggest_categorical(
            "store.section_max_tokens", [128, 256, 512]
        )
    s["fields"] = FIELD_PRESETS[trial.suggest_categorical("store.fields", list(FIELD_PRESETS))]
    s["date_format"] = trial.suggest_categorical("store.date_format", ["iso", "long", "none"])
    r["index"] = (
        trial.suggest_categorical("retrieve.index", list(indexes))
        if len(indexes) > 1
        else indexes[0]
    )
    if r["index"] in ("bm25", "hybrid"):
        r["bm25"]["k1"] = trial.suggest_float("retrieve.bm25.k1", 0.5, 2.5)
        r["bm25"]["b"] = trial.suggest_float("retrieve.bm25.b", 0.0, 1.0)
        r["bm25"]["stemmer"] = trial.suggest_categorical(
            "retrieve.bm25.stemmer", ["english", "none"]
        )
        r["bm25"]["stopwords"] = trial.suggest_categorical(
            "retrieve.bm25.stopwords", ["english", "none"]
        )
    if r["index"] in ("dense", "hybrid"):
        r["dense"]["embedder"] = "minilm"
    r["top_k"] = trial.suggest_int("retrieve.top_k", 5, 60, log=True)
    r["pool"] = max(r["pool"], r["top_k"])
    r["expand_neighbors"] = trial.suggest_int("retrieve.expand_neighbors", 0, 2)
    c["order"] = trial.suggest_categorical("context.order", ["rank", "chronological", "thread"])
    return MemoryDesign.from_dict(d)


class OptunaProposer:
    """Proposer-free search baseline: ``random`` (Optuna's RandomSampler) or ``tpe`` (TPESampler)
    over :func:`search_space`, seeded, maximizing the validation primary metric. Each finished
    iteration is told to the study (:meth:`observe`); a resumed run rebuilds the study from the
    trajectory (each entry keeps its sampled parameters and their distributions). A sample that
    repeats an earlier design is told that design's score and sampled again (up to ``max_draws``)."""

    uses_feedback = False

    def __init__(self, kind: Literal["random", "tpe"], base: MemoryDesign, objective: Objective, *,
                 seed: int = 0, indexes: Sequence[str] | None = None, max_draws: int = 50):  # fmt: skip
        try:
            import optuna
        except ImportError:
            from memsteer_dspy.errors import MissingExtraError

            raise MissingExtraError("optuna", "tune", f"--search {kind}") from None
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        sampler = (optuna.samplers.RandomSampler(seed=seed) if kind == "random"
                   else optuna.samplers.TPESampler(seed=seed, n_startup_trials=5))  # fmt: skip
        self.kind, self.base, self.objective, self.max_draws = kind, base, objective, max_draws
        self.indexes = list(indexes) if indexes is not None else available_indexes()
        self.study = optuna.create_study(direction="maximize", sampler=sampler)
        self._scores: dict[str, float] = {}
        self._pending: dict[int, Any] = {}

    def _add(self, params: Mapping[str, Any], dists: Mapping[str, str], value: float) -> None:
        import optuna
        from optuna.distributions import json_to_distribution

        self.study.add_trial(optuna.trial.create_trial(
            params=dict(params), distributions={k: json_to_distribution(v) for k, v in dists.items()}, value=value,
        ))  # fmt: skip

    def propose(self, parent, history, feedback, *, seen, iteration) -> Proposal:
        from optuna.distributions import distribution_to_json

        from memsteer_dspy.optimize.proposer import ProposalAttempt

        attempts: list[ProposalAttempt] = []
        for _ in range(self.max_draws):
            trial = self.study.ask()
            design = search_space(trial, self.base, indexes=self.indexes)
            key = design.key()
            params = dict(trial.params)
            dists = {k: distribution_to_json(v) for k, v in trial.distributions.items()}
            if key in seen:
                self.study.tell(trial, self._scores.get(key, 0.0))
                attempts.append(
                    ProposalAttempt(kind="duplicate", duplicate_of=seen[key], design_key=key)
                )
                continue
            self._pending[iteration] = trial
            attempts.append(
                ProposalAttempt(kind="ok", design_key=key, notes=[f"{self.kind} sample: {params}"])
            )
            return Proposal(status="ok", design=design, rationale=f"{self.kind} sample {params}",
                            attempts=attempts, search_params={"params": params, "distributions": dists})  # fmt: skip
        return Proposal(status="duplicate", attempts=attempts,
                        error=f"{self.max_draws} samples in a row repeated earlier designs")  # fmt: skip

    def observe(self, entry: TrajectoryEntry) -> None:
        s = entry.score or entry.screen_score
        value = (s.primary(self.objective) if s else None) or 0.0
        if entry.design_key:
            self._scores.setdefault(entry.design_key, value)
        trial = self._pending.pop(entry.iteration, None)
        if trial is not None:
            self.study.tell(trial, value)
        elif entry.search_params:  # a resumed run: rebuild the study from the trajectory
            self._add(entry.search_params["params"], entry.search_params["distributions"], value)


def check_extras(design: MemoryDesign) -> None:
    """Raise :class:`InputError` naming the field when ``design`` needs an optional package this
    machine lacks (the proposer is sent it back, as for a missing model folder)."""
    r = design.retrieve
    if r.index in ("dense", "hybrid"):
        need = {"wordllama": "wordllama"}.get(r.dense.embedder, "sentence_transformers")
        if (
            importlib.util.find_spec(need) is None
            and importlib.util.find_spec("FlagEmbedding") is None
        ):
            raise InputError(
                f"retrieve.index {r.index!r} needs the 'dense' extra ({need}), which is not installed here",
                field="retrieve.index",
                hint="choose index 'bm25', or install it: pip install 'memsteer-dspy[dense]'",
            )
    if r.rerank == "cross_encoder" and not (importlib.util.find_spec("FlagEmbedding")
                                            or importlib.util.find_spec("sentence_transformers")):  # fmt: skip
        raise InputError(
            "retrieve.rerank 'cross_encoder' needs the 'dense' extra, which is not installed here",
            field="retrieve.rerank", hint="choose rerank 'none' or 'llm', or pip install 'memsteer-dspy[dense]'",
        )  # fmt: skip


# Fields that only make sense together: a switch and the settings that act under it, and the
# top-k / pool pair (pool >= top_k). A sub-change moves each such group as one.
COUPLED: tuple[tuple[str, ...], ...] = (
    ("store.unit", "store.window_size", "store.window_stride", "store.section_max_tokens", "store.facts_batch",
     "store.max_facts_per_record"),
    ("retrieve.top_k", "retrieve.pool"),
    ("retrieve.query", "retrieve.keep_original_query", "retrieve.n_queries"),
    ("retrieve.rerank", "retrieve.reranker_model", "retrieve.rerank_top"),
    ("retrieve.index", "retrieve.bm25_weight", "retrieve.dense_weight", "retrieve.dense.embedder",
     "retrieve.dense.backend", "retrieve.dense.query_instruction", "retrieve.dense.max_chars"),
)  # fmt: skip


def single_field_variants(
    parent: MemoryDesign, proposed: MemoryDesign
) -> list[tuple[str, MemoryDesign]]:
    """``parent`` with one of ``proposed``'s changes applied at a time, as (label, design): each
    changed field on its own, except that coupled fields (:data:`COUPLED`: a switch with its
    settings, top-k with the pool) move together under the first one's name. Empty when the
    proposal changes fewer than two such groups; a variant that is not a valid design on its own
    is left out."""
    from memsteer_dspy.optimize.proposer import _flat

    before = _flat(parent.model_dump(mode="json", exclude={"name"}))
    after = _flat(proposed.model_dump(mode="json", exclude={"name"}))
    changed = [k for k in after if before.get(k) != after.get(k)]
    groups: dict[str, list[str]] = {}
    for k in changed:
        group = next((g for g in COUPLED if k in g), (k,))
        label = next(f for f in group if f in changed)
        groups.setdefault(label, []).append(k)
    if len(groups) < 2:
        return []
    out = []
    for label, keys in groups.items():
        d = parent.model_dump(mode="json")
        for k in keys:
            node = d
            *path, last = k.split(".")
            for p in path:
                node = node[p]
            node[last] = after[k]
        try:
            out.append((label, MemoryDesign.from_dict(d)))
        except InputError:
            continue
    return out
