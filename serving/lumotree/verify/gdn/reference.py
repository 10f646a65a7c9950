"""Gated DeltaNet tree verification and accepted-path publication: the PyTorch reference.

Per value head h (key head h // (HV/H)) with the V-first state S [V, K] (S[v, :] a row over keys):
    g = -exp(A_log) * softplus(a + dt_bias);  beta = sigmoid(b)
    k <- k / sqrt(|k|^2 + 1e-6);  q <- q / sqrt(|q|^2 + 1e-6) * K^-1/2
    S <- S * exp(g)                 decay first
    u  = beta * (v - S k)           predict with the decayed state
    S <- S + u k^T                  rank-1 write
    o  = S q                        read
All arithmetic runs in the compute dtype: float64 for float64 inputs, else float32 (the durable
state is float32). Outputs are cast back to the input dtype of v.

`gdn_verify` runs the path scan (spine from the durable pre-tree state, exporting cut states;
branch paths from their cut states; leaf children read from their parent's tile) and records each
node's operands; it never writes the durable state. `replay_accepted_` publishes the accepted path
into the durable state in place from those recorded operands. `gdn_sequential_reference` is the
ground truth: every node recomputed along its own ancestry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from lumotree.tree import TreeDescriptor

NORM_EPS = 1e-6


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; every narrower float computes in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@dataclass(frozen=True, eq=False)
class GdnInputs:
    """What a GDN layer's verification reads per row, as the layer hands it over: q, k [R, H, K]
    after the conv (not yet normalised), v [R, HV, V], a, b [R, HV] raw gate inputs, and the
    layer's A_log, dt_bias [HV]. Stacked forms add a leading instance dim N to every tensor."""

    q: Tensor
    k: Tensor
    v: Tensor
    a: Tensor
    b: Tensor
    A_log: Tensor
    dt_bias: Tensor

    def tensors(self) -> tuple[Tensor, ...]:
        """q, k, v, a, b, A_log, dt_bias: the order the kernels take them in."""
        return (self.q, self.k, self.v, self.a, self.b, self.A_log, self.dt_bias)

    def map(self, fn: Callable[[Tensor], Tensor]) -> GdnInputs:
        """The same inputs with `fn` applied to every tensor (e.g. `.contiguous()`, `t[None]`)."""
        return GdnInputs(*(fn(t) for t in self.tensors()))

    @staticmethod
    def stack(layers: Sequence[GdnInputs]) -> GdnInputs:
        """The inputs of several instances as one contiguous stack (leading instance dim)."""
        return GdnInputs(
            *(torch.stack(col).contiguous() for col in zip(*(x.tensors() for x in layers), strict=True))
        )

    def check(self) -> None:
        """Shapes of one layer's inputs (no instance dim); raises ValueError naming what is off."""
        q, k, v, a, b = self.q, self.k, self.v, self.a, self.b
        n, h, dk = q.shape
        hv = v.shape[1]
        if k.shape != (n, h, dk) or v.shape[0] != n or a.shape != (n, hv) or b.shape != (n, hv):
            raise ValueError(
                f"expected q, k [n, H, K], v [n, HV, V], a, b [n, HV]; got q {tuple(q.shape)}, "
                f"k {tuple(k.shape)}, v {tuple(v.shape)}, a {tuple(a.shape)}, b {tuple(b.shape)}"
            )
        if hv % h:
            raise ValueError(f"value heads ({hv}) must be a multiple of key heads ({h})")
        if self.A_log.shape != (hv,) or self.dt_bias.shape != (hv,):
            raise ValueError(
                f"A_log and dt_bias must be [HV]={hv}, got {tuple(self.A_log.shape)}, "
                f"{tuple(self.dt_bias.shape)}"
            )


@dataclass(frozen=True, eq=False)
class GateInputs:
    """A GDN layer's gate inputs: a, b [R, HV] raw (columns of the projection), A_log, dt_bias [HV]."""

    a: Tensor
    b: Tensor
    A_log: Tensor
    dt_bias: Tensor


