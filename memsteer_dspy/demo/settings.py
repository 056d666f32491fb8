"""The demo's sizes: :class:`DemoSettings`, the named :data:`SIZES` and the answered subset.

:func:`demo_settings` picks a size (with overrides); :func:`accuracy_subset` chooses which
hand-written items are answered and judged when not all of them are.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from memsteer_dspy.errors import ConfigError
from memsteer_dspy.memory.design import DEFAULT_CONTEXT_BUDGET
from memsteer_dspy.optimize.defaults import ResolvedDefaults, resolve_defaults
from memsteer_dspy.optimize.objectives import Objective
from memsteer_dspy.records import QAItem

SizeName = Literal["small", "full"]


class DemoSettings(BaseModel):
    """How big one demo run is: supervision, optimization and evaluation budgets.

    ``context_budget`` is the answer-context budget of *both* designs compared (Base-BM25 starts
    with it and MemSteer-Opt keeps it fixed). ``accuracy_items`` hand-written items are answered
    and judged (None: all of them); R@10 is always measured on every hand-written item.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    size: str = Field("small", description="The size's name (small, full, or custom).")
    n_supervision: int = Field(ge=2, description="Accepted QA items wanted from generation.")
    max_candidates: int = Field(ge=1, description="Candidates tried at most during generation.")
    supervision_seconds: float | None = Field(
        None,
        gt=0,
        description="Generation starts no new candidate after this many seconds (None: no limit), "
        "so that a slower CPU ends the stage with fewer items instead of overrunning the demo.",
    )
    bundle_profile: Literal["auto", "small", "full"] = Field(
        "auto", description="Bundle profile: 'small' for a local LM, 'full' for an API LM, or auto."
    )
    iterations: int = Field(ge=0, description="MemSteer-Opt proposals after Base-BM25.")
    objective: Objective | None = Field(
        None,
        description="MemSteer-Opt's objective; None: by the LMs (recall when the answerer runs "
        "in-process, else accuracy; memsteer_dspy.optimize.defaults). A run resolves it at start.",
    )
    paper: bool = Field(
        False,
        description="MemSteer-Opt's options left unset take the paper's setting whatever LMs run "
        "(otherwise the small-proposer setting when the proposer runs in-process).",
    )
    feedback_tokens: int = Field(
        3000, ge=200, description="Token budget of the proposer's feedback."
    )
    per_stage: int = Field(10, ge=1, description="Feedback cases per failure stage (stratified).")
    accuracy_items: int | None = Field(
        None,
        ge=0,
        description="Hand-written items answered and judged (None: all; 0: none, the designs are "
        "compared on R@10 and delivered recall only).",
    )
    context_budget: int = Field(
        DEFAULT_CONTEXT_BUDGET, ge=64, description="The fixed answer-context budget (tokens)."
    )
    answer_max_tokens: int | None = Field(
        None, ge=16, description="Cap on each answer's length in evaluation (None: the LM's own)."
    )
    max_resamples: int = Field(3, ge=0, description="Re-samples of a duplicate proposal.")
    seed: int = 0
    threads: int = Field(1, ge=1, description="Items / candidates run concurrently (API LMs).")

    def identity(self) -> dict[str, Any]:
        """What a resumed run must share with the run it continues (``threads`` may change;
        ``paper`` is left out when off, as demos written before it behaved)."""
        return self.model_dump(
            mode="json", exclude={"threads"} | ({"paper"} if not self.paper else set())
        )

    def resolve(self, lm_config: Any) -> tuple[DemoSettings, ResolvedDefaults]:
        """These settings with the objective resolved for ``lm_config``'s LMs, and MemSteer-Opt's
        LM-dependent options (the size's objective and feedback budget given, the rest auto)."""
        resolved = resolve_defaults(
            {"objective": self.objective, "feedback_tokens": self.feedback_tokens},
            proposer_in_process=lm_config.in_process("proposer"),
            answerer_in_process=lm_config.in_process("answerer"),
            paper=self.paper,
        )
        return self.model_copy(update={"objective": resolved.values["objective"]}), resolved

    def sized_down(self, reference: DemoSettings | None = None) -> list[str]:
        """What this size changes relative to ``reference`` (default: the full size), in words."""
        ref = reference or SIZES["full"]
        out: list[str] = []
        if self.n_supervision < ref.n_supervision:
            within = (
                f" within {self.supervision_seconds / 60:g} min"
                if self.supervision_seconds is not None
                else ""
            )
            out.append(
                f"supervision: {self.n_supervision} accepted QA items wanted from at most "
                f"{self.max_candidates} candidates{within} (full: {ref.n_supervision} from "
                f"{ref.max_candidates})"
            )
        if self.iterations < ref.iterations:
            out.append(f"optimization: {self.iterations} iterations (full: {ref.iterations})")
        if self.objective != ref.objective:
            out.append(
                f"optimization objective: {self.objective} (full: {ref.objective or 'by the LMs'}; "
                + (
                    "candidates are scored by delivered recall, no answering during optimization)"
                    if self.objective == "recall"
                    else "candidates are screened by recall before they are answered)"
                )
            )
        if self.max_resamples < ref.max_resamples:
            out.append(
                f"a proposal repeating an earlier design is re-sampled {self.max_resamples} time(s) "
                f"(full: {ref.max_resamples})"
            )
        if self.feedback_tokens < ref.feedback_tokens or self.per_stage < ref.per_stage:
            out.append(
                f"proposer feedback: {self.per_stage} cases per failure stage within "
                f"{self.feedback_tokens} tokens (full: {ref.per_stage} within {ref.feedback_tokens})"
            )
        if self.accuracy_items == 0 and ref.accuracy_items != 0:
            out.append(
                "accuracy and QS: not measured, no hand-written item is answered (full: all; "
                "--accuracy-items N answers N); R@10 and delivered recall on all of them"
            )
        elif self.accuracy_items is not None and (
            ref.accuracy_items is None or self.accuracy_items < ref.accuracy_items
        ):
            out.append(
                f"accuracy and QS: {self.accuracy_items} hand-written items, stratified by question "
                "type (full: all); R@10 on all of them"
            )
        if (
            self.accuracy_items != 0
            and self.answer_max_tokens is not None
            and (ref.answer_max_tokens is None or self.answer_max_tokens < ref.answer_max_tokens)
        ):
            out.append(
                f"answers: at most {self.answer_max_tokens} tokens each, for both designs "
                "(full: the LM's own limit)"
            )
        if self.context_budget < ref.context_budget:
            out.append(
                f"answer context: {self.context_budget} tokens for both designs "
                f"(full: {ref.context_budget})"
            )
        return out


