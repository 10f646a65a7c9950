"""vLLM's "align" mamba cache mode (prefix caching on hybrid models) as the plugin serves it.

In align mode a request's mamba state lives in its block table: once cached, block j's state slot
holds the state after exactly (j + 1) * block_size tokens, and during a step the running state sits
in the block of the step's last scheduled token (vLLM's `mamba_utils.preprocess_mamba`). vLLM's
own speculative path keeps a state per draft token and moves the accepted one with Triton kernels
(no CPU form in vLLM 0.32). The plugin's publication replays the accepted path instead, so:
- `move_running_states` (before the forward, in place of vLLM's preprocess) copies each request's
  committed state from the last step's column to this step's, with no accepted-token offset;
- `boundary_saver` (publication, in place of vLLM's postprocess) copies the state at each block end
  the accepted path crosses into that block's slot (`checkpoints.publish_gdn_path`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from lumotree.vllm.gdn_core import conv_state_view

NULL_BLOCK = 0  # vLLM's null block: a placeholder in block tables, never written


def running_column(num_computed: int, num_scheduled: int, block_size: int) -> int:
    """The block-table column of the running state in a step: the block of its last scheduled token."""
    return -(-(num_computed + num_scheduled) // block_size) - 1


def copy_state(layer: torch.nn.Module, src: int, dst: int, dim_first: bool) -> None:
    """Copy a GDN layer's recurrent and conv state from mamba slot src to slot dst."""
    if src in (dst, NULL_BLOCK) or dst == NULL_BLOCK:
        return
    width = layer.conv_kernel_size
    conv = layer.kv_cache[0]
    conv_state_view(conv, dst, width, dim_first).copy_(conv_state_view(conv, src, width, dim_first))
    layer.kv_cache[1][dst].copy_(layer.kv_cache[1][src])


def copy_column(
    layers: Iterable[tuple[torch.nn.Module, int]],
    block_ids: Callable[[int], list[int]],
    src: int,
    dst: int,
    dim_first: bool,
) -> None:
    """Copy one request's state from block-table column src to column dst in every GDN layer
    (layer, KV cache group); block_ids(group) is the request's block table in that group."""
    for layer, group in layers:
        ids = block_ids(group)
        copy_state(layer, ids[src], ids[dst], dim_first)


def move_running_states(
    layers: Iterable[tuple[torch.nn.Module, int]],
    block_ids: Callable[[int], list[int]],
    last: int,
    current: int,
    dim_first: bool,
) -> None:
    """One request's committed state from column `last` to column `current` in every GDN layer
    (layer, KV cache group); block_ids(group) is the request's block table in that group."""
    if last != -1:
        copy_column(layers, block_ids, last, current, dim_first)


def boundary_saver(
    layers: Iterable[tuple[torch.nn.Module, int]],
    block_ids: Callable[[int], list[int]],
    running: int,
    prefix_len: int,
    block_size: int,
    dim_first: bool,
) -> Callable[[int], None]:
    """save(k) for `publish_gdn_path`: the running column's states, holding the accepted path's
    first k nodes (prefix_len + k tokens, a whole number of blocks), copied to the block they end."""
    layers = list(layers)

    def save(k: int) -> None:
        copy_column(layers, block_ids, running, (prefix_len + k) // block_size - 1, dim_first)

    return save
