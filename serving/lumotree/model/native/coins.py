"""The acceptance walk's sampling coins in native code (forward.c's lt_philox_coins): bitwise the
coins of `lumotree.engine.acceptance.support_coins` (Philox4x32-10, Triton's float rule), without
NumPy's per-round array calls (~1 ms per sampled token on this model's dispatch, profiled)."""

from __future__ import annotations

import ctypes
from functools import cache

import torch
from torch import Tensor

from lumotree.model.native.build import load_library


@cache
def _coins_fn() -> ctypes._CFuncPtr:
    """lt_philox_coins of the library (loaded once: a load checks the compiler)."""
    fn = load_library().lt_philox_coins
    fn.argtypes = [
        ctypes.c_uint64,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int32,
        ctypes.c_int32,
        ctypes.c_void_p,
    ]
    return fn


def philox_coins(seed: int, positions: int | list[int], tokens: Tensor) -> Tensor:
    """float32 coins of `tokens` ([k] at output position `positions`, or [n, k] at n positions) for a
    request `seed` (any int: taken mod 2^64) -> a tensor of tokens' shape."""
    rows = tokens.reshape(-1, tokens.shape[-1]).to(torch.int64).contiguous()
    pos = torch.as_tensor([positions] if isinstance(positions, int) else positions, dtype=torch.int64)
    if pos.numel() != rows.shape[0]:
        raise ValueError(f"{pos.numel()} positions for {rows.shape[0]} rows of tokens")
    out = torch.empty(rows.shape, dtype=torch.float32)
    _coins_fn()(
        seed & (1 << 64) - 1, pos.data_ptr(), rows.data_ptr(), rows.shape[0], rows.shape[1], out.data_ptr()
    )
    return out.reshape(tokens.shape)
