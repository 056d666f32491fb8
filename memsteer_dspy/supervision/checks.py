"""Programmatic checks of MemSteer's supervision pipeline (paper Section 3.2), imported from here.

"Answer plans that fail programmatic checks of structural consistency and provenance coverage are
rejected before question generation." :func:`check_plan` and its reason codes
(:class:`PlanCheckCode`), the citation repair and the answer's support are in
:mod:`~memsteer_dspy.supervision.plan_checks`; :func:`check_question`, which holds the question
writer's output to the same standard, and the text tests it uses are in
:mod:`~memsteer_dspy.supervision.question_checks`. This module imports both.
"""

from __future__ import annotations

from memsteer_dspy.supervision.plan_checks import (
    _DATE_IN_TEXT as _DATE_IN_TEXT,
)
from memsteer_dspy.supervision.plan_checks import (
    EXTRACTIVE_TYPES,
    PlanCheckCode,
    PlanIssue,
    Repair,
    answer_spans,
    check_plan,
    drop_stray_facts,
    expand_name,
    is_user_name,
    repair_answer_citation,
    resolve_plan,
    user_display_name,
)
from memsteer_dspy.supervision.question_checks import (
    _RELATIVE_TIME as _RELATIVE_TIME,
)
from memsteer_dspy.supervision.question_checks import (
    ECHO_MAX_RUN,
    ECHO_MAX_WORDS,
    MAX_QUESTION_WORDS,
    MIN_TOPIC_WORDS,
    asked_kinds,
    asks_plural,
    check_question,
    copied_run,
    demo_borrowed,
    detail_terms,
    echoed_words,
    echoes,
    is_role,
    names_self,
    off_evidence_words,
    outside_quotes,
    prefilter_bundle,
    quoted_fact_support,
    records_missed,
    spans_by_id,
    swaps_roles,
    topic_words,
    unknown_details,
    unknown_names,
)

__all__ = [
    "PlanCheckCode",
    "PlanIssue",
    "Repair",
    "answer_spans",
    "check_plan",
    "topic_words",
    "check_question",
    "asks_plural",
    "off_evidence_words",
    "records_missed",
    "prefilter_bundle",
    "asked_kinds",
    "quoted_fact_support",
    "user_display_name",
    "detail_terms",
    "expand_name",
    "unknown_names",
    "unknown_details",
    "demo_borrowed",
    "resolve_plan",
    "MAX_QUESTION_WORDS",
    # importable from here before the split as well
    "ECHO_MAX_RUN",
    "ECHO_MAX_WORDS",
    "EXTRACTIVE_TYPES",
    "MIN_TOPIC_WORDS",
    "copied_run",
    "drop_stray_facts",
    "echoed_words",
    "echoes",
    "is_role",
    "is_user_name",
    "names_self",
    "outside_quotes",
    "repair_answer_citation",
    "spans_by_id",
    "swaps_roles",
]
