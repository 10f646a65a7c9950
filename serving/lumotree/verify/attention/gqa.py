"""Grouped-query tree attention in PyTorch: the CPU-fast kernel set's tree attention.

Query heads of one KV head are stacked as rows of one matmul, so KV heads are not repeated over the
prefix. Same mask and compute dtype as `reference.tree_attention`, different summation order: equal
within the paired rule, not bitwise. The additive mask of a descriptor is cached while it lives.
"""

from __future__ import annotations

import math
import weakref

import torch
from torch import Tensor

from lumotree.tree import TreeDescriptor
from lumotree.verify.attention.reference import tree_attention_mask
from lumotree.verify.gdn.reference import compute_dtype

_masks: weakref.WeakKeyDictionary[TreeDescriptor, Tensor] = weakref.WeakKeyDictionary()


def tree_attention_gqa(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, tree: TreeDescriptor, scale: float | None = None
) -> tuple[Tensor, Tensor]:
    """Same arguments and results as `tree_attention` (o [R, Hq, D], lse [R, Hq])."""
    rows, hq, dim = q.shape
    hkv = k_cache.shape[1]
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of KV heads ({hkv})")
    if tree.prefix_len + rows > k_cache.shape[0]:
        raise ValueError(
            f"prefix {tree.prefix_len} + {rows} tree rows exceed the cache's {k_cache.shape[0]} rows"
        )
    group, keys, cd = hq // hkv, tree.prefix_len + rows, compute_dtype(q.dtype)
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    bias = _masks.get(tree)
    if bias is None:
        bias = torch.zeros((rows, keys), dtype=cd).masked_fill_(~tree_attention_mask(tree), float("-inf"))
        _masks[tree] = bias
    qg = q.to(cd).reshape(rows, hkv, group, dim).permute(1, 0, 2, 3).reshape(hkv, rows * group, dim)
    kt = k_cache[:keys].to(cd).permute(1, 2, 0)  # [Hkv, D, T]
    vt = v_cache[:keys].to(cd).transpose(0, 1)  # [Hkv, T, D]
    scores = (torch.bmm(qg, kt) * scale).view(hkv, rows, group, keys) + bias[None, :, None, :]
    lse = torch.logsumexp(scores, dim=-1)  # [Hkv, R, g]
    probs = torch.exp(scores - lse[..., None]).view(hkv, rows * group, keys)
    o = torch.bmm(probs, vt).view(hkv, rows, group, dim).permute(1, 0, 2, 3).reshape(rows, hq, dim)
    return o.to(q.dtype), lse.permute(1, 0, 2).reshape(rows, hq)
