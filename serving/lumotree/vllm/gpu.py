"""The plugin on vLLM's CUDA path, wired to LumoTree's Triton kernels. UNTESTED: this work had no GPU
(the project's GPU budget is the lead's); everything it shares with the CPU path (plan, positions,
walk, publication order, proposer) is tested there, the kernels are tested on the H200 by
tests/kernels/test_gpu_parity.py, and what is GPU-only here is the glue below.

- GDN: vLLM's CUDA layers call `QwenGatedDeltaNetAttention._forward_core` from their core op; it is
  replaced by the plugin's core (chunks: the project's chain ops in torch; trees: the Triton tree
  conv and tree-parallel GDN verification), and vLLM's fused MTP decode path, which would bypass
  it, is switched off on every layer (`disable_fused_decode`);
- attention: FlashAttention runs as before, then the tree rows are recomputed with the Triton
  tree-attention kernel over the prefix read in FlashAttention's KV layout ("flash");
- publication: the Triton GDN replay per layer; conv and KV moves in torch.
CUDA graphs cannot replay a step whose tree changes (its plan lives on the host), so the server must
run eager (`--enforce-eager`); the proposer refuses otherwise.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from torch import Tensor

from lumotree.model.tree_kernels import REFERENCE, TreeKernels
from lumotree.verify.gdn.reference import GdnOperands
from lumotree.vllm.worker import LumoTreeWorker


def triton_kernels() -> TreeKernels:
    """The Triton op set, each with its reference's signature (imported only on a GPU)."""
    from lumotree.verify.attention import decode
    from lumotree.verify.conv import fused_conv
    from lumotree.verify.gdn import replay, tree_scan

    def replay_each_layer(states: Sequence[Tensor], ops: Sequence[GdnOperands], path: Tensor, n: int) -> None:
        for state, layer_ops in zip(states, ops, strict=True):
            replay.replay_accepted_(state, layer_ops, path, n)

    return TreeKernels(
        name="triton",
        tree_conv=fused_conv.tree_conv,
        gdn_verify=tree_scan.gdn_verify_tree,
        write_tree_kv=REFERENCE.write_tree_kv,  # unused: vLLM writes the tree's KV rows
        tree_attention=decode.tree_attention,
        replay=replay_each_layer,
        publish_conv=REFERENCE.publish_conv,  # vLLM's conv state views are strided
        publish_kv=REFERENCE.publish_kv,  # unused: KV moves go through the paged cache
    )


def disable_fused_decode(gdn_layers: Sequence[object]) -> None:
    """vLLM's fused CUDA spec-decode GDN kernel skips `_forward_core`: keep every layer off it."""
    for layer in gdn_layers:
        layer.enable_fused_gdn_spec_decode = False  # type: ignore[attr-defined]


def patch_cuda(worker: LumoTreeWorker) -> None:
    """The CUDA-side patches (see the module docstring)."""
    from vllm.forward_context import get_forward_context
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention
    from vllm.v1.attention.backends.flash_attn import FlashAttentionImpl

    original_core = QwenGatedDeltaNetAttention._forward_core

    @functools.wraps(original_core)
    def _forward_core(self, mixed_qkv, b, a, core_attn_out):  # type: ignore[no-untyped-def]
        if get_forward_context().attn_metadata is None or worker.plan is None:
            return original_core(self, mixed_qkv, b, a, core_attn_out)  # profiling and warm-up runs
        worker.gdn(self, mixed_qkv, b, a, core_attn_out)
        return None

    QwenGatedDeltaNetAttention._forward_core = _forward_core

    original_forward = FlashAttentionImpl.forward

    @functools.wraps(original_forward)
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs):  # type: ignore[no-untyped-def]
        result = original_forward(
            self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs
        )
        if attn_metadata is not None:
            worker.attention(layer, query, key, value, kv_cache, output)
        return result

    FlashAttentionImpl.forward = forward
