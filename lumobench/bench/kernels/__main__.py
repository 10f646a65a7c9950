"""`python -m lumobench.bench.kernels ...`: the same as `lumobench bench kernels ...` (device runs
call it so; the command line recorded in kernels.json is the `lumobench bench kernels` form)."""

import typer

from lumobench.bench.kernels.command import kernels_command

typer.run(kernels_command)
