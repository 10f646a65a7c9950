"""Publication of a tree's accepted path into vLLM's own state (DESIGN §3.5): through the GDN core,
the replay of the recorded steps into each layer's recurrent-state slot and the conv state from the
path's last inputs; and the path's KV rows moved to the contiguous positions vLLM's scheduler now counts as
computed (prefix_len .. prefix_len + path_len - 1; no move when the path is a spine prefix).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from lumotree.vllm.align import boundary_saver
from lumotree.vllm.checkpoints import boundary_cuts, publish_gdn_path
from lumotree.vllm.gdn_core import GdnCore, conv_state_view
from lumotree.vllm.paged_kv import gather_kv
from lumotree.vllm.steps import RequestStep, StepPlan


@dataclass(frozen=True)
class LayerIndex:
    """The model's stateful layers by name with their KV cache group: GDN layers (mamba state) and
    attention layers (paged KV)."""

    gdn: dict[str, tuple[torch.nn.Module, int]]
    attention: dict[str, tuple[torch.nn.Module, int]]
    conv_dim_first: bool


def publish_accepted(
    plan: StepPlan, req: RequestStep, accepted: list[int], layers: LayerIndex, core: GdnCore
) -> None:
    """Publish the accepted logical nodes (root first) of a tree request in place."""
    tree = req.tree
    assert tree is not None
    path_len = len(accepted)
    states, convs = [], []
    for layer, group in layers.gdn.values():
        slot = plan.state_slot(req, group)
        states.append(layer.kv_cache[1][slot])
        convs.append(conv_state_view(layer.kv_cache[0], slot, layer.conv_kernel_size, layers.conv_dim_first))
    cuts, save = [], None
    if plan.align_block_size is not None and layers.gdn:
        cuts = boundary_cuts(tree.prefix_len, path_len, plan.align_block_size)
        running = plan.state_columns[req.req_id]
        block_ids = functools.partial(plan.block_ids, req)
        save = boundary_saver(
            layers.gdn.values(),
            block_ids,
            running,
            tree.prefix_len,
            plan.align_block_size,
            layers.conv_dim_first,
        )
    publish_gdn_path(core, req, list(layers.gdn), states, convs, accepted, cuts, save)
    if tree.is_spine_prefix(accepted):
        return  # the path's KV already sits at prefix_len .. prefix_len + path_len - 1
    src = tree.prefix_len + tree.slot_map[torch.as_tensor(accepted)]
    dst = tree.prefix_len + torch.arange(path_len)
    for layer, group in layers.attention.values():
        _move_kv(layer, plan.kv_slots(req, group, src), plan.kv_slots(req, group, dst))


def _move_kv(layer: torch.nn.Module, src: Tensor, dst: Tensor) -> None:
    """Copy KV rows from paged slots src to dst (gathered first: a source may be a destination),
    written with vLLM's own cache writer."""
    kv_cache = layer.kv_cache
    key, value = gather_kv(kv_cache, src, getattr(layer, "isa", None) or "flash")
    layer.impl.do_kv_cache_update(layer, key.clone(), value.clone(), kv_cache, dst)
