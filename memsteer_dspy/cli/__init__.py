"""The ``memsteer`` command line. Each command lives in its own module; this one builds the app."""

from __future__ import annotations

import typer

from memsteer_dspy.cli.batch import batch_app
from memsteer_dspy.cli.demo import demo
from memsteer_dspy.cli.evaluate import evaluate
from memsteer_dspy.cli.export import export
from memsteer_dspy.cli.generate import assess, generate
from memsteer_dspy.cli.ingest import ingest
from memsteer_dspy.cli.lm import lm_app
from memsteer_dspy.cli.optimize import optimize, tune_prompts
from memsteer_dspy.cli.report import report

app = typer.Typer(
    name="memsteer",
    help=(
        "MemSteer: turn a user's unlabeled history into verified QA-evidence supervision and "
        "optimize their agent-memory design. Run 'memsteer COMMAND --help' for each command."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.command()(demo)
app.command()(ingest)
app.command()(generate)
app.command()(assess)
app.command()(evaluate)
app.command()(optimize)
app.command("tune-prompts")(tune_prompts)
app.command()(report)
app.command()(export)
app.add_typer(lm_app, name="lm")
app.add_typer(batch_app, name="batch")


def main() -> None:  # pragma: no cover - console entry point
    app()
