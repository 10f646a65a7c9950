"""Tree attention, partial RoPE and KV-remap publication: the PyTorch reference.

KV cache per attention layer: k_cache, v_cache [T_max, Hkv, D], token-major; the committed prefix
occupies rows [0, prefix_len); tree row i is written at physical slot prefix_len + slot_map[i].
Visibility: every active row sees the whole prefix, then its ancestors and itself among the tree
slots; a padding row sees the prefix and the root (so it stays finite and reads no padding KV).
Query head h reads KV head h // (Hq / Hkv). Arithmetic runs in the compute dtype (float64 for
float64 inputs, else float32); the output is cast to q's dtype; the log-sum-exp is returned for
kernels that merge split-K partials.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lumotree.tree import TreeDescriptor
from lumotree.verify.gdn.reference import compute_dtype


def rope_cos_sin(
    positions: Tensor, rotary_dim: int, theta: float, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """cos, sin [n, rotary_dim] for integer positions [n] (NeoX halves layout).

    Computed in float32 (float64 when dtype is float64), then cast to `dtype`, as HF Qwen3-Next does.
    """
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even, got {rotary_dim}")
    cd = compute_dtype(dtype)
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=cd) / rotary_dim))
    freqs = positions.to(cd)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_partial_rope(x: Tensor, positions: Tensor, rotary_dim: int, theta: float) -> Tensor:
    """Rotate the first rotary_dim dims of x [n, H, D] at positions [n]; dims >= rotary_dim pass through.

    Products run in x's dtype with cos/sin already cast to it (HF's cast points).
    """
    cos, sin = rope_cos_sin(positions, rotary_dim, theta, x.dtype)
    cos, sin = cos[:, None, :], sin[:, None, :]
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    return torch.cat([rot * cos + rotated * sin, rest], dim=-1)


def _check_cache(k_cache: Tensor, v_cache: Tensor, tree: TreeDescriptor) -> None:
    if k_cache.shape != v_cache.shape or k_cache.dim() != 3:
        raise ValueError(
            f"k_cache and v_cache must both be [T_max, Hkv, D], got {tuple(k_cache.shape)}, "
            f"{tuple(v_cache.shape)}"
        )
    if tree.prefix_len + tree.rows > k_cache.shape[0]:
        raise ValueError(
            f"prefix {tree.prefix_len} + {tree.rows} tree rows exceed the cache's {k_cache.shape[0]} rows"
        )


def write_tree_kv_(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, tree: TreeDescriptor) -> None:
    """Write the tree's k, v [R, Hkv, D] (already RoPE'd) at physical slots prefix_len + slot_map."""
    _check_cache(k_cache, v_cache, tree)
    slots = tree.prefix_len + tree.slot_map
    k_cache[slots] = k.to(k_cache.dtype)
    v_cache[slots] = v.to(v_cache.dtype)


def tree_attention_mask(tree: TreeDescriptor) -> Tensor:
    """Visibility [R, prefix_len + R] bool over physical key columns."""
    rows, prefix = tree.rows, tree.prefix_len
    sees = tree.ancestry & tree.active[None, :]
    sees[~tree.active, 0] = True
    mask = torch.zeros((rows, prefix + rows), dtype=torch.bool)
    mask[:, :prefix] = True
    mask[:, prefix + tree.slot_map] = sees
    return mask


def tree_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, tree: TreeDescriptor, scale: float | None = None
) -> tuple[Tensor, Tensor]:
    """q [R, Hq, D] (RoPE'd) against prefix + tree KV.

    Returns o [R, Hq, D] in q's dtype and lse [R, Hq] in the compute dtype.
    """
    _check_cache(k_cache, v_cache, tree)
    rows, hq, dim = q.shape
    hkv = k_cache.shape[1]
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of KV heads ({hkv})")
    cd = compute_dtype(q.dtype)
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    keys = tree.prefix_len + rows
    k = k_cache[:keys].to(cd).repeat_interleave(hq // hkv, dim=1)  # [T, Hq, D]
    v = v_cache[:keys].to(cd).repeat_interleave(hq // hkv, dim=1)
    scores = torch.einsum("rhd,thd->hrt", q.to(cd), k) * scale
    scores = scores.masked_fill(~tree_attention_mask(tree).to(scores.device)[None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [Hq, R]
    o = torch.einsum("hrt,thd->rhd", torch.exp(scores - lse[..., None]), v)
    return o.to(q.dtype), lse.T.contiguous()


def publish_kv_(
    k_cache: Tensor, v_cache: Tensor, tree: TreeDescriptor, accepted: Tensor, path_len: Tensor | int
) -> bool:
    """Publish: move accepted[0:path_len]'s KV to rows prefix_len .. prefix_len+path_len-1, in place.

    Returns False (and touches nothing) when the path is a spine prefix, whose KV is already there.
    """
    n = int(path_len)
    src = tree.prefix_len + tree.slot_map[accepted[:n]]
    dst = tree.prefix_len + torch.arange(n)
    if torch.equal(src, dst):
        return False
    # Gather before scatter: a source slot may also be a destination.
    k_rows, v_rows = k_cache[src].clone(), v_cache[src].clone()
    k_cache[dst] = k_rows
    v_cache[dst] = v_rows
    return True
