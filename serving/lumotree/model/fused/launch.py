"""Programmatic dependent launch (PDL) for the fused path's Triton kernels on Hopper and later.

A decode step is a chain of short kernels, and each one ramps up (its first weight tiles arrive
after a DRAM round trip) and drains (its last programs run on a few SMs) while the next one waits.
With PDL a kernel is launched while its predecessor still runs: every program of the fused
path's kernels first signals that its successor may launch (`gdc_launch_dependents`), then waits
for its predecessor to finish and its writes to be visible (`gdc_wait`) before it reads any
activation or writes anything. Before that wait a kernel may read only what no kernel of the
forward writes: the skinny GEMM loads its first weight tile there, so a projection's first bytes
stream while the norm before it runs. A kernel launched without PDL (cuBLAS, PyTorch, the tree
kernels) waits for its predecessor as usual, and one after it starts no earlier than its end.

PDL needs a CUDA device of compute capability 9.0 or later and a Triton that knows the launch
option; elsewhere (and under TRITON_INTERPRET=1) kernels take `PDL=False` and launch as before.
The kernels compute the same values either way (tested bitwise on the GPU).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

_enabled = os.environ.get("LUMOTREE_PDL", "1") != "0"


def enabled() -> bool:
    """Whether PDL is asked for now (it still needs `pdl_supported`)."""
    return _enabled


@contextmanager
def pdl_mode(enabled: bool) -> Iterator[None]:
    """Launch the enclosed code's kernels with PDL where supported (True) or never (False)."""
    global _enabled
    previous, _enabled = _enabled, enabled
    try:
        yield
    finally:
        _enabled = previous


@functools.cache
def pdl_supported(device: torch.device) -> bool:
    """Whether kernels on `device` can launch with PDL (CUDA, sm90+, Triton's launch option)."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if torch.cuda.get_device_capability(device)[0] < 9:
        return False
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: F401
    except ImportError:
        return False
    return "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})


def launch_options(x: torch.Tensor) -> dict[str, Any]:
    """The `PDL` constexpr and, when it is on, Triton's `launch_pdl` option for a kernel on x's device."""
    if _enabled and pdl_supported(x.device):
        return {"PDL": True, "launch_pdl": True}
    return {"PDL": False}
