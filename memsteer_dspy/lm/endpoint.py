"""OpenAI-compatible endpoints (vLLM, llama-server, llama-cpp-python's server, Ollama): what they serve.

A role LM written ``openai/<name>`` with ``api_base`` talks to a server chosen by its address, and
the name after ``openai/`` is only the alias that server gives its model. Two things follow:

- the identity of a cached answer is the endpoint *and* the model behind the alias, not the alias
  (DSPy's cache key leaves ``api_base`` out): :func:`model_identity` reads the server's
  ``GET {api_base}/models`` entry for the alias and hashes what it says about the model (vLLM's
  ``root`` and ``max_model_len``, llama-server's ``meta``, ...; volatile fields such as ``created``
  are left out), so a restarted server that serves another model under the same alias at the same
  address gets new cache entries wherever the server says what it serves;
- ``memsteer lm check`` can say *which* part is wrong: the address does not answer
  (:class:`EndpointError` naming the URL), or it answers but does not serve that alias (naming the
  aliases it does serve).

API keys are read from the environment (``OPENAI_API_KEY``) only to send them; they are never part
of a message, an identity or a log line.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from memsteer_dspy.errors import ConfigError

_VOLATILE = {"created", "permissions", "object"}
"""Fields of a /models entry that change per request or say nothing about the model."""


class EndpointError(ConfigError):
    """An OpenAI-compatible endpoint that does not answer, or does not serve the model asked for.

    ``answered`` says whether the server answered at all (an HTTP error or an unexpected body)."""

    def __init__(self, message: str, *, answered: bool = True) -> None:
        super().__init__(message)
        self.answered = answered


def redact_url(url: str) -> str:
    """``url`` without a ``user:password@`` part, so it can be written out."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def _redact(url: str) -> str:
    return redact_url(url)


def models_url(api_base: str) -> str:
    return api_base.rstrip("/") + "/models"


def list_models(
    api_base: str, *, timeout: float = 10.0, api_key_env: str = "OPENAI_API_KEY"
) -> list[dict[str, Any]]:
    """The ``data`` entries of ``GET {api_base}/models``.

    Raises:
        EndpointError: the endpoint does not answer, answers with an HTTP error, or with something
            that is not an OpenAI-style model list; the message names the URL (credentials removed).
    """
    url = models_url(api_base)
    shown = _redact(url)
    request = urllib.request.Request(shown, headers={"accept": "application/json"})
    parts = urlsplit(url)
    key = os.environ.get(api_key_env)
    if parts.username is not None:  # user:password@ in api_base: HTTP basic auth, as httpx does
        token = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        request.add_header("authorization", "Basic " + base64.b64encode(token).decode())
    elif key:
        request.add_header("authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - user's endpoint
            body = response.read()
    except urllib.error.HTTPError as exc:
        raise EndpointError(
            f"the endpoint {shown} answered HTTP {exc.code} ({exc.reason}); check api_base "
            "(an OpenAI-compatible server serves its models at <api_base>/models, api_base usually "
            "ends in /v1) and, for a server that wants a key, OPENAI_API_KEY"
        ) from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise EndpointError(
            f"cannot reach the endpoint {shown}: {reason}; is the server running, and is api_base "
            "right (scheme, host, port, /v1)?",
            answered=False,
        ) from None
    try:
        data = json.loads(body)
        entries = data["data"]
        if not isinstance(entries, list):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise EndpointError(
            f"the endpoint {shown} did not return an OpenAI-style model list "
            f'(expected {{"data": [{{"id": ...}}]}}, got {body[:120]!r}); is api_base the '
            "server's OpenAI-compatible root (usually ending in /v1)?"
        ) from None
    return [e for e in entries if isinstance(e, dict)]


def served_entry(api_base: str, alias: str, *, timeout: float = 10.0) -> dict[str, Any]:
    """The ``/models`` entry whose ``id`` is ``alias``; an :class:`EndpointError` naming the aliases
    the endpoint does serve when it is not among them."""
    entries = list_models(api_base, timeout=timeout)
    for entry in entries:
        if entry.get("id") == alias:
            return entry
    ids = ", ".join(repr(e.get("id")) for e in entries) or "none"
    raise EndpointError(
        f"the endpoint {_redact(api_base)} does not serve a model named {alias!r}; it serves: {ids}. "
        f"Write openai/<one of those> (llama-cpp-python's server takes --model_alias, vLLM "
        "--served-model-name)"
    )


def entry_identity(entry: dict[str, Any]) -> str:
    """A short hash of what a ``/models`` entry says about its model (volatile fields left out)."""
    stable = {k: v for k, v in entry.items() if k not in _VOLATILE}
    text = json.dumps(stable, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class EndpointIdentity:
    """The cache identity of one (endpoint, alias): the redacted ``api_base`` and, once the server
    has answered ``/models``, the hash of its entry for the alias.

    Shared by a role LM and its copies. The lookup is made at most once per success; an endpoint
    that does not answer leaves the identity at the address alone and is asked again on the next
    call, so a server that comes up later is still fingerprinted.
    """

    def __init__(self, api_base: str, alias: str, *, timeout: float = 5.0) -> None:
        self.api_base = _redact(api_base)
        self._raw_base = api_base
        self.alias = alias
        self.timeout = timeout
        self._model: str | None = None
        self._entry: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def tag(self) -> dict[str, str]:
        """``{"memsteer_endpoint": <api_base>, "memsteer_model": <hash | "unknown">}``."""
        with self._lock:
            if self._model is None:
                try:
                    entries = list_models(self._raw_base, timeout=self.timeout)
                except EndpointError as exc:
                    if exc.answered:  # a server without a model list: the address alone
                        self._model = "unlisted"
                else:
                    entry = next((e for e in entries if e.get("id") == self.alias), None)
                    self._entry = entry
                    self._model = entry_identity(entry) if entry is not None else "unlisted"
            return {"memsteer_endpoint": self.api_base, "memsteer_model": self._model or "unknown"}

    def schema_dialect(self) -> str:
        """How this server takes a JSON schema: ``json_object_schema`` for llama-cpp-python's server
        (its ``/models`` entries say ``owned_by: "me"``; it refuses OpenAI's ``json_schema`` type),
        ``json_schema`` (OpenAI's form: vLLM, llama-server, Ollama) for any other."""
        self.tag()
        entry = self._entry or {}
        if entry.get("owned_by") == "me" and isinstance(entry.get("permissions"), list):
            return "json_object_schema"
        return "json_schema"
