"""Material bundles: path-based expansion from seeds over the record graph (paper Section 3.2).

"Path-based expansion from a seed samples a connected subgraph, whose records form a
context-budgeted material bundle B with source-span references for identifying jointly supporting
facts and evidence records."

* :func:`sample_seeds` picks seed records that cover the history's sources (record kinds), time
  (months) and threads — never all from one conversation — preferring records whose spans carry
  names, numbers, dates and places (:func:`informativeness`).
* :func:`expand_bundle` walks typed edges from a seed, choosing each next record among the walked
  records' neighbours with probability proportional to the edge weight, until the bundle has its
  records or its token budget (``memsteer_dspy.tokens.count_tokens``) is used.
* :class:`Task` asks for a question type and an evidence count (1–4 records); :func:`sample_task`
  draws one.
* :class:`BundleSampler` ties these together: candidate ``i`` of a run is a pure function of
  (history, graph, config, seed, i), so a resumed run rebuilds exactly the same candidates.

A bundle renders its records as quoted data, one labelled span per line (``[<span id>] text``),
which is what every LLM role reads.

The package's modules, one way (each reads only those before it): :mod:`.config`, :mod:`.view`,
:mod:`.text`, :mod:`.options`, :mod:`.sampling`.
"""

from __future__ import annotations

from memsteer_dspy.bundles.config import (
    ANCHORED_SAMPLING,
    ANSWER_TYPE_TEXT,
    ANSWER_TYPES_BY_QUESTION,
    MIN_CONCRETE_DETAIL,
    QUESTION_TYPES,
    STEERED_MIX,
    BundleConfig,
    Task,
    small_lm_bundle_config,
)
from memsteer_dspy.bundles.options import (
    BRIDGE_ANSWER_TYPES,
    BRIDGE_EVENT_WORDS,
    BRIDGE_EVENTS,
    BRIDGE_MAX_SHARED,
    DAY_TRIES,
    MAX_ANSWER_OPTIONS,
    OPTION_MIN_WORDS,
    PAIR_ANSWER_TYPES,
    PAIR_MIN_WORDS,
    UPDATE_ANSWER_TYPES,
    UPDATE_MIN_SHARED,
    AnswerOption,
    answer_kinds,
    answer_options,
    bridge_event,
    bridge_options,
    pair_options,
    task_options,
    update_options,
    update_values,
)
from memsteer_dspy.bundles.options import _tells_event as _tells_event
from memsteer_dspy.bundles.sampling import (
    AcceptedMix,
    BundleSampler,
    bundle_from_records,
    bundle_size,
    expand_bundle,
    random_bundle,
    sample_seeds,
    sample_task,
    steered,
    steered_task,
    task_for_count,
    user_side,
)
from memsteer_dspy.bundles.text import (
    EVENT_SPAN_WINDOW,
    UNDATED_EVENT_KINDS,
    concrete_records,
    count_numbers,
    event_span,
    informativeness,
    plain_text,
    span_features,
    stating_spans,
    whole_word,
)
from memsteer_dspy.bundles.view import (
    Bundle,
    BundleRecord,
    BundleView,
    Candidate,
)

__all__ = [
    "QUESTION_TYPES",
    "Bundle",
    "BundleConfig",
    "BundleRecord",
    "BundleView",
    "BundleSampler",
    "Candidate",
    "Task",
    "expand_bundle",
    "concrete_records",
    "informativeness",
    "random_bundle",
    "sample_seeds",
    "sample_task",
    "steered_task",
    "task_for_count",
    "answer_kinds",
    "answer_options",
    "pair_options",
    "bridge_event",
    "bridge_options",
    "update_options",
    "update_values",
    "stating_spans",
    "task_options",
    "AnswerOption",
    "plain_text",
    "small_lm_bundle_config",
    "ANCHORED_SAMPLING",
    "UNDATED_EVENT_KINDS",
    # importable from here before the split as well
    "ANSWER_TYPES_BY_QUESTION",
    "ANSWER_TYPE_TEXT",
    "AcceptedMix",
    "BRIDGE_ANSWER_TYPES",
    "BRIDGE_EVENT_WORDS",
    "BRIDGE_EVENTS",
    "BRIDGE_MAX_SHARED",
    "DAY_TRIES",
    "EVENT_SPAN_WINDOW",
    "MAX_ANSWER_OPTIONS",
    "MIN_CONCRETE_DETAIL",
    "OPTION_MIN_WORDS",
    "PAIR_ANSWER_TYPES",
    "PAIR_MIN_WORDS",
    "STEERED_MIX",
    "UPDATE_ANSWER_TYPES",
    "UPDATE_MIN_SHARED",
    "bundle_from_records",
    "bundle_size",
    "count_numbers",
    "event_span",
    "span_features",
    "steered",
    "user_side",
    "whole_word",
]
