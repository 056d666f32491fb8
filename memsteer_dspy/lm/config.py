"""Which LM serves each role, from one config: CLI flags > environment > TOML file > default.

MemSteer's LLM roles (planner, question writer, auditor, blind reader, answerer, judge, quality
judge, design proposer) can each run on a different LM. An LM is a string:

- ``local/qwen2.5-coder-1.5b`` — the embedded model (the default for every role), run in-process;
- ``llamacpp/<path/to/model.gguf>`` — any local GGUF file, run in-process by llama.cpp;
- any LiteLLM model string through ``dspy.LM``: ``openai/gpt-4o-mini``, ``deepseek/deepseek-chat``,
  ``ollama_chat/qwen2.5``, or ``openai/<name>`` with ``api_base`` for a vLLM / llama-server.

Resolution, per role, takes the first tier that names an LM (within a tier the role's own entry
beats the one for all roles): CLI (``--lm-<role>``, ``--lm``), environment (``MEMSTEER_LM_<ROLE>``,
``MEMSTEER_LM``), the TOML file (``[lm.roles] <role>``, ``[lm] default``), then the built-in default.
Options (temperature, max_tokens, api_base, n_ctx, ...) come from ``[lm.options."<lm string>"]``
whichever tier chose that LM, and from a role's own table ``[lm.roles.<role>]`` when that entry
chose it. API keys are never part of a config: they are read from the environment by the provider
client (``OPENAI_API_KEY``, ``DEEPSEEK_API_KEY``, ...), and a config file naming one is refused.

Every role gets its own thin ``dspy.LM`` object that books calls and tokens under the role name
(:meth:`LMConfig.usage_by_role`), even when several roles share one model (and, for local models,
one loaded model instance).
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import dspy
from pydantic import BaseModel, ConfigDict, ValidationError

from memsteer_dspy.errors import ConfigError
from memsteer_dspy.lm.endpoint import EndpointIdentity, redact_url
from memsteer_dspy.lm.model_files import EMBEDDED_MODELS, ensure_embedded_model, file_identity
from memsteer_dspy.lm.usage import UsageMeter, _RoleTracker

ROLES: tuple[str, ...] = (
    "planner",
    "question_writer",
    "auditor",
    "blind_reader",
    "answerer",
    "judge",
    "quality_judge",
    "proposer",
)
"""The LLM roles of MemSteer, in pipeline order (supervision construction, evaluation, optimizer)."""

DEFAULT_LM = "local/qwen2.5-coder-1.5b"
ENV_LM = "MEMSTEER_LM"
ENV_CONFIG = "MEMSTEER_CONFIG"
DEFAULT_CONFIG_FILE = "memsteer.toml"

LM_FORMS = """an LM is written as one of:
  local/qwen2.5-coder-1.5b        the embedded model, run in-process (pip install 'memsteer-dspy[local]')
  llamacpp/<path/to/model.gguf>   any local GGUF file, run in-process by llama.cpp
  openai/<model>                  OpenAI (key from OPENAI_API_KEY); with api_base = "http://host:port/v1"
                                  for a vLLM or llama-server endpoint
  <provider>/<model>              any LiteLLM provider, e.g. deepseek/deepseek-chat, anthropic/<model>,
                                  ollama_chat/<model> (keys from the provider's usual env variable)"""

_LOCAL_ONLY = ("n_ctx", "n_threads", "n_batch")
_SECRET_KEYS = re.compile(
    r"^(api[_-]?key|.*_api_key|api[_-]?secret|secret[_-]?key|password)$", re.I
)
_PROVIDER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


def env_var_for(role: str) -> str:
    """The environment variable naming the LM of one role, e.g. ``MEMSTEER_LM_QUESTION_WRITER``."""
    return f"{ENV_LM}_{role.upper()}"


def cli_flag_for(role: str) -> str:
    """The CLI flag naming the LM of one role, e.g. ``--lm-question-writer``."""
    return "--lm-" + role.replace("_", "-")


def _role_name(name: str, *, where: str) -> str:
    role = name.strip().lower().replace("-", "_")
    if role not in ROLES:
        raise ConfigError(f"{where}: unknown role {name!r}; the roles are: {', '.join(ROLES)}")
    return role


class LMSpec(BaseModel):
    """One LM and its options, as a role uses it. Holds no secrets, so it can be written out."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    temperature: float | None = None
    max_tokens: int | None = None
    top_p: float | None = None
    api_base: str | None = None
    timeout: float | None = None
    num_retries: int = 3
    cache: bool = True
    seed: int | None = None
    n_ctx: int | None = None
    n_threads: int | None = None
    n_batch: int | None = None
    structured_output: Literal[
        "auto", "json_schema", "json_object_schema", "json_object", "none"
    ] = "auto"
    """How a server LM is asked for structured output. ``json_schema``: the signature's JSON schema
    as OpenAI's ``response_format: {"type": "json_schema", ...}`` (vLLM, llama-server, Ollama,
    OpenAI); ``json_object_schema``: ``{"type": "json_object", "schema": ...}`` (llama-cpp-python's
    server, llama-server); ``json_object``: any JSON object, no schema; ``none``: no
    ``response_format`` at all (what DSPy does for a model it knows nothing of, e.g. a server
    alias: the output format is only described in the prompt). Either schema form makes the
    server constrain decoding to the schema. ``auto``: for ``openai/<name>`` with ``api_base``,
    ``json_object_schema`` when the server's ``/models`` entry is llama-cpp-python's and
    ``json_schema`` otherwise; for anything else DSPy's own capability lookup."""
    fast_decoding: bool = True
    """In-process LMs: check a sampled token against the output grammar before masking the whole
    vocabulary with it, and write a structured answer one field at a time, feeding the keys its
    schema fixes as prompt (:class:`~memsteer_dspy.lm.local.LlamaCppEngine`). False: the engine
    before 2026-12-06 (the grammar masks every pick; the whole JSON object is decoded key by key).
    Ignored for other LMs. Part of a run's LM identity, so a run folder resumes only under the
    decoding it was made with."""

    @property
    def backend(self) -> Literal["local", "llamacpp", "litellm"]:
        """``local`` (embedded model), ``llamacpp`` (a GGUF file), or ``litellm`` (any other provider)."""
        provider = self.provider
        return provider if provider in ("local", "llamacpp") else "litellm"  # type: ignore[return-value]

    @property
    def in_process(self) -> bool:
        """Decoded by llama.cpp in this process (``local`` or ``llamacpp``): output schemas bound
        lengths by grammar, and the small-LM profiles apply."""
        return self.backend != "litellm"

    @property
    def provider(self) -> str:
        return self.model.split("/", 1)[0]

    @property
    def on_server(self) -> bool:
        """An OpenAI-compatible server of the user's (``openai/<alias>`` with an ``api_base``)."""
        return self.provider == "openai" and self.api_base is not None

    def options(self) -> dict[str, Any]:
        """The options that are set, with credentials removed from ``api_base`` if a URL holds any."""
        out = self.model_dump(exclude_none=True, exclude={"model"})
        defaults = {
            "num_retries": 3,
            "cache": True,
            "structured_output": "auto",
            "fast_decoding": True,
        }
        for key, default in defaults.items():
            if out.get(key) == default:
                out.pop(key)
        if "api_base" in out:
            out["api_base"] = redact_url(out["api_base"])
        return out

    def describe(self) -> dict[str, Any]:
        """The model string and its options, safe to log or write to a provenance file."""
        return {"model": self.model, **self.options()}


