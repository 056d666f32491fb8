"""Start llama-cpp-python's OpenAI-compatible server on a local GGUF, for tests and benchmarks.

:func:`start_llama_server` runs ``python -m llama_cpp.server --model <gguf> --model_alias <alias>``
on 127.0.0.1 at a free port as a subprocess, waits until ``GET /v1/models`` lists the alias, and
returns a :class:`LlamaServer` whose ``stop()`` ends that process by its PID (SIGTERM, then
SIGKILL). It needs the ``server`` extra (``pip install 'memsteer-dspy[local,server]'``);
:func:`server_missing` says what is missing; :func:`running_llama_server` is the ``with`` form that
stops the server however the block ends. :func:`llama_server_format` rewrites OpenAI's
``json_schema`` response format into the form this server takes, for clients (A-Mem, Ragas through
instructor) that send OpenAI's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from memsteer_dspy.runfolder import sigterm_raises

ALIAS = "qwen-server"
SERVER_N_CTX = 4096
START_TIMEOUT_S = 300.0


def llama_server_format(response_format: dict | None) -> dict | None:
    """``response_format`` as llama-cpp-python's server takes it: OpenAI's ``{"type":
    "json_schema", "json_schema": {"schema": S}}`` becomes ``{"type": "json_object", "schema": S}``
    (the server answers 422 to the first and binds the reply to ``S`` with a grammar for the
    second); anything else is returned as it is."""
    if not response_format or response_format.get("type") != "json_schema":
        return response_format
    schema = (response_format.get("json_schema") or {}).get("schema")
    return {"type": "json_object", **({"schema": schema} if schema else {})}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LlamaServer:
    """One running ``llama_cpp.server`` process."""

    process: subprocess.Popen
    port: int
    alias: str
    log: Path

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def toml(self, *, default: bool = True, structured_output: str | None = None) -> str:
        """An ``[lm]`` config pointing every role (``default``) at this server."""
        lines = ["[lm]"]
        if default:
            lines.append(f'default = "openai/{self.alias}"')
        lines += [
            f'[lm.options."openai/{self.alias}"]',
            f'api_base = "{self.api_base}"',
            "temperature = 0.0",
            "max_tokens = 512",
            "timeout = 600",
            "num_retries = 1",
        ]
        if structured_output:
            lines.append(f'structured_output = "{structured_output}"')
        return "\n".join(lines) + "\n"

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)


def server_missing() -> str | None:
    """Why llama-cpp-python's server cannot start here (None when it can)."""
    import importlib.util

    for module in ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context"):
        if importlib.util.find_spec(module) is None:
            return (
                f"llama-cpp-python's server needs {module!r}: "
                "pip install 'memsteer-dspy[local,server]' (make install does)"
            )
    return None


@contextlib.contextmanager
def running_llama_server(gguf: Path, log_dir: Path, **kwargs) -> Iterator[LlamaServer]:
    """:func:`start_llama_server` for the ``with`` block: the server is stopped when the block
    ends, raises, or the process is sent SIGTERM (turned into ``SystemExit`` for the block's
    length, so a benchmark killed by ``kill`` or a scheduler leaves no server running)."""

    with sigterm_raises(lambda signum: SystemExit(128 + signum)):
        server = start_llama_server(gguf, log_dir, **kwargs)
        try:
            yield server
        finally:
            server.stop()


@contextlib.contextmanager
def embedded_model_server(log_dir: Path, *, n_ctx: int = SERVER_N_CTX) -> Iterator[LlamaServer]:
    """The embedded model (Qwen2.5-Coder-1.5B, from its packages) behind this server for the
    length of the block: what third-party packages that call an LLM by URL are given."""
    from memsteer_dspy.errors import ConfigError
    from memsteer_dspy.lm.model_files import ensure_embedded_model

    if why := server_missing():
        raise ConfigError(why)
    with running_llama_server(
        ensure_embedded_model("qwen2.5-coder-1.5b"), log_dir, n_ctx=n_ctx
    ) as s:
        yield s


def llm_endpoint(
    stack: contextlib.ExitStack,
    log_dir: Path,
    *,
    api_base: str | None = None,
    model: str | None = None,
    schema_form: str | None = None,
    n_ctx: int = SERVER_N_CTX,
) -> dict[str, str | None]:
    """Where a third-party package that calls an LLM by URL (Ragas, Mem0, A-Mem) sends its calls:
    ``api_base`` and ``model`` when given (``schema_form`` ``json_schema``, OpenAI's response
    format, unless told otherwise), else the embedded model behind llama.cpp's server for the life
    of ``stack`` (:func:`embedded_model_server`, its log in ``log_dir``; ``json_object``, the form
    the server binds with a grammar, see :func:`llama_server_format`)."""
    if api_base:
        return {"api_base": api_base, "model": model, "schema_form": schema_form or "json_schema"}
    log_dir.mkdir(parents=True, exist_ok=True)
    server = stack.enter_context(embedded_model_server(log_dir, n_ctx=n_ctx))
    return {
        "api_base": server.api_base,
        "model": ALIAS,
        "schema_form": schema_form or "json_object",
    }


def start_llama_server(
    gguf: Path, log_dir: Path, *, alias: str = ALIAS, n_ctx: int = SERVER_N_CTX, n_threads: int = 2
) -> LlamaServer:
    port = free_port()
    log = log_dir / f"llama-server-{port}.log"
    cmd = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(gguf),
        "--model_alias",
        alias,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        str(n_ctx),
        "--n_threads",
        str(n_threads),
        "--verbose",
        "False",
    ]
    with open(log, "wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    server = LlamaServer(process, port, alias, log)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"llama_cpp.server exited with {process.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(f"{server.api_base}/models", timeout=2) as r:
                if alias in [m.get("id") for m in json.load(r).get("data", [])]:
                    return server
        except OSError:
            pass
        time.sleep(0.5)
    server.stop()
    raise RuntimeError(
        f"llama_cpp.server did not list {alias!r} within {START_TIMEOUT_S:.0f}s; see {log}"
    )
