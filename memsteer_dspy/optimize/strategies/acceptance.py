"""Accept rules: does a scored candidate replace the current design?

* :class:`StrictAccept` — the paper's: strictly better on validation under the objective;
* :class:`PairedAccept` — a significant paired improvement on the validation items;
* :class:`NonInferiorityGuard` — on top of either, no significant loss on a guard metric;
* :func:`lm_margin_decision` — a design that calls an LM at retrieval time must beat the best
  LM-free design by a margin.

:class:`Judge` applies them in that order and returns one :class:`Decision`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from memsteer_dspy.errors import ConfigError
from memsteer_dspy.optimize.config import GUARD_METRICS
from memsteer_dspy.optimize.objectives import accept
from memsteer_dspy.optimize.types import AcceptRule, Candidate, Decision, Objective
from memsteer_dspy.stats import paired_bootstrap_p, paired_differences, sign_test_p


class StrictAccept:
    """The paper's rule: strictly better on validation under the objective (ties rejected)."""

    name = "strict"

    def __init__(self, objective: Objective):
        self.objective = objective

    def decide(self, candidate: Candidate, incumbent: Candidate) -> Decision:
        if accept(self.objective, candidate.score, incumbent.score):
            return Decision(True, "strictly better on validation")
        return Decision(False, f"not better than the current design ({incumbent.score.short()})")


class PairedAccept:
    """Accept only a significant paired improvement on the validation items.

    The candidate's and the incumbent's per-item primary scores (delivered recall under
    ``recall``, correctness otherwise) are paired by item; the candidate is accepted when its mean
    gain is above ``margin`` and the one-sided test (``bootstrap``: paired bootstrap, 1,000
    resamples, seeded; ``sign``: exact sign test) gives p < ``alpha`` (default 0.1). Under
    ``recall-then-accuracy`` the recall screen applies first. Ties and within-noise gains are
    rejected; the statistic is returned for the trajectory.
    """

    name = "paired"

    def __init__(
        self,
        objective: Objective,
        *,
        alpha: float = 0.1,
        margin: float = 0.0,
        test: Literal["bootstrap", "sign"] = "bootstrap",
        seed: int = 0,
    ):
        if not 0 < alpha < 1:
            raise ConfigError(f"--accept-alpha must be between 0 and 1, not {alpha}")
        if test not in ("bootstrap", "sign"):
            raise ConfigError(f"the paired test must be 'bootstrap' or 'sign', not {test!r}")
        self.objective, self.alpha, self.margin, self.test, self.seed = (
            objective,
            alpha,
            margin,
            test,
            seed,
        )

    def decide(self, candidate: Candidate, incumbent: Candidate) -> Decision:
        if self.objective == "recall-then-accuracy" and accept(
            "recall", incumbent.score, candidate.score
        ):
            return Decision(False, "worse recall than the current design")
        if candidate.item_ids != incumbent.item_ids:
            raise ValueError("paired acceptance needs both designs scored on the same items")
        a, b = incumbent.item_scores, candidate.item_scores
        d = paired_differences(a, b)
        gain = float(d.mean()) if len(d) else 0.0
        p = (
            paired_bootstrap_p(a, b, seed=self.seed)
            if self.test == "bootstrap"
            else sign_test_p(a, b)
        )
        stats = {
            "test": self.test,
            "p": round(p, 4),
            "alpha": self.alpha,
            "gain": round(gain, 4),
            "margin": self.margin,
            "n": len(d),
            "wins": int((d > 0).sum()),
            "losses": int((d < 0).sum()),
        }
        ok = gain > self.margin and p < self.alpha
        why = (
            f"paired gain {gain:+.3f} (p={p:.3f} by {self.test}, {stats['wins']} wins / "
            f"{stats['losses']} losses over {len(d)} items)"
        )
        if ok:
            return Decision(True, f"significant: {why}", stats)
        bar = f"needs p < {self.alpha}" + (f" and gain > {self.margin}" if self.margin else "")
        return Decision(
            False, f"not a significant improvement over the current design: {why}; {bar}", stats
        )


