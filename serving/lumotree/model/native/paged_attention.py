"""The native forward's tree attention over a paged KV cache (forward.c's `lt_paged_tree_attention`):
the vLLM plugin recomputes a tree's attention rows with it, over vLLM's CPU cache layout ("vec":
per block and KV head, keys dimension-major then values token-major; float32 or bfloat16).

A tree row attends to the committed prefix, its ancestors and itself, in that order, with the
native forward's own attention (`attend_rows`) over float32 token-major copies of the request's
positions (`KVMirror`): each call copies the positions from the mirror's end to prefix + rows (the
tree's own keys and values at prefix + slot, where the model's attention wrote them) and then
counts the committed prefix as mirrored, since committed positions never change while the request
runs (a caller resets the mirror when they may: a restart, a preemption).
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch
from torch import Tensor

from lumotree.model.native.gdn_core import MAX_ROWS, TreeRows
from lumotree.model.native.model import _MAX_GROUP, _MAX_HEAD, _Layer, _library, _Model, _PagedIO

_IO_DTYPES = {torch.float32: 0, torch.bfloat16: 1}


class KVMirror:
    """Float32 token-major keys and values [capacity, Hkv, D] of one request's positions in one
    layer; positions below `valid` equal the paged cache's."""

    def __init__(self, capacity: int, kv_heads: int, head_dim: int) -> None:
        self.k = torch.empty(capacity, kv_heads, head_dim)
        self.v = torch.empty(capacity, kv_heads, head_dim)
        self.valid = 0


class NativePagedAttention:
    """Tree attention of `heads` query heads over `kv_heads` KV heads of `head_dim`, for requests of
    up to `capacity` positions (prefix + tree rows)."""

    def __init__(self, heads: int, kv_heads: int, head_dim: int, capacity: int) -> None:
        if heads % kv_heads or head_dim % 16 or head_dim > _MAX_HEAD or heads // kv_heads > _MAX_GROUP:
            raise ValueError(
                f"the native tree attention does not serve {heads}/{kv_heads} heads of {head_dim}"
            )
        self.lib, self.capacity, self.kv_heads, self.head_dim = _library(), capacity, kv_heads, head_dim
        self._work = torch.empty(int(self.lib.lt_attn_work_floats(capacity)))
        self._q = torch.empty(MAX_ROWS, heads, head_dim)
        self._out = torch.empty(MAX_ROWS, heads, head_dim)
        self._layer = _Layer()
        self._model = _Model(
            hq=heads, hkv=kv_heads, hd=head_dim, kv_capacity=capacity, work=self._work.data_ptr()
        )

    def new_mirror(self) -> KVMirror:
        """An empty mirror of one request's positions in one layer."""
        return KVMirror(self.capacity, self.kv_heads, self.head_dim)

    def tree(
        self,
        rows: TreeRows,
        cache: Tensor,
        blocks: np.ndarray,
        query: Tensor,
        output: Tensor,
        start: int,
        mirror: KVMirror,
    ) -> None:
        """Overwrite the tree's rows of output [N, HQ, D] (logical row i at flat row start + slot[i])
        from query [N, HQ, D] (RoPE'd at depth positions) over cache [blocks, Hkv, B, 2 D], the
        request's block table `blocks` (int32) holding its positions, through its `mirror`."""
        tokens = rows.struct.prefix + rows.struct.n
        if tokens > self.capacity:
            raise ValueError(f"{tokens} positions exceed the native tree attention's {self.capacity}")
        dtype = query.dtype
        if dtype not in _IO_DTYPES or cache.dtype != dtype or output.dtype != dtype:
            raise ValueError(
                f"query, cache and output must share float32 or bfloat16, got {dtype}, {cache.dtype}"
            )
        if not cache.is_contiguous() or query.stride(-1) != 1 or output.stride(-1) != 1:
            raise ValueError("the cache must be contiguous and rows of unit stride")
        q2, o2 = query.flatten(1), output.flatten(1)  # views: within a row [HQ, D] is contiguous
        table = np.ascontiguousarray(blocks, dtype=np.int32)
        io = _PagedIO(
            cache=cache.data_ptr(),
            blocks=table.ctypes.data,
            block_size=cache.shape[2],
            q=q2.data_ptr(),
            o=o2.data_ptr(),
            ldq=q2.stride(0),
            ldo=o2.stride(0),
            bf16=_IO_DTYPES[dtype],
        )
        self._layer.k_cache, self._layer.v_cache = mirror.k.data_ptr(), mirror.v.data_ptr()
        self.lib.lt_paged_tree_attention(
            ctypes.byref(self._model),
            ctypes.byref(self._layer),
            ctypes.byref(rows.struct),
            ctypes.byref(io),
            start,
            min(mirror.valid, rows.struct.prefix),
            self._q.data_ptr(),
            self._out.data_ptr(),
        )
        mirror.valid = rows.struct.prefix
