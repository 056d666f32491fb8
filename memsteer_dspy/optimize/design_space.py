"""The design space as a proposer sees it: the compact schema, one field's value schema, the
"changes" grammar (:func:`changes_signature`) that offers only some fields and values, applying a
list of changes to a design, and the values a grammar leaves out (:func:`excluded_values`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any

import dspy
from pydantic import TypeAdapter

from memsteer_dspy.errors import InputError
from memsteer_dspy.memory.design import MemoryDesign, design_json_schema
from memsteer_dspy.signatures.propose import DesignChange, ProposeDesignChanges
from memsteer_dspy.supervision.limits import bounded_type


def design_space_schema() -> str:
    """The design-space schema the proposer reads: :class:`MemoryDesign`'s JSON schema, compact
    (no titles, no indentation) so it fits a small model's context."""

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k != "title"}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    return json.dumps(strip(design_json_schema()), separators=(",", ":"), ensure_ascii=False)


def compact_design(design: MemoryDesign) -> str:
    """A design as one-line JSON (what the proposer reads as the current design)."""
    return json.dumps(design.model_dump(mode="json"), separators=(",", ":"), ensure_ascii=False)


# Longest free-text value a "changes" proposal may write (a model folder path, a query instruction)
# and its rationale: a grammar-bound small model otherwise can loop inside one string or list until
# max_tokens (measured: 443 s on one reply repeating "date", "author" inside store.fields).
MAX_VALUE_CHARS = 200
MAX_RATIONALE_CHARS = 400
# Output tokens of one "changes" reply: four changes and a 400-character rationale need ~250.
CHANGES_MAX_TOKENS = 600


