"""The commands against a real OpenAI-compatible server, exactly as a user points them at one.

llama-cpp-python's server runs the embedded model on 127.0.0.1 (``tests/lm_server_fixtures.py``);
every command gets ``--config <toml>`` whose LM is ``openai/qwen-server`` with that ``api_base``:
``memsteer lm check``, a one-candidate ``memsteer generate`` with mixed roles (the embedded planner
in-process, every other role on the server), ``memsteer evaluate`` with answers and the judge,
two iterations of ``memsteer optimize``, ``experiments/main.py --preset tiny`` with
``experiments/configs/llama-cpp-server.toml``, and a second server process under the same alias for
cache identity. ``integration``: a 1.5B model on the CPU, a few minutes in all.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import dspy
import pytest
from lm_server_fixtures import ALIAS, start_llama_server
from script_helpers import argv
from typer.testing import CliRunner

from memsteer_dspy.cli import app

pytestmark = pytest.mark.integration

# Timed on 2 cores (Intel Xeon, AVX-512 llama.cpp build): experiments/main.py --preset tiny through the
# server 388 s (while another test run shared the cores); generate + evaluate + optimize 8 min 12 s
# on the fresh-clone check of the previous session. All of them run in `make test`.

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "memsteer_dspy" / "data" / "demo"
KEY = "sk-integration-secret-key-0000"


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)  # the server ignores it; it must never be written out
    monkeypatch.delenv("MEMSTEER_LM", raising=False)
    monkeypatch.delenv("MEMSTEER_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)


def server_toml(server, tmp_path: Path) -> Path:
    path = tmp_path / "server.toml"
    path.write_text(server.toml())
    return path


def invoke(*args: str) -> dict:
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout[result.stdout.index("{") :])


def no_key_in(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file() and path.stat().st_size < 50_000_000:
            assert KEY.encode() not in path.read_bytes(), f"the API key leaked into {path}"


def test_lm_check_through_the_server_and_a_wrong_alias(llama_server, tmp_path):
    toml = server_toml(llama_server, tmp_path)
    report = invoke("lm", "check", "--config", str(toml))
    (check,) = report["checks"]
    assert check["ok"], check
    assert check["model"] == f"openai/{ALIAS}" and set(check["roles"]) == set(report["roles"])
    assert check["prompt_tokens"] > 0 and check["output"]["answer"]
    wrong = CliRunner().invoke(
        app,
        argv(
            "lm check --config {} --lm-judge openai/qwen --api-base {}", toml, llama_server.api_base
        ),
    )
    assert wrong.exit_code == 1
    assert (
        f"{llama_server.api_base}" in wrong.output
        and "does not serve a model named 'qwen'" in wrong.output
    )
    assert KEY not in wrong.output


def test_generate_evaluate_optimize_against_the_server(llama_server, tmp_path):
    toml = server_toml(llama_server, tmp_path)
    gen = tmp_path / "gen"
    # mixed roles: the embedded model plans in-process, the server does everything else (one
    # candidate, one thread: two llama.cpp engines at once on 2 cores only slow each other down;
    # concurrency against a server is tested on the fake endpoint in test_lm_server.py)
    summary = invoke(
        *argv("generate --format jsonl --path {} --out {} --n 1 --max-candidates 1", DEMO, gen),
        *argv("--config {} --lm-planner local/qwen2.5-coder-1.5b --profile small", toml),
    )
    usage = summary["lm_usage_by_role"]
    assert usage["planner"]["calls"] >= 1 and usage["planner"]["errors"] == 0
    outcomes = [
        json.loads(line)
        for name in ("train.jsonl", "val.jsonl", "rejected.jsonl")
        if (gen / name).exists()
        for line in (gen / name).read_text().splitlines()
    ]
    assert len(outcomes) == summary["candidates"] == 1  # the run folder holds the candidate once
    lm_errors = [o for o in outcomes if o.get("reason") == "lm_error"]
    assert not lm_errors, lm_errors  # every server role parsed (structured outputs)

    ev = tmp_path / "eval"
    report = invoke(
        *argv("evaluate --format jsonl --path {} --limit 2", DEMO),
        *argv("--out {} --config {} --no-cache", ev, toml),
    )
    items = [json.loads(line) for line in (ev / "items.jsonl").read_text().splitlines()]
    assert len(items) == 2 and all(i["error"] is None for i in items), items
    assert (
        report["lm_usage"]["answerer"]["calls"] == 2
        and report["lm_usage"]["answerer"]["errors"] == 0
    )
    assert report["lm_usage"]["answerer"]["cost_usd"] is None  # a server alias is never priced
    assert report["lms"]["judge"] == f"openai/{ALIAS}"

    opt = tmp_path / "opt"
    result = invoke(
        *argv("optimize --format jsonl --path {} --supervision official", DEMO),
        *argv("--objective recall --iterations 2 --proposer-output changes"),
        *argv("--feedback-tokens 600 --out {} --config {} --no-cache", opt, toml),
        *argv("--tracking-uri {}", f"sqlite:///{tmp_path / 'mlflow.db'}"),
    )
    lines = (opt / "trajectory.jsonl").read_text().splitlines()
    assert [json.loads(line)["iteration"] for line in lines] == [0, 1, 2]
    assert result["lm_usage"]["proposer"]["calls"] >= 2
    for folder in (gen, ev, opt):
        no_key_in(folder)
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        params = db.execute("select key, value from params").fetchall()
    assert params and not [p for p in params if KEY in p[1]]


def test_two_servers_under_one_alias_never_share_cached_answers(
    llama_server, embedded_gguf, tmp_path
):
    from memsteer_dspy.lm import LMSpec, build_lm
    from memsteer_dspy.lm.check import TinyCheck

    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=True)
    other = start_llama_server(embedded_gguf, tmp_path, n_ctx=2048)  # same alias, other settings
    try:
        lms = [
            build_lm(
                LMSpec(model=f"openai/{ALIAS}", api_base=s.api_base, max_tokens=32), role="judge"
            )
            for s in (llama_server, other, llama_server)
        ]
        for lm in lms:
            with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
                dspy.Predict(TinyCheck)(question="Capital of Italy?")
    finally:
        other.stop()
        dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
    assert other.process.poll() is not None  # stopped by its PID
    first, second, again = (lm.meter.by_role()["judge"] for lm in lms)
    assert first["cache_hits"] == 0 and first["prompt_tokens"] > 0
    assert second["cache_hits"] == 0 and second["prompt_tokens"] > 0  # the other server was asked
    assert (
        again["cache_hits"] == 1 and again["prompt_tokens"] == 0
    )  # the same server: from the cache


def test_experiments_main_tiny_with_the_server_config(llama_server, rhelm_root, tmp_path):
    import importlib.util
    import sys

    shipped = (REPO / "experiments" / "configs" / "llama-cpp-server.toml").read_text()
    assert 'api_base = "http://127.0.0.1:8080/v1"' in shipped
    config = tmp_path / "server-tiny.toml"
    config.write_text(
        shipped.replace("http://127.0.0.1:8080/v1", llama_server.api_base)
        # smaller than the tiny preset: one setting, two test items, two candidates, MemSteer
        # supervision only (every generation role on the server)
        .replace(
            "[dataset]\n",
            '[main]\nsources = ["memsteer"]\n\n[dataset]\nsettings = ["without"]\neval_items = 2\n',
        )
        .replace(
            "[budgets]\n",
            "[budgets]\nsupervision = 2\nmax_candidates = 2\nofficial_train = 2\nofficial_val = 1\n",
        )
    )
    sys.path.insert(0, str(REPO / "experiments"))
    try:
        spec = importlib.util.spec_from_file_location(
            "exp_main_server", REPO / "experiments" / "main.py"
        )
        main = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(main)
        import _common

        cfg = _common.load_config(config, "tiny", overrides={"dataset": {"rhelm_root": rhelm_root}})
        out = tmp_path / "main"
        results_md = main.run(cfg, out, tracking=True, progress=False)
    finally:
        sys.path.remove(str(REPO / "experiments"))
    text = Path(results_md).read_text()
    assert "Base-BM25" in text and "+ MemSteer" in text
    assert (out / "without" / "supervision" / "Elena_Morales" / "summary.json").exists()
    results = json.loads((out / "results.json").read_text())
    assert results["personas"] == ["Elena_Morales"]
    no_key_in(out)
