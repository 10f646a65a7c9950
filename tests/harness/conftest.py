"""Fixtures for the harness tests: scripted-server arms, the CLI in this process."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from lumobench.cli import app

from .helpers import free_port


@pytest.fixture
def scripted_arm(tmp_path: Path) -> Callable[..., Path]:
    """Write an arm TOML that launches the scripted SSE server with the given script keys."""

    def make(name: str = "scripted", arm_fields: str = "", **script: object) -> Path:
        """`arm_fields`: extra top-level TOML (e.g. 'memory_gb = 0.1') or tables before [readiness]."""
        script_path = tmp_path / f"{name}.script.json"
        script_path.write_text(json.dumps(script))
        arm = tmp_path / f"{name}.toml"
        arm.write_text(
            f'engine = "scripted"\nport = {free_port()}\n'
            f'command = ["{{python}}", "-m", "lumobench.bench.client.scripted_server", "--port", "{{port}}", '
            f'"--script", "{script_path}"]\n'
            f"{arm_fields}\n"
            "[readiness]\ntimeout_s = 30\n"
            "[request]\nstream_options = { continuous_usage_stats = true }\n"
        )
        return arm

    return make


@pytest.fixture
def cli() -> Iterator[Callable[..., Result]]:
    """The CLI in this process (a fresh one costs seconds of imports); replay's signal handlers are
    put back afterwards."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    runner = CliRunner()
    yield lambda *args: runner.invoke(app, [str(a) for a in args])
    for sig, handler in saved.items():
        signal.signal(sig, handler)
