"""LM calls and tokens per role: the raw material of the cost report.

Cost is a first-class output of MemSteer (LM calls and tokens per role, per accepted QA, per
iteration). Every role's LM records into a :class:`UsageMeter` under its role name, so usage stays
attributable even when several roles share one model. Cache hits are counted apart and add no
tokens; a call that raised is counted as an error (with whatever tokens it had already used).
"""

from __future__ import annotations

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

    def record_tokens(self, role: str, usage: Mapping[str, Any] | None) -> None:
        """Add the tokens of one backend call (an OpenAI-style usage dict) to ``role``."""
        usage = usage or {}
        prompt = _as_int(usage.get("prompt_tokens"))
        completion = _as_int(usage.get("completion_tokens"))
        total = _as_int(usage.get("total_tokens")) or prompt + completion
        with self._lock:
            u = self._role(role)
            u.calls += 1
            u.prompt_tokens += prompt
            u.completion_tokens += completion
            u.total_tokens += total

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
                    setattr(out, field, getattr(out, field) + getattr(u, field))
        return out.model_dump()

    def reset(self) -> None:
        with self._lock:
            self._usage.clear()


class _RoleTracker:
    """Stands in for DSPy's ``settings.usage_tracker`` during one call of a role's LM.

    DSPy reports the usage of every call that reached the backend (never of a cache hit) to the
    active tracker; this one books it under the role and passes it on to any tracker the caller had
    enabled (``dspy.track_usage()``), so both keep working.
    """

    def __init__(self, meter: UsageMeter, role: str, parent: Any | None) -> None:
        self.meter = meter
        self.role = role
        self.parent = parent
        self.reached_backend = False

    def add_usage(self, lm: str, usage_entry: dict[str, Any]) -> None:
        self.reached_backend = True
        self.meter.record_tokens(self.role, usage_entry)
        if self.parent is not None:
            self.parent.add_usage(lm, usage_entry)

    def __getattr__(self, name: str) -> Any:  # anything else a caller asks of the real tracker
        if self.parent is None:
            raise AttributeError(name)
        return getattr(self.parent, name)
