"""A real `python -m lumotree.server` process for the integration tests (lumobench's launcher starts
and stops it: own process group, log file, SIGTERM then SIGKILL)."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from harness.helpers import free_port

from lumobench.arms import ArmConfig, resolve_arm
from lumobench.launch import ArmServer, log_tail

STARTUP_S = 180.0
#: the context of the session's shared server (`live_url`): the demo corpus has prompts of ~4,700 tokens
LIVE_MAX_LEN = 8192


@contextmanager
def lumotree_server(log: Path, *args: str) -> Iterator[str]:
    """Start the server with `args`, wait for /health, yield its base URL; assert a clean exit."""
    config = ArmConfig(
        name="lumotree-test",
        engine="lumotree",
        port=free_port(),
        command=["{python}", "-m", "lumotree.server", "--host", "{host}", "--port", "{port}", *args],
    )
    server = ArmServer(resolve_arm(config), log)
    server.start()
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            assert server.exit_code() is None, f"the server exited:\n{log_tail(log)}"
            assert time.monotonic() < deadline, f"the server was not healthy in time:\n{log_tail(log)}"
            try:
                if httpx.get(server.base_url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        yield server.base_url
    finally:
        code = server.stop()
    # uvicorn shuts down gracefully on SIGTERM, then re-raises it: -SIGTERM is a clean stop
    assert code in (0, -signal.SIGTERM), f"the server did not stop cleanly (exit {code}):\n{log_tail(log)}"
