"""Parent selection: which scored design the next proposal revises.

* :class:`HillClimb` — always the current best (the paper's single path);
* :class:`SoftmaxSelector` — M*'s softmax over validation score;
* :class:`ParetoSelector` — GEPA's per-item Pareto front.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from memsteer_dspy.errors import ConfigError
from memsteer_dspy.optimize.config import PARENT_STRATEGIES
from memsteer_dspy.optimize.types import Candidate, Objective, ParentSelector


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
    """The selector of ``search`` and ``parents``: hill climbing unless the search is 'population'."""
    if search != "population":
        return HillClimb()
    if parents == "softmax":
        return SoftmaxSelector(objective, temperature)
    if parents == "pareto":
        return ParetoSelector()
    raise ConfigError(
        f"unknown parent strategy {parents!r}; choose one of {', '.join(PARENT_STRATEGIES)}"
    )
