"""The LM-dependent defaults of MemSteer-Opt (:mod:`memsteer_dspy.optimize.defaults`): the
resolver's table, the CLI's ``resolved:`` line, and that a folder written before resumes."""

from __future__ import annotations

import json

import pytest
from optimize_fixtures import ProposerLM
from script_helpers import argv
from test_optimize_cli import history_dir  # noqa: F401  (fixture)
from typer.testing import CliRunner

from memsteer_dspy.cli import app
from memsteer_dspy.optimize.defaults import PAPER, SMALL_PROPOSER, resolve_defaults

NONE = dict.fromkeys(PAPER)


@pytest.mark.parametrize(
    ("proposer", "answerer", "paper", "expected"),
    [
        (True, True, False, {**SMALL_PROPOSER, "objective": "recall"}),
        # an API answerer can carry accuracy; selecting on training items needs recall, so val
        (True, False, False, {**SMALL_PROPOSER, "objective": "accuracy", "val_from": "val"}),
        (False, True, False, {**PAPER, "objective": "recall"}),
        (False, False, False, PAPER),
        (True, True, True, PAPER),
        (False, False, True, PAPER),
    ],
)
def test_the_resolver_picks_the_setting_by_where_the_lms_run(proposer, answerer, paper, expected):
    r = resolve_defaults(
        NONE, proposer_in_process=proposer, answerer_in_process=answerer, paper=paper
    )
    assert r.values == expected and r.auto == tuple(PAPER)
    assert r.setting == ("small-proposer" if proposer and not paper else "paper")
    assert r.line().startswith(f"resolved: {r.setting} setting, ")
    if paper:
        assert r.reason == "because --paper was given"
    else:
        assert ("proposer runs in-process" in r.reason) == proposer


def test_explicit_values_win_over_auto_and_paper():
    given = {
        "objective": "accuracy",
        "accept": "strict",
        "guard": ["recall_at_5"],
        "feedback_tokens": 800,
    }
    for paper in (False, True):
        r = resolve_defaults(given, proposer_in_process=True, answerer_in_process=True, paper=paper)
        assert {k: r.values[k] for k in given} == given
        assert set(r.auto) == set(PAPER) - set(given)
    r = resolve_defaults(given, proposer_in_process=True, answerer_in_process=True)
    # the rest is the small-proposer setting, but an explicit accuracy objective keeps val_from val
    assert r.values["proposer_output"] == "changes" and r.values["val_from"] == "val"
    assert "--accept" not in r.flags() and "--proposer-output changes" in r.flags()
    everything = resolve_defaults(
        SMALL_PROPOSER | {"objective": "recall"},
        proposer_in_process=False,
        answerer_in_process=False,
    )
    assert everything.values == SMALL_PROPOSER | {"objective": "recall"}
    assert everything.auto == () and everything.line() == "resolved: every setting given explicitly"
    with pytest.raises(ValueError, match="iterations"):
        resolve_defaults({"iterations": 3}, proposer_in_process=True, answerer_in_process=True)


def test_the_resolved_lists_are_copies():
    r = resolve_defaults(NONE, proposer_in_process=True, answerer_in_process=True)
    r.values["guard"].append("accuracy")
    assert SMALL_PROPOSER["guard"] == ["recall_at_10"]


@pytest.fixture
def lm_where(monkeypatch):
    """--lm/--config resolve to a scripted LMConfig; ``holder["in_process"]`` says whether its
    roles count as in-process (only the defaults read it)."""
    import memsteer_dspy.lm as lm_pkg
    from memsteer_dspy.lm import LMConfig

    holder = {"in_process": False}

    def load(config=None, lm=None, role_lms=None):
        cfg = LMConfig.uniform("openai/gpt-4o-mini")
        cfg.set_lm("proposer", ProposerLM([]))
        cfg.in_process = lambda *roles: holder["in_process"]
        return cfg

    monkeypatch.setattr(lm_pkg, "load_lm_config", load)
    return holder


def _args(history_dir, out):  # noqa: F811
    folder, sup, design = history_dir
    return [
        *argv("optimize --format jsonl --path {}", folder),
        *argv("--supervision {} --out {} --init-design {}", sup, out, design),
        *argv("--no-tracking --no-cache --iterations 0 --test-fraction 0"),
    ]


