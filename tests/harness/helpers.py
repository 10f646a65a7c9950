"""Helpers for the harness tests: free ports, the CLI as a subprocess, small corpora."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "corpora" / "demo.jsonl"


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
