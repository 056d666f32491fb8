"""The llama.cpp build flags chosen per CPU, and the crash-safe child-process preflight."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memsteer_dspy.lm import buildflags, preflight
from memsteer_dspy.lm.preflight import LocalModelCrashError, ensure_preflight, run_preflight

XEON_AMX = (
    "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz\n"
    "flags\t\t: fpu sse4_2 avx avx2 fma f16c bmi2 avx_vnni avx512f avx512cd avx512vl avx512dq "
    "avx512bw avx512vbmi avx512_vnni avx512_bf16 amx_tile amx_int8 amx_bf16\n"
)
EPYC_AVX2 = "model name\t: AMD EPYC\nflags\t\t: fpu sse4_2 avx avx2 fma f16c bmi2 sha_ni\n"


def _switches(cpuinfo: str, machine: str = "x86_64") -> dict[str, bool]:
    return buildflags.cmake_switches(buildflags.cpu_flags(cpuinfo), machine)


def test_amx_is_off_even_on_a_cpu_that_has_it_and_avx512_follows_the_cpu():
    amx = _switches(XEON_AMX)
    assert amx["GGML_NATIVE"] is False
    assert not any(amx[s] for s in ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"))
    assert amx["GGML_AVX512"] and amx["GGML_AVX512_VNNI"] and amx["GGML_AVX512_BF16"]
    assert amx["GGML_AVX_VNNI"] and amx["GGML_AVX2"]

    epyc = _switches(EPYC_AVX2)
    assert epyc["GGML_AVX2"] and epyc["GGML_FMA"] and epyc["GGML_F16C"] and epyc["GGML_BMI2"]
    # an AVX-512 build dies with SIGILL on a CPU without it
    assert not any(v for k, v in epyc.items() if k.startswith("GGML_AVX512"))
    assert not epyc["GGML_AVX_VNNI"]


def test_avx512_needs_its_companion_extensions():
    partial = (
        "flags: avx avx2 fma f16c avx512f avx512_vnni\n"  # no bw/dq/vl/cd: llama.cpp needs them
    )
    assert not _switches(partial)["GGML_AVX512"]
    assert not _switches(partial)["GGML_AVX512_VNNI"]


def test_cmake_args_render_every_switch_and_keep_native_default_off_x86():
    args = buildflags.cmake_args(buildflags.cpu_flags(XEON_AMX), "x86_64")
    assert "-DGGML_NATIVE=OFF" in args and "-DGGML_AMX_INT8=OFF" in args
    assert "-DGGML_AVX512=ON" in args
    assert buildflags.cmake_switches(frozenset({"asimd"}), "aarch64") == {}
    assert buildflags.cmake_args(frozenset({"asimd"}), "aarch64") == ""


def test_reinstall_command_pins_the_version_and_bypasses_pips_wheel_cache():
    cmd = buildflags.reinstall_command("/venv/bin/python", "-DGGML_NATIVE=OFF -DGGML_AVX2=ON")
    assert cmd.startswith("CMAKE_ARGS='-DGGML_NATIVE=OFF -DGGML_AVX2=ON' /venv/bin/python -m pip")
    assert f"llama-cpp-python=={buildflags.LLAMA_CPP_PYTHON_VERSION}" in cmd
    assert "--no-cache-dir" in cmd and "--no-binary llama-cpp-python" in cmd


def test_build_key_changes_with_flags_and_version():
    a = buildflags.build_key("-DGGML_AVX2=ON", "0.3.36", "cp311")
    assert a == buildflags.build_key("-DGGML_AVX2=ON", "0.3.36", "cp311")
    assert a != buildflags.build_key("-DGGML_AVX2=OFF", "0.3.36", "cp311")
    assert a != buildflags.build_key("-DGGML_AVX2=ON", "0.3.35", "cp311")


def test_pyproject_pins_the_verified_llama_cpp_python():
    text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert f'"llama-cpp-python=={buildflags.LLAMA_CPP_PYTHON_VERSION}"' in text


# -- the preflight, with stand-in children -------------------------------------------------------

SEGFAULT = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]


def _counting(tmp_path: Path, body: str) -> list[str]:
    """A child that appends a line to ``calls.txt`` (so tests count runs) and then runs ``body``."""
    counter = tmp_path / "calls.txt"
    code = f"open({str(counter)!r}, 'a').write('x\\n'); {body}"
    return [sys.executable, "-c", code]


def _calls(tmp_path: Path) -> int:
    path = tmp_path / "calls.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF not really")
    return path


def test_a_child_killed_by_sigsegv_is_reported_with_signal_cpu_and_reinstall_command(model_file):
    result = run_preflight(model_file, command=SEGFAULT)
    assert not result.ok
    assert result.signal == "SIGSEGV" and result.returncode == -11
    message = result.error
    assert "crashed with SIGSEGV" in message
    assert "CPU:" in message and "features:" in message
    assert "CMAKE_ARGS=" in message and "-DGGML_NATIVE=OFF" in message
    assert f"llama-cpp-python=={buildflags.LLAMA_CPP_PYTHON_VERSION}" in message
    assert "nothing of yours was lost" in message
    assert not (model_file.parent / (model_file.name + preflight.PREFLIGHT_SUFFIX)).exists()


def test_a_failing_child_that_exits_is_reported_with_its_status(model_file):
    result = run_preflight(model_file, command=[sys.executable, "-c", "raise SystemExit(3)"])
    assert not result.ok and result.signal is None
    assert "exited with status 3" in result.error


def test_ensure_preflight_raises_once_per_process_and_never_remembers_a_crash(
    model_file, tmp_path, monkeypatch
):
    monkeypatch.setattr(preflight, "_FAILED", {})
    crash = _counting(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    monkeypatch.setattr(preflight, "child_command", lambda path: crash)
    with pytest.raises(LocalModelCrashError, match="SIGSEGV") as info:
        ensure_preflight(model_file)
    assert info.value.result.signal == "SIGSEGV"
    with pytest.raises(LocalModelCrashError, match="SIGSEGV"):
        ensure_preflight(model_file)
    assert _calls(tmp_path) == 1  # the second caller got the answer without another child


def test_a_pass_is_remembered_next_to_the_model_and_keyed_by_cpu_features(
    model_file, tmp_path, monkeypatch
):
    monkeypatch.setattr(preflight, "_FAILED", {})
    ok = _counting(tmp_path, 'print(\'{"prompt_tokens": 31, "completion_tokens": 6}\')')
    monkeypatch.setattr(preflight, "child_command", lambda path: ok)
    first = ensure_preflight(model_file)
    assert first.ok and not first.cached and first.prompt_tokens == 31
    record = json.loads((model_file.parent / (model_file.name + ".preflight.json")).read_text())
    assert record["ok"] and record["key"] == first.key
    second = ensure_preflight(model_file)
    assert second.cached and _calls(tmp_path) == 1
    # another CPU (say the clone moved to an AMX Xeon) must be checked again
    monkeypatch.setattr(buildflags, "reported_features", lambda flags=None: ["avx2", "amx_int8"])
    third = ensure_preflight(model_file)
    assert not third.cached and _calls(tmp_path) == 2


def test_the_model_loader_runs_the_preflight_before_loading_in_process(model_file, monkeypatch):
    pytest.importorskip("llama_cpp")
    from memsteer_dspy.lm import local

    monkeypatch.setattr(preflight, "_FAILED", {})
    monkeypatch.setattr(preflight, "child_command", lambda path: SEGFAULT)
    with pytest.raises(LocalModelCrashError, match="SIGSEGV"):
        local._load(model_file, 512, 1, 64)
    assert not any(key[0] == str(model_file) for key in local._MODELS)


def test_lm_check_reports_a_crashing_build_instead_of_dying(model_file, monkeypatch):
    from memsteer_dspy.cli import app

    monkeypatch.setattr(preflight, "child_command", lambda path: SEGFAULT)
    result = CliRunner().invoke(app, ["lm", "check", "--lm", f"llamacpp/{model_file}"])
    assert result.exit_code == 1, result.output
    assert "FAIL" in result.output and "crashed with SIGSEGV" in result.output
    assert "--no-binary llama-cpp-python" in result.output


# -- the real build ------------------------------------------------------------------------------


def _cpu_libraries() -> list[Path]:
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llama-cpp-python is not installed (the local extra)")
    root = Path(next(iter(spec.submodule_search_locations)))
    libs = sorted(root.rglob("libggml-cpu*.so*")) or sorted(root.rglob("libggml*.so*"))
    if not libs:
        pytest.skip(f"no libggml shared library under {root}")
    return libs


@pytest.mark.integration
def test_the_installed_build_holds_no_amx_tile_instructions():
    if shutil.which("objdump") is None:
        pytest.skip("objdump (binutils) is not installed")
    for lib in _cpu_libraries():
        disasm = subprocess.run(
            ["objdump", "-d", "--no-show-raw-insn", str(lib)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert disasm, lib
        for insn in ("tileloadd", "tdpbssd", "ldtilecfg"):
            assert insn not in disasm, f"{lib.name} holds AMX instruction {insn}"


@pytest.mark.integration
def test_real_preflight_decodes_the_embedded_model_in_a_child():
    pytest.importorskip("llama_cpp")
    from memsteer_dspy.lm.model_files import ensure_embedded_model

    path = ensure_embedded_model("qwen2.5-coder-1.5b")
    result = run_preflight(path, remember=False)
    assert result.ok, result.error
    assert result.prompt_tokens > 8 and result.completion_tokens >= 1
    assert result.system_info and "AMX_INT8 = 1" not in result.system_info
