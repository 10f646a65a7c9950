"""`lumobench bench ...`: the project's benchmarks (`bench_app`); each lives in lumobench/bench/."""

from __future__ import annotations

import typer

from lumobench.bench.client.command import client_command
from lumobench.bench.engine import engine_command
from lumobench.bench.kernels.command import kernels_command
from lumobench.bench.prefill import prefill_command

bench_app = typer.Typer(help="Benchmarks (client overhead, kernels, engine, prefill).", no_args_is_help=True)
bench_app.command("client")(client_command)
bench_app.command("kernels")(kernels_command)
bench_app.command("engine")(engine_command)
bench_app.command("prefill")(prefill_command)
