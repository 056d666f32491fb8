"""The settings of a ``memsteer generate`` run and its same-run key: :class:`GenerationConfig`
(what decides candidates and verdicts, :meth:`GenerationConfig.identity`), the small-LM preset
(:func:`small_lm_generation_config`) and :func:`generation_key`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from memsteer_dspy.bundles import (
    ANCHORED_SAMPLING,
    BundleConfig,
    small_lm_bundle_config,
)
from memsteer_dspy.graph import GraphParams
from memsteer_dspy.records import History
from memsteer_dspy.runfolder import run_key
from memsteer_dspy.supervision.program import (
    ANCHORED_VERSION,
    GENERATION_ROLES,
    LEAN_VERSION,
    OWN_WORDS_VERSION,
    PROMPT_VERSION,
)
from memsteer_dspy.supervision.writer_examples import (
    WriterExample,
    default_writer_examples,
    examples_key,
)
from memsteer_dspy.untrusted import WITHHOLD_VERSION

METHODS = ("memsteer", "joint", "direct", "naive")


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
    "pairs": True,
    "seed_kind_power": 0.5,
    "bridge_events": "subject",
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
    writer_examples: list[WriterExample] = Field(
        default_factory=list,
        description="Demonstrations shown to the question writer before the cold-start one: "
        "hand-written questions of another history in the writer's input format "
        "(supervision.writer_examples; generate --writer-examples K).",
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
            "withhold_version": WITHHOLD_VERSION,
        }
        if self.lean:
            key["lean_version"] = LEAN_VERSION
        if self.anchored:  # absent when off: the key runs made before the option had
            key["anchored_version"] = ANCHORED_VERSION
        if self.own_words and self.checks:  # absent when off, as above
            key["own_words_version"] = OWN_WORDS_VERSION
        if self.writer_examples:  # absent when none, as above
            key["writer_examples"] = examples_key(self.writer_examples)
        return key


def small_lm_generation_config(**fields: Any) -> GenerationConfig:
    """The configuration for a small in-process LM (the small bundle profile), as measured on the
    embedded 1.5B model by ``benchmarks/generate_cost.py`` (its ``lean-anchor``): the lean pipeline,
    the anchored planner, and tasks steered toward the profile's mix, each kind weighed by its
    squared kept share and by the answer types a bundle has options for. ``fields`` are any other
    :class:`GenerationConfig` fields (n, seed, …)."""
    bundle = small_lm_bundle_config(steer_by_yield=True, yield_power=2.0, **ANCHORED_SAMPLING)
    return GenerationConfig(**{"lean": True, "anchored": True, "bundle": bundle, **fields})


def small_lm_default_config(history: History, **fields: Any) -> GenerationConfig:
    """What a small in-process LM runs by default — ``memsteer generate`` (its unset ``--lean``),
    ``memsteer demo`` and the experiments: :func:`small_lm_generation_config` with the question
    writer's packaged examples (:func:`~memsteer_dspy.supervision.writer_examples.
    default_writer_examples`, drawn by the run's ``seed``)."""
    examples = default_writer_examples(history, fields.get("seed", 0))
    return small_lm_generation_config(**fields, writer_examples=examples)


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
