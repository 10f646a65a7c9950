"""The replay row's walk through lumobench's modules stays straight (issue 27): counted by
`walk.py`'s tracer over an in-process replay of one request against a running scripted server."""

from __future__ import annotations

import signal
from pathlib import Path

from .walk import replay_walk

#: the row's trip at 0a307bb: 40 stays in 15 rooms with 25 returns; at feed525 50 / 16 / 34, which issue 27
#: had counted as 47 / 12 / 35
MAX_RETURNS = 25


def test_a_replay_rows_trip_re_enters_at_most_25_modules(tmp_path: Path) -> None:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        walk = replay_walk(tmp_path, "endpoint")
    finally:  # replay installs its own handlers in this process
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    trip = walk.trip()
    assert trip.returns <= MAX_RETURNS, f"{trip.summary()}: {' > '.join(trip.modules)}"
