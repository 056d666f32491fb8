"""``memsteer lm check``: one tiny structured call to each distinct LM of a config.

Before a long run it is worth knowing that every role's LM answers, parses, and how fast: for each
distinct LM among the roles this makes one typed call (``question -> answer: str, confidence:
float``) through ``dspy.Predict`` with the ``JSONAdapter``, and reports the roles it serves, latency,
tokens and tokens/s, the parsed output, or the error. One failing LM never stops the others. For a
server LM (``openai/<alias>`` with ``api_base``) it first asks the server's ``/models``, so a wrong
address or alias is reported as such, naming the endpoint and the aliases it serves.

A local model (``local/...`` or ``llamacpp/<file>``) is first loaded and run in a child process
(:mod:`memsteer_dspy.lm.preflight`, always afresh here): a llama.cpp build that crashes on this CPU is
reported with the signal and the reinstall command instead of killing ``lm check`` itself.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import dspy
from dspy.utils.usage_tracker import track_usage
from pydantic import BaseModel, Field

from memsteer_dspy.lm.config import LMConfig
from memsteer_dspy.lm.endpoint import served_entry
from memsteer_dspy.lm.model_files import ensure_embedded_model
from memsteer_dspy.lm.preflight import run_preflight


class TinyCheck(dspy.Signature):
    """Answer the question with one word, and say how confident you are (0 to 1)."""

    question: str = dspy.InputField()
    answer: str = dspy.OutputField()
    confidence: float = dspy.OutputField()


CHECK_QUESTION = "What is the capital of France?"


class CheckResult(BaseModel):
    """The outcome of one LM's check call."""

    model: str
    roles: list[str]
    ok: bool
    error: str | None = None
    latency_s: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tokens_per_s: float = 0.0
    output: dict[str, Any] = Field(default_factory=dict)
    preflight: str | None = None


def check_lms(config: LMConfig, *, question: str = CHECK_QUESTION) -> list[CheckResult]:
    """Call each distinct LM of ``config`` once with a tiny typed signature; never raises per LM.

    The call bypasses DSPy's cache (``cache=False``), so the latency and tokens are real. Its usage
    is booked under the first role the LM serves, like any other call of that role.
    """
    results: list[CheckResult] = []
    for spec, roles in config.distinct():
        role = roles[0]
        preflight = None
        if spec.in_process:
            try:
                preflight = _preflight(spec)
            except Exception as exc:  # noqa: BLE001 - a missing model file etc., reported per LM
                results.append(
                    CheckResult(model=spec.model, roles=roles, ok=False, error=_why(exc))
                )
                continue
            if not preflight.ok:
                results.append(
                    CheckResult(
                        model=spec.model,
                        roles=roles,
                        ok=False,
                        error=preflight.error,
                        preflight=preflight.summary(),
                    )
                )
                continue
        try:
            if spec.on_server:  # name the endpoint, or the aliases it serves, before calling it
                served_entry(
                    spec.api_base, spec.model.split("/", 1)[1], timeout=spec.timeout or 10.0
                )
            lm = config.lm(role).copy(cache=False)
        except Exception as exc:  # noqa: BLE001 - reported per LM, never fatal
            results.append(CheckResult(model=spec.model, roles=roles, ok=False, error=_why(exc)))
            continue
        predict = dspy.Predict(TinyCheck)
        start = time.perf_counter()
        try:
            with dspy.context(lm=lm, adapter=dspy.JSONAdapter()), track_usage() as tracker:
                prediction = predict(question=question)
        except Exception as exc:  # noqa: BLE001
            results.append(
                CheckResult(
                    model=spec.model,
                    roles=roles,
                    ok=False,
                    error=_why(exc),
                    latency_s=time.perf_counter() - start,
                )
            )
            continue
        latency = time.perf_counter() - start
        usage = tracker.get_total_tokens().get(lm.model, {})
        prompt = int(usage.get("prompt_tokens") or 0)
        completion = int(usage.get("completion_tokens") or 0)
        results.append(
            CheckResult(
                model=spec.model,
                roles=roles,
                ok=True,
                latency_s=latency,
                prompt_tokens=prompt,
                completion_tokens=completion,
                tokens_per_s=completion / latency if latency > 0 else 0.0,
                output={k: prediction[k] for k in TinyCheck.output_fields},
                preflight=preflight.summary() if preflight is not None else None,
            )
        )
    return results


def _preflight(spec: Any) -> Any:
    """Run the crash-safe child-process preflight of a local model afresh (and remember a pass)."""
    name = spec.model.split("/", 1)[1]
    path = ensure_embedded_model(name) if spec.backend == "local" else Path(name)
    return run_preflight(path)


def _why(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


def format_check_table(results: list[CheckResult]) -> str:
    """The check results as a plain-text table (one row per LM, errors spelled out below it)."""
    headers = ["model", "roles", "ok", "latency_s", "prompt_tok", "compl_tok", "tok/s", "output"]
    rows = []
    for r in results:
        output = ", ".join(f"{k}={v!r}" for k, v in r.output.items()) if r.ok else "-"
        rows.append(
            [
                r.model,
                ",".join(r.roles),
                "ok" if r.ok else "FAIL",
                f"{r.latency_s:.2f}",
                str(r.prompt_tokens),
                str(r.completion_tokens),
                f"{r.tokens_per_s:.1f}",
                output,
            ]
        )
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    lines = [
        "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    for r in results:
        if r.preflight and r.ok:
            lines.append(f"\n{r.model}: {r.preflight}")
        if not r.ok:
            lines.append(f"\n{r.model} ({', '.join(r.roles)}): {r.error}")
    return "\n".join(lines)
