"""The design proposer: a DSPy module around :class:`~memsteer_dspy.signatures.propose.ProposeDesign`.

It asks an LM (the ``proposer`` role) for a revised design, with the design schema as the
structured output (``JSONAdapter``: a grammar-bound JSON object on the embedded model, structured
outputs on API models), and handles the two ways a proposal can be unusable:

* **invalid** — the reply is not a valid :class:`MemoryDesign` (a field out of range, a forbidden
  combination): it is sent back once with the validation error; still invalid → the iteration is
  recorded invalid and skipped;
* **duplicate** — the design equals an earlier candidate (same :meth:`MemoryDesign.key`): it is
  not evaluated again but re-sampled with a new DSPy ``rollout_id`` at a temperature above 0, with
  the duplicate named in the revision history (at temperature 0 the same feedback gives the same
  proposal, and the loop would stall).

The context token budget is held fixed across designs (paper, Section 3.3): a proposal that changes
it is pinned back, and the attempt says so.

``output="changes"`` asks for the fields to change instead of the whole design
(:class:`~memsteer_dspy.signatures.propose.ProposeDesignChanges`): a short, grammar-cheap structured
output that makes the embedded 1.5B model usable on a busy CPU, where writing all ~40 fields of a
design under the full schema's grammar took tens of minutes per proposal.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

import dspy
from dspy.adapters.chat_adapter import FieldInfoWithName
from pydantic import BaseModel, Field

from memsteer_dspy.errors import InputError
from memsteer_dspy.memory.design import MemoryDesign, design_json_schema
from memsteer_dspy.memory.embedders import check_local_models
from memsteer_dspy.signatures.propose import (
    DESIGN_FIELDS,
    DesignChange,
    ProposeDesign,
    ProposeDesignChanges,
)
from memsteer_dspy.tokens import count_tokens, truncate_to_tokens

HISTORY_TOKENS = 900
RATIONALE_TOKENS = 70


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


def _flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: obj}


def design_diff(before: MemoryDesign, after: MemoryDesign) -> list[str]:
    """What changed, one ``path: old -> new`` per field (the name is not part of a design)."""
    a, b = _flat(before.model_dump(mode="json")), _flat(after.model_dump(mode="json"))
    out = []
    for k in sorted(set(a) | set(b)):
        if k == "name" or a.get(k) == b.get(k):
            continue
        out.append(f"{k}: {json.dumps(a.get(k))} -> {json.dumps(b.get(k))}")
    return out


class ProposerAdapter(dspy.JSONAdapter):
    """``JSONAdapter`` that does not repeat the design schema in the output-format note: the
    schema is already an input (``design_space``), and a small model's context is short. The
    structured-output response format still carries the full schema."""

    def format_field_structure(self, signature: type[dspy.Signature]) -> str:
        def note(name: str, info) -> str:
            if info.annotation is str:
                return f"{{{name}}}"
            return f"{{{name}}}        # note: a JSON object that follows the design_space schema"

        inputs = self.format_field_with_value(
            {
                FieldInfoWithName(name=n, info=f): f"{{{n}}}"
                for n, f in signature.input_fields.items()
            },
            role="user",
        )
        outputs = self.format_field_with_value(
            {
                FieldInfoWithName(name=n, info=f): note(n, f)
                for n, f in signature.output_fields.items()
            },
            role="assistant",
        )
        return "\n\n".join(
            [
                "All interactions will be structured in the following way, with the appropriate values filled in.",
                "Inputs will have the following structure:",
                inputs,
                "Outputs will be a JSON object with the following fields.",
                outputs,
            ]
        )


class RevisionEntry(BaseModel):
    """One earlier proposal as the proposer sees it in the revision history."""

    iteration: int
    status: str = Field(description="baseline, accepted, rejected, invalid, duplicate or failed.")
    changes: list[str] = Field(default_factory=list)
    score: str = ""
    rationale: str = ""
    note: str = ""
    tried_alone: list[str] | None = Field(
        None,
        description="Fields whose single-field sub-change was screened (a rejected multi-field "
        "proposal); None: not screened, so every changed field counts as tried.",
    )
    rejected_alone: list[tuple[str, Any]] = Field(
        default_factory=list,
        description="(field, value) changes this entry rejected on their own: a rejected "
        "single-change proposal, or a rejected single-field sub-change screen (the tabu list).",
    )

    def render(self) -> str:
        head = f"- iteration {self.iteration}: {self.status.upper()}"
        if self.score:
            head += f" ({self.score})"
        lines = [head]
        if self.changes:
            lines.append("  changes: " + "; ".join(self.changes))
        if self.rationale:
            lines.append(
                "  rationale: "
                + truncate_to_tokens(self.rationale, RATIONALE_TOKENS).replace("\n", " ")
            )
        if self.note:
            lines.append("  note: " + self.note)
        return "\n".join(lines)


def render_history(entries: list[RevisionEntry], max_tokens: int = HISTORY_TOKENS) -> str:
    """The revision history, newest last; the oldest entries are left out to fit ``max_tokens``
    (the baseline is always kept)."""
    if not entries:
        return "(none yet)"
    texts = [e.render() for e in entries]
    keep_first = entries[0].status == "baseline"
    used = count_tokens(texts[0]) if keep_first else 0
    chosen: list[int] = []
    for i in range(len(texts) - 1, 0 if keep_first else -1, -1):
        n = count_tokens(texts[i]) + 1
        if used + n > max_tokens and chosen:
            break
        chosen.append(i)
        used += n
    chosen = sorted(chosen)
    out = [texts[0]] if keep_first else []
    omitted = (chosen[0] if chosen else len(texts)) - (1 if keep_first else 0)
    if omitted > 0:
        out.append(f"- ({omitted} earlier proposal(s) omitted)")
    out.extend(texts[i] for i in chosen)
    return "\n".join(out)


class ProposalAttempt(BaseModel):
    """One call of the proposer LM within an iteration."""

    kind: Literal["ok", "invalid", "duplicate", "error"]
    error: str | None = None
    duplicate_of: str | None = Field(
        None, description="The earlier candidate it equals (e.g. 'iteration 3, rejected')."
    )
    design_key: str | None = None
    rollout_id: int | None = None
    temperature: float | None = None
    seconds: float = 0.0
    raw: str | None = Field(None, description="The reply, when it could not be parsed as a design.")
    notes: list[str] = Field(default_factory=list)


class Proposal(BaseModel):
    """What the proposer produced in one iteration."""

    status: Literal["ok", "invalid", "duplicate", "failed"]
    design: MemoryDesign | None = None
    rationale: str = ""
    attempts: list[ProposalAttempt] = Field(default_factory=list)
    error: str | None = None
    search_params: dict[str, Any] | None = Field(
        None, description="random/tpe: the sampled parameters and their distributions."
    )


# Below this many untried fields, exploration starts over with every field.
MIN_UNTRIED_FIELDS = 4


def tried_fields(history: list[RevisionEntry]) -> set[str]:
    """Design fields changed by the proposals that were not accepted since the current design was
    accepted (or since the baseline). A multi-field proposal whose single-field sub-changes were
    screened (``tried_alone``) blocks only the fields tried on their own, so one bad field does not
    hide a good one proposed with it."""
    tried: set[str] = set()
    for entry in history:
        if entry.status in ("accepted", "baseline"):
            tried = set()
        elif entry.tried_alone is not None:
            tried.update(entry.tried_alone)
        else:
            tried.update(c.split(":", 1)[0].strip() for c in entry.changes)
    return tried


def single_change(changes: list[str]) -> tuple[str, Any] | None:
    """The one change a ``design_diff`` list makes, as (field, new value), when it changes one
    field or one coupled group (a switch with its settings: the switch names it, e.g.
    ``("store.unit", "window")`` for a window of any size); None for several changes or a line
    that does not parse."""
    from memsteer_dspy.optimize.search import COUPLED

    new: dict[str, Any] = {}
    for line in changes:
        field, sep, rest = line.partition(": ")
        _, arrow, value = rest.rpartition(" -> ")
        if not sep or not arrow:
            return None
        try:
            new[field.strip()] = json.loads(value)
        except json.JSONDecodeError:
            return None
    groups = {next((g for g in COUPLED if f in g), (f,)) for f in new}
    if len(groups) != 1:
        return None
    (group,) = groups
    label = next(f for f in group if f in new)
    return label, new[label]


def rejected_alone(history: list[RevisionEntry]) -> dict[tuple[str, str], int]:
    """The tabu list: every (field, JSON value) change rejected on its own anywhere in the run,
    with the iteration that rejected it. A proposal that only repeats one of them is re-sampled
    like a duplicate, and a "changes" proposer is not offered those values (measured on the shared
    RHELM run: the embedded proposer re-proposed changes rejected on an ancestor in 12 of 20
    iterations — a window store 5 times, ISO dates 4 times, a dense index 3 times)."""
    out: dict[tuple[str, str], int] = {}
    for entry in history:
        for field, value in entry.rejected_alone:
            out.setdefault((field, json.dumps(value, sort_keys=True)), entry.iteration)
    return out


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
        for v in field_value_schema(f, _current_value(current, f)).get("enum") or ():
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
    from typing import Annotated

    from pydantic import TypeAdapter

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


def _current_value(design: MemoryDesign, path: str) -> Any:
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
    from memsteer_dspy.supervision.limits import bounded_type

    def value(f: str) -> dict[str, Any]:
        cur = None if current is None else _current_value(current, f)
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


def _validation_error(exc: Exception) -> tuple[str, str | None]:
    """A readable validation error for an unparseable reply, and the raw reply."""
    if isinstance(exc, InputError):
        return exc.render(), getattr(exc, "raw", None)
    raw = getattr(exc, "lm_response", None)
    if raw is None:
        return f"{type(exc).__name__}: {exc}", None
    import json_repair

    try:
        data = json_repair.loads(raw)
    except Exception:
        data = None
    if not isinstance(data, dict):
        return "the reply is not a JSON object with the fields rationale and design", raw
    design = data.get("design")
    if not isinstance(design, dict):
        return "the reply has no 'design' object (a complete design following design_space)", raw
    try:
        MemoryDesign.from_dict(design)
    except Exception as err:  # InputError naming the field at fault
        return str(err), raw
    return str(exc).split("\n\n")[0], raw


class DesignProposer(dspy.Module):
    """Proposes revised designs with one LM (see the module docstring).

    Args:
        lm: the proposer's LM (``lm_config.lm("proposer")``); None uses the configured DSPy LM.
        fixed_budget: the context budget every design keeps (None: not enforced).
        max_resamples: re-samples of a duplicate proposal before the iteration is skipped.
        resample_temperature: the temperature of a re-sample (at least this, above 0).
        history_tokens: token budget of the rendered revision history.
        output: ``"design"`` (the whole revised design, the design schema as structured output) or
            ``"changes"`` (only the fields to change; for small local models).
        explore: with ``output="changes"``, each call may only change fields that no proposal
            tried since the last accepted design (measured on the embedded 1.5B proposer: at
            temperature 0.7 it re-proposed the same field in 17 of 17 calls, so without this the
            loop evaluates nothing new); the restriction is in the output schema, so a
            grammar-constrained LM cannot break it, and it is lifted when few fields are left.
        unscored: design fields the run's objective cannot see, never offered by a "changes"
            grammar (``answer.verify`` under the recall objective, which scores retrieval only:
            seen on the shared RHELM run, an embedded proposal turned verification on and the
            iteration scored an identical system).
        tabu: a proposal that only repeats a change rejected on its own earlier in the run
            (:func:`rejected_alone`) is re-sampled like a duplicate, and with ``output="changes"``
            the output schema does not offer those values (a field with no value left is not
            offered at all).
        check: raises :class:`InputError` for a valid design this machine cannot build (default:
            :func:`~memsteer_dspy.memory.embedders.check_local_models`, a model folder that is not
            there); such a proposal is sent back once with the error, like an invalid one.
    """

    def __init__(
        self,
        lm: Any = None,
        *,
        fixed_budget: int | None = None,
        max_resamples: int = 3,
        resample_temperature: float = 0.7,
        history_tokens: int = HISTORY_TOKENS,
        output: Literal["design", "changes"] = "design",
        check: Callable[[MemoryDesign], None] | None = check_local_models,
        explore: bool = True,
        tabu: bool = True,
        unscored: frozenset[str] | set[str] = frozenset(),
    ):
        super().__init__()
        self.check = check
        self.explore = explore
        self.tabu = tabu
        self.unscored = frozenset(unscored)
        if output not in ("design", "changes"):
            raise ValueError(f"output must be 'design' or 'changes', not {output!r}")
        self.output = output
        self.propose = dspy.Predict(ProposeDesign if output == "design" else ProposeDesignChanges)
        self.propose.lm = lm
        self.adapter = ProposerAdapter()
        self.fixed_budget = fixed_budget
        self.max_resamples = max_resamples
        self.resample_temperature = resample_temperature
        self.history_tokens = history_tokens
        self._schema = design_space_schema()

    def _call(
        self,
        current: MemoryDesign,
        history: str,
        feedback: str,
        config: dict[str, Any],
        allowed: tuple[str, ...] | None = None,
        avoid: dict[str, list[Any]] | None = None,
    ):
        original = self.propose.signature
        if allowed is not None:
            self.propose.signature = changes_signature(allowed, current, avoid)
        try:
            with dspy.context(adapter=self.adapter):
                return self.propose(
                    current_design=compact_design(current),
                    design_space=self._schema,
                    revision_history=history,
                    feedback=feedback,
                    config=config,
                )
        finally:
            self.propose.signature = original

    @property
    def pinned_fields(self) -> set[str]:
        """Fields never offered as a change: the context budget when it is fixed (a proposal that
        changes it is pinned back), and the ``unscored`` fields the run's objective cannot see.
        Derived, since the loop may set ``fixed_budget`` later."""
        pinned = set(self.unscored)
        if self.fixed_budget is not None:
            pinned.add("context.budget_tokens")
        return pinned

    def _allowed_fields(
        self, exclude: set[str], current: MemoryDesign, avoid: dict[str, list[Any]] | None = None
    ) -> tuple[str, ...] | None:
        """The fields a "changes" proposal may name: those that act under the current design
        (:meth:`MemoryDesign.inert_fields` are left out), have a value left once the tabu values
        in ``avoid`` are taken out, and were not tried since the last accept (all of them when
        fewer than :data:`MIN_UNTRIED_FIELDS` are left); None when not exploring."""
        if self.output != "changes" or not self.explore:
            return None
        inert = current.inert_fields()
        fields = [f for f in DESIGN_FIELDS if f not in self.pinned_fields and f not in inert]
        if avoid:
            open_ = [
                f
                for f in fields
                if f not in avoid
                or field_value_schema(f, _current_value(current, f), avoid[f]).get("enum") != []
            ]
            fields = open_ if len(open_) >= MIN_UNTRIED_FIELDS else fields
        untried = tuple(f for f in fields if f not in exclude)
        return untried if len(untried) >= MIN_UNTRIED_FIELDS else tuple(fields)

    def _pin(self, design: MemoryDesign, notes: list[str]) -> MemoryDesign:
        if self.fixed_budget is not None and design.context.budget_tokens != self.fixed_budget:
            notes.append(
                f"context.budget_tokens {design.context.budget_tokens} pinned back to the fixed "
                f"budget {self.fixed_budget}"
            )
            design = design.model_copy(
                update={
                    "context": design.context.model_copy(
                        update={"budget_tokens": self.fixed_budget}
                    )
                }
            )
        return design

    def forward(
        self,
        current: MemoryDesign,
        history: list[RevisionEntry],
        feedback: str,
        *,
        seen: dict[str, str] | None = None,
        iteration: int = 0,
    ) -> Proposal:
        """Propose a revision of ``current``. ``seen`` maps the key of every earlier candidate to
        a label (``"iteration 3, rejected"``); ``iteration`` numbers the rollouts."""
        import time

        seen = seen or {}
        extra: list[RevisionEntry] = []
        attempts: list[ProposalAttempt] = []
        # a "changes" reply is a few fields and a short rationale: cap it, so a reply that loops
        # costs seconds, not minutes (a cut reply is still parsed as far as it goes)
        limit = {"max_tokens": CHANGES_MAX_TOKENS} if self.output == "changes" else {}
        config: dict[str, Any] = dict(limit)
        resamples = 0
        sent_back = False
        exclude = tried_fields(history)
        tabu = rejected_alone(history) if self.tabu else {}
        avoid: dict[str, list[Any]] = {}
        for field, value in tabu:
            avoid.setdefault(field, []).append(json.loads(value))
        excluded: dict[str, dict[str, list[Any]]] = {}
        if self.output == "changes" and self.explore:
            pin = lambda d: self._pin(d, [])  # noqa: E731
            excluded = excluded_values(current, DESIGN_FIELDS, seen, pin, self.check)
            for by_field in excluded.values():
                for field, values in by_field.items():
                    have = avoid.setdefault(field, [])
                    have.extend(v for v in values if v not in have)
        while True:
            t0 = time.perf_counter()
            notes: list[str] = []
            text = render_history(history + extra, self.history_tokens)
            allowed = self._allowed_fields(exclude, current, avoid)
            if allowed is not None and exclude & set(DESIGN_FIELDS) - set(allowed):
                notes.append(
                    "fields tried since the last accept were not offered: "
                    + ", ".join(sorted(exclude))
                )
            if allowed is not None and tabu:
                notes.append(
                    "values rejected on their own earlier were not offered: "
                    + "; ".join(f"{f}={v}" for f, v in sorted(tabu))
                )
            for reason, label in (
                ("scored", "give an already scored design"),
                ("unbuildable", "cannot be built or scored here on their own"),
            ):
                if allowed is not None and excluded.get(reason):
                    notes.append(
                        f"values that {label} were not offered: "
                        + "; ".join(
                            f"{f}={json.dumps(v)}"
                            for f, vs in sorted(excluded[reason].items())
                            for v in vs
                        )
                    )
            try:
                pred = self._call(current, text, feedback, config, allowed, avoid)
                error, raw = None, None
                if self.output == "changes":
                    proposed = list(pred.changes or [])
                    exclude.update(str(c.field) for c in proposed)
                    notes.append("changes: " + "; ".join(f"{c.field}={c.value}" for c in proposed))
                    try:
                        design = apply_changes(current, proposed)
                    except InputError as err:  # name the value the proposer gave the field at fault
                        given = [f"{c.field} = {c.value}" for c in proposed if c.field == err.field]
                        err.message += f" (you proposed {'; '.join(given)})" if given else ""
                        err.args = (err.render(),)
                        err.raw = json.dumps([c.model_dump() for c in proposed])
                        raise
                else:
                    design = pred.design
                    if not isinstance(design, MemoryDesign):
                        design = MemoryDesign.from_dict(design)
                if self.check is not None:
                    self.check(design)  # e.g. a model folder that is not on this machine
            except Exception as exc:  # noqa: BLE001 - sorted below: parse/validation vs LM failure
                design = None
                if _is_parse_error(exc):
                    error, raw = _validation_error(exc)
                else:
                    attempts.append(
                        ProposalAttempt(
                            kind="error",
                            error=f"{type(exc).__name__}: {exc}",
                            seconds=time.perf_counter() - t0,
                            **_cfg(config),
                        )
                    )
                    return Proposal(
                        status="failed", attempts=attempts, error=f"{type(exc).__name__}: {exc}"
                    )
            seconds = time.perf_counter() - t0
            if design is None:
                attempts.append(
                    ProposalAttempt(
                        kind="invalid", error=error, raw=raw, seconds=seconds, **_cfg(config)
                    )
                )
                if sent_back:
                    return Proposal(status="invalid", attempts=attempts, error=error)
                sent_back = True
                extra.append(
                    RevisionEntry(
                        iteration=iteration,
                        status="invalid",
                        note=f"your last proposal was not a valid design: {error}. Return a complete, valid design.",
                    )
                )
                continue
            design = self._pin(design, notes)
            key = design.key()
            rationale = str(getattr(pred, "rationale", "") or "")
            repeat = single_change(design_diff(current, design)) if tabu else None
            if repeat is not None:
                at = tabu.get((repeat[0], json.dumps(repeat[1], sort_keys=True)))
                if at is not None and key not in seen:
                    label = f"iteration {at}, where {repeat[0]} = {json.dumps(repeat[1])}"
                    seen = {**seen, key: label + " was rejected on its own"}
            if key in seen:
                attempts.append(
                    ProposalAttempt(
                        kind="duplicate",
                        duplicate_of=seen[key],
                        design_key=key,
                        seconds=seconds,
                        notes=notes,
                        **_cfg(config),
                    )
                )
                if resamples >= self.max_resamples:
                    return Proposal(
                        status="duplicate",
                        design=design,
                        rationale=rationale,
                        attempts=attempts,
                        error=f"every proposal repeated an earlier candidate ({seen[key]})",
                    )
                resamples += 1
                extra.append(
                    RevisionEntry(
                        iteration=iteration,
                        status="duplicate",
                        changes=design_diff(current, design),
                        note=f"identical to the design of {seen[key]}; propose a different design",
                    )
                )
                base_t = _temperature(self.propose.lm)
                config = {
                    **limit,
                    "rollout_id": iteration * 100 + resamples,
                    "temperature": max(self.resample_temperature, base_t or 0.0),
                }
                continue
            attempts.append(
                ProposalAttempt(
                    kind="ok", design_key=key, seconds=seconds, notes=notes, **_cfg(config)
                )
            )
            return Proposal(status="ok", design=design, rationale=rationale, attempts=attempts)


def _cfg(config: dict[str, Any]) -> dict[str, Any]:
    return {"rollout_id": config.get("rollout_id"), "temperature": config.get("temperature")}


def _temperature(lm: Any) -> float | None:
    lm = lm or dspy.settings.lm
    t = getattr(lm, "kwargs", {}).get("temperature") if lm is not None else None
    return float(t) if isinstance(t, (int, float)) else None


def _is_parse_error(exc: Exception) -> bool:
    from dspy.utils.exceptions import AdapterParseError

    from memsteer_dspy.errors import InputError

    return isinstance(exc, (AdapterParseError, InputError, ValueError)) and not _is_lm_error(exc)


def _is_lm_error(exc: Exception) -> bool:
    name = type(exc).__name__
    return any(
        s in name
        for s in (
            "ContextLength",
            "RateLimit",
            "Timeout",
            "Connection",
            "APIError",
            "Authentication",
        )
    )
