"""Attention rows of a tree: each row sees the committed prefix, its ancestors and itself.

vLLM writes every new KV row to its slot, and its attention backend computes causal attention for
the batch (right for chunks; skipped on the CPU when every row is a tree row, `patches.py`); the
rows of each tree are then recomputed with the ancestry mask of the op set's tree attention, over
the prefix read from the paged cache and the tree's own keys and values (the step's inputs, in
physical order: exactly the core's cache layout rows prefix_len + slot_map).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lumotree.verify.kernel_sets import TreeKernels
from lumotree.vllm.paged_kv import block_kv
from lumotree.vllm.steps import StepPlan


def tree_attention_rows(
    plan: StepPlan,
    group: int,
    kernels: TreeKernels,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    kv_cache: Tensor,
    output: Tensor,
    isa: str,
) -> None:
    """Overwrite output [N, Hq, D] at every tree row; query [N, Hq, D] (RoPE'd at depth positions),
    key and value [N, Hkv, D] the step's new rows, kv_cache one layer's paged cache (layout `isa`)."""
    for req in plan.trees:
        assert req.tree is not None and req.rows is not None
        prefix_k, prefix_v = block_kv(kv_cache, plan.kv_blocks(req, group, req.prefix_len), isa)
        k = torch.cat([prefix_k[: req.prefix_len].to(key.dtype), key[req.tokens]])
        v = torch.cat([prefix_v[: req.prefix_len].to(value.dtype), value[req.tokens]])
        o, _ = kernels.tree_attention(query[req.rows], k, v, req.tree)
        output[req.rows] = o.to(output.dtype)
