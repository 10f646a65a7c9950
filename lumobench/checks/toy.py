"""A toy hybrid stack for publication checks: a fake model that honestly stands for the per-layer
operand flow of a Qwen3.5-style block (embedding -> in_proj -> conv -> GDN; embedding -> q/k/v ->
partial RoPE -> attention), with two GDN layers and one attention layer that each read the token
embedding directly. Tree cycles run through the LumoTree references (verify, then publish the
accepted path); the step-by-step decoder runs one token at a time through independent native code
(F.conv1d, the sequential GDN ground truth, scaled_dot_product_attention).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from lumotree.tree import TreeDescriptor, chain_tree
from lumotree.verify.attention.reference import (
    apply_partial_rope,
    publish_kv_,
    tree_attention,
    write_tree_kv_,
)
from lumotree.verify.conv.reference import publish_conv_state_, tree_conv
from lumotree.verify.gdn.reference import (
    GdnInputs,
    GdnVerifyResult,
    gdn_sequential_reference,
    gdn_verify,
    replay_accepted_,
)


@dataclass(frozen=True)
class ToyDims:
    vocab: int = 64
    d_model: int = 32
    H: int = 2
    HV: int = 4
    K: int = 16
    V: int = 16
    Hq: int = 4
    Hkv: int = 2
    D: int = 16
    rotary_dim: int = 8
    theta: float = 10000.0
    gdn_layers: int = 2
    width: int = 4
    max_len: int = 160

    @property
    def channels(self) -> int:
        return 2 * self.H * self.K + self.HV * self.V


@dataclass(frozen=True, eq=False)
class ToyGdnLayer:
    w_in: Tensor  # [Dm, C]
    w_a: Tensor  # [Dm, HV]
    w_b: Tensor  # [Dm, HV]
    conv_w: Tensor  # [C, W]
    conv_b: Tensor  # [C]
    A_log: Tensor  # [HV] float32 (float64 in a float64 model)
    dt_bias: Tensor  # [HV]


@dataclass(frozen=True, eq=False)
class ToyHybrid:
    dims: ToyDims
    embed: Tensor  # [vocab, Dm]
    gdn: tuple[ToyGdnLayer, ...]
    w_q: Tensor  # [Dm, Hq*D]
    w_k: Tensor  # [Dm, Hkv*D]
    w_v: Tensor  # [Dm, Hkv*D]

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    def to(self, dtype: torch.dtype) -> ToyHybrid:
        """Weights in `dtype`; gate parameters stay float32 unless dtype is float64."""
        param = torch.float64 if dtype == torch.float64 else torch.float32
        layers = tuple(
            ToyGdnLayer(
                layer.w_in.to(dtype),
                layer.w_a.to(dtype),
                layer.w_b.to(dtype),
                layer.conv_w.to(dtype),
                layer.conv_b.to(dtype),
                layer.A_log.to(param),
                layer.dt_bias.to(param),
            )
            for layer in self.gdn
        )
        return ToyHybrid(
            self.dims,
            self.embed.to(dtype),
            layers,
            self.w_q.to(dtype),
            self.w_k.to(dtype),
            self.w_v.to(dtype),
        )


def make_toy(dims: ToyDims, gen: torch.Generator) -> ToyHybrid:
    """Random float32 weights at scales that keep every activation O(1)."""

    def w(*shape: int, scale: float = 1.0) -> Tensor:
        return torch.randn(*shape, generator=gen) * scale

    dm = dims.d_model
    layers = tuple(
        ToyGdnLayer(
            w(dm, dims.channels, scale=dm**-0.5),
            w(dm, dims.HV, scale=dm**-0.5),
            w(dm, dims.HV, scale=dm**-0.5),
            w(dims.channels, dims.width, scale=0.5),
            w(dims.channels, scale=0.1),
            torch.empty(dims.HV).uniform_(0.0, 2.5, generator=gen),
            w(dims.HV, scale=0.5),
        )
        for _ in range(dims.gdn_layers)
    )
    return ToyHybrid(
        dims,
        w(dims.vocab, dm),
        layers,
        w(dm, dims.Hq * dims.D, scale=dm**-0.5),
        w(dm, dims.Hkv * dims.D, scale=dm**-0.5),
        w(dm, dims.Hkv * dims.D, scale=dm**-0.5),
    )


@dataclass(eq=False)
class ToyState:
    """Durable per-request state: GDN states [HV, V, K] and conv states [C, W-1] per layer, KV cache."""

    gdn: list[Tensor]
    conv: list[Tensor]
    k_cache: Tensor  # [T_max, Hkv, D]
    v_cache: Tensor
    length: int  # committed tokens (rows of the KV cache in use)

    def to(self, model: ToyHybrid) -> ToyState:
        """A copy in the model's storage dtypes (GDN state in its compute dtype)."""
        sd = torch.float64 if model.dtype == torch.float64 else torch.float32
        return ToyState(
            [s.to(sd).clone() for s in self.gdn],
            [c.to(model.dtype).clone() for c in self.conv],
            self.k_cache.to(model.dtype).clone(),
            self.v_cache.to(model.dtype).clone(),
            self.length,
        )


