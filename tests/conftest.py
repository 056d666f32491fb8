"""Shared fixtures: DSPy settings reset per test, no disk cache, and the RHELM data when present."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

pytest_plugins = [
    "lm_server_fixtures"
]  # llama_server, embedded_gguf: a real OpenAI-compatible server


@pytest.fixture(autouse=True)
def _clean_dspy_settings():
    """Every test starts with no configured LM and no DSPy disk cache (as DSPy's own suite does)."""
    import dspy

    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
    dspy.settings.configure(lm=None, adapter=None)
    yield
    dspy.settings.configure(lm=None, adapter=None)


@pytest.fixture(autouse=True)
def _no_model_in_unit_tests(request, monkeypatch):
    """A test not marked ``integration`` never loads the embedded model in-process: a CLI test
    meant to see ``generate`` refuse its options once went on to generate with the 1.5B model for
    twelve minutes, unnoticed beside a measurement run. It fails at once instead."""
    if request.node.get_closest_marker("integration"):
        return
    try:
        import llama_cpp
    except ImportError:  # no llama.cpp: nothing to guard
        return

    def refuse(*args, **kwargs):
        raise RuntimeError(
            "a unit test tried to load the embedded model: mark it `integration`, or give it a "
            "scripted LM (tests/scripted_roles.py, tests/fault_helpers.py)"
        )

    monkeypatch.setattr(llama_cpp, "Llama", refuse)


def _find_rhelm() -> Path | None:
    env = os.environ.get("MEMSTEER_RHELM_ROOT")
    candidates = [Path(env)] if env else []
    candidates.append(REPO_ROOT.parent / "shared" / "benchmarks" / "rhelm")
    for c in candidates:
        if (c / "data" / "QA_final").is_dir():
            return c
    return None


@pytest.fixture(scope="session")
def rhelm_root() -> Path:
    """The RHELM benchmark root (``../shared/benchmarks/rhelm``); skips the test where it is absent."""
    root = _find_rhelm()
    if root is None:
        pytest.skip(
            "RHELM data not found: expected ../shared/benchmarks/rhelm beside the checkout "
            "(or set MEMSTEER_RHELM_ROOT)"
        )
    return root
