"""The plugin's KV reader on FlashAttention's layout (vLLM's CUDA backend, whose writer writes through
the view `kv_cache.transpose(1, 2).split(D, -1)`); the CPU layouts are checked against vLLM's own
C++ writer in test_vllm_internals.py."""

from __future__ import annotations

import torch

from lumotree.vllm.paged_kv import block_kv, gather_kv


def test_flash_layout_reads_back_what_flash_attentions_view_writes() -> None:
    blocks, heads, block_size, dim = 5, 2, 16, 64
    cache = torch.zeros(blocks, heads, block_size, 2 * dim)
    key_cache, value_cache = cache.transpose(1, 2).split(dim, dim=-1)  # [B, N, H, D] each, views
    gen = torch.Generator().manual_seed(0)
    slots = torch.randperm(blocks * block_size, generator=gen)[:30]
    key, value = torch.randn(30, heads, dim, generator=gen), torch.randn(30, heads, dim, generator=gen)
    key_cache[slots // block_size, slots % block_size] = key
    value_cache[slots // block_size, slots % block_size] = value
    got_k, got_v = gather_kv(cache, slots, "flash")
    assert torch.equal(got_k, key) and torch.equal(got_v, value)
    all_k, all_v = block_kv(cache, torch.arange(blocks), "flash")
    assert torch.equal(all_k[slots], key) and torch.equal(all_v[slots], value)
