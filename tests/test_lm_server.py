"""Server LMs (``openai/<alias>`` + ``api_base``) against an in-process OpenAI-compatible endpoint.

What a user who points a role at vLLM / llama-server / llama-cpp-python's server relies on:
the signature's JSON schema reaches the server (so output parses on the first try), the cache
never mixes two servers, a server that fails fails one call (after the configured retries), never
silently, `memsteer lm check` names a wrong endpoint or alias, keys stay out of every output,
and dollar cost is booked where LiteLLM's price map knows the model. The real server
(llama-cpp-python's, on the embedded model) is exercised in ``test_lm_server_integration.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import dspy
import pytest
from script_helpers import argv

from memsteer_dspy.lm import LMSpec, build_lm, load_lm_config
from memsteer_dspy.lm.check import check_lms, format_check_table
from memsteer_dspy.lm.endpoint import EndpointError, served_entry
from memsteer_dspy.lm.fake_server import FakeOpenAIServer, example_for
from memsteer_dspy.lm.usage import UsageMeter, cost_of

KEY = "sk-test-never-print-me-0123456789"


class Reply(dspy.Signature):
    """Answer the question."""

    question: str = dspy.InputField()
    answer: str = dspy.OutputField()
    count: int = dspy.OutputField()
    sure: bool = dspy.OutputField()
    names: list[str] = dspy.OutputField()


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)


@pytest.fixture
def memory_cache():
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=True)
    yield
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)


def server_lm(server: FakeOpenAIServer, role: str = "answerer", **options):
    options.setdefault("num_retries", 0)
    return build_lm(
        LMSpec(model=f"openai/{server.alias}", api_base=server.api_base, **options), role=role
    )


def predict(lm, question: str = "How many?"):
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        return dspy.Predict(Reply)(question=question)


# ---------------------------------------------------------------------------------------------
# structured outputs
# ---------------------------------------------------------------------------------------------


def test_the_signature_schema_reaches_the_server_and_parses_on_the_first_call():
    with FakeOpenAIServer(alias="qwen-server") as server:
        out = predict(server_lm(server))
    assert len(server.requests) == 1  # parsed on the first try: no JSON-mode retry
    fmt = server.requests[0]["response_format"]
    assert fmt["type"] == "json_schema"
    schema = fmt["json_schema"]["schema"]
    assert set(schema["required"]) == {"answer", "count", "sure", "names"}
    assert schema["properties"]["count"]["type"] == "integer"
    assert (out.answer, out.count, out.sure, out.names) == ("x", 0, True, [])


def test_without_the_fix_dspy_sends_no_schema_to_an_unknown_alias():
    """The trap the fix removes: plain DSPy knows nothing of a server alias and sends no schema."""
    with FakeOpenAIServer(alias="qwen-server") as server:
        lm = dspy.LM(f"openai/{server.alias}", api_base=server.api_base, num_retries=0, cache=False)
        with (
            pytest.raises(Exception, match="parse"),
            dspy.context(lm=lm, adapter=dspy.JSONAdapter()),
        ):
            dspy.Predict(Reply)(question="How many?")
    assert all("schema" not in json.dumps(r.get("response_format") or {}) for r in server.requests)


def test_llama_cpp_python_servers_get_the_schema_in_their_json_object_form():
    """llama-cpp-python's server refuses OpenAI's json_schema type; it is recognised by its model list."""
    info = {"owned_by": "me", "permissions": []}
    with FakeOpenAIServer(alias="qwen-server", model_info=info) as server:
        out = predict(server_lm(server))
    fmt = server.requests[0]["response_format"]
    assert fmt["type"] == "json_object" and set(fmt["schema"]["properties"]) == {
        "answer",
        "count",
        "sure",
        "names",
    }
    assert out.count == 0


def test_structured_output_option_overrides_the_choice(tmp_path):
    with FakeOpenAIServer(alias="m") as server:
        toml = tmp_path / "memsteer.toml"
        toml.write_text(
            f'[lm]\ndefault = "openai/m"\n[lm.options."openai/m"]\napi_base = "{server.api_base}"\n'
            'structured_output = "json_object"\nnum_retries = 0\n'
        )
        cfg = load_lm_config(toml, env={})
        assert cfg.spec("judge").structured_output == "json_object"
        with (
            pytest.raises(Exception, match="parse"),
            dspy.context(lm=cfg.lm("judge"), adapter=dspy.JSONAdapter()),
        ):
            dspy.Predict(Reply)(question="q")  # the fake answers {} without a schema
    assert server.requests[0]["response_format"] == {"type": "json_object"}
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[lm]\ndefault = "openai/m"\n[lm.options."openai/m"]\nstructured_output = "grammar"\n'
    )
    with pytest.raises(Exception, match="structured_output"):
        load_lm_config(bad, env={})


def test_example_for_satisfies_nested_schemas():
    from pydantic import BaseModel

    class Fact(BaseModel):
        span: str
        weight: float

    class Plan(BaseModel):
        facts: list[Fact]
        kind: str | None
        mode: str = "a"

    value = example_for(Plan.model_json_schema())
    Plan.model_validate(value)


# ---------------------------------------------------------------------------------------------
# cache identity
# ---------------------------------------------------------------------------------------------


def test_two_servers_under_one_alias_never_share_cache_entries(memory_cache):
    with FakeOpenAIServer(alias="same") as a, FakeOpenAIServer(alias="same") as b:
        predict(server_lm(a))
        predict(server_lm(b))
        lm_a = server_lm(a)
        predict(lm_a)
    assert (
        len(a.requests) == 1 and len(b.requests) == 1
    )  # b was asked; a's answer came from the cache
    assert lm_a.meter.by_role()["answerer"]["cache_hits"] == 1
    tags = {r["metadata"]["memsteer_endpoint"] for r in a.requests + b.requests}
    assert tags == {a.api_base, b.api_base}


def test_a_restarted_server_with_another_model_at_the_same_address_misses_the_cache(memory_cache):
    with FakeOpenAIServer(alias="same", model_info={"root": "/models/qwen-1.5b"}) as server:
        predict(server_lm(server))
        server.model_info = {"root": "/models/qwen-7b"}  # what a restart on another model says
        predict(server_lm(server))
        predict(server_lm(server))
    assert len(server.requests) == 2
    models = [r["metadata"]["memsteer_model"] for r in server.requests]
    assert models[0] != models[1]


# ---------------------------------------------------------------------------------------------
# robustness at the boundary
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("failure", ["http500", "truncated"])
def test_a_failing_server_is_retried_then_the_call_fails(failure):
    with FakeOpenAIServer(alias="m", failures=dict.fromkeys((1, 2), failure)) as server:
        lm = server_lm(server, num_retries=1)
        with pytest.raises(Exception):  # noqa: B017 - any LM error; callers record it per item
            predict(lm)
        assert len(server.requests) == 2  # the call and one retry
        usage = lm.meter.by_role()["answerer"]
        assert usage["errors"] == 1 and usage["cache_hits"] == 0
        out = predict(lm)  # the server recovers: the next call works
    assert out.sure is True and len(server.requests) == 3


def test_a_retry_after_one_http_500_succeeds():
    with FakeOpenAIServer(alias="m", failures={1: "http500"}) as server:
        out = predict(server_lm(server, num_retries=2))
    assert out.count == 0 and len(server.requests) == 2


def test_a_server_that_does_not_answer_in_time_fails_the_call():
    with FakeOpenAIServer(alias="m", failures={1: "hang"}) as server:
        lm = server_lm(server, timeout=0.5)
        with pytest.raises(Exception, match="(?i)time"):
            predict(lm)
    assert lm.meter.by_role()["answerer"]["errors"] == 1


def test_a_server_that_is_down_fails_the_call():
    with FakeOpenAIServer(alias="m") as server:
        base = server.api_base
    lm = build_lm(LMSpec(model="openai/m", api_base=base, num_retries=0), role="judge")
    with pytest.raises(Exception):  # noqa: B017
        predict(lm)
    assert lm.meter.by_role()["judge"]["errors"] == 1


# ---------------------------------------------------------------------------------------------
# lm check names the endpoint
# ---------------------------------------------------------------------------------------------


def test_lm_check_names_a_wrong_endpoint_and_a_wrong_alias():
    with FakeOpenAIServer(alias="qwen-server") as server:
        good = LMSpec(model="openai/qwen-server", api_base=server.api_base, num_retries=0)
        wrong_alias = LMSpec(model="openai/qwen", api_base=server.api_base, num_retries=0)
        wrong_path = LMSpec(
            model="openai/qwen-server", api_base=server.api_base[: -len("/v1")], num_retries=0
        )
        from memsteer_dspy.lm import LMConfig
        from memsteer_dspy.lm.config import ROLES

        specs = dict.fromkeys(ROLES, good)
        specs["judge"], specs["proposer"] = wrong_alias, wrong_path
        results = {r.roles[0]: r for r in check_lms(LMConfig(specs))}
        port = server.api_base.rsplit(":", 1)[1].split("/")[0]
    dead = LMSpec(model="openai/qwen-server", api_base=f"http://127.0.0.1:{port}/v1", num_retries=0)
    dead_result = check_lms(LMConfig(dict.fromkeys(ROLES, dead)))[0]
    assert results["planner"].ok and results["planner"].output["answer"] == "x"
    assert (
        not results["judge"].ok and "does not serve a model named 'qwen'" in results["judge"].error
    )
    assert "'qwen-server'" in results["judge"].error
    assert not results["proposer"].ok and "HTTP 404" in results["proposer"].error
    assert server.api_base[: -len("/v1")] + "/models" in results["proposer"].error
    assert not dead_result.ok and "cannot reach the endpoint" in dead_result.error
    assert f"127.0.0.1:{port}/v1/models" in dead_result.error
    table = format_check_table([*results.values(), dead_result])
    assert KEY not in table


def test_served_entry_redacts_credentials_in_the_url():
    with FakeOpenAIServer(alias="m") as server:
        base = server.api_base.replace("http://", "http://user:hunter2@")
        with pytest.raises(EndpointError) as err:
            served_entry(base, "other")
    assert "hunter2" not in str(err.value) and "'m'" in str(err.value)


# ---------------------------------------------------------------------------------------------
# cost
# ---------------------------------------------------------------------------------------------


def test_cost_is_booked_where_litellm_prices_the_model_and_unpriced_elsewhere():
    import litellm

    expected_in, expected_out = litellm.cost_per_token(
        model="openai/gpt-4o-mini", prompt_tokens=1000, completion_tokens=100
    )
    assert cost_of("openai/gpt-4o-mini", 1000, 100) == pytest.approx(expected_in + expected_out)
    assert cost_of("openai/gpt-4o-mini", 1000, 100) > 0
    assert cost_of("openai/my-own-alias", 1000, 100) is None
    assert cost_of("local/qwen2.5-coder-1.5b", 1000, 100) is None
    meter = UsageMeter()
    meter.record_tokens(
        "judge", {"prompt_tokens": 1000, "completion_tokens": 100}, "openai/gpt-4o-mini"
    )
    meter.record_tokens("judge", {"prompt_tokens": 10, "completion_tokens": 1}, None)
    meter.record_tokens(
        "answerer", {"prompt_tokens": 10, "completion_tokens": 1}, "openai/my-own-alias"
    )
    by_role = meter.by_role()
    assert by_role["judge"]["cost_usd"] == pytest.approx(expected_in + expected_out)
    assert by_role["judge"]["unpriced_calls"] == 1
    assert by_role["answerer"]["cost_usd"] is None and by_role["answerer"]["unpriced_calls"] == 1
    assert meter.total()["cost_usd"] == pytest.approx(expected_in + expected_out)


def test_a_server_alias_that_happens_to_be_a_priced_name_is_not_priced():
    with FakeOpenAIServer(alias="gpt-4o-mini") as server:
        lm = server_lm(server)
        predict(lm)
    usage = lm.meter.by_role()["answerer"]
    assert (
        usage["cost_usd"] is None and usage["unpriced_calls"] == 1 and usage["prompt_tokens"] == 20
    )


# ---------------------------------------------------------------------------------------------
# keys
# ---------------------------------------------------------------------------------------------


def test_the_key_goes_to_the_server_and_nowhere_else():
    with FakeOpenAIServer(alias="m") as server:
        lm = server_lm(server)
        predict(lm)
    assert server.headers[0]["authorization"] == f"Bearer {KEY}"
    assert KEY not in json.dumps(lm.dump_state(), default=str)
    assert KEY not in json.dumps(lm.history, default=str)
    assert all(KEY not in json.dumps(r) for r in server.requests)  # not in the body or metadata


# ---------------------------------------------------------------------------------------------
# the commands on a server: concurrency, exact books, failures that stay with their item
# ---------------------------------------------------------------------------------------------

DEMO = Path(__file__).resolve().parent.parent / "memsteer_dspy" / "data" / "demo"


def server_config(server: FakeOpenAIServer, tmp_path: Path, **options) -> Path:
    lines = [
        "[lm]",
        f'default = "openai/{server.alias}"',
        f'[lm.options."openai/{server.alias}"]',
        f'api_base = "{server.api_base}"',
    ]
    lines += [f"{k} = {json.dumps(v)}" for k, v in options.items()]
    path = tmp_path / "server.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def run_cli(*args: str) -> dict:
    from typer.testing import CliRunner

    from memsteer_dspy.cli import app

    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    assert KEY not in result.output
    return json.loads(result.stdout[result.stdout.index("{") :])


def test_evaluate_with_threads_overlaps_requests_and_keeps_exact_books(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with FakeOpenAIServer(alias="m", delay=0.2) as server:
        toml = server_config(server, tmp_path, num_retries=0)
        out = tmp_path / "eval"
        report = run_cli(
            *argv("evaluate --format jsonl --path {} --limit 6", DEMO),
            *argv("--threads 4 --out {} --config {} --no-cache", out, toml),
        )
    items = [json.loads(line) for line in (out / "items.jsonl").read_text().splitlines()]
    assert (
        sorted(i["qa_id"] for i in items) == sorted({i["qa_id"] for i in items}) and len(items) == 6
    )
    assert all(i["error"] is None for i in items)
    usage = report["lm_usage"]
    assert usage["answerer"]["calls"] == 6
    assert sum(u["calls"] for u in usage.values()) == len(server.requests)
    assert sum(u["prompt_tokens"] for u in usage.values()) == 20 * len(server.requests)
    assert server.max_in_flight > 1  # requests ran at the same time
    assert KEY not in "".join(p.read_text() for p in out.rglob("*.json*"))


@pytest.mark.parametrize("failure", ["http500", "truncated"])
def test_a_failing_server_fails_items_never_the_run(tmp_path, monkeypatch, failure):
    monkeypatch.chdir(tmp_path)
    with FakeOpenAIServer(alias="m", failures=dict.fromkeys(range(1, 500), failure)) as server:
        toml = server_config(server, tmp_path, num_retries=1, timeout=0.5)
        gen = tmp_path / "gen"
        summary = run_cli(
            *argv("generate --format jsonl --path {} --out {}", DEMO, gen),
            *argv("--n 1 --max-candidates 2 --threads 2 --config {}", toml),
        )
        generate_requests = len(server.requests)
        ev = tmp_path / "eval"
        report = run_cli(
            *argv("evaluate --format jsonl --path {} --limit 2", DEMO),
            *argv("--out {} --config {} --no-cache", ev, toml),
        )
    rejected = [json.loads(line) for line in (gen / "rejected.jsonl").read_text().splitlines()]
    assert summary["candidates"] == 2 and len(rejected) == 2
    assert {r["reason"] for r in rejected} == {"lm_error"}
    planner = summary["lm_usage_by_role"]["planner"]
    assert planner["errors"] >= 2 and planner["prompt_tokens"] == 0
    assert (
        generate_requests == 2 * planner["errors"]
    )  # every call was tried twice (num_retries = 1)
    items = [json.loads(line) for line in (ev / "items.jsonl").read_text().splitlines()]
    assert len(items) == 2 and all(i["error"] for i in items)
    assert report["errors"] == 2 if "errors" in report else report["summary"]["errors"] == 2


def test_keys_stay_out_of_run_folders_and_mlflow_and_url_credentials_are_refused(
    tmp_path, monkeypatch
):
    import sqlite3

    from typer.testing import CliRunner

    from memsteer_dspy.cli import app

    monkeypatch.chdir(tmp_path)
    with FakeOpenAIServer(alias="m") as server:
        out = tmp_path / "opt"
        args = [
            *argv("optimize --format jsonl --path {} --supervision official", DEMO),
            *argv("--objective recall --iterations 1 --proposer-output changes"),
            *argv("--out {} --no-cache --lm openai/m", out),
        ]
        run_cli(
            *args,
            *argv("--api-base {}", server.api_base),
            *argv("--tracking-uri {}", f"sqlite:///{tmp_path / 'mlflow.db'}"),
        )
        assert server.requests and server.headers[0]["authorization"] == f"Bearer {KEY}"
        credentialed = server.api_base.replace("//", "//user:hunter2@")
        refused = CliRunner().invoke(
            app, [*args[:-5], "--out", str(tmp_path / "o2"), *args[-3:], "--api-base", credentialed]
        )
    assert refused.exit_code == 2 and "holds credentials" in refused.output
    assert "hunter2" not in refused.output and "OPENAI_API_KEY" in refused.output
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        rows = [
            " ".join(map(str, row))
            for table in ("params", "tags", "metrics")
            for row in db.execute(f"select * from {table}")  # noqa: S608 - fixed table names
        ]
    assert rows and not [r for r in rows if KEY in r]
    leaked = [p for p in out.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
    assert not leaked, leaked


def test_the_api_base_flag_serves_the_openai_lms_named_on_the_command_line(tmp_path):
    toml = tmp_path / "m.toml"
    toml.write_text(
        '[lm.roles]\nauditor = "openai/file-model"\n[lm.options."openai/file-model"]\napi_base = "http://file:1/v1"\n'
    )
    cfg = load_lm_config(
        toml,
        lm="openai/a",
        role_lms={"judge": "local/qwen2.5-coder-1.5b", "auditor": "openai/file-model"},
        env={},
        api_base="http://h:1/v1",
    )
    assert cfg.spec("planner").api_base == "http://h:1/v1" and cfg.spec("planner").on_server
    assert cfg.spec("auditor").api_base == "http://h:1/v1"  # the flag beats the file
    assert cfg.spec("judge").api_base is None  # the embedded model takes no endpoint
    assert (
        load_lm_config(toml, env={}, api_base="http://h:1/v1").spec("auditor").api_base
        == "http://file:1/v1"
    )


def test_optimize_costs_carry_dollars_and_keep_unpriced_apart():
    """The optimizer's per-iteration cost (trajectory, summary.json, MLflow ``cost_usd``) takes
    the dollar delta of priced roles from the usage meter; an unpriced role adds nothing, and a
    cost with no priced call at all stays None (not $0)."""
    from memsteer_dspy.optimize.loop import Cost, _usage_delta

    before = {
        "judge": {"calls": 1, "total_tokens": 10, "cost_usd": 0.25},
        "answerer": {"calls": 2, "total_tokens": 20, "cost_usd": None},
    }
    after = {
        "judge": {"calls": 3, "total_tokens": 30, "cost_usd": 1.0},
        "answerer": {"calls": 5, "total_tokens": 50, "cost_usd": None},
    }
    delta = _usage_delta(before, after)
    assert delta.calls == 5 and delta.total_tokens == 50
    assert delta.cost_usd == pytest.approx(0.75)
    assert delta.by_role["judge"]["cost_usd"] == pytest.approx(0.75)
    assert "cost_usd" not in delta.by_role["answerer"]
    unpriced = _usage_delta({}, {"answerer": {"calls": 1, "total_tokens": 9}})
    assert unpriced.cost_usd is None
    total = Cost().plus(unpriced).plus(delta).plus(delta)
    assert total.cost_usd == pytest.approx(1.5) and total.by_role["judge"][
        "cost_usd"
    ] == pytest.approx(1.5)
    assert Cost().plus(unpriced).cost_usd is None
    assert "$1.5000" in total.short()


def test_running_llama_server_stops_the_server_however_the_block_ends(monkeypatch, tmp_path):
    """The benchmarks' server is stopped when the block ends, raises, or the process gets SIGTERM
    (an injection run killed mid-way left llama_cpp.server running, holding both cores), and the
    process's SIGTERM handler is restored after."""
    import os
    import signal

    import memsteer_dspy.lm.serve as serve

    stopped: list[int] = []

    class Server:
        def __init__(self, n):
            self.n = n

        def stop(self):
            stopped.append(self.n)

    started = iter(range(3))
    monkeypatch.setattr(serve, "start_llama_server", lambda gguf, log, **kw: Server(next(started)))
    before = signal.getsignal(signal.SIGTERM)
    with serve.running_llama_server(tmp_path / "m.gguf", tmp_path) as server:
        assert server.n == 0
    with pytest.raises(RuntimeError), serve.running_llama_server(tmp_path / "m.gguf", tmp_path):
        raise RuntimeError("a role failed")
    with pytest.raises(SystemExit) as ended, serve.running_llama_server(tmp_path / "m", tmp_path):
        os.kill(os.getpid(), signal.SIGTERM)
    assert ended.value.code == 128 + signal.SIGTERM
    assert stopped == [0, 1, 2] and signal.getsignal(signal.SIGTERM) == before


