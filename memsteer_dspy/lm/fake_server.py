"""A small OpenAI-compatible endpoint, in-process, for tests and benchmarks of server LMs.

:class:`FakeOpenAIServer` serves ``GET /v1/models`` and ``POST /v1/chat/completions`` on
127.0.0.1 at a free port from a thread pool (so concurrent requests overlap, like a real server's).
Each completion answers the request's JSON schema (``response_format`` ``json_schema``) with the
smallest value the schema allows, so any DSPy signature run through the ``JSONAdapter`` parses;
``delay`` makes it slow, ``failures`` makes chosen requests fail the way servers do (HTTP 500, a
body cut short, no answer before the client's timeout), and every request is kept in
``requests`` for assertions. Used by ``tests/test_lm_server.py`` and
``benchmarks/server_threads.py``; also handy for testing your own programs against a server LM.

```python
with FakeOpenAIServer(alias="m", delay=0.2) as server:
    lm = build_lm(LMSpec(model="openai/m", api_base=server.api_base), role="answerer")
```
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

Failure = Literal["http500", "truncated", "hang"]


def example_for(schema: dict[str, Any], defs: dict[str, Any] | None = None) -> Any:
    """The smallest JSON value that satisfies ``schema`` (the subset DSPy's schemas use)."""
    defs = defs if defs is not None else schema.get("$defs", schema.get("definitions", {}))
    if "$ref" in schema:
        return example_for(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            options = [s for s in schema[key] if s.get("type") != "null"] or schema[key]
            return example_for(options[0], defs)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        return {name: example_for(sub, defs) for name, sub in props.items()}
    if kind == "array":
        item = example_for(schema.get("items", {"type": "string"}), defs)
        return [item] * int(schema.get("minItems", 0))
    if kind == "string":
        return "x" * max(1, int(schema.get("minLength", 1)))
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        return int(low) + (1 if "exclusiveMinimum" in schema else 0) if kind == "integer" else low
    if kind == "boolean":
        return True
    return None


_FIELD = re.compile(r"^\s*\d+\. `(\w+)` \(([^)]*)\)", re.M)
_CHAT_VALUES = {"str": "x", "bool": "True", "int": "0", "float": "0"}


def _chat_answer(body: dict[str, Any]) -> str:
    """An answer in DSPy's ChatAdapter format (``[[ ## field ## ]]`` sections) for the output
    fields the system message lists, as a model that follows the prompt would write it."""
    system = next(
        (m.get("content") for m in body.get("messages", []) if m.get("role") == "system"), ""
    )
    if not isinstance(system, str) or "Your output fields are:" not in system:
        return "{}"
    outputs = system.split("Your output fields are:", 1)[1].split("All interactions", 1)[0]
    parts = []
    for name, kind in _FIELD.findall(outputs):
        value = _CHAT_VALUES.get(
            kind.split("[", 1)[0].strip(), "[]" if kind.startswith("list") else "x"
        )
        parts.append(f"[[ ## {name} ## ]]\n{value}")
    return "\n\n".join([*parts, "[[ ## completed ## ]]"])


def answer_for(body: dict[str, Any]) -> str:
    """The assistant text a fake server returns for a chat-completions request body: the smallest
    value of the requested JSON schema, any JSON object in JSON mode, and without a
    ``response_format`` the ChatAdapter's field sections the prompt asks for."""
    fmt = body.get("response_format") or {}
    schema = None
    if fmt.get("type") == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema")
    elif fmt.get("type") == "json_object":
        schema = fmt.get("schema")
    else:
        return _chat_answer(body)
    return json.dumps(example_for(schema) if schema else {})


class FakeOpenAIServer:
    """An OpenAI-compatible chat endpoint on 127.0.0.1 (see the module docstring).

    Args:
        alias: the one model name ``/v1/models`` lists and completions accept (others get 404).
        delay: seconds each completion waits before answering.
        failures: request number (1-based, in arrival order) -> how it fails.
        answer: body -> assistant text (default :func:`answer_for`).
        model_info: extra fields of the ``/v1/models`` entry (what the server says it serves).
    """

    def __init__(
        self,
        *,
        alias: str = "fake-model",
        delay: float = 0.0,
        failures: dict[int, Failure] | None = None,
        answer: Callable[[dict[str, Any]], str] | None = None,
        model_info: dict[str, Any] | None = None,
        prompt_tokens: int = 20,
        completion_tokens: int = 5,
    ) -> None:
        self.alias = alias
        self.delay = delay
        self.failures = dict(failures or {})
        self.answer = answer or answer_for
        self.model_info = dict(model_info or {})
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._server: ThreadingHTTPServer | None = None

    @property
    def api_base(self) -> str:
        assert self._server is not None, "start the server first"
        return f"http://127.0.0.1:{self._server.server_port}/v1"

    def start(self) -> FakeOpenAIServer:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, payload: bytes, *, length: int | None = None) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload) if length is None else length))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                if self.path.rstrip("/") != "/v1/models":
                    self._send(404, b'{"error": {"message": "not found"}}')
                    return
                entry = {"id": owner.alias, "object": "model", "created": int(time.time())}
                self._send(
                    200,
                    json.dumps(
                        {"object": "list", "data": [{**entry, **owner.model_info}]}
                    ).encode(),
                )

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                with owner._lock:
                    owner.requests.append(body)
                    owner.headers.append({k.lower(): v for k, v in self.headers.items()})
                    number = len(owner.requests)
                    owner.in_flight += 1
                    owner.max_in_flight = max(owner.max_in_flight, owner.in_flight)
                try:
                    self._complete(body, owner.failures.get(number))
                finally:
                    with owner._lock:
                        owner.in_flight -= 1

            def _complete(self, body: dict[str, Any], failure: Failure | None) -> None:
                if owner.delay:
                    time.sleep(owner.delay)
                if body.get("model") != owner.alias:
                    message = f"model {body.get('model')!r} not found"
                    self._send(404, json.dumps({"error": {"message": message}}).encode())
                    return
                if failure == "http500":
                    self._send(500, b'{"error": {"message": "internal server error"}}')
                    return
                if failure == "hang":
                    owner._release.wait(60)
                    return
                data = json.dumps(
                    {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": owner.alias,
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": owner.answer(body)},
                                "finish_reason": "stop",
                            }
                        ],
                        "usage": {
                            "prompt_tokens": owner.prompt_tokens,
                            "completion_tokens": owner.completion_tokens,
                            "total_tokens": owner.prompt_tokens + owner.completion_tokens,
                        },
                    }
                ).encode()
                if failure == "truncated":  # promise the whole body, send half, hang up
                    self._send(200, data[: len(data) // 2], length=len(data))
                    self.close_connection = True
                    return
                self._send(200, data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
