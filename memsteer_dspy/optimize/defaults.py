"""The defaults of the MemSteer-Opt options whose best value depends on the LMs at hand.

The paper's setting (whole-design proposals, 3,000 feedback tokens, strict accept, validation
accuracy) suits an API proposer. With the embedded proposer it spent 774 s and 26,670 tokens on
its first iteration and proposed the baseline itself, and the embedded answerer answered "I don't
know" to every RHELM item tried, so an accuracy objective selects on zeros. The small-proposer
setting below (the README's) ran 10 iterations in 19 minutes on the same user and won on held-out
questions. :func:`resolve_defaults` is the one place that picks between them; the CLI, the demo
and the experiments all call it, and an option the caller set explicitly always wins.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

PAPER: dict[str, Any] = {
    "objective": "accuracy",
    "proposer_output": "design",
    "feedback_tokens": 3000,
    "accept": "strict",
    "guard": [],
    "guard_margin": None,
    "val_from": "val",
    "max_eval_lm_calls": None,
}
"""The paper's setting (Section 3.3): what ``--paper`` forces for every option left unset."""

SMALL_PROPOSER: dict[str, Any] = {
    "proposer_output": "changes",
    "feedback_tokens": 1200,
    "accept": "paired",
    "guard": ["recall_at_10"],
    "guard_margin": 0.02,
    "val_from": "train+val",
    "max_eval_lm_calls": 0,
}
"""The measured-best setting for a proposer decoded in this process (a small local model)."""


def build_call_limit(given: int | None, *, answerer_in_process: bool) -> int | None:
    """``max_build_calls`` when the caller left it unset: 0 where the LM that builds an LM store
    (fact extraction, one call per ``facts_batch`` records) runs in this process — a ``facts``
    store over a RHELM persona is hundreds of calls, over ten personas about 6,800, days on 2
    cores, so such a proposal is sent back to the proposer — and no limit for an API LM. The CLI
    and the experiments both take it from here."""
    if given is not None:
        return given
    return 0 if answerer_in_process else None


AUTO_OPTIONS = tuple(PAPER)
"""The options resolved here; None for any of them means "auto"."""

FLAGS = {
    "objective": "--objective",
    "proposer_output": "--proposer-output",
    "feedback_tokens": "--feedback-tokens",
    "accept": "--accept",
    "guard": "--guard",
    "guard_margin": "--guard-margin",
    "val_from": "--val-from",
    "max_eval_lm_calls": "--max-eval-lm-calls",
}


@dataclass(frozen=True)
class ResolvedDefaults:
    """The options after resolution: ``values`` holds every option of :data:`AUTO_OPTIONS`
    (explicit ones as given), ``auto`` the ones that were left unset, ``setting`` which setting
    they took and ``reason`` why."""

    values: dict[str, Any]
    auto: tuple[str, ...]
    setting: Literal["paper", "small-proposer"]
    reason: str

    def flags(self) -> str:
        """The auto-resolved options as command-line flags (what to pass to get the same run)."""
        parts: list[str] = []
        for name in self.auto:
            value = self.values[name]
            if name == "guard":
                parts += [f"--guard {g}" for g in value]
            elif value is not None:
                parts.append(f"{FLAGS[name]} {value}")
        return " ".join(parts) or "(none)"

    def line(self) -> str:
        """One line for the start of a run: ``resolved: ...``."""
        if not self.auto:
            return "resolved: every setting given explicitly"
        return f"resolved: {self.setting} setting, {self.flags()}, {self.reason}"


def resolve_defaults(
    given: Mapping[str, Any],
    *,
    proposer_in_process: bool,
    answerer_in_process: bool,
    paper: bool = False,
) -> ResolvedDefaults:
    """Fill the options of ``given`` that are None (auto; a missing key counts as None).

    ``paper`` forces :data:`PAPER`. Otherwise a proposer decoded in this process gets
    :data:`SMALL_PROPOSER` and an API proposer the paper's; the objective is ``recall`` (delivered
    recall, no answering LM) when the answerer runs in-process, else ``accuracy``. Selecting on
    training items (``val_from`` ``train+val``) needs the recall objective, so it resolves to
    ``val`` under any other. Explicit values always win."""
    unknown = set(given) - set(AUTO_OPTIONS)
    if unknown:
        raise ValueError(f"not an auto option: {', '.join(sorted(unknown))}")
    small = proposer_in_process and not paper
    table = {**PAPER, **(SMALL_PROPOSER if small else {})}
    if not paper and answerer_in_process:
        table["objective"] = "recall"
    values = {k: given.get(k) for k in AUTO_OPTIONS}
    auto = tuple(k for k in AUTO_OPTIONS if values[k] is None)
    for k in auto:
        values[k] = list(table[k]) if isinstance(table[k], list) else table[k]
    if "val_from" in auto and values["objective"] != "recall":
        values["val_from"] = "val"
    if paper:
        reason = "because --paper was given"
    else:
        where = "runs in-process" if proposer_in_process else "is not in-process"
        reason = f"because the proposer {where}"
        if "objective" in auto:
            reason += " and the answerer " + (
                "runs in-process" if answerer_in_process else "is not"
            )
    return ResolvedDefaults(values, auto, "small-proposer" if small else "paper", reason)
