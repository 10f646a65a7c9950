"""Stand-ins for the parts of vLLM's layers the plugin's pure-torch code touches, with vLLM 0.32's
state layouts: a GDN layer's mamba cache (conv buffer [slots, L, C] "SD" or [slots, C, L] "DS", and
the recurrent state [slots, HV, V, K]) and a CPU attention layer's paged KV cache (keys
dimension-major per block and head, values token-major, written as vLLM's own writer does; the real
writer is checked against the plugin's reader in the vLLM environment, test_vllm_internals.py).
Weights are the shipped model's, so the plugin's results can be compared with the project's model.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
from torch import Tensor

from lumotree.model.gdn import GatedDeltaNet
from lumotree.vllm.paged_kv import _offsets
from lumotree.vllm.steps import StepPlan


def gdn_layer(
    mixer: GatedDeltaNet, slots: int, spec_width: int = 0, dim_first: bool = False
) -> SimpleNamespace:
    """A vLLM Qwen3-Next GDN layer's attributes with `mixer`'s weights and an empty mamba cache."""
    channels, width = mixer.conv1d.weight.shape[0], mixer.conv1d.weight.shape[-1]
    length = width - 1 + spec_width
    conv = torch.randn(slots, channels, length) if dim_first else torch.randn(slots, length, channels)
    ssm = torch.randn(slots, mixer.num_v_heads, mixer.head_v_dim, mixer.head_k_dim)
    return SimpleNamespace(
        prefix="model.layers.0.linear_attn",
        key_dim=mixer.key_dim,
        value_dim=mixer.value_dim,
        tp_size=1,
        head_k_dim=mixer.head_k_dim,
        head_v_dim=mixer.head_v_dim,
        conv_kernel_size=width,
        conv1d=SimpleNamespace(weight=mixer.conv1d.weight.detach()),
        A_log=mixer.A_log.detach(),
        dt_bias=mixer.dt_bias.detach(),
        kv_cache=[conv, ssm],
    )


class PagedWriter:
    """vLLM's CPU `do_kv_cache_update` (a fake of its C++ writer) for the "vec" layout."""

    def do_kv_cache_update(
        self, layer: object, key: Tensor, value: Tensor, kv_cache: Tensor, slots: Tensor
    ) -> None:
        blocks, heads, block_size, two_d = kv_cache.shape
        dim = two_d // 2
        flat = kv_cache.view(blocks, heads, 2 * block_size * dim)
        key_at, value_at = _offsets("vec", slots % block_size, block_size, dim)
        for row, block in enumerate((slots // block_size).tolist()):
            flat[block, :, key_at[row]] = key[row]
            flat[block, :, value_at[row]] = value[row]


def attention_layer(blocks: int, heads: int, block_size: int, dim: int) -> SimpleNamespace:
    """A vLLM attention layer with a paged KV cache [blocks, heads, block_size, 2 * dim]."""
    return SimpleNamespace(
        layer_name="model.layers.3.self_attn.attn",
        isa="vec",
        kv_cache=torch.zeros(blocks, heads, block_size, 2 * dim),
        impl=PagedWriter(),
    )


def plan(requests: list, block_rows: list[list[list[int]]], block_sizes: list[int]) -> StepPlan:
    """A StepPlan over block tables given as lists (one table per KV cache group)."""
    return StepPlan(requests, [np.asarray(rows, dtype=np.int32) for rows in block_rows], block_sizes)
