"""The harness's numerical checks of LumoTree (paper §VII-D..G, DESIGN §8), run as `lumobench verify`.

Beside the checks: the paired error rule (`paired.py`) and the random draft trees (`random_trees.py`)
that the checks, the kernel benchmarks and the tests use. LumoTree's verification kernels are
`lumotree.verify`, a different thing.
"""

from __future__ import annotations

import json
from typing import Annotated

import torch
import typer
from rich.console import Console
from rich.progress import Progress

from lumobench.checks.components import DEFAULT, FULL, suite
from lumobench.checks.result import render_table

app = typer.Typer(help="Numerical validation of LumoTree components.", no_args_is_help=True)


@app.command()
def components(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the results as JSON instead of a table.")
    ] = False,
    full: Annotated[
        bool,
        typer.Option("--full", help="Full sizes: paper GDN shapes, 200,000 walks per audit step (minutes)."),
    ] = False,
    seed: Annotated[int, typer.Option(help="Seed of every random case.")] = 0,
) -> None:
    """Run the component checks and print check | cases | passed | faults planted | faults detected.

    Exits non-zero if any case fails or any planted fault goes undetected.
    """
    # The checks are many small tensor ops: extra OpenMP threads only add synchronisation, and they
    # stall badly on a shared CPU (measured: 1.8 s single-threaded vs 34 s with 2 threads under load).
    torch.set_num_threads(1)
    console = Console(stderr=as_json)
    checks = suite(FULL if full else DEFAULT, seed)
    results = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("component checks", total=len(checks))
        for name, run in checks:
            progress.update(task, description=name)
            results.append(run())
            progress.advance(task)
    if as_json:
        typer.echo(json.dumps([r.as_dict() for r in results], indent=2))
    else:
        render_table(results, console)
    failed = [r.check for r in results if not r.ok]
    if failed:
        console.print(f"[red]failed: {', '.join(failed)}[/red]")
        raise typer.Exit(1)
