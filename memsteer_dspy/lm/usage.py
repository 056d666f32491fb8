"""LM calls and tokens per role: the raw material of the cost report.

Cost is a first-class output of MemSteer (LM calls and tokens per role, per accepted QA, per
iteration). Every role's LM records into a :class:`UsageMeter` under its role name, so usage stays
attributable even when several roles share one model. Cache hits are counted apart and add no
tokens; a call that raised is counted as an error (with whatever tokens it had already used).

Dollar cost comes from LiteLLM's bundled price map, read offline (``LITELLM_LOCAL_MODEL_COST_MAP``,
set by the package): a call of a model the map prices adds its cost to ``cost_usd``; a call of a
model it does not know (a server alias, the embedded model) counts in ``unpriced_calls`` instead,
because an unknown price is not a price of zero. ``cost_usd`` stays ``None`` while no call was priced.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel


class RoleUsage(BaseModel):
    """Usage of one role: backend calls, cache hits, errors, tokens and seconds spent waiting."""

    calls: int = 0
    cache_hits: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    seconds: float = 0.0
    cost_usd: float | None = None
    unpriced_calls: int = 0


@functools.lru_cache(maxsize=256)
def _prices(model: str) -> tuple[float, float] | None:
    """(USD per prompt token, USD per completion token) from LiteLLM's bundled map, or None."""
    if model.split("/", 1)[0] in ("local", "llamacpp", "scripted"):
        return None  # in-process models: no bill, and never a name LiteLLM should guess at
    try:
        import litellm

        info = litellm.get_model_info(model)
    except Exception:  # noqa: BLE001 - LiteLLM raises plain Exception for an unknown model
        return None
    inp, out = info.get("input_cost_per_token"), info.get("output_cost_per_token")
    if not isinstance(inp, (int, float)) or not isinstance(out, (int, float)):
        return None
    return float(inp), float(out)


def cost_of(model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    """The dollar cost of one call of ``model`` by LiteLLM's bundled price map, or None if unpriced."""
    prices = _prices(model)
    if prices is None:
        return None
    return prompt_tokens * prices[0] + completion_tokens * prices[1]


def _as_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0
    return int(value)


class UsageMeter:
    """Thread-safe per-role counters of LM calls and tokens.

    ``record_call`` is told about every LM invocation (with whether it was a cache hit or raised);
    ``record_tokens`` receives the usage dict DSPy reports for each call that reached the backend.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._usage: dict[str, RoleUsage] = {}

    def _role(self, role: str) -> RoleUsage:
        usage = self._usage.get(role)
        if usage is None:
            usage = self._usage[role] = RoleUsage()
        return usage

    def record_tokens(
        self, role: str, usage: Mapping[str, Any] | None, model: str | None = None
    ) -> None:
        """Add the tokens of one backend call (an OpenAI-style usage dict) to ``role``, and its
        dollar cost where LiteLLM's price map knows ``model``."""
        usage = usage or {}
        prompt = _as_int(usage.get("prompt_tokens"))
        completion = _as_int(usage.get("completion_tokens"))
        total = _as_int(usage.get("total_tokens")) or prompt + completion
        cost = cost_of(model, prompt, completion) if model else None
        with self._lock:
            u = self._role(role)
            u.calls += 1
            u.prompt_tokens += prompt
            u.completion_tokens += completion
            u.total_tokens += total
            if cost is None:
                u.unpriced_calls += 1
            else:
                u.cost_usd = (u.cost_usd or 0.0) + cost

    def record_call(
        self, role: str, *, seconds: float, reached_backend: bool, failed: bool = False
    ) -> None:
        """Close one LM invocation of ``role``: its wall time, and whether it was a cache hit/raised."""
        with self._lock:
            u = self._role(role)
            u.seconds += seconds
            if failed:
                u.errors += 1
            elif not reached_backend:
                u.cache_hits += 1

    def by_role(self) -> dict[str, dict[str, Any]]:
        """A snapshot: role -> {calls, cache_hits, errors, prompt_tokens, completion_tokens, ...}."""
        with self._lock:
            return {role: u.model_dump() for role, u in sorted(self._usage.items())}

    def total(self) -> dict[str, Any]:
        """All roles together."""
        out = RoleUsage()
        with self._lock:
            for u in self._usage.values():
                for field in RoleUsage.model_fields:
                    mine, theirs = getattr(out, field), getattr(u, field)
                    if theirs is not None:
                        setattr(out, field, theirs if mine is None else mine + theirs)
        return out.model_dump()

    def reset(self) -> None:
        with self._lock:
            self._usage.clear()


class _RoleTracker:
    """Stands in for DSPy's ``settings.usage_tracker`` during one call of a role's LM.

    DSPy reports the usage of every call that reached the backend (never of a cache hit) to the
    active tracker; this one books it under the role and passes it on to any tracker the caller had
    enabled (``dspy.track_usage()``), so both keep working. ``model`` is the name to price the
    call by (None: unpriced, e.g. an alias on the user's own server).
    """

    def __init__(
        self, meter: UsageMeter, role: str, parent: Any | None, model: str | None = None
    ) -> None:
        self.meter = meter
        self.role = role
        self.parent = parent
        self.model = model
        self.reached_backend = False

    def add_usage(self, lm: str, usage_entry: dict[str, Any]) -> None:
        self.reached_backend = True
        self.meter.record_tokens(self.role, usage_entry, self.model)
        if self.parent is not None:
            self.parent.add_usage(lm, usage_entry)

    def __getattr__(self, name: str) -> Any:  # anything else a caller asks of the real tracker
        if self.parent is None:
            raise AttributeError(name)
        return getattr(self.parent, name)
