"""The model's tree-verification mode: one target forward over every row of a draft tree, then
publication of the accepted path into the request's durable state (DESIGN §3.3, §3.5); and the
MTP head's chained draft step in the same style.

The layers' own project and output code runs unchanged; only the mixers are swapped for the tree
op families (tree conv + GDN path scan for linear layers, tree attention for full-attention layers),
taken from a `TreeKernels` set. A root-only tree is one autoregressive decode step and a chain is
chain-speculation verification: AR, chain MTP and LumoTree share this code path.

verify_tree never writes durable GDN or conv state; it writes the tree's KV rows into the cache
slots past the committed prefix (prefix_len + slot_map), where publication finds them.

`mtp_chain_step` is `HybridLM.mtp_step` for a drafter: grouped-query attention without repeating KV
heads over the whole context, and logits for the last row only (the next draft); it computes
the same values (tested).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor

from lumotree.model.attention import GatedAttention, causal_mask
from lumotree.model.gdn import GatedDeltaNet
from lumotree.model.layers import DecoderLayer
from lumotree.model.model import HybridLM
from lumotree.model.state import GDNState, KVCache, ModelState
from lumotree.tree import TreeDescriptor
from lumotree.verify.gdn.reference import GdnOperands
from lumotree.verify.kernel_sets import REFERENCE, TreeKernels


@dataclass(eq=False)
class GdnRecord:
    """What one GDN layer's verification leaves for publication: pre-conv inputs x [R, C] and the
    recorded recurrence operands of every row."""

    x: Tensor
    operands: GdnOperands


@dataclass(eq=False)
class TreeForward:
    """hidden [R, hidden] post-norm rows (logical order); one GdnRecord per GDN layer, in layer order."""

    tree: TreeDescriptor
    hidden: Tensor
    gdn: list[GdnRecord]


def _gdn_tree(
    mixer: GatedDeltaNet,
    x: Tensor,
    *,
    state: GDNState,
    tree: TreeDescriptor,
    kernels: TreeKernels,
    records: list[GdnRecord],
) -> Tensor:
    mixed_qkv, z, a, b = mixer.project(x)
    conv_out = kernels.tree_conv(mixed_qkv[0], state.conv, mixer.conv1d.weight[:, 0], None, tree)
    q, k, v = mixer.split_qkv(conv_out[None])
    result = kernels.gdn_verify(
        q[0], k[0], v[0], a[0], b[0], mixer.A_log, mixer.dt_bias, state.recurrent, tree
    )
    records.append(GdnRecord(mixed_qkv[0], result.operands))
    return mixer.output(result.o[None], z)


def _attention_tree(
    attn: GatedAttention,
    x: Tensor,
    *,
    cos: Tensor,
    sin: Tensor,
    cache: KVCache,
    tree: TreeDescriptor,
    kernels: TreeKernels,
) -> Tensor:
    q, k, v, gate = attn.project(x, cos, sin)
    kernels.write_tree_kv(cache.key, cache.value, k[0], v[0], tree)
    o, _ = kernels.tree_attention(q[0], cache.key, cache.value, tree)
    return attn.output(o[None], gate)


def verify_tree(
    model: HybridLM, state: ModelState, tree: TreeDescriptor, kernels: TreeKernels = REFERENCE
) -> TreeForward:
    """Run all tree rows through the target model from the committed `state` (read only, except
    the tree's KV slots). tree.prefix_len must equal state.length."""
    if tree.prefix_len != state.length:
        raise ValueError(f"tree prefix_len {tree.prefix_len} != committed length {state.length}")
    if state.length + tree.rows > state.capacity:
        raise ValueError(
            f"context limit: {state.length} committed + {tree.rows} tree rows exceed the KV capacity "
            f"{state.capacity}"
        )
    cos, sin = model.rotary(tree.position[None])
    h = model.embed(tree.tokens[None])
    records: list[GdnRecord] = []
    for layer, layer_state in zip(model.model.layers, state.layers, strict=True):
        mixer: Callable[[Tensor], Tensor]
        if layer.is_linear:
            assert isinstance(layer_state, GDNState)
            mixer = partial(
                _gdn_tree, layer.linear_attn, state=layer_state, tree=tree, kernels=kernels, records=records
            )
        else:
            assert isinstance(layer_state, KVCache)
            mixer = partial(
                _attention_tree,
                layer.self_attn,
                cos=cos,
                sin=sin,
                cache=layer_state,
                tree=tree,
                kernels=kernels,
            )
        h = _residual_block(layer, h, mixer)
    return TreeForward(tree, model.model.norm(h)[0], records)


def _residual_block(layer: DecoderLayer, h: Tensor, mixer: Callable[[Tensor], Tensor]) -> Tensor:
    """DecoderLayer.forward's structure with the token mixer swapped: pre-norm mixer, pre-norm MLP."""
    h = h + mixer(layer.input_layernorm(h))
    return h + layer.mlp(layer.post_attention_layernorm(h))


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
    gdn_states = [s for s in state.layers if isinstance(s, GDNState)]
    kernels.replay([s.recurrent for s in gdn_states], [r.operands for r in forward.gdn], accepted, path_len)
    for layer_state, record in zip(gdn_states, forward.gdn, strict=True):
        kernels.publish_conv(layer_state.conv, record.x, accepted, path_len)
    for cache in state.layers:
        if isinstance(cache, KVCache):
            kernels.publish_kv(cache.key, cache.value, tree, accepted, path_len)
    state.length += path_len


def _attention_chain(
    attn: GatedAttention, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache, start: int
) -> Tensor:
    """x [1, T, H] at positions start.. : write KV rows, attend causally over rows [0, start+T)."""
    q, k, v, gate = attn.project(x, cos, sin)
    seq = x.shape[1]
    end = start + seq
    cache.key[start:end] = k[0]
    cache.value[start:end] = v[0]
    mask = None if seq == 1 else causal_mask(seq, end, x.device)
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2),
        cache.key[None, :end].transpose(1, 2),
        cache.value[None, :end].transpose(1, 2),
        attn_mask=mask,
        enable_gqa=True,
    )
    return attn.output(o.transpose(1, 2), gate)


@torch.inference_mode()
def mtp_chain_step(
    model: HybridLM,
    hidden: Tensor,
    tokens: Tensor,
    mtp_state: ModelState,
    step_idx: int = 0,
    lm_head: Callable[[Tensor], Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """HybridLM.mtp_step for drafting: hidden rows [T, H] and their next tokens [T] at positions
    mtp_state.length.. -> (logits [V] of the last row, MTP hidden rows [T, H]). Writes the MTP KV
    rows and advances mtp_state.length by T. lm_head: the vocabulary projection to use (default
    the model's)."""
    mtp = model.mtp
    if mtp is None:
        raise ValueError("this model has no MTP module")
    start, seq = mtp_state.length, hidden.shape[0]
    cos, sin = model.rotary(torch.arange(start, start + seq, device=hidden.device)[None])
    layer = mtp.layers[step_idx % len(mtp.layers)]
    cache = mtp_state.layers[step_idx % len(mtp_state.layers)]
    assert isinstance(cache, KVCache)
    x = torch.cat(
        [mtp.pre_fc_norm_embedding(model.embed(tokens[None])), mtp.pre_fc_norm_hidden(hidden[None])], -1
    )
    h = _residual_block(
        layer, mtp.fc(x), lambda y: _attention_chain(layer.self_attn, y, cos, sin, cache, start)
    )
    out = mtp.norm(h)[0]
    mtp_state.length = start + seq
    return (lm_head or model.compute_logits)(out[-1]), out
