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
import time
from collections.abc import Callable
from typing import Any, Literal

import dspy
import json_repair
from dspy.adapters.chat_adapter import FieldInfoWithName
from dspy.utils.exceptions import AdapterParseError

from memsteer_dspy.errors import InputError
from memsteer_dspy.memory.design import MemoryDesign
from memsteer_dspy.memory.embedders import check_local_models
from memsteer_dspy.optimize.design_space import (
    CHANGES_MAX_TOKENS,
    MAX_RATIONALE_CHARS,
    MAX_VALUE_CHARS,
    apply_changes,
    changes_signature,
    compact_design,
    current_value,
    design_space_schema,
    excluded_values,
    field_value_schema,
)
from memsteer_dspy.optimize.types import (
    RATIONALE_TOKENS,
    Proposal,
    ProposalAttempt,
    RevisionEntry,
    design_diff,
    single_change,
)
from memsteer_dspy.signatures.propose import DESIGN_FIELDS, ProposeDesign, ProposeDesignChanges
from memsteer_dspy.tokens import count_tokens

# Kept importable from here: the proposer's inputs and outputs, and its grammar helpers.
__all__ = [
    "CHANGES_MAX_TOKENS",
    "DESIGN_FIELDS",
    "HISTORY_TOKENS",
    "MAX_RATIONALE_CHARS",
    "MAX_VALUE_CHARS",
    "MIN_UNTRIED_FIELDS",
    "RATIONALE_TOKENS",
    "DesignProposer",
    "Proposal",
    "ProposalAttempt",
    "ProposerAdapter",
    "RevisionEntry",
    "apply_changes",
    "changes_signature",
    "compact_design",
    "design_diff",
    "design_space_schema",
    "excluded_values",
    "field_value_schema",
    "rejected_alone",
    "render_history",
    "single_change",
    "tried_fields",
]

HISTORY_TOKENS = 900


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


def _validation_error(exc: Exception) -> tuple[str, str | None]:
    """A readable validation error for an unparseable reply, and the raw reply."""
    if isinstance(exc, InputError):
        return exc.render(), getattr(exc, "raw", None)
    raw = getattr(exc, "lm_response", None)
    if raw is None:
        return f"{type(exc).__name__}: {exc}", None

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
                or field_value_schema(f, current_value(current, f), avoid[f]).get("enum") != []
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
