"""`python -m lumobench.vllm_cpu --help` is help: the build it would start takes minutes and gigabytes.
(That the environment holds what `vllm bench serve --dataset-name custom` imports is proven by
tests/server/test_outside_clients.py, which runs it.)"""

from __future__ import annotations

import subprocess
import sys
import time

from lumobench.vllm_cpu import VENV_DIR
from lumobench.vllm_cpu.env import MARKER

from .helpers import REPO


def _marker_state() -> float | None:
    marker = VENV_DIR / MARKER
    return marker.stat().st_mtime if marker.exists() else None


def test_help_prints_usage_and_builds_nothing() -> None:
    before = _marker_state()
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "lumobench.vllm_cpu", "--help"],
        capture_output=True, text=True, timeout=60, cwd=REPO, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m lumobench.vllm_cpu")
    assert "vllm-cpu env:" not in proc.stdout + proc.stderr  # no build step ran
    assert time.monotonic() - start < 30 and _marker_state() == before
