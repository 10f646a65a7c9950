"""The plugin's kernels on vLLM's CUDA path: LumoTree's Triton kernels behind the plugin's
signatures, and the switch that keeps vLLM's GDN layers on the core the plugin replaces. What has
run on a GPU (an H200, no vLLM there): this module's Triton set in the plugin's GDN core over vLLM's
mamba cache layout and its publication, and in the plugin's tree attention over FlashAttention's
paged KV layout, equal to the CPU op set (tests/vllm_plugin/test_gpu_path.py); the kernels
themselves (tests/kernel_tests/test_gpu_parity.py). What has not: vLLM's CUDA model runner around them,
FlashAttention, and the CUDA patches (`patches.patch_cuda`).

- GDN: vLLM's CUDA layers call `QwenGatedDeltaNetAttention._forward_core` from their core op; the
  patch replaces it with the plugin's core (chunks: the project's chain ops in torch; trees: the
  Triton tree conv and tree-parallel GDN verification), and vLLM's fused MTP decode path, which
  would bypass it, is switched off on every layer (`disable_fused_decode`);
- attention: FlashAttention runs as before, then the tree rows are recomputed with the Triton
  tree-attention kernel over the prefix read in FlashAttention's KV layout ("flash");
- publication: the Triton GDN replay per layer; conv and KV moves in torch.
The Triton ops are the project's (`lumotree.verify.kernel_sets.triton_kernels`, the entry points of
`lumotree.verify.device_ops`), given each tree's device tables (`DeviceTree`); tests run them in
the plugin's GDN core, tree attention and publication under TRITON_INTERPRET=1 on the CPU.
CUDA graphs cannot replay a step whose tree changes (its plan lives on the host), so the server must
run eager (`--enforce-eager`); the proposer refuses otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from lumotree.tree import TreeDescriptor
from lumotree.verify.device_tree import DeviceTree
from lumotree.verify.gdn.reference import GdnInputs, GdnOperands, GdnVerifyResult
from lumotree.verify.kernel_sets import REFERENCE, TreeKernels

LOADED_TREES = 64  # device tables kept: a step's trees (one per request) and a few steps before


class DeviceTrees:
    """The device tables (`DeviceTree`) of each tree descriptor the Triton ops are given: loaded once
    per descriptor (a step's tree is read by every layer), the last LOADED_TREES kept."""

    def __init__(self) -> None:
        self._loaded: dict[int, tuple[TreeDescriptor, DeviceTree]] = {}

    def __call__(self, tree: TreeDescriptor, device: torch.device) -> DeviceTree:
        hit = self._loaded.get(id(tree))
        if hit is not None and hit[0] is tree:
            return hit[1]
        table = DeviceTree(tree.rows, tree.max_depth, device).load_(tree)
        if len(self._loaded) >= LOADED_TREES:
            self._loaded.pop(next(iter(self._loaded)))
        self._loaded[id(tree)] = (tree, table)  # the descriptor kept alive: its id stays unique
        return table


def triton_kernels() -> TreeKernels:
    """The project's Triton set (`lumotree.verify.kernel_sets.triton_kernels`, whose ops are in
    `lumotree.verify.device_ops`) with the plugin's signatures: a host `TreeDescriptor` per call,
    loaded into device tables, and the accepted path moved to the state's device. Conv publication
    stays in torch (vLLM's conv state views are strided); the KV ops are unused (vLLM writes the
    tree's KV rows, and publication moves them through the paged cache). Imported only on a GPU
    (and by the tests, under TRITON_INTERPRET=1)."""
    from lumotree.verify.kernel_sets import triton_kernels as project_triton_kernels

    device_set = project_triton_kernels()
    tables = DeviceTrees()

    def tree_conv(x: Tensor, state: Tensor, w: Tensor, bias: Tensor | None, tree: TreeDescriptor) -> Tensor:
        return device_set.tree_conv(x, state, w, bias, tables(tree, x.device))

    def gdn_verify(x: GdnInputs, state: Tensor, tree: TreeDescriptor) -> GdnVerifyResult:
        return device_set.gdn_verify(x, state, tables(tree, x.q.device))

    def tree_attention(q: Tensor, k: Tensor, v: Tensor, tree: TreeDescriptor) -> tuple[Tensor, Tensor]:
        return device_set.tree_attention(q, k, v, tables(tree, q.device))

    def replay(states: Sequence[Tensor], ops: Sequence[GdnOperands], path: Tensor, path_len: int) -> None:
        device_set.replay(states, ops, path.to(states[0].device), path_len)

    return TreeKernels(
        name="triton",
        tree_conv=tree_conv,
        gdn_verify=gdn_verify,
        write_tree_kv=REFERENCE.write_tree_kv,  # unused: vLLM writes the tree's KV rows
        tree_attention=tree_attention,
        replay=replay,
        publish_conv=REFERENCE.publish_conv,  # vLLM's conv state views are strided
        publish_kv=REFERENCE.publish_kv,  # unused: KV moves go through the paged cache
    )


def disable_fused_decode(gdn_layers: Sequence[object]) -> None:
    """vLLM's fused CUDA spec-decode GDN kernel skips `_forward_core`: keep every layer off it."""
    for layer in gdn_layers:
        layer.enable_fused_gdn_spec_decode = False  # type: ignore[attr-defined]
