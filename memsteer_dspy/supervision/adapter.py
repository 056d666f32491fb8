"""A compact JSON prompt format for small in-process LMs.

DSPy's ``JSONAdapter`` spells out each output field's type in the system message — for a field
typed by a pydantic model, its whole JSON schema — and repeats the structure in every request. An
LM that decodes under a grammar compiled from that schema (the embedded llama.cpp model) cannot
break it anyway, so the prompt only needs to say what each field *means*.
:class:`CompactJSONAdapter` keeps everything else of ``JSONAdapter`` (structured outputs, parsing,
demos as conversation turns) and writes:

- the system message as the task instruction, then one line per field: name, a short type hint
  (``list of {record_id, contribution}``, ``one of entity|number|…``) and its description;
- demonstrations and requests with the same ``[[ ## field ## ]]`` input sections, and answers as
  one-line JSON (a small LM imitates its demonstrations, so it writes no indentation either);
- a one-line reminder of the output fields' order at the end of each request.

The instruction and field lines come first and are the same for every call of a role, so
consecutive calls of one role share that prefix (an in-process LM reuses its cached evaluation).
"""

from __future__ import annotations

import json
import textwrap
import types
import typing
from typing import Any, Literal, get_args, get_origin

import dspy
from dspy.adapters.utils import serialize_for_json
from pydantic import BaseModel

__all__ = ["CompactJSONAdapter", "brief_type"]


def brief_type(annotation: Any) -> str:
    """A few words for a field's type: ``text``, ``integer``, ``true/false``, ``one of a|b``,
    ``list of {x, y}`` …"""
    base = getattr(annotation, "__base_type__", None)  # a bounded type (supervision.limits)
    if base is not None:
        return brief_type(base)
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is typing.Annotated:
        return brief_type(args[0])
    if origin is Literal:
        return "one of " + "|".join(str(a) for a in args)
    if origin in (list, tuple, set):
        return f"list of {brief_type(args[0]) if args else 'values'}"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(brief_type(a) for a in args if a is not type(None))
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return "{" + ", ".join(annotation.model_fields) + "}"
        if annotation is bool:
            return "true/false"
        if annotation in (int, float):
            return "number" if annotation is float else "integer"
        if annotation is str:
            return "text"
    return "value"


def _field_line(n: int, name: str, info: Any) -> str:
    extra = info.json_schema_extra or {}
    desc = extra.get("desc", "")
    desc = "" if desc == f"${{{name}}}" else desc
    return f"{n}. `{name}` ({brief_type(info.annotation)})" + (f": {desc}" if desc else "")


class CompactJSONAdapter(dspy.JSONAdapter):
    """``JSONAdapter`` with a short system message and one-line JSON answers (see the module
    docstring). Use it with LMs that decode under the output schema; an API LM that ignores the
    schema is better served by the full ``JSONAdapter``."""

    def format_field_description(self, signature: type[dspy.Signature]) -> str:
        fields = (signature.input_fields, signature.output_fields)
        inputs, outputs = (
            "\n".join(_field_line(n, k, v) for n, (k, v) in enumerate(f.items(), 1)) for f in fields
        )
        return (
            f"Your input fields are:\n{inputs}\nYour output fields are:\n{outputs}\n"
            "Outputs will be a JSON object with these fields, in this order."
        )

    def format_field_structure(self, signature: type[dspy.Signature]) -> str:
        return "Each input comes as a [[ ## name ## ]] section."

    def format_task_description(self, signature: type[dspy.Signature]) -> str:
        return textwrap.dedent(signature.instructions).strip()

    def format_system_message(self, signature: type[dspy.Signature]) -> str:
        # the instruction first: the same for every call of the role
        return (
            f"{self.format_task_description(signature)}\n\n"
            f"{self.format_field_description(signature)}\n{self.format_field_structure(signature)}"
        )

    def user_message_output_requirements(self, signature: type[dspy.Signature]) -> str:
        return "Respond with the JSON object: " + ", ".join(signature.output_fields) + "."

    def format_field_with_value(
        self, fields_with_values: dict[Any, Any], role: str = "user"
    ) -> str:
        if role == "user":
            return super().format_field_with_value(fields_with_values, role=role)
        values = {k.name: v for k, v in fields_with_values.items()}
        return json.dumps(serialize_for_json(values), ensure_ascii=False)
