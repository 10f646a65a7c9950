"""CPU time of whole process groups, from /proc (Linux): what idle arms spend while another is measured.

A launched arm runs in its own process group (`launch.ArmServer`), so the group's CPU time covers the
engine and every worker it spawned. Resolution is the kernel's clock tick (usually 10 ms).
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection
from pathlib import Path

PROC = Path("/proc")
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def _stat_fields(stat: str) -> list[str]:
    # the command name (field 2) is in parentheses and may hold spaces: split after its closing ')'
    return stat[stat.rindex(")") + 2 :].split()


def group_cpu_seconds(pgids: Collection[int]) -> dict[int, float]:
    """User + system CPU seconds consumed so far by the live processes of each process group.

    Groups with no live process (or no /proc) read 0.0. Exited processes drop out, so compare
    readings of groups whose processes stay up (a serving arm between two requests).
    """
    totals = dict.fromkeys(pgids, 0.0)
    if not totals:
        return totals
    try:
        entries = list(PROC.iterdir())
    except OSError:
        return totals
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat_fields((entry / "stat").read_text())
        except (OSError, ValueError):
            continue  # exited meanwhile
        pgrp = int(fields[2])  # field 5 of stat(5): fields here start at field 3 (state)
        if pgrp in totals:
            totals[pgrp] += (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime
    return totals


def wait_quiet(
    pgids: Collection[int],
    window_s: float = 0.05,
    quiet_windows: int = 3,
    busy_fraction: float = 0.05,
    max_wait_s: float = 2.0,
) -> float:
    """Wait until the groups together used less than `busy_fraction` of one core in each of
    `quiet_windows` consecutive `window_s` windows (or `max_wait_s` passed); return the seconds waited.

    Used between interleaved requests so that an arm still finishing its last request (or spinning
    on its work queue) does not run while the next arm is timed. Several windows, because CPU time is
    sampled per clock tick: on a loaded machine a spinning process can miss every tick of one window.
    """
    start = time.monotonic()
    if not pgids:
        return 0.0
    before, quiet = sum(group_cpu_seconds(pgids).values()), 0
    while quiet < quiet_windows and time.monotonic() - start < max_wait_s:
        time.sleep(window_s)
        now = sum(group_cpu_seconds(pgids).values())
        quiet = quiet + 1 if now - before <= busy_fraction * window_s else 0
        before = now
    return time.monotonic() - start
