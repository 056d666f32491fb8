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
- *fast* decoding (default; ``fast_decoding=False`` is the engine as it was before 2026-12-06):

  - a token is sampled as llama.cpp's own samplers do (``common_sampler``): from the model's
    distribution first, then checked alone against the grammar; only a refused token makes the
    grammar mask the whole vocabulary (llama-cpp-python masks all 151,936 tokens before every
    pick: 17 ms of each 51 ms decode step on 2 cores, measured by cProfile). Greedy decoding picks
    the same token either way;
  - *fieldwise*: an output schema that is a JSON object of required fields is
  written one field at a time. The program feeds the text the schema fixes (``{"answer_option": ``,
  ``, "evidence": ``) as prompt, which llama.cpp evaluates in one batch (~90 tokens/s on 2 cores),
  and samples only each value, under a grammar compiled from that field's schema, up to its
  closing separator (a single decode step costs ~15 tokens/s). The answer is the same JSON object
  with the same keys in the same order; a fifth of a plan's output tokens are keys
  (:func:`field_grammars`);
- sampling is seeded: a request's own ``seed`` wins; otherwise each sampling call (temperature > 0)
  draws the next seed from the engine's generator, so re-sampling with a new ``rollout_id`` really
  gives a new sample while a whole run stays reproducible from its configured seed.

llama-cpp-python is an optional dependency (the ``local`` extra), imported only when a model loads.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import importlib.util
import json
import os
import random
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memsteer_dspy.errors import ConfigError, MissingExtraError
from memsteer_dspy.lm.preflight import ensure_preflight

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
        _install_grammar_first(llama)
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
    return {
        **usage,
        "prompt_tokens_details": {
            **(usage.get("prompt_tokens_details") or {}),
            "cached_tokens": cached,
        },
    }


class _GrammarFirstSampler:
    """A stand-in for llama-cpp-python's sampler chain when a grammar binds the answer (``Llama``
    only ever calls its ``sample``; both chains free themselves): the chain's
    other samplers (``rest``: penalties, then greedy or top-k/top-p/min-p/temperature/dist) pick a
    token from the raw logits; the grammar checks that one token; only when it refuses does the
    grammar mask the whole vocabulary and ``rest`` pick again from what is left. Greedy picks are
    the ones the full chain makes; sampled ones follow llama.cpp's ``common_sampler``."""

    def __init__(self, llama: Any, grammar: Any, rest: Any) -> None:
        from llama_cpp import _internals

        self.llama = llama
        self.rest = rest
        self.grammar = _internals.LlamaSampler()
        self.grammar.add_grammar(llama._model, grammar)

    def sample(self, ctx: Any, idx: int = -1) -> int:
        import llama_cpp
        import numpy as np

        token = self.rest.sample(ctx, idx)  # builds the candidates from the logits, picks, accepts
        one = (llama_cpp.llama_token_data * 1)()
        one[0].id, one[0].logit, one[0].p = token, 0.0, 0.0
        single = llama_cpp.llama_token_data_array(data=one, size=1, selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(self.grammar.sampler, ctypes.byref(single))
        if one[0].logit != float("-inf"):
            self.grammar.accept(token)
            return int(token)
        self.llama.grammar_refusals += 1
        n_vocab = self.llama.n_vocab()
        logits = np.ctypeslib.as_array(
            llama_cpp.llama_get_logits_ith(ctx.ctx, idx), shape=(n_vocab,)
        )
        token_data = np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True)
        data = np.zeros(n_vocab, dtype=token_data)  # llama_token_data's layout
        data["id"] = np.arange(n_vocab, dtype=np.intc)
        data["logit"] = logits
        full = llama_cpp.llama_token_data_array(
            data=data.ctypes.data_as(llama_cpp.llama_token_data_p),
            size=n_vocab,
            selected=-1,
            sorted=False,
        )
        llama_cpp.llama_sampler_apply(self.grammar.sampler, ctypes.byref(full))
        llama_cpp.llama_sampler_apply(self.rest.sampler, ctypes.byref(full))
        token = int(data["id"][full.selected])
        self.grammar.accept(token)
        self.rest.accept(token)
        return token


def _install_grammar_first(llama: Any) -> None:
    """Make ``llama`` build a :class:`_GrammarFirstSampler` for a grammar-bound generation while
    its ``grammar_first`` attribute is true (the engine sets it per call: the instance is shared by
    engines of both decodings)."""
    original = llama._init_sampler

    def init_sampler(**kw: Any) -> Any:
        grammar = kw.get("grammar")
        plain = kw.get("mirostat_mode") or kw.get("logits_processor") is not None
        if grammar is None or plain or not getattr(llama, "grammar_first", False):
            return original(**kw)
        return _GrammarFirstSampler(llama, grammar, original(**{**kw, "grammar": None}))

    llama._init_sampler = init_sampler
    llama.grammar_first = False
    llama.grammar_refusals = 0  # picks the grammar refused, over the instance's life


def _chat_formatter(llama: Any) -> Any:
    """The formatter of the model's own chat template, as ``Llama`` builds it for
    ``create_chat_completion`` (it keeps only the handler), compiled once per instance."""
    formatter = getattr(llama, "memsteer_chat_formatter", None)
    if formatter is None:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        eos, bos = llama.token_eos(), llama.token_bos()
        formatter = llama.memsteer_chat_formatter = Jinja2ChatFormatter(
            template=llama.metadata["tokenizer.chat_template"],
            eos_token=llama._model.token_get_text(eos) if eos != -1 else "",
            bos_token=llama._model.token_get_text(bos) if bos != -1 else "",
            stop_token_ids=[eos],
        )
    return formatter


@dataclass(frozen=True)
class FieldStep:
    """One field of a fieldwise answer: the text fed before its value (``{"name":`` for the first,
    `` "name":`` after a separator) and the GBNF grammar of its value (after an optional space)
    followed by the separator that closes it (``,`` or, for the last field, ``}``)."""

    name: str
    prefix: str
    grammar: str


@functools.lru_cache(maxsize=64)
def _field_grammars(schema_json: str) -> tuple[FieldStep, ...] | None:
    from llama_cpp.llama_grammar import SchemaConverter

    schema = json.loads(schema_json)
    props = schema.get("properties")
    if schema.get("type") != "object" or not isinstance(props, dict) or not props:
        return None
    if set(schema.get("required") or ()) != set(props):
        return None  # optional fields: whether to write one is the model's choice
    defs = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
    steps = []
    names = list(props)
    for i, name in enumerate(names):
        converter = SchemaConverter(
            prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False
        )
        sub = converter.resolve_refs({**props[name], **defs}, "stdin")
        value = converter.visit(sub, "value")
        close = "}" if i == len(names) - 1 else ","
        # the key is fed up to its colon: the space before a value is part of the value's first
        # token as a tokenizer writes JSON (' "', ' ['), and a lone ' ' token fed before it throws
        # a small model off (measured: "What is the capital of France?" -> "On" instead of "Paris")
        converter._add_rule("root", f'" "? {value} {json.dumps(close)}')
        prefix = ("{" if i == 0 else " ") + json.dumps(name) + ":"
        steps.append(FieldStep(name, prefix, converter.format_grammar()))
    return tuple(steps)


def field_grammars(schema: dict[str, Any]) -> tuple[FieldStep, ...] | None:
    """The fieldwise plan of an output schema: one :class:`FieldStep` per property, in order, or
    None when the schema is not a JSON object whose properties are all required (then the whole
    object is decoded under one grammar)."""
    try:
        return _field_grammars(json.dumps(schema, sort_keys=False))
    except (TypeError, ValueError, KeyError, RecursionError):
        return None  # a schema the converter does not take: decode it whole


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
        fast_decoding: sample grammar-first and write a structured answer one field at a time
            (see the module docstring); False masks the whole vocabulary before every pick and
            decodes the whole answer under one grammar.
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
        fast_decoding: bool = True,
    ) -> None:
        self.model_path = Path(model_path)
        self.kv_slot = kv_slot
        self.fast_decoding = bool(fast_decoding)
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
            shared.llama.grammar_first = self.fast_decoding
            steps = self._steps(shared.llama, config.response_format)
            try:
                if steps:
                    body, prompt_evaluated = self._complete_fieldwise(
                        shared.llama, messages, steps, kwargs
                    )
                else:
                    body = shared.llama.create_chat_completion(messages=messages, **kwargs)
                    prompt_evaluated = None
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
        evaluated = timings.prompt_tokens if prompt_evaluated is None else prompt_evaluated
        body["usage"] = _with_cached_tokens(body.get("usage"), evaluated)
        return response_from_openai_chat(body, model=self.label)

    def _steps(self, llama: Any, response_format: dict | None) -> tuple[FieldStep, ...] | None:
        """The fieldwise plan for this request, or None to decode it whole (fast decoding off,
        no schema, a schema that is not an object of required fields, or a chat format other
        than the model's own template, whose prompt only llama-cpp-python's handler writes)."""
        if not self.fast_decoding or not response_format:
            return None
        schema = response_format.get("schema")
        if not isinstance(schema, dict) or llama.chat_format != "chat_template.default":
            return None
        if "tokenizer.chat_template" not in llama.metadata:
            return None
        return field_grammars(schema)

    def _complete_fieldwise(
        self, llama: Any, messages: list[dict[str, str]], steps: tuple[FieldStep, ...], kwargs: dict
    ) -> tuple[dict[str, Any], int]:
        """Write the JSON answer field by field (call under the model lock): feed each field's
        key as prompt, sample its value and closing separator under the field's grammar. Returns
        the chat-completion body (usage as one call's: the prompt, and the whole answer as
        completion) and the prompt tokens evaluated before the first value."""
        import llama_cpp
        from llama_cpp.llama_grammar import LlamaGrammar

        chat = _chat_formatter(llama)(messages=messages)
        prompt = llama.tokenize(
            chat.prompt.encode("utf-8"), add_bos=not chat.added_special, special=True
        )
        if len(prompt) >= llama.n_ctx():  # refused as create_completion refuses it
            raise ValueError(
                f"Requested tokens ({len(prompt)}) exceed context window of {llama.n_ctx()}"
            )
        stop = [
            *(kwargs.get("stop") or ()),
            *([chat.stop] if isinstance(chat.stop, str) else chat.stop or ()),
        ]
        budget = int(kwargs["max_tokens"])
        sampling = {k: kwargs[k] for k in ("temperature", "seed", "top_p", "top_k") if k in kwargs}
        tokens = list(prompt)
        text = ""
        finish = "stop"
        prompt_evaluated = 0  # the perf counters were reset by complete()
        for i, step in enumerate(steps):
            fed = llama.tokenize(step.prefix.encode("utf-8"), add_bos=False, special=False)
            tokens += fed
            text += step.prefix
            # what is left of the answer's budget and of the context (create_completion also
            # cuts max_tokens to the context)
            room = min(budget - (len(tokens) - len(prompt)), llama.n_ctx() - len(tokens))
            if room <= 0:
                finish = "length"
                break
            out = llama.create_completion(
                prompt=tokens,
                max_tokens=room,
                stop=stop,
                grammar=LlamaGrammar.from_string(step.grammar, verbose=False),
                **sampling,
            )
            if i == 0:
                # the prompt's own evaluation (later batches are the fed keys: answer tokens)
                first = llama_cpp.llama_perf_context(llama.ctx)
                prompt_evaluated = max(0, int(first.n_p_eval) - len(fed))
            choice = out["choices"][0]
            value = choice["text"]
            text += value
            # what llama.cpp holds now: the tokens fed, the value and its separator as sampled
            # (the separator was evaluated to sample the grammar's end), so the next field's call
            # evaluates only its key
            tokens = [int(t) for t in llama.input_ids[: llama.n_tokens]]
            if choice.get("finish_reason") == "length" or not value.endswith((",", "}")):
                finish = "length"
                break
        completion = len(tokens) - len(prompt)
        body = {
            "id": f"fieldwise-{time.time_ns()}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.label,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": finish,
                }
            ],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": completion,
                "total_tokens": len(prompt) + completion,
            },
        }
        return body, prompt_evaluated

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
            "fast_decoding": self.fast_decoding,
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
