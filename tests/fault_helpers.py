"""Deterministic LMs for the run-integrity suites (issue #13).

* :class:`HandlerLM` answers each request by a pure function of its messages, so a run killed and
  resumed asks the same questions and gets the same answers as an uninterrupted run.
* :class:`FaultyLM` wraps one: seeded, it raises, times out or returns unparseable text on about
  ``rate`` of the calls, chosen by a hash of (seed, request, how often this request was seen), so
  the faults do not depend on thread scheduling or on where a resumed run starts.

Both are DSPy LMs (``DummyLM`` with a custom engine), importable from a subprocess (the kill
tests put ``tests/`` on ``PYTHONPATH``).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import dspy
from dspy.clients.engines.dummy_engine import AsyncDummyEngine, DummyEngine
from dspy.utils.dummies import DummyLM

Handler = Callable[[str, str], dict[str, Any]]
FAULT_KINDS = ("raise", "timeout", "unparseable")


class InjectedFault(RuntimeError):
    """The error a FaultyLM raises (its message says 'injected')."""


class _Engine(DummyEngine):
    def _complete_messages(self, messages):
        from dspy.lm15 import Message, Response, TextPart, Usage

        owner = self.owner
        system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
        user = messages[-1]["content"]
        text = owner.reply_text(system, user)
        return Response(
            id=None,
            model=owner.model,
            message=Message.assistant([TextPart(text)]),
            finish_reason="stop",
            usage=Usage(
                input_tokens=len(user) // 4,
                output_tokens=len(text) // 4,
                total_tokens=(len(user) + len(text)) // 4,
            ),
        )


class HandlerLM(DummyLM):
    """Reply = ``handler(system_prompt, user_message)`` (a dict of output fields, formatted by
    ``adapter``; ChatAdapter by default). ``calls`` counts requests."""

    def __init__(self, handler: Handler, *, adapter: Any = None, model: str = "scripted/handler"):
        super().__init__([], adapter=adapter or dspy.ChatAdapter())
        self.handler = handler
        self.model = model
        self.calls = 0
        self._lock = threading.Lock()
        self._engine_spec = _Engine(self)
        self._async_engine_spec = AsyncDummyEngine(self._engine_spec)

    def reply_text(self, system: str, user: str) -> str:
        with self._lock:
            self.calls += 1
        outputs = self.handler(system, user)
        if isinstance(self.adapter, dspy.JSONAdapter):
            return json.dumps(outputs)
        return self._format_answer_fields(outputs)

    def copy(self, **kwargs):  # one LM object per role: keep the handler and the counters
        return self


class FaultyLM(HandlerLM):
    """A HandlerLM that fails about ``rate`` of its calls, deterministically from ``seed``.

    ``faults`` lists every injected fault as ``(kind, request digest)``."""

    def __init__(
        self,
        handler: Handler,
        *,
        seed: int,
        rate: float = 0.2,
        adapter: Any = None,
        model: str = "scripted/faulty",
    ):
        super().__init__(handler, adapter=adapter, model=model)
        self.seed = seed
        self.rate = rate
        self.faults: list[tuple[str, str]] = []
        self._seen: Counter[str] = Counter()

    def reply_text(self, system: str, user: str) -> str:
        request = hashlib.sha256(f"{system}\x00{user}".encode()).hexdigest()[:16]
        with self._lock:
            attempt = self._seen[request]
            self._seen[request] += 1
        draw = hashlib.sha256(f"{self.seed}:{request}:{attempt}".encode()).digest()
        if int.from_bytes(draw[:4], "big") / 2**32 < self.rate:
            kind = FAULT_KINDS[draw[4] % len(FAULT_KINDS)]
            with self._lock:
                self.faults.append((kind, request))
                self.calls += 1
            if kind == "raise":
                raise InjectedFault(f"injected fault: the LM call failed (request {request})")
            if kind == "timeout":
                raise TimeoutError(f"injected fault: the LM call timed out (request {request})")
            return "Sorry -- injected fault: this is not in the expected output format at all."
        return super().reply_text(system, user)


def digest(text: str) -> int:
    """A stable small integer of ``text`` (replies chosen by content, not by call order)."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)
