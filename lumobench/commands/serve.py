"""`lumobench serve ARM`: run one arm in the foreground until Ctrl-C."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Annotated

import typer

from lumobench.arms import check_launchable, load_arm, resolve_arm
from lumobench.errors import interrupt_on_signals, user_errors
from lumobench.launch import ArmServer
from lumobench.results import new_run_id


def _follow(path: Path, stop: threading.Event) -> None:
    """Print the server log as it grows (the server writes to the file; we echo it)."""
    with path.open("rb") as fh:
        fh.seek(0, 2)
        while not stop.is_set():
            line = fh.readline()
            if line:
                typer.echo(line.decode(errors="replace"), nl=False)
            else:
                time.sleep(0.1)


def serve(
    arm: Annotated[
        str, typer.Argument(help="Arm name (serving/arms/NAME.toml) or path to an arm TOML file.")
    ],
    port: Annotated[
        int | None,
        typer.Option(min=0, max=65535, help="Listen on this port instead of the arm's (0: pick a free one)."),
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model path or name instead of the arm's.")] = None,
    log: Annotated[
        Path | None, typer.Option(help="Server log file (default results/serve-<arm>-<time>.log).")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="Do not echo the server log.")] = False,
) -> None:
    """Start one arm in the foreground and keep it up until Ctrl-C, which stops it and its children."""
    with user_errors():
        config, source = load_arm(arm)
        resolved = resolve_arm(config, source, port=port, model=model)
        check_launchable(resolved)
    if port == 0:
        typer.secho(f"arm {config.name}: picked free port {resolved.port}", err=True)
    log = log or Path("results") / f"serve-{new_run_id(config.name)}.log"
    server = ArmServer(resolved, log)
    interrupt_on_signals()
    stop = threading.Event()
    with user_errors():
        server.start()
    if not quiet:
        threading.Thread(target=_follow, args=(log, stop), daemon=True).start()
    code: int | None = None
    try:
        with user_errors(exit_code=1):
            served = server.wait_ready()
        typer.secho(
            f"arm {config.name} ready at {resolved.base_url} (model {served}); log {log}; Ctrl-C stops it",
            fg="green",
            err=True,
        )
        while (code := server.exit_code()) is None:
            time.sleep(0.5)
        typer.secho(f"arm {config.name} exited with code {code}", fg="red", err=True)
    except KeyboardInterrupt:
        typer.echo(f"stopping arm {config.name}", err=True)
    finally:
        stop.set()
        server.stop()
    if code is not None:
        raise typer.Exit(1)
