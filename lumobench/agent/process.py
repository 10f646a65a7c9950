"""Run a child process under a wall-clock budget and leave nothing of it behind.

The budget is enforced by ending the child's whole process group (SIGTERM, then SIGKILL after a grace
period). That is not enough for an agent: Qwen Code starts its shell commands detached (their own
session and group), so they survive a group kill. Every process of a run therefore carries a unique
marker in its environment, and after the run any process still carrying it is killed (Linux /proc).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MARKER_VAR = "LUMOBENCH_RUN_MARKER"


@dataclass(frozen=True)
class ProcessOutcome:
    """How a budgeted run ended: exit code (negative = killed by that signal), timeout flag, wall seconds,
    and how many leftover processes had to be killed after it ended."""

    exit_code: int
    timed_out: bool
    wall_s: float
    leftovers_killed: int


def _marked_pids(marker: bytes) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "environ").read_bytes():
                pids.append(int(entry.name))
        except OSError:  # exited meanwhile, or not ours
            continue
    return pids


def kill_marked(marker: str) -> int:
    """SIGKILL every process whose environment carries `MARKER_VAR=marker`; returns how many were found."""
    if not Path("/proc/self/environ").exists():
        return 0
    needle = f"{MARKER_VAR}={marker}".encode() + b"\0"
    killed: set[int] = set()
    for _ in range(20):  # a dying parent may still fork: sweep until nothing is left
        pids = [p for p in _marked_pids(needle) if _is_alive(p)]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        time.sleep(0.05)
    return len(killed)


def _is_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie is dead; its parent reaps it


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _wait(proc: subprocess.Popen[bytes], deadline: float, on_tick: Callable[[float], None] | None) -> None:
    """Wait for `proc` until the monotonic `deadline`; raises `subprocess.TimeoutExpired` past it."""
    start = time.monotonic()
    while True:
        remaining = deadline - time.monotonic()
        try:
            proc.wait(timeout=max(0.0, min(1.0, remaining)))
            return
        except subprocess.TimeoutExpired:
            if remaining <= 1.0:
                raise
        if on_tick is not None:
            on_tick(time.monotonic() - start)


def run_budgeted(
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    stdout: Path,
    stderr: Path,
    budget_s: float,
    grace_s: float = 2.0,
    on_tick: Callable[[float], None] | None = None,
) -> ProcessOutcome:
    """Run `argv` with stdin closed, output to files, in a new session; end it after `budget_s` seconds.

    On timeout the process group gets SIGTERM, then SIGKILL after `grace_s`. Afterwards (timeout,
    normal exit or Ctrl-C) every process that inherited this run's marker is killed. `on_tick` is
    called about once a second with the elapsed seconds (for progress displays).
    """
    marker = uuid.uuid4().hex
    start = time.monotonic()
    timed_out = False
    with stdout.open("wb") as out, stderr.open("wb") as err:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env={**env, MARKER_VAR: marker},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
        try:
            try:
                _wait(proc, start + budget_s, on_tick)
            except subprocess.TimeoutExpired:
                timed_out = True
                _signal_group(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    _signal_group(proc.pid, signal.SIGKILL)
                    proc.wait()
        finally:
            if proc.poll() is None:  # interrupted (Ctrl-C): take the agent down with us
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
            wall_s = time.monotonic() - start
            _signal_group(proc.pid, signal.SIGKILL)
            leftovers = kill_marked(marker)
    return ProcessOutcome(proc.returncode, timed_out, wall_s, leftovers)
