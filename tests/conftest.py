"""Session-wide test setup.

Kernel parity tests run the Triton kernels on the CPU through the Triton interpreter.
TRITON_INTERPRET must be set before triton is first imported anywhere in the session
(kernels are bound to the interpreter when decorated), so it is set here, at the root,
before any test module (engine, server, agent) can import triton through lumotree.
On the GPU machine, run the `gpu` tests with TRITON_INTERPRET=0.

`live_url` is one real LumoTree server process shared by the server, harness and agent integration
tests (starting one costs 10-20 s on 2 cores).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")

if "triton" in sys.modules and os.environ["TRITON_INTERPRET"] == "1":
    raise RuntimeError(
        "triton was imported before tests/conftest.py could select its CPU interpreter; "
        "run the tests with TRITON_INTERPRET=1 set in the environment"
    )


@pytest.fixture(scope="session")
def live_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`python -m lumotree.server` with the shipped model and the tree drafter, for the whole session."""
    from server.live import LIVE_MAX_LEN, lumotree_server

    log = tmp_path_factory.mktemp("server") / "server.log"
    with lumotree_server(log, "--max-model-len", str(LIVE_MAX_LEN), "--seed", "0") as base:
        yield base
