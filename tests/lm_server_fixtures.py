"""The real OpenAI-compatible server as pytest fixtures: llama-cpp-python's server on the embedded GGUF.

``llama_server`` (session scope) starts :func:`memsteer_dspy.lm.serve.start_llama_server` once for
every test that needs it and stops it by its PID at the end; it skips, naming the ``server`` extra,
where llama-cpp-python's server dependencies are missing. Tests that use it are marked
``integration`` (they run the 1.5B model on the CPU).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memsteer_dspy.lm.serve import ALIAS, LlamaServer, server_missing, start_llama_server

__all__ = ["ALIAS", "LlamaServer", "embedded_gguf", "llama_server", "start_llama_server"]


@pytest.fixture(scope="session")
def embedded_gguf() -> Path:
    from memsteer_dspy.lm.model_files import ensure_embedded_model

    return ensure_embedded_model("qwen2.5-coder-1.5b")


@pytest.fixture(scope="session")
def llama_server(embedded_gguf, tmp_path_factory):
    """llama-cpp-python's OpenAI-compatible server on the embedded model, for the whole session."""
    why = server_missing()
    if why:
        pytest.skip(why)
    server = start_llama_server(embedded_gguf, tmp_path_factory.mktemp("llama-server"))
    yield server
    server.stop()
