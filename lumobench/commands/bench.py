"""`lumobench bench ...`: benchmarks of lumobench's own parts (`bench_app`)."""

from __future__ import annotations

import typer

from lumobench.bench.client import client_command
from lumobench.bench.kernels import kernels_command

bench_app = typer.Typer(help="Benchmarks (client overhead, kernels).", no_args_is_help=True)
bench_app.command("client")(client_command)
bench_app.command("kernels")(kernels_command)
