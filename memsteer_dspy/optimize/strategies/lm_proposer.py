"""The LM proposer (the ``ProposeDesign`` signature) as a :class:`~memsteer_dspy.optimize.types.Proposer`."""

from __future__ import annotations

from collections.abc import Callable

from memsteer_dspy.optimize.proposer import DesignProposer
from memsteer_dspy.optimize.types import Proposal, TrajectoryEntry


class LMProposer:
    """The ``ProposeDesign`` signature (:class:`DesignProposer`) as a :class:`Proposer`."""

    uses_feedback = True

    def __init__(self, get: Callable[[], DesignProposer]):
        self._get = get

    def propose(self, parent, history, feedback, *, seen, iteration) -> Proposal:
        return self._get()(parent, history, feedback, seen=seen, iteration=iteration)

    def observe(self, entry: TrajectoryEntry) -> None:
        return None
