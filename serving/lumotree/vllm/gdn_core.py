"""The Gated DeltaNet core (conv + recurrence) of vLLM's Qwen3-Next layers, replaced by LumoTree's.

vLLM's layer keeps its projections, gated RMSNorm and output projection; a core (`GdnCore`) is what
runs between them (what vLLM's `cpu_gdn_attention_core` op does), for every scheduled request:
- a chunk of known tokens runs from the request's state slot and writes the slot (prefill);
- a tree runs from the slot, writes nothing durable and records what publication replays;
- `publish` replays a segment of a tree's accepted path into the slots of every GDN layer.
Two cores: `TorchGdnCore` here (the project model's chain ops `gdn_ops` and an op set's tree conv and
GDN verification: the reference, and the Triton set on CUDA) and `native_core.NativeGdnCore` (the
native forward's kernels, the CPU default). Any dtype works (vLLM's own CPU kernel is bf16 only);
the recurrent state is fp32.

State layout in vLLM's mamba cache, slot s of a layer: the recurrent state `ssm[s]` [HV, V, K]
(V-first, the core's layout) and the conv state in the first W-1 entries of the conv buffer
(oldest first; vLLM's buffer is wider when speculation is configured, the rest is unused).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from lumotree.model import gdn_ops
from lumotree.model.tree_mode import GdnRecord
from lumotree.verify.gdn.reference import GdnInputs
from lumotree.verify.kernel_sets import TreeKernels
from lumotree.vllm.steps import RequestStep, StepPlan


def conv_state_view(conv_cache: Tensor, slot: int, width: int, dim_first: bool) -> Tensor:
    """The durable conv state [C, W-1] of a slot, a view into vLLM's conv cache (layout DS
    [slots, C, L] or SD [slots, L, C])."""
    if dim_first:
        return conv_cache[slot, :, : width - 1]
    return conv_cache[slot, : width - 1, :].transpose(0, 1)


def conv_weight(layer: torch.nn.Module) -> Tensor:
    """The plain [C, W] depthwise conv weight (vLLM keeps an unpacked copy where it packs weights)."""
    unpacked = getattr(layer.conv1d, "_cpu_unpacked_conv_weight", None)
    weight = unpacked if unpacked is not None else layer.conv1d.weight
    return weight.reshape(weight.shape[0], weight.shape[-1])


def _split_qkv(layer: torch.nn.Module, conv_out: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """[n, C] -> q, k [n, H, K] and v [n, HV, V] (raw, not yet normalised)."""
    n = conv_out.shape[0]
    key_dim, value_dim = layer.key_dim // layer.tp_size, layer.value_dim // layer.tp_size
    q, k, v = conv_out.split([key_dim, key_dim, value_dim], dim=-1)
    return (
        q.reshape(n, -1, layer.head_k_dim),
        k.reshape(n, -1, layer.head_k_dim),
        v.reshape(n, -1, layer.head_v_dim),
    )


def run_chunk(
    layer: torch.nn.Module,
    x: Tensor,
    a: Tensor,
    b: Tensor,
    conv_state: Tensor,
    state: Tensor,
    width: int,
) -> Tensor:
    """Known tokens x [n, C] through conv + delta rule from (conv_state [C, W-1], state [HV, V, K]),
    both updated in place. Returns o [n, HV, V] in x's dtype."""
    y, new_conv = gdn_ops.causal_conv1d(x[None], conv_weight(layer), conv_state[None])
    q, k, v = _split_qkv(layer, y[0])
    g = -layer.A_log.float().exp() * F.softplus(a.float() + layer.dt_bias.float())
    qn, kn = gdn_ops.prepare_qk(q[None], k[None], v.shape[1])
    step = gdn_ops.recurrent_gated_delta_rule if x.shape[0] == 1 else gdn_ops.chunk_gated_delta_rule
    o, new_state = step(qn, kn, v[None], g[None], b.float().sigmoid()[None], state[None])
    state.copy_(new_state[0])
    conv_state.copy_(new_conv[0])
    return o[0].to(x.dtype)