def normalize_lm_string(value: str, *, where: str, base_dir: Path | None = None) -> str:
    """Check an LM string's form and return it normalized (``llamacpp/`` paths made absolute).

    Raises :class:`ConfigError` naming ``where`` it came from and listing the accepted forms for a
    string with no provider prefix, an unknown ``local/<name>``, or a ``llamacpp/`` path that is not
    a file.
    """
    if not isinstance(value, str):
        raise ConfigError(
            f"{where}: an LM must be a string, got {type(value).__name__}\n{LM_FORMS}"
        )
    text = value.strip()
    provider, sep, name = text.partition("/")
    if not sep or not provider or not name.strip() or not _PROVIDER.match(provider):
        raise ConfigError(
            f"{where}: {value!r} is not an LM string (it needs a provider prefix, 'provider/model')\n"
            f"{LM_FORMS}"
        )
    if provider == "local":
        if name not in EMBEDDED_MODELS:
            raise ConfigError(
                f"{where}: unknown embedded model {value!r}; the embedded models are: "
                + ", ".join(f"local/{n}" for n in EMBEDDED_MODELS)
                + ". For another model file on disk use llamacpp/<path/to/model.gguf>; models are "
                "never downloaded at run time.\n" + LM_FORMS
            )
        return text
    if provider == "llamacpp":
        path = Path(name).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if not path.is_file():
            raise ConfigError(
                f"{where}: {value!r} names a model file that does not exist ({path.absolute()}); "
                "give the path of a local .gguf file (relative paths in a config file are relative "
                "to that file)\n" + LM_FORMS
            )
        return f"llamacpp/{path.resolve()}"
    return text


