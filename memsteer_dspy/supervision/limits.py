"""Length limits on the outputs of the supervision roles, for small in-process LMs.

A 1.5B model told "at most six words" still writes whole sentences. The embedded LM decodes under
a grammar compiled from each signature's JSON schema, so limits written into that schema
(``maxLength`` on strings, ``minItems``/``maxItems`` on lists) are enforced while it writes: the answer cannot
grow into a sentence, a rationale cannot ramble, a list cannot repeat itself until the token cap.

:func:`bounded_signature` returns a copy of a signature whose output fields carry such limits. The
limits live only in the JSON schema: parsing stays as lenient as the original field type, so an LM
that ignores the schema (an API model) is never rejected for it. Use bounded signatures only with
LMs that decode under the schema (``local/...``, ``llamacpp/...``).
"""

from __future__ import annotations

from typing import Annotated, Any

import dspy
from pydantic import BeforeValidator, Field

from memsteer_dspy.bundles import MAX_ANSWER_OPTIONS
from memsteer_dspy.signatures.audit import FactCheck, RecordCheck
from memsteer_dspy.signatures.plan import EvidenceUse

__all__ = ["LIMITS", "bounded_signature", "bounded_type"]


def bounded_type(base: Any, name: str, **schema: Any) -> type:
    """A type that validates like ``base`` and adds ``schema`` (e.g. ``maxLength=48``) to its
    JSON schema."""

    def core(cls, source, handler):
        return handler.generate_schema(base)

    def json_schema(cls, core_schema, handler):
        result = handler(core_schema)
        result.update(schema)
        return result

    return type(
        name,
        (),
        {
            "__get_pydantic_core_schema__": classmethod(core),
            "__get_pydantic_json_schema__": classmethod(json_schema),
            "__doc__": f"{base} with JSON-schema limits {schema}",
            "__base_type__": base,  # what it validates as (a prompt describes the field by it)
        },
    )


class BriefEvidenceUse(EvidenceUse):
    record_id: str = Field(max_length=12, description="Label of the evidence record, e.g. R2.")
    contribution: str = Field(
        max_length=80, description="What this record contributes, in a few words."
    )


class BriefFactCheck(FactCheck):
    span_id: str = Field(max_length=12, description="The fact's sentence label, e.g. R2.3.")
    rationale: str = Field(max_length=100, description="One short sentence.")


class BriefRecordCheck(RecordCheck):
    record_id: str = Field(max_length=12, description="The evidence record's label, e.g. R2.")
    rationale: str = Field(max_length=100, description="One short sentence.")


def _text(n: int) -> type:
    return bounded_type(str, f"Text{n}", maxLength=n)


# an answer may come back as a JSON number ("answer": 3 for a count, measured on the embedded
# planner); it is the same answer as "3", so it validates as its text
_Answer = Annotated[str, BeforeValidator(lambda v: str(v) if isinstance(v, int | float) else v)]


def _labels(n: int, at_least: int = 0) -> type:
    return bounded_type(
        list[bounded_type(str, "Label", maxLength=12)], f"Labels{n}", minItems=at_least, maxItems=n
    )


# field name -> bounded type, per output field (the same names recur across signatures)
LIMITS: dict[str, Any] = {
    "fact_span_ids": _labels(4, at_least=1),
    "answer_span_id": _text(12),
    "answer_option": bounded_type(int, "Option", minimum=1, maximum=MAX_ANSWER_OPTIONS),
    "answer": bounded_type(_Answer, "Answer48", maxLength=48),
    "evidence": bounded_type(list[BriefEvidenceUse], "EvidenceList", minItems=1, maxItems=4),
    "operations": bounded_type(
        list[bounded_type(str, "Operation", maxLength=30)], "Operations", maxItems=3
    ),
    "ask": _text(160),
    "question": _text(200),
    "fact_checks": bounded_type(list[BriefFactCheck], "FactChecks", minItems=1, maxItems=6),
    "record_checks": bounded_type(list[BriefRecordCheck], "RecordChecks", minItems=1, maxItems=4),
    "answer_rationale": _text(120),
    "consistency_rationale": _text(120),
    "cited_ids": _labels(4),
    "evidence_record_ids": _labels(4, at_least=1),
    "rationale": _text(160),
}


def bounded_signature(signature: type[dspy.Signature]) -> type[dspy.Signature]:
    """``signature`` with :data:`LIMITS` applied to the output fields it has."""
    for name in signature.output_fields:
        if name in LIMITS:
            signature = signature.with_updated_fields(name, type_=LIMITS[name])
    return signature
