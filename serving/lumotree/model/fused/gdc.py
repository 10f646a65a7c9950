"""The device side of programmatic dependent launch (launch.py says when it is on): the steps a
fused-path kernel takes before it reads an activation or writes anything."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def allow_successor(PDL: tl.constexpr):
    """Let the next kernel launch now (it waits for this one before touching its data)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def await_predecessor(PDL: tl.constexpr):
    """Wait until the previous kernel has finished and its writes are visible."""
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def enter(PDL: tl.constexpr):
    """Both, for kernels with nothing to read early."""
    allow_successor(PDL)
    await_predecessor(PDL)
