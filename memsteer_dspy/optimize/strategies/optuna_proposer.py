"""The proposer-free search baselines: Optuna's random and TPE samplers over the LM-free design
space (:func:`search_space`), at the same evaluation budget as the LM proposer."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from memsteer_dspy.errors import MissingExtraError
from memsteer_dspy.memory.design import MemoryDesign
from memsteer_dspy.optimize.types import Objective, Proposal, ProposalAttempt, TrajectoryEntry


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

    def __init__(
        self,
        kind: Literal["random", "tpe"],
        base: MemoryDesign,
        objective: Objective,
        *,
        seed: int = 0,
        indexes: Sequence[str] | None = None,
        max_draws: int = 50,
    ):
        try:
            import optuna
        except ImportError:
            raise MissingExtraError("optuna", "tune", f"--search {kind}") from None
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        sampler = (
            optuna.samplers.RandomSampler(seed=seed)
            if kind == "random"
            else optuna.samplers.TPESampler(seed=seed, n_startup_trials=5)
        )
        self.kind, self.base, self.objective, self.max_draws = kind, base, objective, max_draws
        self.indexes = list(indexes) if indexes is not None else available_indexes()
        self.study = optuna.create_study(direction="maximize", sampler=sampler)
        self._scores: dict[str, float] = {}
        self._pending: dict[int, Any] = {}

    def _add(self, params: Mapping[str, Any], dists: Mapping[str, str], value: float) -> None:
        import optuna
        from optuna.distributions import json_to_distribution

        self.study.add_trial(
            optuna.trial.create_trial(
                params=dict(params),
                distributions={k: json_to_distribution(v) for k, v in dists.items()},
                value=value,
            )
        )

    def propose(self, parent, history, feedback, *, seen, iteration) -> Proposal:
        from optuna.distributions import distribution_to_json

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
            return Proposal(
                status="ok",
                design=design,
                rationale=f"{self.kind} sample {params}",
                attempts=attempts,
                search_params={"params": params, "distributions": dists},
            )
        return Proposal(
            status="duplicate",
            attempts=attempts,
            error=f"{self.max_draws} samples in a row repeated earlier designs",
        )

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
