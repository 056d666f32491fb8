"""The embedded LM: a GGUF model run in-process by llama.cpp, as a DSPy engine.

DSPy 3.4 runs custom backends as *engines* (``complete(Request) -> Response``) under ``dspy.LM``,
which then owns caching, retries, history, callbacks and usage reporting. :class:`LlamaCppEngine`
is that engine for llama-cpp-python:

- structured outputs are grammar-constrained: when DSPy's ``JSONAdapter`` asks for the JSON schema
  of a signature's output fields (the engine declares ``supports_response_schema``), the schema is
  compiled to a llama.cpp grammar, so even a 1.5B model always returns parseable output;
- one ``Llama`` instance per (model file, load options) is shared process-wide and guarded by a lock,
  since a llama.cpp context is not thread-safe;
- each engine may name a KV *slot* (``build_lm`` gives every role its own): when a call comes from
  another slot than the last one, the KV cache of the last slot's prompt is set aside and this
  slot's own is put back, so a role's next prompt reuses the prefix (instructions, demonstrations)
  of its previous one even when other roles ran in between. llama.cpp itself reuses only the
  prefix shared with the previous call on the instance; a saved sequence costs ~28 KB per token
  (Qwen2.5-1.5B) and one is kept per slot;
- sampling is seeded: a request's own ``seed`` wins; otherwise each sampling call (temperature > 0)
  draws the next seed from the engine's generator, so re-sampling with a new ``rollout_id`` really
  gives a new sample while a whole run stays reproducible from its configured seed.

llama-cpp-python is an optional dependency (the ``local`` extra), imported only when a model loads.
"""

from __future__ import annotations

import asyncio
import ctypes
import importlib.util
import os
import random
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memsteer_dspy.errors import ConfigError, MissingExtraError

DEFAULT_N_CTX = 8192
DEFAULT_MAX_TOKENS = 2048
DEFAULT_N_BATCH = 512


def require_llama_cpp(purpose: str = "the embedded local LM") -> None:
    """Raise :class:`MissingExtraError` (extra ``local``) when llama-cpp-python is not installed."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise MissingExtraError("llama-cpp-python", "local", purpose)


@dataclass
class Timings:
    """llama.cpp's own timing of the last call: prompt evaluation and generation."""

    prompt_tokens: int = 0
    prompt_ms: float = 0.0
    generated_tokens: int = 0
    generation_ms: float = 0.0

    @property
    def prompt_tokens_per_s(self) -> float:
        return self.prompt_tokens / (self.prompt_ms / 1000) if self.prompt_ms > 0 else 0.0

    @property
    def generation_tokens_per_s(self) -> float:
        return (
            self.generated_tokens / (self.generation_ms / 1000) if self.generation_ms > 0 else 0.0
        )


@dataclass
class _KVSnapshot:
    """One slot's KV cache, set aside: the prompt tokens it holds and llama.cpp's copy of them."""

    tokens: list[int]
    data: Any  # a ctypes byte array from llama_state_seq_get_data
    size: int


@dataclass
class _SharedModel:
    llama: Any
    lock: threading.Lock = field(default_factory=threading.Lock)
    load_seconds: float = 0.0
    last_timings: Timings = field(default_factory=Timings)
    slot: str | None = None  # whose prompt the live KV cache holds (None: nobody's in particular)
    snapshots: dict[str, _KVSnapshot] = field(default_factory=dict)
    slot_switches: int = 0
    slot_restores: int = 0

    def use_slot(self, slot: str | None) -> None:
        """Make the live KV cache ``slot``'s (call under :attr:`lock`): set the current slot's
        cache aside and put ``slot``'s back. ``None`` keeps whatever the cache holds."""
        if slot is None or slot == self.slot:
            return
        import llama_cpp

        llama, ctx = self.llama, self.llama.ctx
        self.slot_switches += 1
        if self.slot is not None and llama.n_tokens > 0:
            size = llama_cpp.llama_state_seq_get_size(ctx, 0)
            data = (ctypes.c_uint8 * size)()
            written = llama_cpp.llama_state_seq_get_data(ctx, data, size, 0)
            if written > 0:
                tokens = [int(t) for t in llama.input_ids[: llama.n_tokens]]
                self.snapshots[self.slot] = _KVSnapshot(tokens, data, int(written))
        self.slot = slot
        snap = self.snapshots.get(slot)
        if snap is None:
            return  # nothing of this slot yet: llama.cpp reuses whatever prefix the cache shares
        llama._ctx.kv_cache_seq_rm(-1, 0, -1)
        llama.n_tokens = 0
        if llama_cpp.llama_state_seq_set_data(ctx, snap.data, snap.size, 0) == 0:
            llama._ctx.kv_cache_seq_rm(-1, 0, -1)  # refused: start this slot afresh
            del self.snapshots[slot]
            return
        llama.input_ids[: len(snap.tokens)] = snap.tokens
        llama.n_tokens = len(snap.tokens)
        if hasattr(llama, "_requires_eval"):  # the logits are not the restored prompt's: decode
            llama._requires_eval = True  # at least its last token again before sampling
        self.slot_restores += 1