class NonInferiorityGuard:
    """Reject a candidate the accept rule took when it is significantly *below* the current design
    on a guard metric (``--guard recall_at_10``): per guard, the one-sided paired test (bootstrap or
    sign, as for ``--accept paired``) of "the current design is no better than the candidate" over
    the selecting items; p < ``alpha`` means the candidate lost that metric beyond noise.

    With ``margin`` δ set (``--guard-margin``) the burden of proof turns round — a proper
    non-inferiority test: the candidate passes only if the one-sided paired bootstrap shows its
    mean difference above −δ (p of "candidate − current ≤ −δ" below ``alpha``). That is stricter on
    few items (where a real loss is rarely significant), and still passes a design whose ranking is
    unchanged (all differences 0 > −δ).

    Why: the recall objective selects on delivered recall, which a design can raise (smaller units,
    neighbour expansion, a larger top-k) while ranking fewer gold records in its first ten; without
    a guard that trade is accepted and carries to held-out items."""

    def __init__(
        self,
        metrics: Sequence[str],
        *,
        alpha: float = 0.1,
        test: Literal["bootstrap", "sign"] = "bootstrap",
        seed: int = 0,
        margin: float | None = None,
    ):
        if margin is not None and not 0 < margin < 1:
            raise ConfigError(f"--guard-margin must be between 0 and 1 (exclusive), not {margin}")
        self.margin = margin
        bad = [m for m in metrics if m not in GUARD_METRICS]
        if bad:
            raise ConfigError(
                f"unknown --guard metric {bad[0]!r}; choose from {', '.join(GUARD_METRICS)}"
            )
        if not 0 < alpha < 1:
            raise ConfigError(
                f"the guard's significance level must be between 0 and 1, not {alpha}"
            )
        self.metrics, self.alpha, self.test, self.seed = (
            list(dict.fromkeys(metrics)),
            alpha,
            test,
            seed,
        )

    def check(self, candidate: Candidate, incumbent: Candidate) -> Decision:
        """Rejected when a guard metric is significantly below; ``stats`` holds every guard's
        difference (candidate - current), p and item count either way, for the trajectory."""
        if candidate.item_ids != incumbent.item_ids:
            raise ValueError("the guard needs both designs scored on the same items")
        stats: dict[str, Any] = {}
        for m in self.metrics:
            a, b = candidate.item_metrics.get(m), incumbent.item_metrics.get(m)
            if a is None or b is None:
                raise ValueError(f"guard metric {m!r} was not recorded for both designs")
            d = paired_differences(b, a)  # candidate - incumbent
            diff = float(d.mean()) if len(d) else 0.0
            if self.margin is not None:  # non-inferiority: is candidate + δ better than current?
                shifted = [None if x is None else x + self.margin for x in a]
                p = paired_bootstrap_p(b, shifted, seed=self.seed)
                stats[f"guard_{m}"] = {
                    "diff": round(diff, 4),
                    "p": round(p, 4),
                    "n": len(d),
                    "margin": self.margin,
                }
                if len(d) and p >= self.alpha:
                    return Decision(
                        False,
                        (
                            f"not shown non-inferior to the current design in {m}: {diff:+.3f} (p={p:.3f} that it "
                            f"is at least {self.margin:.3f} below, paired bootstrap over {len(d)} items; needs p < "
                            f"{self.alpha})"
                        ),
                        stats,
                    )
                continue
            p = (
                paired_bootstrap_p(a, b, seed=self.seed)
                if self.test == "bootstrap"
                else sign_test_p(a, b)
            )
            stats[f"guard_{m}"] = {"diff": round(diff, 4), "p": round(p, 4), "n": len(d)}
            if p < self.alpha:
                return Decision(
                    False,
                    (
                        f"significantly below the current design in {m}: {diff:+.3f} (p={p:.3f} by {self.test} "
                        f"over {len(d)} items; guard at alpha {self.alpha})"
                    ),
                    stats,
                )
        return Decision(True, "", stats)


def lm_margin_decision(
    candidate: Candidate, best_lm_free: Candidate | None, objective: Objective, margin: float
) -> Decision | None:
    """A design that calls an LM at retrieval must beat the best LM-free design found so far by
    ``margin`` (primary metric); returns the rejection, or None when the rule does not object."""
    if not candidate.uses_lm or best_lm_free is None:
        return None
    c, f = candidate.score.primary(objective), best_lm_free.score.primary(objective)
    if c is None or f is None or c >= f + margin - 1e-9:
        return None
    return Decision(
        False,
        (
            f"calls an LM {candidate.retrieval_lm_calls:g}x per question at retrieval, but does not beat the "
            f"best LM-free design (iteration {best_lm_free.iteration}: {f:.3f}) by the --lm-retrieval-margin "
            f"{margin:.3f} (it scores {c:.3f})"
        ),
        {"lm_free_best": f, "lm_margin": margin},
    )


class Judge:
    """The accept rule, then the guards (when it accepts), then the LM-retrieval margin: the
    first that objects decides, carrying the statistics of those before it."""

    def __init__(
        self,
        rule: AcceptRule,
        guards: NonInferiorityGuard | None,
        objective: Objective,
        lm_margin: float | None,
    ):
        self.rule, self.guards, self.objective, self.lm_margin = rule, guards, objective, lm_margin

    def decide(
        self, candidate: Candidate, incumbent: Candidate, best_lm_free: Candidate | None
    ) -> Decision:
        decision = self.rule.decide(candidate, incumbent)
        if decision.accepted and self.guards is not None:
            guarded = self.guards.check(candidate, incumbent)
            decision.stats = {**decision.stats, **guarded.stats}
            if not guarded.accepted:
                guarded.stats = decision.stats
                return guarded
        if decision.accepted and self.lm_margin is not None:
            veto = lm_margin_decision(candidate, best_lm_free, self.objective, self.lm_margin)
            if veto is not None:
                veto.stats = {**decision.stats, **veto.stats}
                return veto
        return decision


def accept_rule(config: Any) -> AcceptRule:
    """The rule ``config.accept`` names (an :class:`~memsteer_dspy.optimize.config.OptimizeConfig`)."""
    c = config
    if c.accept == "paired":
        return PairedAccept(
            c.objective,
            alpha=c.accept_alpha,
            margin=c.accept_margin,
            test=c.accept_test,
            seed=c.seed,
        )
    return StrictAccept(c.objective)


def guards_of(config: Any) -> NonInferiorityGuard | None:
    """The non-inferiority guards ``config.guard`` names, or None."""
    c = config
    if not c.guard:
        return None
    return NonInferiorityGuard(
        c.guard, alpha=c.accept_alpha, test=c.accept_test, seed=c.seed, margin=c.guard_margin
    )
