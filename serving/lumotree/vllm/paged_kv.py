"""Reading vLLM's paged KV cache (tree attention needs the committed prefix's keys and values).

vLLM 0.32 stores one attention layer's cache as [blocks, Hkv, block_size, 2 * D]. Offsets below are
of token t, dimension j inside one (block, head) area of 2 * block_size * D elements:
- CPU attention (measured against vLLM's own writer `cpu_attn_reshape_and_cache`, which
  `check_layout` repeats at activation): keys in the first half, values in the second (+ block_size D),
  "vec", "vec16" (fp32, and bf16 without AMX): key j * block_size + t, value t * D + j;
  "amx" (bf16 on AMX CPUs, VNNI pairs): key (t // 16) * 16 D + (j // 2) * 32 + (t % 16) * 2 + j % 2,
  value (j // 16) * 16 block_size + (t // 2) * 32 + (j % 16) * 2 + t % 2;
- FlashAttention on CUDA ("flash", from its writer's view `kv_cache.transpose(1, 2).split(D, -1)`;
  read on an H200 by tests/vllm_plugin/test_gpu_path.py): key t * 2 D + j, value t * 2 D + D + j.
Writes always go through vLLM's writer, so only reading depends on these layouts.
"""

from __future__ import annotations

import torch
from torch import Tensor

READABLE_ISAS = ("vec", "vec16", "amx", "flash")


def _offsets(isa: str, t: Tensor, block_size: int, dim: int) -> tuple[Tensor, Tensor]:
    """Element offsets [n, D] of tokens t [n] (in-block) inside a (block, head) area: keys, values."""
    t, j = t[:, None], torch.arange(dim, device=t.device)[None, :]
    region = block_size * dim
    if isa == "amx":
        key = (t // 16) * 16 * dim + (j // 2) * 32 + (t % 16) * 2 + j % 2
        return key, region + (j // 16) * 16 * block_size + (t // 2) * 32 + (j % 16) * 2 + t % 2
    if isa == "flash":
        return t * 2 * dim + j, t * 2 * dim + dim + j
    return j * block_size + t, region + t * dim + j


def _check_isa(isa: str) -> None:
    if isa not in READABLE_ISAS:
        raise RuntimeError(
            f"lumotree.vllm reads vLLM's KV cache layouts {', '.join(READABLE_ISAS)}, not {isa!r}"
        )


def gather_kv(kv_cache: Tensor, slots: Tensor, isa: str = "vec") -> tuple[Tensor, Tensor]:
    """Keys and values [n, Hkv, D] at paged slots [n] (slot = block * block_size + offset)."""
    _check_isa(isa)
    _, heads, block_size, two_d = kv_cache.shape
    dim = two_d // 2
    slots = slots.to(kv_cache.device)
    flat = kv_cache.reshape(-1)  # a view: each layer's cache is one contiguous tensor
    heads_at = torch.arange(heads, device=kv_cache.device)[None, :]
    base = ((slots // block_size)[:, None] * heads + heads_at) * 2 * block_size * dim  # [n, H]
    key_at, value_at = _offsets(isa, slots % block_size, block_size, dim)
    return flat[base[:, :, None] + key_at[:, None, :]], flat[base[:, :, None] + value_at[:, None, :]]


def block_kv(kv_cache: Tensor, blocks: Tensor, isa: str = "vec") -> tuple[Tensor, Tensor]:
    """Every token of whole blocks [m]: keys and values [m * block_size, Hkv, D] in block order
    (a request's prefix is the first tokens of its block-table blocks; block copies, no per-token
    indexing)."""
    _check_isa(isa)
    _, heads, block_size, two_d = kv_cache.shape
    dim = two_d // 2
    region = block_size * dim
    m = blocks.shape[0]
    picked = kv_cache.view(-1, heads, 2 * region)[blocks.to(kv_cache.device)]  # [m, H, 2 * region]
    keys, values = picked[:, :, :region], picked[:, :, region:]
    if isa == "amx":  # keys (tile, dim pair, token, dim bit); values (dim tile, token pair, dim, token bit)
        keys = keys.reshape(m, heads, block_size // 16, dim // 2, 16, 2).permute(0, 2, 4, 1, 3, 5)
        values = values.reshape(m, heads, dim // 16, block_size // 2, 16, 2).permute(0, 3, 5, 1, 2, 4)
    elif isa == "flash":  # per token: [key D | value D]
        tokens = picked.reshape(m, heads, block_size, 2 * dim).permute(0, 2, 1, 3)
        keys, values = tokens[..., :dim], tokens[..., dim:]
    else:
        keys = keys.reshape(m, heads, dim, block_size).permute(0, 3, 1, 2)
        values = values.reshape(m, heads, block_size, dim).permute(0, 2, 1, 3)
    return keys.reshape(m * block_size, heads, dim), values.reshape(m * block_size, heads, dim)


def check_layout(write: object, isa: str, dtype: torch.dtype) -> None:
    """Write probe rows with vLLM's writer `write(key, value, key_cache, value_cache, slots, isa)`
    and read them back; RuntimeError naming the writer if this reader does not see them."""
    blocks, heads, block_size, dim = 3, 2, 32, 64
    cache = torch.zeros(blocks, heads, block_size, 2 * dim, dtype=dtype)
    key_cache, value_cache = cache.view(blocks, heads, 2 * block_size, dim).chunk(2, dim=2)
    gen = torch.Generator().manual_seed(0)
    slots = torch.randperm(blocks * block_size, generator=gen)[:40]
    key = torch.randn(40, heads, dim, generator=gen).to(dtype)
    value = torch.randn(40, heads, dim, generator=gen).to(dtype)
    write(key, value, key_cache, value_cache, slots, isa)  # type: ignore[operator]
    got_k, got_v = gather_kv(cache, slots, isa)
    all_k, all_v = block_kv(cache, torch.arange(blocks), isa)
    if not (
        torch.equal(got_k, key)
        and torch.equal(got_v, value)
        and torch.equal(all_k[slots], key)
        and torch.equal(all_v[slots], value)
    ):
        raise RuntimeError(
            "vLLM's CPU KV layout changed: vllm._custom_ops.cpu_attn_reshape_and_cache no longer writes "
            f"the layout lumotree.vllm.paged_kv reads (ISA {isa}, {dtype})"
        )
