"""The plugin's hot path on the native forward's kernels, the CPU default: the GDN core
(`lumotree.model.native.gdn_core`: one C call per layer and request for a chunk or a tree, reading
vLLM's flat token rows and writing its output rows in place, bf16 or float32, on the request's state
slot; one call per request for the publication of every layer; a tree's tables and records live on
its step, `RequestStep.native`) and the tree rows' attention over vLLM's paged KV
(`lumotree.model.native.paged_attention`: one C call per layer and tree).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from lumotree.model.native.gdn_core import GdnShape, GdnWeights, NativeGdn, NativeTree, TreeRows, token_rows
from lumotree.model.native.paged_attention import KVMirror, NativePagedAttention
from lumotree.vllm.gdn_core import conv_state_view, conv_weight, start_sequence
from lumotree.vllm.steps import RequestStep, StepPlan

CHAIN_ROWS = 32  # a chunk's rows per block (tree rows may be more)


def layer_shape(layer: torch.nn.Module) -> GdnShape:
    """A vLLM GDN layer's sizes (tensor parallel size 1)."""
    heads_k, heads_v = layer.key_dim // layer.head_k_dim, layer.value_dim // layer.head_v_dim
    return GdnShape(
        conv_dim=2 * layer.key_dim + layer.value_dim,
        conv_width=layer.conv_kernel_size,
        key_heads=heads_k,
        value_heads=heads_v,
        key_dim=layer.head_k_dim,
        value_dim=layer.head_v_dim,
    )


class NativeGdnCore:
    """`GdnCore` of the GDN layers `layers` (by vLLM layer name) for trees of up to max_rows rows."""

    def __init__(self, layers: Mapping[str, torch.nn.Module], max_rows: int) -> None:
        modules = list(layers.values())
        shape = layer_shape(modules[0])
        weights = [GdnWeights(conv_weight(m), m.A_log, m.dt_bias) for m in modules]
        self.native = NativeGdn(shape, weights, max(max_rows, CHAIN_ROWS))
        self.index = {name: i for i, name in enumerate(layers)}

    def _tree(self, req: RequestStep) -> NativeTree:
        """The step's native tables and records, made at its first layer."""
        if req.native is None:
            assert req.tree is not None
            req.native = self.native.new_tree(req.tree)
        return req.native

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
        index = self.index[layer.prefix]
        conv_cache, ssm_cache = layer.kv_cache[0], layer.kv_cache[1]
        io = token_rows(mixed_qkv, a, b, core_attn_out)
        for req in plan.requests:
            slot = plan.state_slot(req, group)
            conv_state = conv_state_view(conv_cache, slot, layer.conv_kernel_size, dim_first)
            state = ssm_cache[slot]
            if req.tree is None:
                start_sequence(req, conv_state, state)
                self.native.chain(index, io, req.start, req.count, conv_state, state)
            else:
                self.native.tree(index, self._tree(req), io, req.start, conv_state, state)

    def publish(
        self,
        req: RequestStep,
        names: Sequence[str],
        states: Sequence[Tensor],
        convs: Sequence[Tensor],
        nodes: Sequence[int],
    ) -> None:
        if [self.index[name] for name in names] != list(range(len(self.index))):
            raise ValueError("the native core publishes all its GDN layers at once, in model order")
        assert req.native is not None
        self.native.publish(req.native, states, convs, nodes)


class NativeTreeAttention:
    """The tree rows' attention (see `tree_attention.py`) on the native forward's kernels, over
    vLLM's CPU paged KV in its "vec" layouts, for requests of up to `capacity` positions; its
    buffers are sized at the first call (heads from the query, KV heads from the cache). Each
    request keeps a float32 mirror of its committed positions per layer, until `forget`."""

    LAYOUTS = ("vec", "vec16")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.native: NativePagedAttention | None = None
        self._mirrors: dict[tuple[str, str], KVMirror] = {}

    def forget(self, req_id: str) -> None:
        """Drop a request's mirrors: it finished, or its positions may be rewritten (a chunk step:
        a prefill, a restart after preemption)."""
        for key in [k for k in self._mirrors if k[0] == req_id]:
            del self._mirrors[key]

    def rows(
        self, plan: StepPlan, group: int, layer: str, query: Tensor, kv_cache: Tensor, output: Tensor
    ) -> None:
        """Overwrite output [N, Hq, D] at every tree row of the plan; query [N, Hq, D] RoPE'd at
        depth positions, kv_cache layer `layer`'s paged cache holding the step's rows already."""
        if self.native is None:
            heads, dim = query.shape[1], query.shape[2]
            self.native = NativePagedAttention(heads, kv_cache.shape[1], dim, self.capacity)
        for req in plan.trees:
            assert req.tree is not None
            rows = req.native.rows if req.native is not None else TreeRows(req.tree)
            blocks = plan.block_rows[group][req.index]  # type: ignore[index]
            mirror = self._mirrors.get((req.req_id, layer))
            if mirror is None:
                mirror = self._mirrors[req.req_id, layer] = self.native.new_mirror()
            self.native.tree(rows, kv_cache, blocks, query, output, req.start, mirror)