@dataclass(frozen=True, eq=False)
class GdnOperands:
    """Per-node operands as used by the recurrence (compute dtype), recorded for replay.

    q [R, H, K] normalised and scaled; k [R, H, K] normalised; v [R, HV, V]; g [R, HV] log-decay;
    beta [R, HV].
    """

    q: Tensor
    k: Tensor
    v: Tensor
    g: Tensor
    beta: Tensor

    @property
    def group(self) -> int:
        return self.v.shape[1] // self.k.shape[1]

    def map(self, fn: Callable[[Tensor], Tensor]) -> GdnOperands:
        """The same records with `fn` applied to every tensor."""
        return GdnOperands(*(fn(t) for t in (self.q, self.k, self.v, self.g, self.beta)))


def record_shapes(rows: int, heads: int, v_heads: int, dk: int, dv: int) -> dict[str, tuple[int, ...]]:
    """The shapes of one layer's records (`GdnOperands`' fields, in their order) for `rows` rows."""
    qk, per_head = (rows, heads, dk), (rows, v_heads)
    return {"q": qk, "k": qk, "v": (rows, v_heads, dv), "g": per_head, "beta": per_head}


@dataclass(frozen=True, eq=False)
class GdnVerifyResult:
    """o [R, HV, V] in the input dtype (padding rows zero); operands; cut_states [C, HV, V, K]."""

    o: Tensor
    operands: GdnOperands
    cut_states: Tensor


def prepare_operands(x: GdnInputs) -> GdnOperands:
    """Gate/beta math and q/k L2 norm in the compute dtype, per node (rows are independent)."""
    x.check()
    cd = compute_dtype(x.v.dtype)
    q, k = x.q.to(cd), x.k.to(cd)
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + NORM_EPS)
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + NORM_EPS) * q.shape[-1] ** -0.5
    g = -torch.exp(x.A_log.to(cd)) * F.softplus(x.a.to(cd) + x.dt_bias.to(cd))
    return GdnOperands(q=q, k=k, v=x.v.to(cd), g=g, beta=torch.sigmoid(x.b.to(cd)))


def _step(state: Tensor, ops: GdnOperands, node: int) -> Tensor:
    """One recurrent update of a [HV, V, K] state by `node`'s operands (out of place)."""
    k = ops.k[node].repeat_interleave(ops.group, dim=0)  # [HV, K]
    state = state * torch.exp(ops.g[node])[:, None, None]
    u = (ops.v[node] - (state * k[:, None, :]).sum(-1)) * ops.beta[node][:, None]
    return state + u[:, :, None] * k[:, None, :]


def _read(state: Tensor, ops: GdnOperands, node: int) -> Tensor:
    q = ops.q[node].repeat_interleave(ops.group, dim=0)
    return (state * q[:, None, :]).sum(-1)


def path_scan(ops: GdnOperands, state: Tensor, tree: TreeDescriptor) -> tuple[Tensor, Tensor]:
    """Outputs [R, HV, V] and exported cut states [C, HV, V, K] (compute dtype); `state` is only read."""
    plan = tree.paths
    o = torch.zeros_like(ops.v)
    cuts = state.new_empty((len(plan.cut_nodes), *state.shape))
    cut_slot = {int(node): i for i, node in enumerate(plan.cut_nodes)}
    leaves: dict[tuple[int, int], list[int]] = {}
    for leaf, p, step in zip(
        plan.leaf_node.tolist(), plan.leaf_path.tolist(), plan.leaf_step.tolist(), strict=True
    ):
        leaves.setdefault((p, step), []).append(leaf)
    # Path 0 (the spine) runs first: it exports the cut states every other path starts from.
    for p, (nodes, owner) in enumerate(zip(plan.nodes.tolist(), plan.owner.tolist(), strict=True)):
        start = int(plan.start_cut[p])
        tile = state if start < 0 else cuts[start]
        for step, (node, owns) in enumerate(zip(nodes, owner, strict=True)):
            if node < 0:
                break
            tile = _step(tile, ops, node)
            if owns:
                o[node] = _read(tile, ops, node)
            if p == 0 and node in cut_slot:
                cuts[cut_slot[node]] = tile
            for leaf in leaves.get((p, step), ()):
                o[leaf] = _read(_step(tile, ops, leaf), ops, leaf)
    return o, cuts


