"""MemSteer supervision construction (paper Section 3.2): from material bundles to verified
QA–evidence items.

* :mod:`.checks` — programmatic plan checks with reason codes, deterministic citation repair, and
  question checks;
* :mod:`.program` — :class:`MemSteerGenerator` (plan → checks → question → audit → blind read) and
  the ``joint`` / ``direct`` / ``naive`` baselines, as ``dspy.Module``s with one LM per role;
* :mod:`.run` — :func:`generate_supervision`: the resumable run behind ``memsteer generate``
  (train/val/rejected JSONL, summary, HF dataset), and :func:`load_qa_jsonl`;
* :mod:`.quality` — the QA-quality judge and the fidelity assessment behind ``memsteer assess``.
"""

from memsteer_dspy.supervision.checks import (
    PlanCheckCode,
    PlanIssue,
    Repair,
    check_plan,
    check_question,
)
from memsteer_dspy.supervision.program import (
    GENERATION_ROLES,
    DirectGenerator,
    JointGenerator,
    MemSteerGenerator,
    Outcome,
    make_generator,
)
from memsteer_dspy.supervision.quality import QualityJudge, assess_fidelity, assess_quality
from memsteer_dspy.supervision.run import (
    METHODS,
    GenerationConfig,
    SupervisionSet,
    format_summary,
    generate_supervision,
    load_qa_jsonl,
    read_log,
)

__all__ = [
    "GENERATION_ROLES",
    "METHODS",
    "DirectGenerator",
    "GenerationConfig",
    "JointGenerator",
    "MemSteerGenerator",
    "Outcome",
    "PlanCheckCode",
    "PlanIssue",
    "QualityJudge",
    "Repair",
    "SupervisionSet",
    "assess_fidelity",
    "assess_quality",
    "check_plan",
    "check_question",
    "format_summary",
    "generate_supervision",
    "load_qa_jsonl",
    "make_generator",
    "read_log",
]
