"""A crash-safe first run of a local GGUF model: load it and decode in a child process.

A llama.cpp build whose CPU kernels do not fit the CPU does not raise, it kills the process: the
native build of llama-cpp-python 0.3.36 segfaults (SIGSEGV) on Xeons with AMX in any multi-token
decode, and an AVX-512 build dies with SIGILL on a CPU without AVX-512. Run in-process, that is a bare
``Segmentation fault`` after a progress bar, with nothing said and nothing saved.

So before a process loads a local model for the first time on a machine, :func:`ensure_preflight`
loads it in a **subprocess** and evaluates a short multi-token prompt plus a few generated tokens. If
the child dies by a signal, :class:`LocalModelCrashError` names the signal, the CPU and its features,
the build flags the library was installed with, and the exact command that rebuilds it with safe
flags. A pass is remembered in a small JSON file next to the model's verification stamp, keyed by the
llama-cpp-python build (version and the size/mtime of its shared libraries), the model file and the
CPU's features, so it costs one child process per machine, build and model — not per run.
``memsteer lm check`` always runs it afresh and prints the result.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from memsteer_dspy.errors import MemsteerError
from memsteer_dspy.lm import buildflags
from memsteer_dspy.runfolder import write_atomic

PREFLIGHT_SUFFIX = ".preflight.json"
CHILD_TIMEOUT_S = 300.0
# A prompt of a few dozen tokens: the crash needs a batch of more than one token.
_PROMPT = (
    "List three colours of the rainbow, then say which one comes first and why people often "
    "remember the order with a short phrase."
)


class LocalModelCrashError(MemsteerError):
    """The local model's preflight child died (by a signal) or failed; the message says what to do."""

    def __init__(self, message: str, result: PreflightResult) -> None:
        super().__init__(message)
        self.result = result


@dataclass
class PreflightResult:
    """What one preflight found (also the JSON remembered next to the model)."""

    ok: bool
    key: str
    model: str
    llama_cpp_python: str | None
    cpu_model: str
    cpu_features: list[str]
    cmake_args: str | None
    seconds: float = 0.0
    cached: bool = False
    returncode: int | None = None
    signal: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    system_info: str | None = None
    extra: dict = field(default_factory=dict)

    def summary(self) -> str:
        if self.ok:
            how = "remembered" if self.cached else f"{self.seconds:.1f} s"
            return (
                f"preflight ok ({how}): {Path(self.model).name} decoded {self.prompt_tokens} prompt "
                f"+ {self.completion_tokens} generated tokens in a child process; "
                f"build flags: {self.cmake_args or 'not recorded (installed outside memsteer)'}"
            )
        return f"preflight FAILED: {self.error}"


def _llama_cpp_build_identity() -> tuple[str | None, str]:
    """(llama-cpp-python version, a digest of its shared libraries' names, sizes and mtimes)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None, "not-installed"
    from importlib import metadata

    try:
        version = metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        version = None
    root = Path(next(iter(spec.submodule_search_locations)))
    libs = []
    for lib in sorted(root.rglob("*.so*")) + sorted(root.rglob("*.dylib")):
        with contextlib.suppress(OSError):
            st = lib.stat()
            libs.append(f"{lib.name}:{st.st_size}:{st.st_mtime_ns}")
    return version, hashlib.sha256("|".join(libs).encode()).hexdigest()[:16]


def preflight_key(model_path: Path, features: Sequence[str] | None = None) -> str:
    version, libs = _llama_cpp_build_identity()
    try:
        st = model_path.stat()
        model_id = f"{model_path.resolve()}:{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        model_id = str(model_path)
    features = buildflags.reported_features() if features is None else list(features)
    text = json.dumps([version, libs, model_id, buildflags.cpu_model_name(), sorted(features)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _record_path(model_path: Path) -> Path:
    return model_path.with_name(model_path.name + PREFLIGHT_SUFFIX)


def _remembered(model_path: Path, key: str) -> PreflightResult | None:
    try:
        data = json.loads(_record_path(model_path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if data.get("key") != key or not data.get("ok"):
        return None
    with contextlib.suppress(TypeError):
        result = PreflightResult(**data)
        result.cached = True
        return result
    return None


def _remember(model_path: Path, result: PreflightResult) -> None:
    with contextlib.suppress(OSError):  # a read-only model folder only costs a rerun next time
        write_atomic(_record_path(model_path), json.dumps(asdict(result), indent=2) + "\n")


def child_command(model_path: Path) -> list[str]:
    """The command the preflight runs: this module's ``--child`` entry under this interpreter."""
    return [sys.executable, "-m", "memsteer_dspy.lm.preflight", "--child", str(model_path)]


