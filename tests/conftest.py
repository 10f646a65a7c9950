"""Session-wide test setup.

Kernel parity tests run the Triton kernels on the CPU through the Triton interpreter.
TRITON_INTERPRET must be set before triton is first imported anywhere in the session
(kernels are bound to the interpreter when decorated), so it is set here, at the root,
before any test module (engine, server, agent) can import triton through lumotree.
On the GPU machine, run the `gpu` tests with TRITON_INTERPRET=0.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

if "triton" in sys.modules and os.environ["TRITON_INTERPRET"] == "1":
    raise RuntimeError(
        "triton was imported before tests/conftest.py could select its CPU interpreter; "
        "run the tests with TRITON_INTERPRET=1 set in the environment"
    )