def test_a_package_s_llm_endpoint_is_the_given_url_or_the_embedded_model_for_the_block(
    tmp_path, monkeypatch
):
    """llm_endpoint: what Ragas, Mem0 and A-Mem are pointed at — a given URL with OpenAI's schema
    form, else the embedded model served for the life of the stack, in the form llama.cpp binds."""
    import contextlib
    from types import SimpleNamespace

    from memsteer_dspy.lm import serve

    with contextlib.ExitStack() as stack:
        given = serve.llm_endpoint(stack, tmp_path / "logs", api_base="http://h:1/v1", model="m")
    assert given == {"api_base": "http://h:1/v1", "model": "m", "schema_form": "json_schema"}
    assert not (tmp_path / "logs").exists()  # nothing started, nothing written

    events = []

    @contextlib.contextmanager
    def fake_server(log_dir, *, n_ctx):
        events.append(("start", log_dir, n_ctx))
        yield SimpleNamespace(api_base="http://127.0.0.1:9/v1")
        events.append(("stop",))

    monkeypatch.setattr(serve, "embedded_model_server", fake_server)
    with contextlib.ExitStack() as stack:
        local = serve.llm_endpoint(stack, tmp_path / "logs", model="ignored", n_ctx=16384)
        assert events == [("start", tmp_path / "logs", 16384)]
    assert events[-1] == ("stop",)  # stopped with the block
    assert local == {
        "api_base": "http://127.0.0.1:9/v1",
        "model": serve.ALIAS,
        "schema_form": "json_object",
    }
    assert (tmp_path / "logs").is_dir()
