"""``--max-concurrent-lm``: at most N LM calls in flight per endpoint, across a whole batch.

The gate is a DSPy callback (``on_lm_start`` takes a slot, ``on_lm_end`` gives it back, also when
the call failed), so it bounds every LM call a command makes without touching the LM classes. An
endpoint is the LM's model string plus its ``api_base``: two roles on one server share its slots.

* :class:`LocalSlots` — semaphores in this process (the local executor's threads).
* :class:`RaySlots` — one named Ray actor holding an asyncio semaphore per endpoint, shared by
  every worker of the batch on every node; the gate carries only the actor's name, never a key.
  A worker killed while it holds a slot does not give it back: the batch then runs with one slot
  fewer until it ends (the actor belongs to one batch).
"""

from __future__ import annotations

import threading
from typing import Any

from dspy.utils.callback import BaseCallback


def endpoint_of(lm: Any) -> str:
    kwargs = getattr(lm, "kwargs", None) or {}
    base = kwargs.get("api_base") or kwargs.get("base_url") or ""
    return (
        f"{getattr(lm, 'model', type(lm).__name__)}@{base}"
        if base
        else str(getattr(lm, "model", lm))
    )


class LocalSlots:
    """N slots per endpoint, for threads of one process."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._sems: dict[str, threading.BoundedSemaphore] = {}
        self._lock = threading.Lock()
        self.in_flight: dict[str, int] = {}
        self.peak: dict[str, int] = {}

    def _sem(self, ep: str) -> threading.BoundedSemaphore:
        with self._lock:
            if ep not in self._sems:
                self._sems[ep] = threading.BoundedSemaphore(self.limit)
            return self._sems[ep]

    def acquire(self, ep: str) -> None:
        self._sem(ep).acquire()
        with self._lock:
            self.in_flight[ep] = self.in_flight.get(ep, 0) + 1
            self.peak[ep] = max(self.peak.get(ep, 0), self.in_flight[ep])

    def release(self, ep: str) -> None:
        with self._lock:
            self.in_flight[ep] -= 1
        self._sem(ep).release()


class _SlotActor:
    """The Ray actor behind :class:`RaySlots` (async: a waiting acquire blocks no other call)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.sems: dict[str, Any] = {}
        self.in_flight: dict[str, int] = {}
        self.peak: dict[str, int] = {}

    def _sem(self, ep: str):
        import asyncio

        if ep not in self.sems:
            self.sems[ep] = asyncio.Semaphore(self.limit)
        return self.sems[ep]

    async def acquire(self, ep: str) -> None:
        await self._sem(ep).acquire()
        self.in_flight[ep] = self.in_flight.get(ep, 0) + 1
        self.peak[ep] = max(self.peak.get(ep, 0), self.in_flight[ep])

    async def release(self, ep: str) -> None:
        self.in_flight[ep] -= 1
        self._sem(ep).release()

    async def stats(self) -> dict[str, dict[str, int]]:
        return {"in_flight": dict(self.in_flight), "peak": dict(self.peak)}


class RaySlots:
    """N slots per endpoint shared by all Ray workers of a batch (a named actor)."""

    def __init__(self, limit: int, name: str, namespace: str = "memsteer") -> None:
        import ray

        self.limit, self.name, self.namespace = limit, name, namespace
        actor = ray.remote(_SlotActor).options(
            name=name, namespace=namespace, get_if_exists=True, max_concurrency=10_000, num_cpus=0
        )
        self._actor = actor.remote(limit)

    def __getstate__(self) -> dict[str, Any]:
        return {"limit": self.limit, "name": self.name, "namespace": self.namespace}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._actor = None

    def _handle(self):
        import ray

        if self._actor is None:
            self._actor = ray.get_actor(self.name, namespace=self.namespace)
        return self._actor

    def acquire(self, ep: str) -> None:
        import ray

        ray.get(self._handle().acquire.remote(ep))

    def release(self, ep: str) -> None:
        import ray

        ray.get(self._handle().release.remote(ep))

    def stats(self) -> dict[str, dict[str, int]]:
        import ray

        return ray.get(self._handle().stats.remote())

    def close(self) -> None:
        import ray

        with_actor = self._handle()
        ray.kill(with_actor)


class LMGate(BaseCallback):
    """A DSPy callback that holds one of the endpoint's slots for the length of each LM call."""

    def __init__(self, slots: LocalSlots | RaySlots) -> None:
        self.slots = slots
        self._held: dict[str, str] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"slots": self.slots}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["slots"])

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        ep = endpoint_of(instance)
        self.slots.acquire(ep)
        with self._lock:
            self._held[call_id] = ep

    def on_lm_end(self, call_id: str, outputs: Any, exception: Exception | None = None) -> None:
        with self._lock:
            ep = self._held.pop(call_id, None)
        if ep is not None:
            self.slots.release(ep)