def make_state(dims: ToyDims, prefix_len: int, gen: torch.Generator) -> ToyState:
    """A committed prefix of `prefix_len` random KV rows, random recurrent and conv state (float32)."""
    k = torch.zeros(dims.max_len, dims.Hkv, dims.D)
    v = torch.zeros_like(k)
    k[:prefix_len] = torch.randn(prefix_len, dims.Hkv, dims.D, generator=gen)
    v[:prefix_len] = torch.randn(prefix_len, dims.Hkv, dims.D, generator=gen)
    return ToyState(
        [0.5 * torch.randn(dims.HV, dims.V, dims.K, generator=gen) for _ in range(dims.gdn_layers)],
        [torch.randn(dims.channels, dims.width - 1, generator=gen) for _ in range(dims.gdn_layers)],
        k,
        v,
        prefix_len,
    )


def _split(model: ToyHybrid, y: Tensor, h: Tensor, layer: ToyGdnLayer) -> tuple[Tensor, ...]:
    d, n = model.dims, y.shape[0]
    qk = d.H * d.K
    q = y[:, :qk].reshape(n, d.H, d.K)
    k = y[:, qk : 2 * qk].reshape(n, d.H, d.K)
    v = y[:, 2 * qk :].reshape(n, d.HV, d.V)
    return q, k, v, h @ layer.w_a, h @ layer.w_b


