"""The demo history shipped inside the package, and its hand-written evaluation set.

The demo is one fictional user's unlabeled history: Nora Whitfield, a product manager in Portland,
Oregon, over February to June 2025. It mixes conversation sessions with her assistant, email
threads with replies, and three documents with sections, and it is written so that retrieval is
not trivial: facts combine across records (a plan in a chat, its date changed by email, its cost
in a document), later records supersede earlier ones, and near-miss distractors (two trips, two
contractors, two prices, two dental offices) sit beside the right answer.

``qa.jsonl`` beside it is the official evaluation set of the demo: hand-written QA items with
evidence record ids. It is for evaluation only, never for optimization; supervision for the demo
is generated from ``records.jsonl`` like for any other user. ``data/demo/README.md`` describes
both.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from memsteer_dspy.errors import ConfigError
from memsteer_dspy.loaders.base import Loaded
from memsteer_dspy.loaders.jsonl import load_jsonl

__all__ = ["DEMO_USER", "demo_path", "load_demo"]

DEMO_USER = "nora-whitfield"
"""The user id of the demo history."""


def demo_path() -> Path:
    """The folder holding the demo's ``records.jsonl``, ``qa.jsonl`` and ``README.md``."""
    folder = resources.files("memsteer_dspy") / "data" / "demo"
    if not isinstance(folder, Path):
        # Only a zipped install (zipimport) gives a non-filesystem Traversable.
        raise ConfigError(
            f"the demo data is not on the file system ({folder!r}); "
            "install memsteer-dspy as a regular or editable package (pip install memsteer-dspy)"
        )
    if not (folder / "records.jsonl").is_file():
        raise ConfigError(
            f"the demo history is missing from the installed package (looked in {folder}); "
            "reinstall memsteer-dspy, and from a checkout check that pyproject.toml's "
            "[tool.setuptools.package-data] ships data/**/*"
        )
    return folder


def load_demo() -> Loaded:
    """The demo history and its hand-written QA items, loaded with the native JSONL loader."""
    return load_jsonl(demo_path(), user=DEMO_USER)
