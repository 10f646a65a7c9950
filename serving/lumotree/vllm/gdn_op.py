"""The function registered under vLLM's GDN core op name in place of vLLM's own.

torch infers the op schema from the annotations, so they are real types here (this module does not
postpone annotations) and mirror vLLM's `cpu_gdn_attention_core`.
"""

from collections.abc import Callable

import torch
from vllm.forward_context import get_forward_context
from vllm.utils.torch_utils import LayerNameType, _resolve_layer_name

from lumotree.vllm.worker import LumoTreeWorker


def make_gdn_op(worker: LumoTreeWorker) -> Callable[..., None]:
    """vLLM's op signature, LumoTree's computation (no-op in profiling runs, as vLLM's)."""

    def lumotree_gdn_attention_core(
        mixed_qkv: torch.Tensor,
        b: torch.Tensor,
        a: torch.Tensor,
        core_attn_out: torch.Tensor,
        layer_name: LayerNameType,
    ) -> None:
        context = get_forward_context()
        if context.attn_metadata is None or worker.plan is None:
            return
        layer = context.no_compile_layers[_resolve_layer_name(layer_name)]
        worker.gdn(layer, mixed_qkv, b, a, core_attn_out)

    return lumotree_gdn_attention_core