def _bounded(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every array and free string given an upper bound."""
    schema = dict(schema)
    if "anyOf" in schema:
        schema["anyOf"] = [_bounded(s) for s in schema["anyOf"]]
    if schema.get("type") == "array":
        items = schema.get("items") or {}
        schema["maxItems"] = len(items["enum"]) if "enum" in items else 16
        schema["uniqueItems"] = True
    elif schema.get("type") == "string" and "enum" not in schema:
        schema.setdefault("maxLength", MAX_VALUE_CHARS)
    return schema


def field_value_schema(path: str, current: Any = None, avoid: Any = ()) -> dict[str, Any]:
    """The JSON schema of one design field's value: its type, allowed values and bounds (arrays
    and free strings bounded). With ``current`` (the field's value in the current design) a
    choice field leaves that value out, so a grammar-bound proposer cannot write a change that
    changes nothing (measured: 2 of 4 calls in one iteration re-proposed the current value).
    A choice field also leaves out the values in ``avoid`` (the tabu list); ``"enum": []`` then
    means no value is left to offer."""
    model: Any = MemoryDesign
    *parents, last = path.split(".")
    for part in parents:
        model = model.model_fields[part].annotation
    info = model.model_fields[last]
    annotation = Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
    schema = TypeAdapter(annotation).json_schema()
    schema.pop("title", None)
    if path == "store.fields":  # the record text is always indexed (apply_changes adds it)
        items = dict(schema["items"])
        items["enum"] = [f for f in items["enum"] if f != "text"]
        schema = {
            **schema,
            "items": items,
            "description": "metadata fields indexed beside the text",
        }
    schema = _bounded(schema)
    avoid = list(avoid)
    if current is not None and isinstance(current, bool) and schema.get("type") == "boolean":
        return {"type": "boolean", "enum": [v for v in [not current] if v not in avoid]}
    if current is not None and "enum" in schema and current in schema["enum"]:
        others = [v for v in schema["enum"] if v != current]
        if others:
            schema["enum"] = [v for v in others if v not in avoid]
    elif "enum" in schema and avoid:
        schema["enum"] = [v for v in schema["enum"] if v not in avoid]
    return schema


def current_value(design: MemoryDesign, path: str) -> Any:
    node: Any = design
    for part in path.split("."):
        node = getattr(node, part)
    return node


def changes_signature(
    allowed: tuple[str, ...],
    current: MemoryDesign | None = None,
    avoid: dict[str, list[Any]] | None = None,
) -> type[dspy.Signature]:
    """:class:`ProposeDesignChanges` whose output schema offers only the ``allowed`` fields, each
    with the type of its own value (one alternative per field: ``{"field": "store.window_size",
    "value": <integer>}``), and asks for at least one change. A grammar-constrained LM can then
    neither name another field nor write a value of the wrong type (measured before this: 17 of
    20 embedded proposals were invalid, e.g. ``window_size = "strconv(2 * 3)"``). With
    ``current``, a choice field offers only values other than the current one, and none of
    ``avoid``'s values for that field (the tabu list). Lists, free strings
    and the rationale are bounded. Parsing still accepts any design field and value (an API LM
    that strays is told what was invalid)."""

    def value(f: str) -> dict[str, Any]:
        cur = None if current is None else current_value(current, f)
        return field_value_schema(f, cur, (avoid or {}).get(f, ()))

    items = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"field": {"const": f}, "value": value(f)},
                "required": ["field", "value"],
            }
            for f in allowed
        ]
    }
    changes = bounded_type(list[DesignChange], "DesignChanges", minItems=1, maxItems=4, items=items)
    rationale = bounded_type(str, "Rationale", maxLength=MAX_RATIONALE_CHARS)
    return ProposeDesignChanges.with_updated_fields("changes", type_=changes).with_updated_fields(
        "rationale", type_=rationale
    )


def apply_changes(current: MemoryDesign, changes: list[DesignChange]) -> MemoryDesign:
    """``current`` with each change applied (values are JSON; a bare word is taken as a string).
    Raises :class:`InputError` naming the field when the result is not a valid design."""
    data = current.model_dump(mode="json")
    for ch in changes:
        try:
            value = json.loads(ch.value)
        except (json.JSONDecodeError, TypeError):
            value = ch.value
        node = data
        *parents, last = ch.field.split(".")
        for part in parents:
            node = node[part]
        if isinstance(node.get(last), list) and isinstance(value, str):
            # a list field written as text: "text, author" (measured: the embedded proposer wrote
            # list values this way in 2 of 3 invalid proposals)
            value = [v.strip().strip("'\"") for v in value.strip("[]").split(",") if v.strip()]
        if ch.field == "store.fields" and isinstance(value, list) and "text" not in value:
            # the record text is always indexed; the grammar offers only the metadata fields
            # (measured: 2 of 15 iterations of the shared RHELM run listed the metadata alone and
            # were invalid twice over)
            value = ["text", *value]
        node[last] = value
    return MemoryDesign.from_dict(data)


def _with_value(design: MemoryDesign, path: str, value: Any) -> MemoryDesign | None:
    """``design`` with one field set to ``value``; None when that is not a valid design."""
    try:
        return apply_changes(design, [DesignChange(field=path, value=json.dumps(value))])
    except InputError:
        return None


def excluded_values(
    current: MemoryDesign,
    fields: tuple[str, ...] | list[str],
    seen: dict[str, str],
    pin: Callable[[MemoryDesign], MemoryDesign] = lambda d: d,
    check: Callable[[MemoryDesign], None] | None = None,
) -> dict[str, dict[str, list[Any]]]:
    """For each choice field (an enum or a bool) of ``fields``, the values a "changes" grammar
    leaves out, by reason: ``"scored"`` — set on their own in ``current`` they give a design
    already scored in the run (a key in ``seen``: a step back to the parent, or any earlier
    candidate); ``"unbuildable"`` — on their own they give an invalid design, or one ``check``
    refuses here (a reranker with no model folder, an LM at retrieval time over the run's limit,
    a missing extra). Measured on the shared RHELM run: after the section store was accepted the
    embedded proposer spent a call on ``store.unit = record`` (the parent), and a whole iteration
    on ``retrieve.rerank = cross_encoder`` with no reranker model on the machine."""
    out: dict[str, dict[str, list[Any]]] = {"scored": {}, "unbuildable": {}}
    for f in fields:
        for v in field_value_schema(f, current_value(current, f)).get("enum") or ():
            design = _with_value(current, f, v)
            reason = "unbuildable" if design is None else None
            if design is not None:
                design = pin(design)
                if design.key() in seen:
                    reason = "scored"
                elif check is not None:
                    try:
                        check(design)
                    except InputError:
                        reason = "unbuildable"
            if reason:
                out[reason].setdefault(f, []).append(v)
    return out
