"""The model's tree-verification mode: one target forward over every row of a draft tree, then
publication of the accepted path into the request's durable state (DESIGN §3.3, §3.5).

The layers' own projection code runs unchanged (`DecoderLayer.chained`: each output projection
adds the residual and, on the fused path, leaves the next pre-norm pending); only the mixers are
swapped for the tree op families (tree conv + GDN path scan for linear layers, tree attention for
full-attention layers), taken from a `TreeKernels` set. A root-only tree is one autoregressive
decode step and a chain is chain-speculation verification: AR, chain MTP and LumoTree share this
code path.

verify_tree never writes durable GDN or conv state; it writes the tree's KV rows into the cache
slots past the committed prefix (prefix_len + slot_map), where publication finds them. The one
exception is the device engine's AR step (`tree_forward(advance_root=True)`): a root-only tree is
accepted whatever is sampled, so its GDN scans advance the recurrent states in place and
publication skips their replay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, TypeAlias

import torch
from torch import Tensor

from lumotree.model.attention import GatedAttention, gated_rows, output_rows
from lumotree.model.fused.pending_norm import PendingNorm
from lumotree.model.gdn import GatedDeltaNet
from lumotree.model.model import HybridLM
from lumotree.model.state import GDNState, KVCache, ModelState
from lumotree.tree import TreeDescriptor
from lumotree.verify.gdn.reference import GateInputs, GdnInputs, GdnOperands, record_shapes
from lumotree.verify.kernel_sets import REFERENCE, TreeKernels

if TYPE_CHECKING:  # the device tables need Triton, which CPU-only installs may lack
    from lumotree.verify.device_tree import DeviceTree

TreeTables: TypeAlias = "TreeDescriptor | DeviceTree"


@dataclass(eq=False)
class GdnRecord:
    """What one GDN layer's verification leaves for publication: pre-conv inputs x [R, C] and the
    recorded recurrence operands of every row."""

    x: Tensor
    operands: GdnOperands


@dataclass(eq=False)
class TreeForward:
    """hidden [R, hidden] post-norm rows (logical order); one GdnRecord per GDN layer, in layer order;
    tree: what the forward was run with (the descriptor, or its DeviceTree on the device path);
    gdn_advanced: the GDN states already hold the root's update (an AR step's forward)."""

    tree: TreeTables
    hidden: Tensor
    gdn: list[GdnRecord]
    gdn_advanced: bool = False


class RecordBanks:
    """Every GDN layer's records of one forward in stacked banks (conv inputs [L, R, C], operands
    [L, R, ...] fp32), allocated at the first layer from its shapes: layer i writes its slices, and
    publication reads each bank whole instead of stacking the layers' records."""

    def __init__(self, layers: int) -> None:
        self.layers = layers
        self.inputs: Tensor | None = None
        self.operands: GdnOperands | None = None

    def conv_input(self, layer: int, x: Tensor) -> Tensor:
        """Layer `layer`'s slice for its conv inputs x [R, C]."""
        if self.inputs is None:
            self.inputs = x.new_empty((self.layers, *x.shape))
        return self.inputs[layer]

    def layer_operands(
        self, layer: int, rows: int, mixer: GatedDeltaNet, device: torch.device
    ) -> GdnOperands:
        """Layer `layer`'s record slices for the operands of `rows` rows of `mixer`'s shapes."""
        if self.operands is None:
            shapes = record_shapes(
                rows, mixer.num_k_heads, mixer.num_v_heads, mixer.head_k_dim, mixer.head_v_dim
            )
            self.operands = GdnOperands(
                **{
                    f: torch.empty((self.layers, *s), dtype=torch.float32, device=device)
                    for f, s in shapes.items()
                }
            )
        return self.operands.map(lambda t: t[layer])


def _gdn_tree(
    mixer: GatedDeltaNet,
    x: Tensor | PendingNorm,
    *,
    state: GDNState,
    tree: TreeTables,
    kernels: TreeKernels,
    records: list[GdnRecord],
    banks: RecordBanks | None,
    advance: bool,
) -> Tensor:
    mixed_qkv, z, a, b = mixer.project(x)
    weight, layer = mixer.conv1d.weight[:, 0], len(records)
    if banks is not None:  # the prepared path: the conv prepares the scan's operands in its launch
        assert kernels.conv_operands is not None and kernels.gdn_scan is not None
        x_record = banks.conv_input(layer, mixed_qkv[0])
        ops = banks.layer_operands(layer, x_record.shape[0], mixer, x_record.device)
        gates = GateInputs(a[0], b[0], mixer.A_log, mixer.dt_bias)
        kernels.conv_operands(mixed_qkv[0], state.conv, weight, tree, gates, x_record, ops)
        records.append(GdnRecord(x_record, ops))
        o = kernels.gdn_scan(ops, state.recurrent, tree, mixed_qkv.dtype, advance=advance)
        return mixer.normed_output(o[None], z)
    conv_out = kernels.tree_conv(mixed_qkv[0], state.conv, weight, None, tree)
    q, k, v = mixer.split_qkv(conv_out[None])
    inputs = GdnInputs(q[0], k[0], v[0], a[0], b[0], mixer.A_log, mixer.dt_bias)
    result = kernels.gdn_verify(inputs, state.recurrent, tree)
    records.append(GdnRecord(mixed_qkv[0], result.operands))
    return mixer.normed_output(result.o[None], z)


