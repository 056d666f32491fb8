"""Safe llama.cpp build flags for this CPU, and the install of llama-cpp-python built with them.

llama.cpp's default CPU build (``GGML_NATIVE=ON``, ``-march=native``) compiles every instruction
the build host has. On Intel Xeons with AMX (``amx_tile amx_int8``) that build segfaults in any
multi-token decode (llama-cpp-python 0.3.36 on 2-core cloud VMs), and an AVX-512 build copied to a
CPU without AVX-512 dies with SIGILL. So the flags are chosen here, at install time, from the CPU's
own features:

- ``GGML_NATIVE=OFF``; each x86 extension llama.cpp has a switch for (SSE4.2, AVX, AVX2, FMA,
  F16C, BMI2, AVX-VNNI, AVX-512 F/VBMI/VNNI/BF16) is ON exactly when ``/proc/cpuinfo`` lists it;
- the AMX switches are always OFF, whatever the CPU says;
- on other architectures (arm64, …) llama.cpp's native default is kept: the AMX fault is x86-only.

The build is cached as a wheel under ``~/.cache/memsteer-dspy/wheels/<key>/`` (``MEMSTEER_WHEEL_CACHE``
moves it), the key covering the llama-cpp-python version, the flags and the Python tag, so a rebuild
happens only when one of them changes — and never reuses pip's own wheel cache, which ignores
``CMAKE_ARGS`` and would hand a native build from an earlier install to this one. The flags used are
written next to the installed package (``<prefix>/share/memsteer-dspy/llama-build.json``) for
``memsteer lm check`` and ``benchmarks/local_lm_speed.py`` to report.

This file imports only the standard library: the Makefile and ``.ci/run`` run it before anything
else is installed::

    python memsteer_dspy/lm/buildflags.py            # print the CMAKE_ARGS for this CPU
    python memsteer_dspy/lm/buildflags.py --explain  # and the CPU features behind them
    python memsteer_dspy/lm/buildflags.py --install --python .venv/bin/python
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
"""The llama-cpp-python release these flags and the preflight were verified with (pyproject pins it)."""

# (llama.cpp CMake switch, the /proc/cpuinfo flag that must be present). Order is llama.cpp's.
X86_SWITCHES: tuple[tuple[str, str], ...] = (
    ("GGML_SSE42", "sse4_2"),
    ("GGML_AVX", "avx"),
    ("GGML_AVX2", "avx2"),
    ("GGML_FMA", "fma"),
    ("GGML_F16C", "f16c"),
    ("GGML_BMI2", "bmi2"),
    ("GGML_AVX_VNNI", "avx_vnni"),
    ("GGML_AVX512", "avx512f"),
    ("GGML_AVX512_VBMI", "avx512vbmi"),
    ("GGML_AVX512_VNNI", "avx512_vnni"),
    ("GGML_AVX512_BF16", "avx512_bf16"),
)
# Never on: llama.cpp's AMX kernels crash multi-token decodes on the Xeons we run on.
X86_ALWAYS_OFF: tuple[str, ...] = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")
# AVX-512 code needs these beside avx512f (llama.cpp passes -mavx512{f,cd,vl,dq,bw} together).
AVX512_COMPANIONS: tuple[str, ...] = ("avx512cd", "avx512vl", "avx512dq", "avx512bw")
# Flags a reader of a crash report wants to see (the ones that decide which kernels run).
REPORTED_FEATURES: tuple[str, ...] = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "bmi2",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vbmi",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)
PLAIN_AVX2_ARGS = (
    "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "
    "-DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
)
"""The portable baseline the issue measured against: AVX2 without AVX-512 or AMX."""

WHEEL_CACHE_ENV = "MEMSTEER_WHEEL_CACHE"
RECORD_NAME = "llama-build.json"


def is_x86(machine: str | None = None) -> bool:
    return (machine or platform.machine()).lower() in {"x86_64", "amd64", "i686", "i386", "x86"}


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU's feature flags as the kernel lists them (``flags`` line of /proc/cpuinfo).

    Empty where there is no /proc/cpuinfo (macOS, Windows): the caller then keeps llama.cpp's
    defaults. ``cpuinfo`` lets tests pass a file's text.
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in {"flags", "Features"}:
            return frozenset(value.split())
    return frozenset()


def cmake_switches(flags: frozenset[str], machine: str | None = None) -> dict[str, bool]:
    """CMake switch → on/off for a CPU with ``flags``; empty (llama.cpp defaults) off x86."""
    if not is_x86(machine):
        return {}
    switches: dict[str, bool] = {"GGML_NATIVE": False}
    avx512_ok = "avx512f" in flags and all(f in flags for f in AVX512_COMPANIONS)
    for switch, flag in X86_SWITCHES:
        on = flag in flags
        if switch.startswith("GGML_AVX512"):
            on = on and avx512_ok
        switches[switch] = on
    for switch in X86_ALWAYS_OFF:
        switches[switch] = False
    return switches


def cmake_args(flags: frozenset[str] | None = None, machine: str | None = None) -> str:
    """The ``CMAKE_ARGS`` value for this CPU (or for ``flags``), as one shell-ready string."""
    switches = cmake_switches(cpu_flags() if flags is None else flags, machine)
    return " ".join(f"-D{k}={'ON' if v else 'OFF'}" for k, v in switches.items())


def reported_features(flags: frozenset[str] | None = None) -> list[str]:
    """The decisive features this CPU has, in a fixed order (for error messages and benchmarks)."""
    flags = cpu_flags() if flags is None else flags
    return [f for f in REPORTED_FEATURES if f in flags]


def cpu_model_name(cpuinfo: str | None = None) -> str:
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return platform.processor() or platform.machine()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    return platform.processor() or platform.machine()


def reinstall_command(python: str = "python", args: str | None = None) -> str:
    """The exact command that rebuilds llama-cpp-python with safe flags for this CPU."""
    args = cmake_args() if args is None else args
    return (
        f"CMAKE_ARGS={shlex.quote(args)} {python} -m pip install --force-reinstall --no-deps "
        f"--no-cache-dir --no-binary llama-cpp-python llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"
    )


def build_key(args: str, version: str = LLAMA_CPP_PYTHON_VERSION, python_tag: str = "") -> str:
    text = json.dumps([version, args, python_tag or _python_tag(), platform.machine()])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _python_tag() -> str:
    return f"cp{sys.version_info.major}{sys.version_info.minor}"


def wheel_cache_dir() -> Path:
    root = os.environ.get(WHEEL_CACHE_ENV)
    return Path(root) if root else Path.home() / ".cache" / "memsteer-dspy" / "wheels"


def record_path(prefix: str | Path) -> Path:
    return Path(prefix) / "share" / "memsteer-dspy" / RECORD_NAME


def installed_build_record(prefix: str | Path | None = None) -> dict | None:
    """The flags llama-cpp-python was installed with by :func:`install` (None if installed otherwise)."""
    path = record_path(prefix or sys.prefix)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def ensure_wheel(python: str, args: str, *, version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    """The cached llama-cpp-python wheel built with ``args`` for ``python``, building it if missing."""
    tag = subprocess.run(
        [python, "-c", "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    cache = wheel_cache_dir() / f"llama_cpp_python-{version}-{build_key(args, version, tag)}"
    wheels = sorted(cache.glob("llama_cpp_python-*.whl"))
    if wheels:
        print(f"llama-cpp-python {version}: reusing {wheels[-1]} (CMAKE_ARGS={args!r})")
        return wheels[-1]
    print(f"building llama-cpp-python {version} with CMAKE_ARGS={args!r} (about 5 min on 2 cores)")
    cache.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache.parent, prefix=".build-") as tmp:
        env = dict(os.environ, CMAKE_ARGS=args, FORCE_CMAKE="1")
        subprocess.run(
            [
                python,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "--no-cache-dir",
                "--no-binary",
                "llama-cpp-python",
                "-w",
                tmp,
                f"llama-cpp-python=={version}",
            ],
            check=True,
            env=env,
        )
        built = sorted(Path(tmp).glob("llama_cpp_python-*.whl"))
        if not built:
            raise RuntimeError(f"pip wheel wrote no llama-cpp-python wheel in {tmp}")
        staged = Path(tmp) / "done"
        staged.mkdir()
        for wheel in built:
            wheel.rename(staged / wheel.name)
        os.replace(staged, cache)  # atomic: a killed build never leaves a half cache entry
    return sorted(cache.glob("llama_cpp_python-*.whl"))[-1]


def install(
    python: str, args: str | None = None, *, version: str = LLAMA_CPP_PYTHON_VERSION
) -> Path:
    """Build (or reuse the cached) llama-cpp-python wheel for ``args`` and install it into ``python``.

    Returns the wheel's path. Raises ``subprocess.CalledProcessError`` when pip fails.
    """
    args = cmake_args() if args is None else args
    wheels = [ensure_wheel(python, args, version=version)]
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheels[-1])],
        check=True,
    )
    prefix = subprocess.run(
        [python, "-c", "import sys; print(sys.prefix)"], check=True, capture_output=True, text=True
    ).stdout.strip()
    record = record_path(prefix)
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(
        json.dumps(
            {
                "llama_cpp_python": version,
                "cmake_args": args,
                "cpu_model": cpu_model_name(),
                "cpu_features": reported_features(),
                "wheel": str(wheels[-1]),
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    return wheels[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Safe llama.cpp build flags for this CPU.")
    parser.add_argument("--explain", action="store_true", help="also print the CPU features used")
    parser.add_argument("--install", action="store_true", help="build/install llama-cpp-python")
    parser.add_argument("--python", default=sys.executable, help="interpreter to install into")
    parser.add_argument(
        "--plain-avx2", action="store_true", help="use the portable AVX2 baseline flags instead"
    )
    ns = parser.parse_args(argv)
    args = PLAIN_AVX2_ARGS if ns.plain_avx2 else cmake_args()
    if ns.explain:
        print(f"cpu: {cpu_model_name()}")
        print(f"features: {' '.join(reported_features()) or '(none read)'}")
    if ns.install:
        install(ns.python, args)
    else:
        print(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