def _qkv_attn(model: ToyHybrid, h: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    d, n = model.dims, h.shape[0]
    q = apply_partial_rope((h @ model.w_q).reshape(n, d.Hq, d.D), positions, d.rotary_dim, d.theta)
    k = apply_partial_rope((h @ model.w_k).reshape(n, d.Hkv, d.D), positions, d.rotary_dim, d.theta)
    return q, k, (h @ model.w_v).reshape(n, d.Hkv, d.D)


@dataclass(eq=False)
class ToyVerified:
    """One tree forward: pre-conv inputs x [R, C] and GDN results per layer, attention output [R, Hq, D]."""

    x: list[Tensor]
    gdn: list[GdnVerifyResult]
    attn: Tensor


def toy_verify(model: ToyHybrid, state: ToyState, tree: TreeDescriptor) -> ToyVerified:
    """Verify all tree rows; writes only the tree's KV slots, never the durable state."""
    if tree.prefix_len != state.length:
        raise ValueError(f"tree prefix_len {tree.prefix_len} != committed length {state.length}")
    h = model.embed[tree.tokens]
    xs, results = [], []
    for layer, s, cs in zip(model.gdn, state.gdn, state.conv, strict=True):
        x = h @ layer.w_in
        y = tree_conv(x, cs, layer.conv_w, layer.conv_b, tree)
        results.append(
            gdn_verify(GdnInputs(*_split(model, y, h, layer), layer.A_log, layer.dt_bias), s, tree)
        )
        xs.append(x)
    q, k, v = _qkv_attn(model, h, tree.position)
    write_tree_kv_(state.k_cache, state.v_cache, k, v, tree)
    return ToyVerified(xs, results, tree_attention(q, state.k_cache, state.v_cache, tree)[0])


@dataclass(frozen=True, eq=False)
class Publication:
    """What publication consumes: the accepted path (and per-consumer overrides a fault may plant)."""

    accepted: Tensor  # [D+1] int64 logical nodes, -1 padded
    path_len: int
    gdn_accepted: Tensor | None = None  # the path the recurrent replay uses (default: accepted)
    conv_accepted: Tensor | None = None  # the rows conv publication gathers (default: accepted)
    kv_slot_map: Tensor | None = None  # the slot map KV publication uses (default: the tree's)
    ring_order: tuple[int, ...] | None = None  # which layer's operand ring each layer replays
    replay: bool = True


def toy_publish(
    model: ToyHybrid, state: ToyState, tree: TreeDescriptor, verified: ToyVerified, pub: Publication
) -> None:
    """Publish the accepted path into every durable consumer, in place."""
    rings = pub.ring_order or tuple(range(len(model.gdn)))
    gdn_path = pub.accepted if pub.gdn_accepted is None else pub.gdn_accepted
    conv_path = pub.accepted if pub.conv_accepted is None else pub.conv_accepted
    for layer, ring in enumerate(rings):
        if pub.replay:
            replay_accepted_(state.gdn[layer], verified.gdn[ring].operands, gdn_path, pub.path_len)
        publish_conv_state_(state.conv[layer], verified.x[layer], conv_path, pub.path_len)
    kv_tree = tree if pub.kv_slot_map is None else replace(tree, slot_map=pub.kv_slot_map)
    publish_kv_(state.k_cache, state.v_cache, kv_tree, pub.accepted, pub.path_len)
    state.length += pub.path_len


@dataclass(eq=False)
class StepOutputs:
    """Per-token outputs of step-by-step decoding: GDN outputs [HV, V] per layer, attention [Hq, D]."""

    gdn: list[Tensor]
    attn: Tensor


def decode_step(model: ToyHybrid, state: ToyState, token: int) -> StepOutputs:
    """Native single-token decode through independent code; advances `state` by one token."""
    d = model.dims
    h = model.embed[token][None]
    outs = []
    for i, layer in enumerate(model.gdn):
        x = h @ layer.w_in
        window = torch.cat([state.conv[i], x.T], dim=1)  # [C, W]
        y = F.silu(F.conv1d(window[None], layer.conv_w[:, None, :], layer.conv_b, groups=d.channels))[
            0, :, -1
        ]
        state.conv[i] = window[:, 1:].clone()
        single = chain_tree([token], prefix_len=state.length)
        inputs = GdnInputs(*_split(model, y[None], h, layer), layer.A_log, layer.dt_bias)
        o, s = gdn_sequential_reference(inputs, state.gdn[i], single)
        state.gdn[i] = s[0]
        outs.append(o[0].to(model.dtype))
    pos = torch.tensor([state.length])
    q, k, v = _qkv_attn(model, h, pos)
    state.k_cache[state.length] = k[0]
    state.v_cache[state.length] = v[0]
    state.length += 1
    keys = state.k_cache[: state.length].repeat_interleave(d.Hq // d.Hkv, dim=1).transpose(0, 1)  # [Hq, T, D]
    vals = state.v_cache[: state.length].repeat_interleave(d.Hq // d.Hkv, dim=1).transpose(0, 1)
    attn = F.scaled_dot_product_attention(q.transpose(0, 1), keys, vals)  # [Hq, 1, D]
    return StepOutputs(outs, attn[:, 0])
