"""Programmatic dependent launch (PDL) of the decode step's Triton kernels on Hopper-class GPUs.

A kernel launched with PDL may be scheduled while the kernel before it in the stream still runs:
its programs become resident and stop at `wait_for_predecessor` (griddepcontrol.wait) until that
kernel has completed and its writes are visible, so the launch latency and the programs' setup
overlap the previous kernel's tail. A step launches ~700 kernels; inside a CUDA graph each still
costs a gap and a ramp (results/h200/cycle-27b.md: 0.28 ms of launch gaps an AR step).

The contract every kernel launched with `launch_options` keeps: each of its programs runs
`wait_for_predecessor` before it reads or writes memory another kernel touches (only constant
weights may be read before it). A kernel then completes only after the one before it, so a wait
covers every earlier kernel too. After its wait a program signals that the next kernel may be
scheduled (griddepcontrol.launch_dependents): by then every program of this kernel is resident, so
the next kernel's waiting programs only take what is left of the GPU.

Off wherever it cannot apply (the CPU, the interpreter, GPUs before compute capability 9, a Triton
without griddepcontrol), and under `pdl_mode(False)` (the benchmarks' side-by-side variant).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import triton
import triton.language as tl

try:
    from triton.backends.nvidia.compiler import CUDAOptions
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    _PDL_OPTION = "launch_pdl" in CUDAOptions.__dataclass_fields__
except ImportError:  # a Triton without griddepcontrol: PDL stays off
    gdc_wait = gdc_launch_dependents = None
    _PDL_OPTION = False

_enabled = True


@contextmanager
def pdl_mode(enabled: bool) -> Iterator[None]:
    """Launch the enclosed code's kernels with PDL where it applies (True) or never; restored after."""
    global _enabled
    previous, _enabled = _enabled, enabled
    try:
        yield
    finally:
        _enabled = previous


@functools.cache
def _supported(device: torch.device) -> bool:
    return _PDL_OPTION and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def launch_options(device: torch.device) -> dict[str, bool]:
    """Keyword arguments for a kernel taking the `GDC` constexpr: its wait compiled in and the PDL
    launch attribute set where PDL applies, else GDC=False (no wait, a plain launch)."""
    if _enabled and _supported(device):
        return {"GDC": True, "launch_pdl": True}
    return {"GDC": False}


@triton.jit
def wait_for_predecessor(GDC: tl.constexpr):
    """Every program's first step under PDL: wait for the previous kernel, then let the next one be
    scheduled (nothing without GDC)."""
    if GDC:
        gdc_wait()
        gdc_launch_dependents()
