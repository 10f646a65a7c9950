"""Helpers for the harness tests: free ports, the CLI as a subprocess, small corpora, the scripted
server as a process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "corpora" / "demo.jsonl"


def processes_with(*args: str) -> list[int]:
    """Pids of the processes whose command line holds every one of `args` (whole arguments)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if all(a.encode() in argv for a in args):
                found.append(int(entry.name))
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def lumobench(
    *args: str | Path, timeout: float = 120, env: dict[str, str] | None = None, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    """Run the CLI in a fresh process (as a user would), capturing its output; `env` adds variables."""
    return subprocess.run(
        [sys.executable, "-m", "lumobench.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        env=None if env is None else {**os.environ, **env},
    )


def small_corpus(tmp_path: Path, n: int, max_tokens: int = 16) -> Path:
    """The first n demo records with a smaller max_tokens, as a new corpus file."""
    lines = DEMO.read_text().splitlines()[:n]
    out = tmp_path / "small.jsonl"
    out.write_text("".join(json.dumps(json.loads(x) | {"max_tokens": max_tokens}) + "\n" for x in lines))
    return out


@contextmanager
def scripted_server(tmp_path: Path, api_key: str | None = None, **script: object) -> Iterator[str]:
    """Run `lumobench.bench.client.scripted_server` with `script`; yield its base URL once it listens."""
    port = free_port()
    script_path = tmp_path / f"script-{port}.json"
    script_path.write_text(json.dumps(script))
    command = [sys.executable, "-m", "lumobench.bench.client.scripted_server", "--port", str(port)]
    command += ["--script", str(script_path)] + (["--api-key", api_key] if api_key else [])
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait()