def run_preflight(
    model_path: str | Path,
    *,
    command: Sequence[str] | None = None,
    timeout: float = CHILD_TIMEOUT_S,
    remember: bool = True,
) -> PreflightResult:
    """Load ``model_path`` and decode a multi-token prompt in a child process; never crashes this one.

    ``command`` replaces the child (tests pass one that kills itself with SIGSEGV). Returns the
    result; a failure is ``ok=False`` with ``error`` and, for a death by signal, ``signal`` set.
    """
    model_path = Path(model_path)
    features = buildflags.reported_features()
    record = buildflags.installed_build_record()
    version, _ = _llama_cpp_build_identity()
    result = PreflightResult(
        ok=False,
        key=preflight_key(model_path, features),
        model=str(model_path),
        llama_cpp_python=version,
        cpu_model=buildflags.cpu_model_name(),
        cpu_features=features,
        cmake_args=(record or {}).get("cmake_args"),
    )
    cmd = list(command) if command is not None else child_command(model_path)
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        result.seconds = time.perf_counter() - start
        result.error = f"the preflight child did not finish in {timeout:.0f} s"
        return result
    result.seconds = time.perf_counter() - start
    result.returncode = proc.returncode
    if proc.returncode < 0:
        try:
            result.signal = signal.Signals(-proc.returncode).name
        except ValueError:
            result.signal = f"signal {-proc.returncode}"
        result.error = _crash_message(result, proc.stderr)
        return result
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
        result.error = f"the preflight child exited with status {proc.returncode} loading {model_path}:\n{tail}"
        return result
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        result.error = f"the preflight child printed no result: {proc.stdout[-500:]!r}"
        return result
    result.ok = True
    result.prompt_tokens = int(out.get("prompt_tokens", 0))
    result.completion_tokens = int(out.get("completion_tokens", 0))
    result.system_info = out.get("system_info")
    if remember:
        _remember(model_path, result)
    return result


def _crash_message(result: PreflightResult, stderr: str) -> str:
    features = " ".join(result.cpu_features) or "(unknown)"
    amx = (
        " — this CPU has AMX, which llama.cpp's native build miscompiles for"
        if any(f.startswith("amx") for f in result.cpu_features)
        else ""
    )
    lines = [
        f"llama.cpp crashed with {result.signal} while decoding a short prompt with "
        f"{Path(result.model).name} (in a child process; nothing of yours was lost).",
        f"  CPU: {result.cpu_model}; features: {features}{amx}",
        f"  llama-cpp-python {result.llama_cpp_python or '?'} built with: "
        f"{result.cmake_args or 'unknown flags (not installed by make install: probably -march=native)'}",
        "  Rebuild it with flags chosen for this CPU (no -march=native, AMX off):",
        f"    {buildflags.reinstall_command(sys.executable)}",
        "  or run `make install` in a fresh checkout (it does the same).",
    ]
    fault = [ln for ln in stderr.splitlines() if "Fatal Python error" in ln or "File " in ln][:6]
    if fault:
        lines.append("  where it died: " + " | ".join(s.strip() for s in fault))
    return "\n".join(lines)


def ensure_preflight(model_path: str | Path) -> PreflightResult:
    """Pass the preflight once per machine/build/model (remembered), or raise :class:`LocalModelCrashError`.

    Set ``MEMSTEER_SKIP_PREFLIGHT=1`` to skip it (for a build you have already checked by hand).
    """
    model_path = Path(model_path)
    if os.environ.get("MEMSTEER_SKIP_PREFLIGHT") == "1":
        return PreflightResult(
            ok=True,
            key="skipped",
            model=str(model_path),
            llama_cpp_python=None,
            cpu_model=buildflags.cpu_model_name(),
            cpu_features=[],
            cmake_args=None,
            cached=True,
        )
    key = preflight_key(model_path)
    failed = _FAILED.get(key)
    if failed is not None:  # one child per process: every later caller gets the same answer at once
        raise LocalModelCrashError(failed.error or "the local model preflight failed", failed)
    remembered = _remembered(model_path, key)
    if remembered is not None:
        return remembered
    result = run_preflight(model_path)
    if not result.ok:
        _FAILED[key] = result
        raise LocalModelCrashError(result.error or "the local model preflight failed", result)
    return result


_FAILED: dict[str, PreflightResult] = {}


def _child(model_path: str) -> int:
    """The child: load the model, evaluate a multi-token prompt, generate a few tokens, print JSON."""
    import llama_cpp

    llama = llama_cpp.Llama(
        model_path=model_path, n_ctx=512, n_batch=64, n_threads=os.cpu_count(), verbose=False
    )
    out = llama.create_completion(_PROMPT, max_tokens=6, temperature=0.0)
    usage = out.get("usage", {})
    info = llama_cpp.llama_print_system_info()
    info = info.decode(errors="replace") if isinstance(info, bytes) else str(info)
    print(
        json.dumps(
            {
                "prompt_tokens": usage.get("prompt_tokens", 0),
                "completion_tokens": usage.get("completion_tokens", 0),
                "system_info": info.strip(),
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        raise SystemExit(_child(sys.argv[2]))
    print("usage: python -m memsteer_dspy.lm.preflight --child MODEL.gguf", file=sys.stderr)
    raise SystemExit(2)