_MODELS: dict[tuple, _SharedModel] = {}
_MODELS_LOCK = threading.Lock()


def _load(path: Path, n_ctx: int, n_threads: int | None, n_batch: int) -> _SharedModel:
    """The process-wide instance for this file and these load options, loading it on first use."""
    key = (str(path), n_ctx, n_threads, n_batch)
    with _MODELS_LOCK:
        shared = _MODELS.get(key)
        if shared is not None:
            return shared
        require_llama_cpp()
        import llama_cpp

        from memsteer_dspy.lm.preflight import ensure_preflight

        # A build whose CPU kernels do not fit this CPU kills the process in its first multi-token
        # decode (SIGSEGV with AMX, SIGILL without AVX-512): try it in a child process first.
        ensure_preflight(path)
        start = time.perf_counter()
        try:
            llama = llama_cpp.Llama(
                model_path=str(path),
                n_ctx=n_ctx,
                # llama-cpp-python defaults to half the cores; on a small CPU all of them generate
                # ~40% faster (measured 21 -> 30 tok/s on 2 cores), so use them unless told.
                n_threads=n_threads or os.cpu_count(),
                n_batch=n_batch,
                n_gpu_layers=0,
                verbose=False,
            )
        except (ValueError, RuntimeError) as exc:
            raise ConfigError(
                f"llama.cpp could not load the model file {path}: {exc}\n"
                "  check that it is a GGUF file this llama-cpp-python version supports"
            ) from exc
        shared = _MODELS[key] = _SharedModel(llama, load_seconds=time.perf_counter() - start)
        return shared


def loaded_models() -> dict[str, float]:
    """Model files loaded in this process and their load time in seconds."""
    with _MODELS_LOCK:
        return {key[0]: shared.load_seconds for key, shared in _MODELS.items()}


_OVERFLOW = re.compile(r"Requested tokens \((\d+)\) exceed context window of (\d+)")


def _system_text(system: Any) -> str | None:
    if system is None:
        return None
    if isinstance(system, str):
        return system
    return "".join(getattr(p, "text", "") or "" for p in system)


def _llama_response_format(response_format: dict | None) -> dict | None:
    """The canonical response_format as llama-cpp-python takes it (a JSON object, grammar-bound)."""
    if not response_format:
        return None
    kind = response_format.get("type")
    if kind == "json_schema" and isinstance(response_format.get("schema"), dict):
        return {"type": "json_object", "schema": response_format["schema"]}
    if kind in ("json_object", "json_schema"):
        return {"type": "json_object"}
    return None


def _with_cached_tokens(usage: Any, evaluated: int) -> Any:
    """``usage`` with ``prompt_tokens_details.cached_tokens``: the prompt tokens llama.cpp did not
    evaluate because they were the longest common prefix with the previous call on this instance
    (its KV cache), as OpenAI-compatible servers report prompt caching. DSPy passes it on in every
    call's usage, so a cost report can show the prompt tokens actually evaluated."""
    if not isinstance(usage, dict) or not isinstance(usage.get("prompt_tokens"), int):
        return usage
    cached = max(0, usage["prompt_tokens"] - int(evaluated))
    return {**usage, "prompt_tokens_details": {**(usage.get("prompt_tokens_details") or {}), "cached_tokens": cached}}


