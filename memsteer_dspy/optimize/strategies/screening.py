"""Screening: cheap retrieval-only scoring that picks among designs before (best of K proposals)
or after (single-field sub-changes of a rejected proposal) the accept rule's verdict."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memsteer_dspy.errors import InputError
from memsteer_dspy.memory.design import MemoryDesign
from memsteer_dspy.optimize.objectives import accept
from memsteer_dspy.optimize.types import (
    COUPLED,
    Candidate,
    Decision,
    Objective,
    Proposal,
    Score,
    design_diff,
    flat_fields,
)


def single_field_variants(
    parent: MemoryDesign, proposed: MemoryDesign
) -> list[tuple[str, MemoryDesign]]:
    """``parent`` with one of ``proposed``'s changes applied at a time, as (label, design): each
    changed field on its own, except that coupled fields (:data:`COUPLED`: a switch with its
    settings, top-k with the pool) move together under the first one's name. Empty when the
    proposal changes fewer than two such groups; a variant that is not a valid design on its own
    is left out."""
    before = flat_fields(parent.model_dump(mode="json", exclude={"name"}))
    after = flat_fields(proposed.model_dump(mode="json", exclude={"name"}))
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


def best_by_recall(
    found: list[Proposal], recall_of: Callable[[MemoryDesign, int], Score], attempts: list[Any]
) -> Proposal | None:
    """``--proposals K``: the proposal (of several) whose design has the best retrieval-only recall
    on validation (``recall_of(design, k)`` scores the k-th, 1-based; one that cannot be built is
    screened out), with every attempt and a note of the choice; None when none could be scored."""
    screened = []
    for k, prop in enumerate(found, start=1):
        try:
            screened.append((recall_of(prop.design, k).recall_key(), -k, prop))
        except Exception:  # noqa: BLE001 - an unbuildable proposal is screened out
            continue
    if not screened:
        return None
    key, neg_k, best = max(screened, key=lambda x: (x[0], x[1]))
    note = (
        f"best of {len(found)} proposals by retrieval-only recall on validation (proposal {-neg_k}: "
        f"delivered recall {key[0]:.3f}, R@10 {key[1]:.3f})"
    )
    return best.model_copy(
        update={"attempts": attempts, "rationale": f"{best.rationale}\n\n({note})"}
    )


@dataclass
class SubChange:
    """A single-field sub-change that the accept rule took on its own (``index``: its ``sub-K``)."""

    design: MemoryDesign
    candidate: Candidate
    index: int


@dataclass
class SubScreens:
    """What screening a rejected proposal's sub-changes found: the best accepted one (if any),
    every screen as the trajectory records it, and the fields tried on their own."""

    chosen: SubChange | None = None
    screens: list[dict[str, Any]] = field(default_factory=list)
    tried: list[str] = field(default_factory=list)


def screen_subchanges(
    t: int,
    parent: MemoryDesign,
    proposed: MemoryDesign,
    seen: set[str],
    objective: Objective,
    *,
    score: Callable[[MemoryDesign, int], tuple[Score, Candidate]],
    decide: Callable[[Candidate], Decision],
) -> SubScreens | None:
    """Score each single-field sub-change of a rejected multi-field proposal (``score(design, i)``
    builds, checks and scores the i-th on validation; ``decide`` judges it against the current
    design); None when the proposal has fewer than two changes to split."""
    variants = single_field_variants(parent, proposed)
    if not variants:
        return None
    out = SubScreens()
    for i, (fld, design) in enumerate(variants, start=1):
        design = design.model_copy(update={"name": f"opt-{t:03d}-{i}"})
        changes = design_diff(parent, design)
        screen: dict[str, Any] = {"field": fld, "design_key": design.key(), "changes": changes}
        out.tried.extend(c.split(":", 1)[0].strip() for c in changes)
        out.screens.append(screen)
        if design.key() in seen:
            screen.update(status="duplicate")
            continue
        try:
            sub_score, cand = score(design, i)
        except Exception as exc:  # noqa: BLE001 - one sub-change failing stops nothing
            screen.update(status="failed", reason=f"{type(exc).__name__}: {exc}")
            continue
        decision = decide(cand)
        screen.update(
            status="accepted" if decision.accepted else "rejected",
            score=sub_score.model_dump(),
            reason=decision.reason,
            stats=decision.stats,
        )
        if decision.accepted and (
            out.chosen is None or accept(objective, sub_score, out.chosen.candidate.score)
        ):
            out.chosen = SubChange(design, cand, i)
    return out
