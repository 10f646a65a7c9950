"""Kernel parity tests run the Triton kernels on the CPU through the Triton interpreter.

TRITON_INTERPRET must be set before triton is first imported (kernels are bound to the
interpreter when decorated). On the GPU machine, run the `gpu` module with TRITON_INTERPRET=0.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
