"""No network on the defaults (issue #13): with every non-loopback socket blocked, ``ingest``,
``generate``, ``evaluate``, ``optimize`` and ``demo`` run at their smallest sizes (scripted LMs,
the real bm25 index, the real MLflow sqlite store for the demo)."""

from __future__ import annotations

import ipaddress
import json
import socket

import pytest
from memory_fixtures import small_history, small_qa
from script_helpers import argv
from scripted_roles import NARROW, config_loader, role_lms
from test_supervision_run import laptop_history
from typer.testing import CliRunner

from memsteer_dspy.cli import app
from memsteer_dspy.memory import MemoryDesign


class NetworkBlocked(RuntimeError):
    pass


def _loopback(address) -> bool:
    if isinstance(address, str | bytes):  # AF_UNIX path
        return True
    host = address[0]
    if host in ("localhost", "", None):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@pytest.fixture
def no_network(monkeypatch):
    """Every connection to a non-loopback address, and every name lookup of a remote host, raises."""
    attempts: list[str] = []
    real_connect, real_connect_ex, real_getaddrinfo = (
        socket.socket.connect,
        socket.socket.connect_ex,
        socket.getaddrinfo,
    )

    def connect(self, address):
        if not _loopback(address):
            attempts.append(repr(address))
            raise NetworkBlocked(f"network access blocked in this test: connect to {address!r}")
        return real_connect(self, address)

    def connect_ex(self, address):
        if not _loopback(address):
            attempts.append(repr(address))
            raise NetworkBlocked(f"network access blocked in this test: connect to {address!r}")
        return real_connect_ex(self, address)

    def getaddrinfo(host, *args, **kwargs):
        if not _loopback((host,)):
            attempts.append(f"getaddrinfo {host}")
            raise NetworkBlocked(f"network access blocked in this test: lookup of {host!r}")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    return attempts


def _patch_lms(monkeypatch, lms):
    import memsteer_dspy.lm as lm_pkg

    monkeypatch.setattr(lm_pkg, "load_lm_config", config_loader(lms))


def test_blocked_connections_raise(no_network):
    with pytest.raises(NetworkBlocked):
        socket.create_connection(("example.org", 443), timeout=1)
    assert no_network


def test_every_command_runs_without_network(no_network, tmp_path, monkeypatch):
    runner = CliRunner()
    # ingest + generate on a small history
    hist = tmp_path / "laptop.jsonl"
    hist.write_text("".join(r.model_dump_json() + "\n" for r in laptop_history(6).records))
    res = runner.invoke(app, ["ingest", "--format", "jsonl", "--path", str(hist), "--json"])
    assert res.exit_code == 0, res.output
    _patch_lms(monkeypatch, role_lms("generate"))
    res = runner.invoke(
        app,
        [
            *argv("generate --format jsonl --path {} --out {}", hist, tmp_path / "gen"),
            *argv("--n 2 --max-candidates 4 --max-demos 0 --json"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "gen" / "summary.json").read_text())["candidates"] >= 1

    # evaluate (answers + judge) and optimize on the memory fixture
    folder = tmp_path / "hist"
    folder.mkdir()
    (folder / "records.jsonl").write_text(
        "".join(r.model_dump_json() + "\n" for r in small_history().records)
    )
    (folder / "qa.jsonl").write_text("".join(q.to_json() + "\n" for q in small_qa()))
    _patch_lms(monkeypatch, role_lms("optimize"))
    res = runner.invoke(
        app,
        [
            *argv("evaluate --format jsonl --path {}", folder),
            *argv("--out {} --metrics all --no-cache --json", tmp_path / "eval"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["n"] == 4
    sup = tmp_path / "sup"
    sup.mkdir()
    (sup / "train.jsonl").write_text("".join(q.to_json() + "\n" for q in small_qa()))
    # validation items under ids of their own (a train/val overlap is refused)
    val = [q.model_copy(update={"id": f"{q.id}-val"}) for q in small_qa()[:3]]
    (sup / "val.jsonl").write_text("".join(q.to_json() + "\n" for q in val))
    design = tmp_path / "narrow.json"
    MemoryDesign.from_dict(NARROW).save(design)
    res = runner.invoke(
        app,
        [
            *argv("optimize --format jsonl --path {} --supervision {}", folder, sup),
            *argv("--out {} --objective recall", tmp_path / "opt"),
            *argv("--init-design {} --iterations 1 --no-cache", design),
            *argv("--tracking-uri {}", f"sqlite:///{tmp_path / 'mlflow.db'}"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert len((tmp_path / "opt" / "trajectory.jsonl").read_text().splitlines()) == 2
    assert not no_network, no_network


def test_demo_runs_without_network(no_network, tmp_path):
    from test_demo import TINY, engine_for_demo, scripted_config

    from memsteer_dspy.demo import run_demo

    result = run_demo(
        tmp_path / "demo", scripted_config(engine_for_demo()), settings=TINY, progress=False
    )
    assert [r.label for r in result.rows][0] == "Base-BM25"
    assert result.tracking_uri and result.tracking_uri.startswith("sqlite")
    assert not no_network, no_network