def run_tree(
    layer: torch.nn.Module,
    req: RequestStep,
    x: Tensor,
    a: Tensor,
    b: Tensor,
    conv_state: Tensor,
    state: Tensor,
    kernels: TreeKernels,
) -> tuple[Tensor, GdnRecord]:
    """Every row of a tree (x [R, C] in logical order) verified from the committed states, which
    are only read. Returns o [R, HV, V] and the record publication needs."""
    assert req.tree is not None
    conv_out = kernels.tree_conv(x, conv_state, conv_weight(layer), None, req.tree)
    q, k, v = _split_qkv(layer, conv_out)
    result = kernels.gdn_verify(GdnInputs(q, k, v, a, b, layer.A_log, layer.dt_bias), state, req.tree)
    return result.o, GdnRecord(x, result.operands)


class GdnCore(Protocol):
    """What the plugin's GDN op and publication call (see the module docstring)."""

    def forward(
        self,
        layer: torch.nn.Module,
        plan: StepPlan,
        group: int,
        dim_first: bool,
        mixed_qkv: Tensor,
        b: Tensor,
        a: Tensor,
        core_attn_out: Tensor,
    ) -> None:
        """vLLM's GDN core op for one layer and every request of the plan: core_attn_out
        [N, HV, V] written in place (rows of the scheduled tokens)."""
        ...

    def publish(
        self,
        req: RequestStep,
        names: Sequence[str],
        states: Sequence[Tensor],
        convs: Sequence[Tensor],
        nodes: Sequence[int],
    ) -> None:
        """Publish logical nodes (a segment of the accepted path, in order) of the request's tree
        into the GDN layers `names` (states[i] [HV, V, K] fp32, convs[i] [C, W-1]: layer i's, in place)."""
        ...


def start_sequence(req: RequestStep, conv_state: Tensor, state: Tensor) -> None:
    """A new sequence starts from zero states (vLLM reuses slots without clearing them)."""
    if req.prefix_len == 0:
        conv_state.zero_()
        state.zero_()


class TorchGdnCore:
    """The GDN core in PyTorch: chunks by the model's chain ops, trees by an op set."""

    def __init__(self, kernels: TreeKernels) -> None:
        self.kernels = kernels

    def forward(
        self,
        layer: torch.nn.Module,
        plan: StepPlan,
        group: int,
        dim_first: bool,
        mixed_qkv: Tensor,
        b: Tensor,
        a: Tensor,
        core_attn_out: Tensor,
    ) -> None:
        conv_cache, ssm_cache = layer.kv_cache[0], layer.kv_cache[1]
        width = layer.conv_kernel_size
        for req in plan.requests:
            slot = plan.state_slot(req, group)
            conv_state = conv_state_view(conv_cache, slot, width, dim_first)
            state = ssm_cache[slot]
            if req.tree is None:
                start_sequence(req, conv_state, state)
                rows = req.tokens
                core_attn_out[rows] = run_chunk(
                    layer, mixed_qkv[rows], a[rows], b[rows], conv_state, state, width
                )
            else:
                assert req.rows is not None
                rows = req.rows
                o, record = run_tree(
                    layer, req, mixed_qkv[rows], a[rows], b[rows], conv_state, state, self.kernels
                )
                core_attn_out[rows] = o.to(core_attn_out.dtype)
                req.gdn[layer.prefix] = record

    def publish(
        self,
        req: RequestStep,
        names: Sequence[str],
        states: Sequence[Tensor],
        convs: Sequence[Tensor],
        nodes: Sequence[int],
    ) -> None:
        assert req.tree is not None
        records = [req.gdn[name] for name in names]
        segment = req.tree.padded_path(list(nodes))
        for conv, record in zip(convs, records, strict=True):
            self.kernels.publish_conv(conv, record.x, segment, len(nodes))
        if states:
            self.kernels.replay(states, [record.operands for record in records], segment, len(nodes))
