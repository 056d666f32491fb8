"""A compact JSON prompt format for small in-process LMs.

DSPy's ``JSONAdapter`` spells out each output field's type in the system message — for a field
typed by a pydantic model, its whole JSON schema — and repeats the structure in every request. An
LM that decodes under a grammar compiled from that schema (the embedded llama.cpp model) cannot
break it anyway, so the prompt only needs to say what each field *means*.
:class:`CompactJSONAdapter` keeps everything else of ``JSONAdapter`` (structured outputs, parsing,
demos as conversation turns) and writes:

- the system message as the task instruction, the input sections by name (each is shown with its
  value in every request, and the instruction says what they are), then one line per output field:
  name, a short type hint (``list of {record_id, contribution}``, ``one of entity|number|…``) and
  its description;
- demonstrations and requests with the same ``[[ ## field ## ]]`` input sections, and answers as
  one-line JSON (a small LM imitates its demonstrations, so it writes no indentation either), with
  no reminder of the output fields after each request: the decoder's grammar writes them in order.

Measured on the embedded 1.5B model (the nineteenth cost run's calls, Qwen's tokenizer), the input
descriptions, the two lines on the format and the closing reminder were 90–150 of the 730–1,060
prompt tokens of a question writer or planner call, repeated in every call.

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
        inputs = ", ".join(f"`{k}`" for k in signature.input_fields)
        outputs = "\n".join(
            _field_line(n, k, v) for n, (k, v) in enumerate(signature.output_fields.items(), 1)
        )
        return (
            f"Inputs, each a [[ ## name ## ]] section: {inputs}.\n"
            f"Answer with a JSON object of these fields, in order:\n{outputs}"
        )

    def format_task_description(self, signature: type[dspy.Signature]) -> str:
        return textwrap.dedent(signature.instructions).strip()

    def format_system_message(self, signature: type[dspy.Signature]) -> str:
        # the instruction first: the same for every call of the role
        return f"{self.format_task_description(signature)}\n\n{self.format_field_description(signature)}"

    def user_message_output_requirements(self, signature: type[dspy.Signature]) -> str | None:
        return None  # the grammar (or the provider's structured output) writes the fields in order

    def format_field_with_value(
        self, fields_with_values: dict[Any, Any], role: str = "user"
    ) -> str:
        if role == "user":
            return super().format_field_with_value(fields_with_values, role=role)
        values = {k.name: v for k, v in fields_with_values.items()}
        return json.dumps(serialize_for_json(values), ensure_ascii=False)