def _attention_tree(
    attn: GatedAttention,
    x: Tensor | PendingNorm,
    *,
    cos: Tensor,
    sin: Tensor,
    cache: KVCache,
    tree: TreeTables,
    kernels: TreeKernels,
) -> Tensor:
    q, k, v, gate = attn.project(x, cos, sin)
    kernels.write_tree_kv(cache.key, cache.value, k[0], v[0], tree)
    if kernels.gated_tree_attention is not None:
        gated = kernels.gated_tree_attention(q[0], cache.key, cache.value, tree, gate[0])
        return output_rows(gated[None])
    o, _ = kernels.tree_attention(q[0], cache.key, cache.value, tree)
    return gated_rows(o[None], gate)


def verify_tree(
    model: HybridLM, state: ModelState, tree: TreeDescriptor, kernels: TreeKernels = REFERENCE
) -> TreeForward:
    """Run all tree rows through the target model from the committed `state` (read only, except
    the tree's KV slots). tree.prefix_len must equal state.length."""
    if tree.prefix_len != state.length:
        raise ValueError(f"tree prefix_len {tree.prefix_len} != committed length {state.length}")
    check_capacity(state, tree.rows)
    return tree_forward(model, state, tree, kernels)


def check_capacity(state: ModelState, rows: int) -> None:
    """ValueError when `rows` tree rows past the committed prefix do not fit the KV caches."""
    if state.length + rows > state.capacity:
        raise ValueError(
            f"context limit: {state.length} committed + {rows} tree rows exceed the KV capacity "
            f"{state.capacity}"
        )


def tree_forward(
    model: HybridLM,
    state: ModelState,
    tables: TreeTables,
    kernels: TreeKernels,
    advance_root: bool = False,
) -> TreeForward:
    """verify_tree without the host-side checks: `tables` is the descriptor (reference and CPU
    kernel sets) or its `DeviceTree` (the triton set), whose per-cycle values live on the device,
    so this forward can be captured in a CUDA graph and replayed for every later tree.
    advance_root: the tree is the root alone (an AR step, always accepted) and the kernel set
    prepares the GDN operands: the scans advance the GDN states in place
    (`TreeForward.gdn_advanced`)."""
    if advance_root and (tables.rows != 1 or not kernels.prepares_gdn):
        raise ValueError(
            "the GDN states advance in the forward only for a one-row tree of a preparing kernel set"
        )
    cos, sin = model.rotary(tables.position[None])
    h = model.embed(tables.tokens[None])
    records: list[GdnRecord] = []
    layers = model.model.layers
    linear = sum(1 for layer in layers if layer.is_linear)
    banks = RecordBanks(linear) if kernels.prepares_gdn else None
    x: Tensor | PendingNorm | None = layers[0].input_layernorm(h)
    norms = [following.input_layernorm for following in layers[1:]] + [None]  # each layer's next
    for layer, layer_state, next_norm in zip(layers, state.layers, norms, strict=True):
        mixer: Callable[[Tensor | PendingNorm], Tensor]
        if layer.is_linear:
            assert isinstance(layer_state, GDNState)
            mixer = partial(
                _gdn_tree,
                layer.linear_attn,
                state=layer_state,
                tree=tables,
                kernels=kernels,
                records=records,
                banks=banks,
                advance=advance_root,
            )
        else:
            assert isinstance(layer_state, KVCache)
            mixer = partial(
                _attention_tree,
                layer.self_attn,
                cos=cos,
                sin=sin,
                cache=layer_state,
                tree=tables,
                kernels=kernels,
            )
        assert x is not None  # (None only after the last layer)
        h, x = layer.chained(h, x, mixer, next_norm)
    return TreeForward(tables, model.model.norm(h)[0], records, gdn_advanced=advance_root)


def publish_tree_(
    state: ModelState,
    forward: TreeForward,
    accepted: Tensor,
    path_len: int,
    kernels: TreeKernels = REFERENCE,
) -> None:
    """Publish accepted[0:path_len] (logical nodes, root first, -1 padded) into `state` in place:
    GDN replay of the recorded operands, conv state from the path's last inputs, KV rows moved to
    contiguous positions. state.length advances by path_len."""
    tree = forward.tree
    if tree.prefix_len != state.length:
        raise ValueError(f"publication for prefix {tree.prefix_len} but the state holds {state.length}")
    if not 1 <= path_len <= tree.n_active:
        raise ValueError(f"path_len must be in 1..{tree.n_active}, got {path_len}")
    publish_path_(state, forward, accepted, path_len, kernels)
    state.length += path_len


def publish_path_(
    state: ModelState, forward: TreeForward, accepted: Tensor, path_len: Tensor | int, kernels: TreeKernels
) -> None:
    """publish_tree_ without the host-side checks and without advancing state.length: accepted and
    path_len may live on the device (the walk's outputs), so this can be graph-captured."""
    gdn_states = [s for s in state.layers if isinstance(s, GDNState)]
    if not forward.gdn_advanced:
        kernels.replay(
            [s.recurrent for s in gdn_states], [r.operands for r in forward.gdn], accepted, path_len
        )
    if kernels.publish_conv_layers is not None:
        convs, inputs = [s.conv for s in gdn_states], [r.x for r in forward.gdn]
        kernels.publish_conv_layers(convs, inputs, accepted, path_len)
    else:
        for layer_state, record in zip(gdn_states, forward.gdn, strict=True):
            kernels.publish_conv(layer_state.conv, record.x, accepted, path_len)
    caches = [cache for cache in state.layers if isinstance(cache, KVCache)]
    if kernels.publish_kv_layers is not None:
        keys, values = [c.key for c in caches], [c.value for c in caches]
        kernels.publish_kv_layers(keys, values, forward.tree, accepted, path_len)
    else:
        for cache in caches:
            kernels.publish_kv(cache.key, cache.value, forward.tree, accepted, path_len)
