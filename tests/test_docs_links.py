"""No stale reference in the README or the docs: every link resolves, every repository path they
name exists, and every ``memsteer <command>`` they show is a command of the CLI."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    ROOT / "experiments" / "README.md",
    *sorted((ROOT / "experiments" / "results").glob("*.md")),
]
TOP = (
    "memsteer_dspy/",
    "docs/",
    "experiments/",
    "tests/",
    "benchmarks/",
    "examples/",
    "signatures/",
    ".ci/",
)
ROOT_FILES = {"Makefile", "pyproject.toml", "memsteer.example.toml", "mkdocs.yml", "README.md"}
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
COMMAND = re.compile(r"(?:^|[\s`(])memsteer ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?")
PLACEHOLDER = re.compile(r"[<>{}*$]|\.\.\.|…|/N\b|-N\b|NNN|-K\b")


def _ids(paths):
    return [str(p.relative_to(ROOT)) for p in paths]


def _repo_paths(text: str) -> set[str]:
    """Inline-code spans that name a file or folder of the repository."""
    out = set()
    for span in CODE.findall(text):
        token = span.split()[0] if span.split() else ""
        token = token.rstrip(".,;:)").split("::")[0].split("#")[0]
        if PLACEHOLDER.search(token):
            continue
        if token.startswith(TOP) or token in ROOT_FILES:
            out.add(token)
    return out


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_link_and_named_path_exists(page):
    text = page.read_text(encoding="utf-8")
    missing = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        if not path.exists():
            missing.append(f"link {target}")
    for name in _repo_paths(text):
        if not (ROOT / name.rstrip("/")).exists():
            missing.append(f"path {name}")
    assert not missing, f"{page.relative_to(ROOT)} names what is not there: {missing}"


def _commands() -> dict[str, set[str]]:
    import typer

    from memsteer_dspy.cli import app

    group = typer.main.get_command(app)
    out = {}
    for name, cmd in group.commands.items():
        out[name] = set(getattr(cmd, "commands", {}) or {})
    return out


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_memsteer_command_shown_exists(page):
    text = page.read_text(encoding="utf-8")
    commands = _commands()
    shown = [
        m for block in [*FENCE.findall(text), *CODE.findall(text)] for m in COMMAND.findall(block)
    ]
    unknown = []
    for cmd, sub in shown:
        if cmd not in commands:
            unknown.append(cmd)
        elif commands[cmd] and sub and sub not in commands[cmd] and not sub.startswith("-"):
            unknown.append(f"{cmd} {sub}")
    assert not unknown, (
        f"{page.relative_to(ROOT)} shows commands the CLI lacks: {sorted(set(unknown))}"
    )


def test_the_readme_is_what_a_new_user_reads_first():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300
    heads = [ln for ln in lines if ln.startswith("## ")]
    for want in (
        "## Install",
        "## Quick start",
        "## LM configuration",
        "## Concepts",
        "## Development",
    ):
        assert want in heads