def test_the_cli_prints_and_records_the_resolved_setting(history_dir, lm_where, tmp_path):  # noqa: F811
    lm_where["in_process"] = True
    out = tmp_path / "small"
    res = CliRunner().invoke(app, [*_args(history_dir, out), "--json"])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("resolved: "))
    assert "small-proposer setting" in line and "because the proposer runs in-process" in line
    assert (
        "--proposer-output changes --feedback-tokens 1200 --accept paired --guard recall_at_10"
        in line
    )
    run = json.loads((out / "run.json").read_text())
    options = run["key"]["options"]
    # the key holds the resolved values, never "auto" (a resume that resolves differently is refused)
    assert options["objective"] == "recall" and options["proposer_output"] == "changes"
    assert options["max_eval_lm_calls"] == 0 and options["guard_margin"] == 0.02
    assert "resolved" not in options and run["resolved"] == line
    assert json.loads((out / "summary.json").read_text())["resolved"] == line
    report = json.loads(res.stdout[res.stdout.index("{") :])
    assert report["resolved"] == line and report["objective"] == "recall"
    # the same folder under an API LM resolves to the paper's setting: refused, the field named
    lm_where["in_process"] = False
    res = CliRunner().invoke(app, _args(history_dir, out))
    assert res.exit_code != 0 and "objective" in res.output
    # --paper on the in-process LM prints why
    lm_where["in_process"] = True
    res = CliRunner().invoke(app, [*_args(history_dir, tmp_path / "paper"), "--paper"])
    assert res.exit_code == 0, res.output
    assert "resolved: paper setting, --objective accuracy --proposer-output design" in res.output
    assert "because --paper was given" in res.output


def test_a_folder_written_before_resumes_with_its_flags(history_dir, lm_where, tmp_path):  # noqa: F811
    """A run folder written by the code before the defaults (OptimizeConfig's own defaults, no
    ``resolved``) resumes under the CLI with the flags it was run with."""
    from memsteer_dspy.loaders import load_history
    from memsteer_dspy.memory import MemoryDesign
    from memsteer_dspy.optimize import MemSteerOpt, OptimizeConfig
    from memsteer_dspy.optimize.splits import read_supervision

    folder, sup, design = history_dir
    out = tmp_path / "old"
    import memsteer_dspy.lm as lm_pkg

    cfg = lm_pkg.load_lm_config()
    train, val = read_supervision(str(sup))
    old = OptimizeConfig(iterations=0, objective="recall", protocol="full")
    assert old.resolved is None
    MemSteerOpt(
        load_history("jsonl", folder).history,
        train,
        val,
        out,
        config=old,
        lms=cfg.lm,
        init_design=MemoryDesign.load(design),
    ).run()
    key = json.loads((out / "run.json").read_text())["key"]
    res = CliRunner().invoke(app, [*_args(history_dir, out), "--objective", "recall"])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "run.json").read_text())["key"] == key
    # on an in-process LM the unset options resolve to the small-proposer setting: refused, named
    lm_where["in_process"] = True
    res = CliRunner().invoke(app, [*_args(history_dir, out), "--objective", "recall"])
    assert res.exit_code != 0 and "options.proposer_output: folder has 'design'" in res.output


class _Where:
    """An LM config that only says whether its roles run in-process."""

    def __init__(self, in_process: bool):
        self._in_process = in_process

    def in_process(self, *roles: str) -> bool:
        return self._in_process


def test_the_demo_resolves_its_optimization_by_the_lms():
    from memsteer_dspy.demo import SIZES, demo_settings

    full, r = SIZES["full"].resolve(_Where(True))
    assert full.objective == "recall" and r.setting == "small-proposer"
    assert r.values["feedback_tokens"] == 3000  # the size's own budget is given, not auto
    full, r = SIZES["full"].resolve(_Where(False))
    assert (
        full.objective == "accuracy"
        and r.setting == "paper"
        and full.identity()
        == {
            **SIZES["full"].identity(),
            "objective": "accuracy",
        }
    )
    small, r = SIZES["small"].resolve(_Where(True))
    assert small.objective == "recall" and r.values["val_from"] == "train+val"
    # a demo folder written before `paper` existed has no such field in its identity
    assert "paper" not in SIZES["small"].identity()
    paper = demo_settings("small", paper=True)
    assert paper.identity()["paper"] is True and paper.resolve(_Where(True))[1].setting == "paper"