def gdn_verify(x: GdnInputs, state: Tensor, tree: TreeDescriptor) -> GdnVerifyResult:
    """Verify every tree row of one GDN layer.

    x: the layer's inputs, R = tree.rows rows; state [HV, V, K] the durable pre-tree state (compute
    dtype, read only). Returns outputs in v's dtype, the recorded operands and the exported cut
    states.
    """
    ops = prepare_operands(x)
    _check_state(state, ops)
    if x.q.shape[0] != tree.rows:
        raise ValueError(f"operands have {x.q.shape[0]} rows, the tree has {tree.rows}")
    o, cuts = path_scan(ops, state, tree)
    return GdnVerifyResult(o=o.to(x.v.dtype), operands=ops, cut_states=cuts)


def replay_accepted_(state: Tensor, ops: GdnOperands, accepted: Tensor, path_len: Tensor | int) -> None:
    """Publish: apply the recorded operands of accepted[0:path_len] (root first) to `state` in place.

    state [HV, V, K] durable (compute dtype); accepted [D+1] int64 logical nodes, -1 padded.
    """
    _check_state(state, ops)
    for node in accepted[: int(path_len)].tolist():
        state.copy_(_step(state, ops, node))


def _check_state(state: Tensor, ops: GdnOperands) -> None:
    hv, dv, dk = ops.v.shape[1], ops.v.shape[2], ops.k.shape[2]
    if state.shape != (hv, dv, dk) or state.dtype != ops.v.dtype:
        raise ValueError(
            f"state must be [HV, V, K] = [{hv}, {dv}, {dk}] {ops.v.dtype}, "
            f"got {tuple(state.shape)} {state.dtype}"
        )


def gdn_sequential_reference(x: GdnInputs, state: Tensor, tree: TreeDescriptor) -> tuple[Tensor, Tensor]:
    """Ground truth: each active node's output and post-update state, recomputed along its ancestry.

    Written independently of the scan's helpers. Returns o [R, HV, V] and states [R, HV, V, K] in
    the compute dtype (padding rows zero).
    """
    x.check()
    q, k, v, a, b, A_log, dt_bias = x.tensors()
    cd = compute_dtype(v.dtype)
    group = v.shape[1] // q.shape[1]
    kn = k.to(cd) / torch.sqrt((k.to(cd) ** 2).sum(-1, keepdim=True) + NORM_EPS)
    qn = q.to(cd) / torch.sqrt((q.to(cd) ** 2).sum(-1, keepdim=True) + NORM_EPS) / q.shape[-1] ** 0.5
    kn, qn = kn.repeat_interleave(group, dim=1), qn.repeat_interleave(group, dim=1)
    decay = torch.exp(-torch.exp(A_log.to(cd)) * F.softplus(a.to(cd) + dt_bias.to(cd)))
    beta = 1.0 / (1.0 + torch.exp(-b.to(cd)))
    vv = v.to(cd)
    o = torch.zeros_like(vv)
    states = torch.zeros((tree.rows, *state.shape), dtype=cd)
    for node in range(tree.n_active):
        s = state.to(cd)
        for j in tree.path_to(node):
            s = decay[j][:, None, None] * s
            pred = torch.einsum("hvk,hk->hv", s, kn[j])
            s = s + torch.einsum("hv,hk->hvk", beta[j][:, None] * (vv[j] - pred), kn[j])
        o[node] = torch.einsum("hvk,hk->hv", s, qn[node])
        states[node] = s
    return o, states
