"""The `lumobench` command line: one Typer sub-app per noun, verbs as commands."""

from __future__ import annotations

from typing import Annotated

import typer

from lumobench import __version__
from lumobench.agent.cli import agent_command, evaluate_command, record_command, select_command
from lumobench.commands.bench import bench_app
from lumobench.commands.corpus import corpus_app
from lumobench.commands.replay import replay
from lumobench.commands.report import report
from lumobench.commands.serve import serve
from lumobench.verify import app as verify_app

app = typer.Typer(
    name="lumobench",
    help="Benchmark and agent-workload replay harness for LumoTree, vLLM and SGLang.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
app.add_typer(corpus_app, name="corpus")
app.add_typer(bench_app, name="bench")
app.command("serve")(serve)
app.command("replay")(replay)
app.command("report")(report)
app.add_typer(verify_app, name="verify")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"lumobench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Benchmark and agent-workload replay harness for LumoTree, vLLM and SGLang."""


app.command("agent")(agent_command)
app.command("evaluate")(evaluate_command)
app.command("record")(record_command)
corpus_app.command("select")(select_command)


def main() -> None:
    """Entry point of the `lumobench` console script."""
    app()


if __name__ == "__main__":
    main()