class LlamaCppEngine:
    """A DSPy engine that answers requests with a GGUF model run in-process by llama.cpp.

    Args:
        model_path: the GGUF file.
        n_ctx: context size in tokens (prompt + answer); 8192 fits a ~6k-token prompt.
        n_threads: CPU threads for llama.cpp (None: every core).
        n_batch: prompt-evaluation batch size.
        seed: seeds the generator that gives each sampling call its own seed.
        default_max_tokens: answer length cap when a request names none.
        label: the LM string this engine serves, used in errors and responses.
        kv_slot: whose KV cache this engine's calls reuse (``build_lm`` passes the role); None
            reuses whatever prefix the shared instance's last call left.
    """

    supports_response_schema = True
    supports_function_calling = False
    supports_reasoning = False
    supported_params = frozenset(
        {"temperature", "max_tokens", "top_p", "top_k", "stop", "seed", "response_format"}
    )

    def __init__(
        self,
        model_path: str | Path,
        *,
        n_ctx: int = DEFAULT_N_CTX,
        n_threads: int | None = None,
        n_batch: int = DEFAULT_N_BATCH,
        seed: int = 0,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        label: str | None = None,
        kv_slot: str | None = None,
    ) -> None:
        self.model_path = Path(model_path)
        self.kv_slot = kv_slot
        self.n_ctx = int(n_ctx)
        self.n_threads = n_threads
        self.n_batch = int(n_batch)
        self.seed = int(seed)
        self.default_max_tokens = int(default_max_tokens)
        self.label = label or f"llamacpp/{self.model_path}"
        self._rng = random.Random(self.seed)
        self._rng_lock = threading.Lock()

    # -- the engine contract ------------------------------------------------------------------

    def model(self) -> _SharedModel:
        """The shared llama.cpp instance (loaded on first call)."""
        return _load(self.model_path, self.n_ctx, self.n_threads, self.n_batch)

    def _messages(self, request: Any) -> list[dict[str, str]]:
        from dspy.lm15 import UnsupportedFeatureError

        if request.tools:
            raise UnsupportedFeatureError(
                f"{self.label}: tool calling is not supported by the embedded llama.cpp backend",
                provider="llamacpp",
            )
        messages = []
        system = _system_text(request.system)
        if system:
            messages.append({"role": "system", "content": system})
        for m in request.messages:
            text = m.text
            if text is None:
                raise UnsupportedFeatureError(
                    f"{self.label}: only text messages are supported (got a non-text part)",
                    provider="llamacpp",
                )
            role = "system" if m.role == "developer" else m.role
            messages.append({"role": role, "content": text})
        return messages

    def _seed_for(self, config: Any, temperature: float) -> int:
        if config.seed is not None:
            return int(config.seed)
        if temperature <= 0:
            return self.seed  # greedy decoding ignores it
        with self._rng_lock:
            return self._rng.randrange(2**31)

    def complete(self, request: Any) -> Any:
        """Answer one canonical request with one response (OpenAI-shaped usage included)."""
        import llama_cpp
        from dspy.clients.engines.base import validate_request
        from dspy.lm15 import ContextLengthError, response_from_openai_chat

        validate_request(request)
        config = request.config
        messages = self._messages(request)
        temperature = float(config.temperature) if config.temperature is not None else 0.0
        kwargs: dict[str, Any] = {
            "temperature": temperature,
            "max_tokens": config.max_tokens or self.default_max_tokens,
            "seed": self._seed_for(config, temperature),
            "stop": list(config.stop) or None,
            "response_format": _llama_response_format(config.response_format),
        }
        if config.top_p is not None:
            kwargs["top_p"] = config.top_p
        if config.top_k is not None:
            kwargs["top_k"] = config.top_k
        shared = self.model()
        with shared.lock:
            shared.use_slot(self.kv_slot)
            ctx = shared.llama.ctx
            llama_cpp.llama_perf_context_reset(ctx)
            try:
                body = shared.llama.create_chat_completion(messages=messages, **kwargs)
            except ValueError as exc:
                match = _OVERFLOW.search(str(exc))
                if match is None:
                    raise
                raise ContextLengthError(
                    f"{self.label}: the prompt needs {match.group(1)} tokens but the context holds "
                    f'{match.group(2)}; raise n_ctx for this LM (e.g. [lm.options."{self.label}"] '
                    "n_ctx = 16384) or give the role less text",
                    provider="llamacpp",
                ) from exc
            perf = llama_cpp.llama_perf_context(ctx)
            timings = shared.last_timings = Timings(
                prompt_tokens=int(perf.n_p_eval),
                prompt_ms=float(perf.t_p_eval_ms),
                generated_tokens=int(perf.n_eval),
                generation_ms=float(perf.t_eval_ms),
            )
        body = dict(body)
        body["model"] = self.label
        body["usage"] = _with_cached_tokens(body.get("usage"), timings.prompt_tokens)
        return response_from_openai_chat(body, model=self.label)

    def stream(self, request: Any) -> Any:
        """The whole answer as stream events (llama.cpp output is not streamed token by token here)."""
        from dspy.lm15 import response_to_events

        return response_to_events(self.complete(request))

    def close(self) -> None:
        """Nothing to close: the model instance is shared process-wide and lives with it."""

    @property
    def last_timings(self) -> Timings:
        return self.model().last_timings

    # -- saving a program that carries this LM ------------------------------------------------

    def dump_state(self) -> dict[str, Any]:
        return {
            "model_path": str(self.model_path),
            "n_ctx": self.n_ctx,
            "n_threads": self.n_threads,
            "n_batch": self.n_batch,
            "seed": self.seed,
            "default_max_tokens": self.default_max_tokens,
            "label": self.label,
            "kv_slot": self.kv_slot,
        }

    @classmethod
    def load_state(cls, state: dict[str, Any]) -> LlamaCppEngine:
        return cls(**state)


class AsyncLlamaCppEngine:
    """The async face of a :class:`LlamaCppEngine`: the same model, called from a worker thread."""

    supports_response_schema = True
    supports_function_calling = False
    supports_reasoning = False
    supported_params = LlamaCppEngine.supported_params

    def __init__(self, sync: LlamaCppEngine) -> None:
        self.sync = sync

    async def complete(self, request: Any) -> Any:
        return await asyncio.to_thread(self.sync.complete, request)

    async def stream(self, request: Any) -> Any:
        from dspy.lm15 import response_to_events

        response = await self.complete(request)
        for event in response_to_events(response):
            yield event

    async def aclose(self) -> None:
        """Nothing to close (see :meth:`LlamaCppEngine.close`)."""

    def dump_state(self) -> dict[str, Any]:
        return self.sync.dump_state()

    @classmethod
    def load_state(cls, state: dict[str, Any]) -> AsyncLlamaCppEngine:
        return cls(LlamaCppEngine.load_state(state))
