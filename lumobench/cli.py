"""The `lumobench` command line: one Typer sub-app per noun, verbs as commands.

The sub-apps that compute with torch (`bench`, `verify`) are imported only when one of their commands
runs (or the top-level help lists them): every other command (agent, record, replay, ...) starts
without importing torch.
"""

from __future__ import annotations

import importlib
from typing import Annotated

import click
import typer
from typer.core import TyperGroup

from lumobench import __version__
from lumobench.agent.cli import agent_command, evaluate_command, record_command, select_command
from lumobench.commands.corpus import corpus_app
from lumobench.commands.replay import replay
from lumobench.commands.serve import serve
from lumobench.reports.command import report

#: sub-app name -> (module, Typer app attribute, one-line help), imported only when run
LAZY_APPS = {
    "bench": (
        "lumobench.commands.bench",
        "bench_app",
        "Every benchmark: kernels, engine, client, cycle, loop (torch).",
    ),
    "verify": ("lumobench.checks", "app", "LumoTree's numerical checks (torch)."),
}


class LazyGroup(TyperGroup):
    """The root command group: the `LAZY_APPS` join the eagerly registered commands.

    A help listing sees a placeholder carrying the one-line help; the real sub-app (and torch) is
    imported only when a command resolves to it.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*super().list_commands(ctx), *LAZY_APPS]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in LAZY_APPS:
            return super().get_command(ctx, cmd_name)
        return click.Group(cmd_name, help=LAZY_APPS[cmd_name][2])

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] in LAZY_APPS:
            module, attr, _ = LAZY_APPS[args[0]]
            group = typer.main.get_group(getattr(importlib.import_module(module), attr))
            group.name = args[0]
            return args[0], group, args[1:]
        return super().resolve_command(ctx, args)


app = typer.Typer(
    name="lumobench",
    cls=LazyGroup,
    help="Benchmark and agent-workload replay harness for LumoTree, vLLM and SGLang.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
app.add_typer(corpus_app, name="corpus")
app.command("serve")(serve)
app.command("replay")(replay)
app.command("report")(report)


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
