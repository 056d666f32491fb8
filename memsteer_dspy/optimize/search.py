"""The protocols the MemSteer-Opt engine is written over and their implementations, kept
importable under this name. They live in:

* :mod:`~memsteer_dspy.optimize.types` — :class:`Evaluator`, :class:`Proposer`,
  :class:`AcceptRule`, :class:`ParentSelector`, :class:`Candidate`, :class:`Decision`;
* :mod:`~memsteer_dspy.optimize.evaluator` — :class:`HistoryEvaluator` and per-item scores;
* :mod:`~memsteer_dspy.optimize.config` — the search, accept-rule and guard choices;
* :mod:`~memsteer_dspy.optimize.strategies` — accept rules, parent selectors, the LM and Optuna
  proposers, sub-change screening.
"""

from memsteer_dspy.optimize.config import (
    ACCEPT_RULES,
    GUARD_METRICS,
    PARENT_STRATEGIES,
    SEARCHES,
    Search,
    val_items,
)
from memsteer_dspy.optimize.evaluator import (
    HistoryEvaluator,
    check_extras,
    item_metric,
    item_primary,
    retrieval_lm_calls,
)
from memsteer_dspy.optimize.strategies.acceptance import (
    NonInferiorityGuard,
    PairedAccept,
    StrictAccept,
    lm_margin_decision,
)
from memsteer_dspy.optimize.strategies.lm_proposer import LMProposer
from memsteer_dspy.optimize.strategies.optuna_proposer import (
    FIELD_PRESETS,
    OptunaProposer,
    available_indexes,
    search_space,
)
from memsteer_dspy.optimize.strategies.parents import (
    HillClimb,
    ParetoSelector,
    SoftmaxSelector,
    parent_selector,
)
from memsteer_dspy.optimize.strategies.screening import single_field_variants
from memsteer_dspy.optimize.types import (
    COUPLED,
    AcceptRule,
    Candidate,
    Decision,
    Evaluator,
    ParentSelector,
    Proposer,
)

__all__ = [
    "ACCEPT_RULES",
    "COUPLED",
    "FIELD_PRESETS",
    "GUARD_METRICS",
    "PARENT_STRATEGIES",
    "SEARCHES",
    "AcceptRule",
    "Candidate",
    "Decision",
    "Evaluator",
    "HillClimb",
    "HistoryEvaluator",
    "LMProposer",
    "NonInferiorityGuard",
    "OptunaProposer",
    "PairedAccept",
    "ParentSelector",
    "ParetoSelector",
    "Proposer",
    "Search",
    "SoftmaxSelector",
    "StrictAccept",
    "available_indexes",
    "check_extras",
    "item_metric",
    "item_primary",
    "lm_margin_decision",
    "parent_selector",
    "retrieval_lm_calls",
    "search_space",
    "single_field_variants",
    "val_items",
]