def check_provider(spec: LMSpec, *, where: str = "LM") -> None:
    """Refuse a ``provider/model`` string whose provider neither LiteLLM nor DSPy's router knows."""
    if spec.backend != "litellm":
        return
    import litellm  # noqa: F401  (DSPy's dependency; imported only for API models)
    from dspy._vendor.lm15.registry import lookup

    provider = spec.provider
    known = set(getattr(litellm, "provider_list", []) or [])
    if provider in known or lookup(provider) is not None:
        return
    raise ConfigError(f"{where}: unknown LM provider {provider!r} in {spec.model!r}\n{LM_FORMS}")


# --------------------------------------------------------------------------------------------
# The role's LM: a dspy.LM that books its usage under the role
# --------------------------------------------------------------------------------------------


class RoleLM(dspy.LM):
    """A ``dspy.LM`` serving one role: every call's tokens are booked under ``role`` in ``meter``.

    It is an ordinary ``dspy.LM`` (caching, retries, history, callbacks, ``rollout_id`` all as
    usual); copies made with ``lm.copy(...)`` keep booking under the same role.
    """

    def __init__(
        self,
        model: str,
        *,
        role: str = "default",
        meter: UsageMeter | None = None,
        schema_mode: str = "auto",
        endpoint: EndpointIdentity | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        self.role = role
        self.meter = meter if meter is not None else UsageMeter()
        self.schema_mode = schema_mode
        self.endpoint = endpoint

    @property
    def _price_as(self) -> str | None:
        """The model name LiteLLM's price map prices this LM's calls by; None on a user's own
        server, whose alias may happen to be a priced name (``openai/gpt-4o-mini``) yet costs nothing."""
        return None if self.endpoint is not None else self.model

    # DSPy's JSONAdapter sends the signature's JSON schema as response_format only when the LM
    # says it supports one; for ``openai/<alias>`` on a user's server nobody's catalog knows the
    # alias, so DSPy would fall back to bare JSON mode and a small model breaks the JSON. The
    # spec's ``structured_output`` states it instead.
    def structured_mode(self) -> str:
        """``schema_mode`` with ``auto`` resolved for a server by its ``/models`` entry."""
        if self.schema_mode == "auto" and self.endpoint is not None:
            return self.endpoint.schema_dialect()
        return self.schema_mode

    @property
    def supports_response_schema(self) -> bool:
        mode = self.structured_mode()
        if mode != "auto":
            return mode in ("json_schema", "json_object_schema")
        return super().supports_response_schema

    @property
    def supported_params(self) -> set[str]:
        params = set(super().supported_params)
        mode = self.structured_mode()
        if mode == "none":
            params.discard("response_format")
        elif mode != "auto":
            params.add("response_format")
        return params

    def _server_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's kwargs for a server: the schema in the form the server takes, and the
        endpoint's identity in ``metadata``, which DSPy's cache key includes (it leaves
        ``api_base`` out) and servers ignore."""
        fmt = kwargs.get("response_format")
        if (
            isinstance(fmt, type)
            and issubclass(fmt, BaseModel)
            and self.structured_mode() == "json_object_schema"
        ):
            kwargs = {
                **kwargs,
                "response_format": {"type": "json_object", "schema": fmt.model_json_schema()},
            }
        if self.endpoint is None:
            return kwargs
        metadata = {**self.endpoint.tag(), **(kwargs.get("metadata") or {})}
        return {**kwargs, "metadata": metadata}

    def __call__(self, prompt: Any = None, *, messages: Any = None, **kwargs: Any) -> Any:
        tracker = _RoleTracker(self.meter, self.role, dspy.settings.usage_tracker, self._price_as)
        start = time.perf_counter()
        failed = True
        kwargs = self._server_kwargs(kwargs)
        try:
            with dspy.context(usage_tracker=tracker):
                result = super().__call__(prompt, messages=messages, **kwargs)
            failed = False
            return result
        finally:
            self.meter.record_call(
                self.role,
                seconds=time.perf_counter() - start,
                reached_backend=tracker.reached_backend,
                failed=failed,
            )

    async def acall(self, prompt: Any = None, *, messages: Any = None, **kwargs: Any) -> Any:
        tracker = _RoleTracker(self.meter, self.role, dspy.settings.usage_tracker, self._price_as)
        start = time.perf_counter()
        failed = True
        kwargs = await asyncio.to_thread(self._server_kwargs, kwargs)
        try:
            with dspy.context(usage_tracker=tracker):
                result = await super().acall(prompt, messages=messages, **kwargs)
            failed = False
            return result
        finally:
            self.meter.record_call(
                self.role,
                seconds=time.perf_counter() - start,
                reached_backend=tracker.reached_backend,
                failed=failed,
            )

    def dump_state(self) -> dict[str, Any]:
        state = super().dump_state()
        state["role"] = self.role
        state.pop("endpoint", None)
        state.pop("meter", None)
        return state


def build_lm(
    spec: LMSpec,
    *,
    role: str = "default",
    meter: UsageMeter | None = None,
    kv_slot: str | None = None,
) -> RoleLM:
    """A ``dspy.LM`` for ``spec`` that books its usage under ``role``.

    An in-process model keeps one KV cache per ``kv_slot`` (default: the role), so a role's next
    prompt reuses its previous one's prefix; two programs that run by turns on one model (the cost
    benchmark's configurations) give their roles slots of their own.

    ``local/<name>`` assembles/verifies the embedded model from its chunk packages (once) and runs it
    through :class:`~memsteer_dspy.lm.local.LlamaCppEngine`; ``llamacpp/<path>`` does the same for
    any GGUF file; anything else goes to ``dspy.LM`` (LiteLLM / DSPy's native clients). The model file
    itself loads on the first call. DSPy's cache key carries the model string and, for in-process
    models, the file's sha256, so two different local models never share cached answers; for a
    server (``openai/<alias>`` + ``api_base``) it carries the endpoint and the hash of the server's
    ``/models`` entry for the alias (:class:`~memsteer_dspy.lm.endpoint.EndpointIdentity`), so two
    servers never share them either, and the signature's JSON schema is sent as ``response_format``
    (``structured_output``).
    """
    common: dict[str, Any] = {
        "temperature": spec.temperature,
        "max_tokens": spec.max_tokens,
        "cache": spec.cache,
        "num_retries": spec.num_retries,
    }
    if spec.top_p is not None:
        common["top_p"] = spec.top_p
    if spec.backend == "litellm":
        check_provider(spec, where=f"role {role}")
        extra: dict[str, Any] = {}
        if spec.api_base is not None:
            extra["api_base"] = spec.api_base
        if spec.timeout is not None:
            extra["timeout"] = spec.timeout
        if spec.seed is not None:
            extra["seed"] = spec.seed
        endpoint = None
        if spec.on_server:
            endpoint = EndpointIdentity(spec.api_base, spec.model.split("/", 1)[1])
        return RoleLM(
            spec.model,
            role=role,
            meter=meter,
            schema_mode=spec.structured_output,
            endpoint=endpoint,
            **common,
            **extra,
        )

    from memsteer_dspy.lm.local import (
        DEFAULT_N_BATCH,
        DEFAULT_N_CTX,
        AsyncLlamaCppEngine,
        LlamaCppEngine,
        require_llama_cpp,
    )

    require_llama_cpp(f"the LM {spec.model!r} (role {role})")
    name = spec.model.split("/", 1)[1]
    if spec.backend == "local":
        path = ensure_embedded_model(name)
        sha = EMBEDDED_MODELS[name].sha256
    else:
        path = Path(name)
        if not path.is_file():
            raise ConfigError(f"role {role}: the model file of {spec.model!r} does not exist")
        sha = file_identity(path)
    engine = LlamaCppEngine(
        path,
        n_ctx=spec.n_ctx or DEFAULT_N_CTX,
        n_threads=spec.n_threads,
        n_batch=spec.n_batch or DEFAULT_N_BATCH,
        seed=spec.seed or 0,
        label=spec.model,
        kv_slot=kv_slot or role,
        fast_decoding=spec.fast_decoding,
    )
    return RoleLM(
        spec.model,
        role=role,
        meter=meter,
        engine=engine,
        async_engine=AsyncLlamaCppEngine(engine),
        # in DSPy's cache key and the run key (runfolder.lm_identity): the decoding changes answers
        metadata={"model_sha256": sha, "decoding": "fast" if spec.fast_decoding else "whole"},
        **common,
    )


# --------------------------------------------------------------------------------------------
# The config: one LMSpec per role, resolved from the tiers
# --------------------------------------------------------------------------------------------


class LMConfig:
    """The LM of every role, with where each came from, and the per-role usage meter.

    ``lm(role)`` builds the role's LM on first use (thread-safe) and keeps it; ``describe()`` and
    ``provenance()`` are safe to write out (no keys).
    """

    def __init__(
        self,
        specs: Mapping[str, LMSpec],
        sources: Mapping[str, str] | None = None,
        *,
        meter: UsageMeter | None = None,
    ) -> None:
        missing = [r for r in ROLES if r not in specs]
        if missing:
            raise ConfigError(f"LM config has no LM for role(s): {', '.join(missing)}")
        self._specs = {r: specs[r] for r in ROLES}
        self._sources = {r: (sources or {}).get(r, "given") for r in ROLES}
        self.meter = meter if meter is not None else UsageMeter()
        self._lms: dict[str, RoleLM] = {}
        self._lock = threading.Lock()

    @classmethod
    def uniform(cls, lm: str | LMSpec = DEFAULT_LM) -> LMConfig:
        """Every role on one LM."""
        spec = lm if isinstance(lm, LMSpec) else LMSpec(model=normalize_lm_string(lm, where="LM"))
        return cls(dict.fromkeys(ROLES, spec), dict.fromkeys(ROLES, "given"))

    @property
    def roles(self) -> tuple[str, ...]:
        return ROLES

    def _check_role(self, role: str) -> str:
        return _role_name(role, where="LM config")

    def spec(self, role: str) -> LMSpec:
        return self._specs[self._check_role(role)]

    def in_process(self, *roles: str) -> bool:
        """Whether every one of ``roles`` runs on an in-process llama.cpp LM (:attr:`LMSpec.in_process`)."""
        return all(self.spec(r).in_process for r in roles)

    def source(self, role: str) -> str:
        """Where the role's LM was named: ``cli --lm-judge``, ``env MEMSTEER_LM``, ``file ...``."""
        return self._sources[self._check_role(role)]

    def lm(self, role: str) -> RoleLM:
        """The role's ``dspy.LM`` (built on first use, then shared by every caller of this role)."""
        role = self._check_role(role)
        with self._lock:
            lm = self._lms.get(role)
            if lm is None:
                lm = self._lms[role] = build_lm(self._specs[role], role=role, meter=self.meter)
            return lm

    def set_lm(self, role: str, lm: RoleLM) -> None:
        """Use an already-built LM for ``role`` (tests, or a caller that built its own)."""
        role = self._check_role(role)
        with self._lock:
            self._lms[role] = lm

    def describe(self) -> dict[str, str]:
        """role -> model string."""
        return {r: s.model for r, s in self._specs.items()}

    def provenance(self) -> dict[str, dict[str, Any]]:
        """role -> {model, options..., source}: what a run records about its LMs (no secrets)."""
        return {r: {**s.describe(), "source": self._sources[r]} for r, s in self._specs.items()}

    def distinct(self) -> list[tuple[LMSpec, list[str]]]:
        """Each distinct LM spec and the roles it serves, in role order."""
        groups: dict[LMSpec, list[str]] = {}
        for role, spec in self._specs.items():
            groups.setdefault(spec, []).append(role)
        return list(groups.items())

    def usage_by_role(self) -> dict[str, dict[str, Any]]:
        """role -> {calls, cache_hits, errors, prompt_tokens, completion_tokens, total_tokens, seconds}."""
        return self.meter.by_role()

    def usage_total(self) -> dict[str, Any]:
        return self.meter.total()

    def reset_usage(self) -> None:
        self.meter.reset()


# --------------------------------------------------------------------------------------------
# Loading: TOML file, environment, CLI flags
# --------------------------------------------------------------------------------------------


def _line_of(text: str, key: str) -> int | None:
    pattern = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*=", re.M)
    match = pattern.search(text)
    return text.count("\n", 0, match.start()) + 1 if match else None


def _find_secrets(node: Any, path: str = "") -> list[str]:
    found = []
    if isinstance(node, Mapping):
        for key, value in node.items():
            here = f"{path}.{key}" if path else str(key)
            if _SECRET_KEYS.match(str(key)):
                found.append(here)
            found.extend(_find_secrets(value, here))
    elif isinstance(node, list):
        for i, item in enumerate(node):
            found.extend(_find_secrets(item, f"{path}[{i}]"))
    return found


def _spec(
    model: str, options: Mapping[str, Any], *, where: str, file: Path | None, text: str
) -> LMSpec:
    try:
        spec = LMSpec(model=model, **options)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"])
            line = _line_of(text, str(err["loc"][0])) if file and err["loc"] else None
            at = f"{file}:{line}" if line else where
            problems.append(f"{at}: option {key!r}: {err['msg']}")
        raise ConfigError(
            "invalid LM options:\n  "
            + "\n  ".join(problems)
            + "\n  known options: "
            + ", ".join(k for k in LMSpec.model_fields if k != "model")
        ) from None
    if spec.api_base is not None and redact_url(spec.api_base) != spec.api_base:
        line = _line_of(text, "api_base") if file else None
        raise ConfigError(
            f"{f'{file}:{line}' if line else where}: the api_base of {model!r} "
            f"({redact_url(spec.api_base)}) holds credentials (user:password@); credentials are "
            "never read from a config or a flag, DSPy's client does not send them from a URL, and "
            "they would show in its error messages. Remove them and put the server's token in the "
            "provider's key variable (OPENAI_API_KEY for openai/..., sent as a Bearer token)"
        )
    if spec.backend == "litellm":
        local_only = [k for k in _LOCAL_ONLY if getattr(spec, k) is not None]
        if local_only:
            raise ConfigError(
                f"{where}: option(s) {', '.join(local_only)} apply only to in-process models "
                f"(local/..., llamacpp/...), not to {model!r}; remove them"
            )
    elif spec.api_base is not None:
        raise ConfigError(
            f"{where}: api_base does not apply to the in-process model {model!r}; to use a server, "
            "write openai/<name> with api_base instead"
        )
    return spec


class _FileConfig:
    """The ``[lm]`` table of a TOML config, checked."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.text = ""
        self.default: str | None = None
        self.roles: dict[str, str] = {}
        self.role_options: dict[str, dict[str, Any]] = {}
        self.options: dict[str, dict[str, Any]] = {}
        if path is None:
            return
        try:
            self.text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read the config file: {exc}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason}); a config "
                "file is UTF-8 TOML"
            ) from None
        try:
            data = tomllib.loads(self.text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
        secrets = _find_secrets(data)
        if secrets:
            key = secrets[0].rsplit(".", 1)[-1]
            line = _line_of(self.text, key)
            raise ConfigError(
                f"{path}{f':{line}' if line else ''}: the config holds a secret ({', '.join(secrets)}); "
                "API keys are never read from config files. Remove it and set the provider's "
                "environment variable instead (e.g. OPENAI_API_KEY, DEEPSEEK_API_KEY), which "
                "LiteLLM / DSPy read at call time"
            )
        lm = data.get("lm", {})
        if not isinstance(lm, Mapping):
            raise ConfigError(f"{path}: [lm] must be a table")
        unknown = set(lm) - {"default", "roles", "options"}
        if unknown:
            key = sorted(unknown)[0]
            raise ConfigError(
                f"{self.at(key)}: unknown key(s) in [lm]: {', '.join(sorted(unknown))}; "
                '[lm] takes default = "<lm>", a [lm.roles] table and [lm.options."<lm>"] tables'
            )
        if "default" in lm:
            self.default = normalize_lm_string(
                lm["default"], where=f"{self.at('default')} [lm] default", base_dir=path.parent
            )
        roles = lm.get("roles", {})
        if not isinstance(roles, Mapping):
            raise ConfigError(f'{self.at("roles")}: [lm.roles] must be a table of role = "<lm>"')
        for name, value in roles.items():
            role = _role_name(name, where=f"{self.at(name)} [lm.roles]")
            where = f"{self.at(name)} [lm.roles] {name}"
            if isinstance(value, Mapping):
                options = dict(value)
                if "model" not in options:
                    raise ConfigError(f'{where}: a role table needs model = "<lm>"\n{LM_FORMS}')
                model = options.pop("model")
                self.role_options[role] = options
            else:
                model = value
            self.roles[role] = normalize_lm_string(model, where=where, base_dir=path.parent)
        options = lm.get("options", {})
        if not isinstance(options, Mapping):
            raise ConfigError(
                f"{self.at('options')}: [lm.options] must hold one table per LM string"
            )
        for name, table in options.items():
            if not isinstance(table, Mapping):
                raise ConfigError(
                    f'{self.at(name)}: [lm.options."{name}"] must be a table of options'
                )
            key = normalize_lm_string(
                name, where=f"{self.at(name)} [lm.options]", base_dir=path.parent
            )
            self.options[key] = dict(table)

    def at(self, key: str) -> str:
        line = _line_of(self.text, key) if self.path else None
        return f"{self.path}:{line}" if line else str(self.path)


def _env_lms(env: Mapping[str, str]) -> tuple[str | None, dict[str, str]]:
    general = env.get(ENV_LM) or None
    per_role: dict[str, str] = {}
    prefix = ENV_LM + "_"
    for name, value in env.items():
        if not name.startswith(prefix) or not value:
            continue
        suffix = name[len(prefix) :]
        role = suffix.lower()
        if role not in ROLES:
            raise ConfigError(
                f"environment variable {name}: unknown role {suffix.lower()!r}; set one of "
                + ", ".join(env_var_for(r) for r in ROLES)
            )
        per_role[role] = value
    return general, per_role


def default_config_path(env: Mapping[str, str] | None = None) -> Path | None:
    """``$MEMSTEER_CONFIG`` if set, else ``./memsteer.toml`` if it exists, else None."""
    env = os.environ if env is None else env
    if env.get(ENV_CONFIG):
        return Path(env[ENV_CONFIG]).expanduser()
    here = Path(DEFAULT_CONFIG_FILE)
    return here if here.is_file() else None


def load_lm_config(
    config_path: str | Path | None = None,
    *,
    lm: str | None = None,
    role_lms: Mapping[str, str | None] | None = None,
    env: Mapping[str, str] | None = None,
    meter: UsageMeter | None = None,
    api_base: str | None = None,
) -> LMConfig:
    """Resolve every role's LM: CLI flags > environment > TOML file > built-in default.

    Args:
        config_path: a TOML file with an ``[lm]`` table; None looks for ``$MEMSTEER_CONFIG``, then
            ``./memsteer.toml``.
        lm: the ``--lm`` flag (all roles).
        role_lms: the ``--lm-<role>`` flags, role -> LM string (None values are ignored; role
            names may use ``-`` or ``_``).
        env: the environment to read (default ``os.environ``): ``MEMSTEER_LM``,
            ``MEMSTEER_LM_<ROLE>``.
        meter: the usage meter to book into (a new one by default).
        api_base: the ``--api-base`` flag: the endpoint of every ``openai/<name>`` LM that a CLI
            flag (``--lm``, ``--lm-<role>``) chose, over any ``api_base`` the file gives it.

    Raises:
        ConfigError: an unknown role, a malformed/unknown LM string, an unknown option, or a config
            file holding an API key; the message names where it came from and what to write instead.
    """
    env = os.environ if env is None else env
    path = Path(config_path).expanduser() if config_path is not None else default_config_path(env)
    if path is not None and not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    file = _FileConfig(path)
    env_general, env_roles = _env_lms(env)
    cli_roles: dict[str, str] = {}
    for name, value in (role_lms or {}).items():
        if value:
            role = _role_name(name, where=f"CLI flag {cli_flag_for(name.replace('-', '_'))}")
            cli_roles[role] = value

    specs: dict[str, LMSpec] = {}
    sources: dict[str, str] = {}
    built: dict[tuple[str, str], str] = {}  # (raw string, where) -> normalized, to check once

    def norm(value: str, where: str, base_dir: Path | None = None) -> str:
        key = (value, where)
        if key not in built:
            built[key] = normalize_lm_string(value, where=where, base_dir=base_dir)
        return built[key]

    for role in ROLES:
        role_options: dict[str, Any] = {}
        if role in cli_roles:
            source = f"cli {cli_flag_for(role)}"
            model = norm(cli_roles[role], source)
        elif lm:
            source = "cli --lm"
            model = norm(lm, source)
        elif role in env_roles:
            source = f"env {env_var_for(role)}"
            model = norm(env_roles[role], source)
        elif env_general:
            source = f"env {ENV_LM}"
            model = norm(env_general, source)
        elif role in file.roles:
            source = f"file {path} [lm.roles] {role}"
            model = file.roles[role]
            role_options = file.role_options.get(role, {})
        elif file.default:
            source = f"file {path} [lm] default"
            model = file.default
        else:
            source = "default"
            model = DEFAULT_LM
        options = {**file.options.get(model, {}), **role_options}
        if api_base and source.startswith("cli") and model.startswith("openai/"):
            options["api_base"] = api_base
        specs[role] = _spec(model, options, where=source, file=path, text=file.text)
        sources[role] = source
    for spec in {s for s in specs.values() if s.backend == "litellm"}:
        check_provider(spec, where=next(sources[r] for r in ROLES if specs[r] == spec))
    return LMConfig(specs, sources, meter=meter)
