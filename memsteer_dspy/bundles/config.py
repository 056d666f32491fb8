"""How bundles are sampled: :class:`BundleConfig` (sizes, budgets, steering), the question and
answer type tables, :class:`Task` (a question type and an evidence count), the small-LM preset
(:func:`small_lm_bundle_config`) and the anchored planner's sampling (:data:`ANCHORED_SAMPLING`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from memsteer_dspy.graph import EdgeType

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
    seed_kind_power: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Each seed's record kind (conversation turn, email, document section) is "
        "drawn with probability proportional to (records of that kind) ** this power: 0.5 (the "
        "default) over-samples the rarer kinds (emails: 14% of Elena_Morales's seeds, 5% of her "
        "records); 1.0 draws kinds as the history has them. Measured: emails are the kind lexical "
        "retrieval finds every time (short, with a distinctive subject), and they were 29% of the "
        "generated items' evidence against 4% of the official items' (experiments/results/"
        "steering.md).",
    )
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
    pairs: bool = Field(
        default=True,
        description="With steer_to_pairs: a two-record task may be answered by a pair "
        "(pair_options: an answer two records write). Off in the anchored sampling: over every "
        "anchored run of 2026-12-07 (runs/), 0 of 75 two-record candidates that were no bridge "
        "or update were kept, against 3 of 50 bridges; without pairs a two-record task goes to a "
        "bridge (a record of the seed's day) or to one record.",
    )
    bridges: bool = Field(
        default=False,
        description="With steer_to_pairs: a two-record task may also be answered by a bridge "
        "(bridge_options): an answer one record writes, asked by what another record of the same "
        "day tells ('Who helped me set up the displays on the day the winter storm hit?'), the "
        "way most of RHELM's official multi-record questions are asked.",
    )
    bridge_events: Literal["subject", "told"] = Field(
        default="subject",
        description="With bridges: which sentence of another record may name a bridge's day. "
        "'subject': its first clause, four words or more after a subject; 'told': also no "
        "question, no word to the assistant and no feeling, opinion or wish — a conversation's "
        "opening reaction ('I think you're right', 'What really struck me was …') says nothing of "
        "the day (read on the embedded model's bridges of RHELM).",
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
    "pairs": False,
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
