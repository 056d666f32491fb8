"""``memsteer lm check``: which LM serves each role, and one tiny structured call per distinct LM."""

from typing import Annotated

import typer

from memsteer_dspy.cli.common import cli_errors, echo_json, lm_options
from memsteer_dspy.lm.check import check_lms, format_check_table

lm_app = typer.Typer(help="Inspect and test the LM of each role.", no_args_is_help=True)


@lm_app.command("check")
@cli_errors
@lm_options
def check(
    lm_config,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print JSON instead of a table.")
    ] = False,
) -> None:
    """Print the LM of each role and make one tiny structured call per distinct LM (latency, tokens)."""
    results = check_lms(lm_config)
    if json_out:
        echo_json(
            {
                "roles": lm_config.describe(),
                "checks": [
                    r.model_dump() if hasattr(r, "model_dump") else r.__dict__ for r in results
                ],
            }
        )
    else:
        typer.echo("\n".join(f"{role:15s} {model}" for role, model in lm_config.describe().items()))
        typer.echo(format_check_table(results))
    if any(not getattr(r, "ok", True) for r in results):
        raise typer.Exit(1)
