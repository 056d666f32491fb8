"""The wheel must hold every sub-package: pyproject lists them explicitly (``signatures/`` is
mapped to ``memsteer_dspy.signatures``, which automatic discovery cannot express)."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_subpackage_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    on_disk = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "memsteer_dspy").rglob("__init__.py")
    }
    assert on_disk - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert (
        "memsteer_dspy.signatures" in listed
        and config["package-dir"]["memsteer_dspy.signatures"] == "signatures"
    )


def test_console_script_points_at_the_app():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"memsteer": "memsteer_dspy.cli:app"}
