"""Reading vLLM's CPU paged KV cache (tree attention needs the committed prefix's keys and values).

vLLM 0.32's CPU attention stores one attention layer's cache as [blocks, Hkv, block_size, 2 * D];
per (block, head) the first block_size * D elements are the keys, dimension-major ([D, block_size]),
the next block_size * D the values, token-major ([block_size, D]) (ISAs "vec" and "vec16"; measured
against vLLM's own writer `cpu_attn_reshape_and_cache`, which `check_layout` repeats at activation).
Writes always go through vLLM's writer, so only reading depends on this layout.
"""

from __future__ import annotations

import torch
from torch import Tensor

READABLE_ISAS = ("vec", "vec16")


def _split(kv_cache: Tensor) -> tuple[Tensor, Tensor]:
    blocks, heads, block_size, two_d = kv_cache.shape
    dim = two_d // 2
    flat = kv_cache.view(blocks, heads, 2 * block_size * dim)
    keys = flat[:, :, : block_size * dim].view(blocks, heads, dim, block_size)
    values = flat[:, :, block_size * dim :].view(blocks, heads, block_size, dim)
    return keys, values


def gather_kv(kv_cache: Tensor, slots: Tensor) -> tuple[Tensor, Tensor]:
    """Keys and values [n, Hkv, D] at paged slots [n] (slot = block * block_size + offset)."""
    keys, values = _split(kv_cache)
    block_size = kv_cache.shape[2]
    block, offset = slots // block_size, slots % block_size
    return keys[block, :, :, offset], values[block, :, offset]


def check_layout(write: object, isa: str, dtype: torch.dtype) -> None:
    """Write probe rows with vLLM's writer `write(key, value, key_cache, value_cache, slots, isa)`
    and read them back; RuntimeError naming the writer if this reader does not see them."""
    if isa not in READABLE_ISAS:
        raise RuntimeError(
            f"lumotree.vllm reads vLLM's CPU KV cache for ISAs {', '.join(READABLE_ISAS)}; this machine's "
            f"attention ISA is {isa!r}"
        )
    blocks, heads, block_size, dim = 3, 2, 32, 64
    cache = torch.zeros(blocks, heads, block_size, 2 * dim, dtype=dtype)
    key_cache, value_cache = cache.view(blocks, heads, 2 * block_size, dim).chunk(2, dim=2)
    gen = torch.Generator().manual_seed(0)
    slots = torch.randperm(blocks * block_size, generator=gen)[:40]
    key = torch.randn(40, heads, dim, generator=gen).to(dtype)
    value = torch.randn(40, heads, dim, generator=gen).to(dtype)
    write(key, value, key_cache, value_cache, slots, isa)  # type: ignore[operator]
    got_k, got_v = gather_kv(cache, slots)
    if not (torch.equal(got_k, key) and torch.equal(got_v, value)):
        raise RuntimeError(
            "vLLM's CPU KV layout changed: vllm._custom_ops.cpu_attn_reshape_and_cache no longer writes "
            f"the layout lumotree.vllm.paged_kv reads (ISA {isa}, {dtype})"
        )