SIZES: dict[str, DemoSettings] = {
    # Sized for about 15 minutes on a 2-core CPU with the embedded 1.5B model (measured 11 min 34 s
    # on an AVX2-only one, README). Supervision: 8 accepted items wanted (about 5 train / 3
    # validation) from at most 40 candidates, with the lean-anchor pipeline (skipped bundles count as
    # candidates and cost no LM call), and no candidate started after 10 minutes: the yield on this
    # history swung between 5 and 8 of 30 with small changes (README), and a slower CPU (the AMX
    # Xeon: 14 min 51 s for 30) ends the stage with fewer items instead of overrunning the demo.
    # The designs are compared on R@10 and delivered recall
    # (the recall objective's metric) on all 34 hand-written items; answering them with the 1.5B
    # model cost 3 min per design for 6 items in the first measured run (README), so the small
    # size answers none unless asked (--accuracy-items).
    "small": DemoSettings(
        size="small",
        n_supervision=8,
        max_candidates=40,
        supervision_seconds=600,
        bundle_profile="auto",
        iterations=3,
        objective="recall",
        feedback_tokens=1500,
        per_stage=3,
        accuracy_items=0,
        context_budget=1000,
        answer_max_tokens=128,
        max_resamples=1,
    ),
    # The paper-sized run: meant for an API LM or a GPU (hours on the embedded model on a CPU). Its
    # objective follows the LMs: the embedded answerer answers "I don't know" to the RHELM items
    # tried, so accuracy would select on zeros; an API answerer keeps the paper's accuracy.
    "full": DemoSettings(
        size="full",
        n_supervision=100,
        max_candidates=500,
        bundle_profile="auto",
        iterations=20,
        objective=None,
        feedback_tokens=3000,
        per_stage=10,
        accuracy_items=None,
        context_budget=DEFAULT_CONTEXT_BUDGET,
    ),
}
"""The demo's sizes: ``small`` (default) and ``full``."""


def demo_settings(size: str = "small", **overrides: Any) -> DemoSettings:
    """The settings of a named size, with ``overrides`` applied (a changed size is named ``custom``)."""
    if size not in SIZES:
        raise ConfigError(f"unknown demo size {size!r}; choose one of {', '.join(SIZES)}")
    base = SIZES[size]
    if not overrides:
        return base
    values = {**base.model_dump(), **overrides}
    if any(base.model_dump().get(k) != v for k, v in overrides.items() if k != "threads"):
        values["size"] = overrides.get("size", f"{size}-custom")
    return DemoSettings(**values)


def accuracy_subset(items: list[QAItem], n: int | None) -> list[QAItem]:
    """``n`` items taken round-robin across question types (each type in file order), returned in
    file order; all items when ``n`` is None or not smaller than the set."""
    if n is None or n >= len(items):
        return list(items)
    if n <= 0:
        return []
    by_type: dict[str, list[QAItem]] = {}
    for q in items:
        by_type.setdefault(q.question_type or "unknown", []).append(q)
    chosen: set[str] = set()
    queues = [list(v) for v in by_type.values()]
    while len(chosen) < n:
        for queue in queues:
            if queue and len(chosen) < n:
                chosen.add(queue.pop(0).id)
    return [q for q in items if q.id in chosen]
