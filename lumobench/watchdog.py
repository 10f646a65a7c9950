"""Stop a launched arm's process group when the lumobench process that started it dies, kill -9 included.

    python -m lumobench.watchdog PGID        (stdin: a pipe whose write end only lumobench holds)

lumobench never writes to the pipe while the arm runs. When lumobench exits for any reason the kernel
closes its end and the read below returns end-of-file: the watchdog sends SIGTERM to the group, then
SIGKILL after a grace period. A normal stop writes one byte first ("disarm"): the arm is already
stopped by then, and its group id may be reused. The watchdog runs in its own session, so the
terminal's Ctrl-C reaches lumobench (which stops the arm itself) but not the watchdog.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

GRACE_S = 10.0


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(pgid: int, grace_s: float = GRACE_S) -> None:
    """SIGTERM the process group, SIGKILL whatever is left of it after `grace_s`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def main() -> None:
    pgid = int(sys.argv[1])
    if sys.stdin.buffer.read(1):
        return  # disarmed: lumobench stopped the arm itself
    stop_group(pgid)


if __name__ == "__main__":
    main()
