"""MemSteer-Opt: evidence-guided memory-design optimization (paper, Section 3.3 and Appendix A.5).

* :mod:`~memsteer_dspy.optimize.diagnosis` — :class:`Diagnosis` of incorrect training responses
  into :class:`FailureStage` storage / retrieval / answering from the evidence annotations;
* :mod:`~memsteer_dspy.optimize.feedback` — the four feedback modes (``random30``,
  ``random30+gold``, ``random30+diagnosis``, ``stratified``);
* :mod:`~memsteer_dspy.optimize.proposer` — :class:`DesignProposer` (the ``ProposeDesign``
  signature, invalid proposals sent back once, duplicates re-sampled), over the design space of
  :mod:`~memsteer_dspy.optimize.design_space`;
* :mod:`~memsteer_dspy.optimize.objectives` — ``accuracy`` / ``recall`` / ``recall-then-accuracy``
  and the strict accept rule;
* :mod:`~memsteer_dspy.optimize.loop` — :class:`MemSteerOpt`, the resumable engine: one iteration
  reads propose → score → decide → screen → record. Beside it, along GEPA's seams:
  :mod:`~memsteer_dspy.optimize.types` (data types and protocols; a leaf),
  :mod:`~memsteer_dspy.optimize.config` (settings and the same-run key),
  :mod:`~memsteer_dspy.optimize.state` (trajectory, candidate cache, resume),
  :mod:`~memsteer_dspy.optimize.evaluator` (scoring a candidate),
  :mod:`~memsteer_dspy.optimize.strategies` (accept rules, parent selection, proposers, screening),
  :mod:`~memsteer_dspy.optimize.proposing` (training results, feedback and proposals of an
  iteration), :mod:`~memsteer_dspy.optimize.run_files` (the run folder, same-run key, trajectory),
  :mod:`~memsteer_dspy.optimize.callbacks` (MLflow and the progress line, listening to typed
  events) and :mod:`~memsteer_dspy.optimize.summary` (``summary.md`` / ``summary.json``);
* :mod:`~memsteer_dspy.optimize.tune` — the supervision handed to DSPy's GEPA / MIPROv2 over the
  answerer and query-rewriter prompts of a fixed design.
"""

from memsteer_dspy.optimize.diagnosis import (
    Diagnosis,
    EvidenceCheck,
    FailureStage,
    diagnose,
    diagnose_failures,
)
from memsteer_dspy.optimize.feedback import FEEDBACK_MODES, Feedback, FeedbackCase, build_feedback
from memsteer_dspy.optimize.loop import (
    MemSteerOpt,
    OptimizeConfig,
    OptimizeResult,
    TrajectoryEntry,
    progress_line,
)
from memsteer_dspy.optimize.objectives import OBJECTIVES, Score, accept
from memsteer_dspy.optimize.proposer import (
    DesignProposer,
    Proposal,
    design_diff,
    design_space_schema,
)
from memsteer_dspy.optimize.splits import read_supervision, split_official

__all__ = [
    "FEEDBACK_MODES",
    "OBJECTIVES",
    "DesignProposer",
    "Diagnosis",
    "EvidenceCheck",
    "FailureStage",
    "Feedback",
    "FeedbackCase",
    "MemSteerOpt",
    "OptimizeConfig",
    "OptimizeResult",
    "Proposal",
    "Score",
    "TrajectoryEntry",
    "accept",
    "build_feedback",
    "design_diff",
    "design_space_schema",
    "diagnose",
    "diagnose_failures",
    "progress_line",
    "read_supervision",
    "split_official",
]
