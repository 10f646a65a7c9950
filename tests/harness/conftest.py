"""Fixtures for the harness tests: scripted-server arms."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from .helpers import free_port


@pytest.fixture
def scripted_arm(tmp_path: Path) -> Callable[..., Path]:
    """Write an arm TOML that launches the scripted SSE server with the given script keys."""

    def make(name: str = "scripted", **script: object) -> Path:
        script_path = tmp_path / f"{name}.script.json"
        script_path.write_text(json.dumps(script))
        arm = tmp_path / f"{name}.toml"
        arm.write_text(
            f'engine = "scripted"\nport = {free_port()}\n'
            f'command = ["{{python}}", "-m", "lumobench.bench.client.scripted_server", "--port", "{{port}}", '
            f'"--script", "{script_path}"]\n'
            "[readiness]\ntimeout_s = 30\n"
            "[request]\nstream_options = { continuous_usage_stats = true }\n"
        )
        return arm

    return make
