"""CPU-fast variants of the tree op families (`CPU_FAST`), each tested against the core reference.

- `gdn_verify_wy`: verification in the tree WY form (the chunked delta rule with the ancestry mask
  in place of the causal one, as TreeWY and Bole evaluate trees): one unit-triangular solve per
  layer instead of a Python loop over path steps. On a CPU the sequential scan is bound by per-op
  overhead (~1.7 ms per layer for the paper tree, 0.5 ms in this form). Same recurrence, different
  arithmetic: equal to the reference within the paired rule, not bitwise. Publication still
  replays the recorded operands through the sequential recurrence.
- `replay_layers_`: accepted-path replay of all GDN layers at once (stacked states), the reference
  step per node, bitwise equal to `replay_accepted_` layer by layer.
- `tree_attention_gqa`: grouped-query tree attention without repeating KV heads over the prefix:
  query heads of one KV head are stacked as rows of one matmul. Same mask and compute dtype as the
  reference, different summation order: equal within the paired rule, not bitwise.
Conv and publication of conv/KV state are cheap already and use the references.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence

import torch
from torch import Tensor

from lumotree.model.tree_kernels import REFERENCE, TreeKernels
from lumotree.tree import TreeDescriptor
from lumotree.verify.attention.reference import tree_attention_mask
from lumotree.verify.gdn.reference import GdnOperands, GdnVerifyResult, compute_dtype, prepare_operands

_masks: weakref.WeakKeyDictionary[TreeDescriptor, Tensor] = weakref.WeakKeyDictionary()


def gdn_verify_wy(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    state: Tensor,
    tree: TreeDescriptor,
) -> GdnVerifyResult:
    """Same arguments and results as `gdn_verify` (outputs, operands, cut states), in the tree WY form.

    Per value head, over the n active nodes (logical order: ancestors first) with the ancestry mask
    M (self included), cumulative log decay c = M g and D[i, j] = exp(c_i - c_j) on M:
        (I + strict(beta_i D_ij k_i.k_j)) U = beta (v - e^c K S0^T)      unit lower triangular
        o = e^c Q S0^T + (D * Q K^T) U
        S_n = e^{c_n} S0 + sum_{j in anc(n)} D_nj u_j k_j^T              (cut states only)
    """
    ops = prepare_operands(q, k, v, a, b, A_log, dt_bias)
    hv, dv, dk = ops.v.shape[1], ops.v.shape[2], ops.k.shape[2]
    if state.shape != (hv, dv, dk) or state.dtype != ops.v.dtype:
        raise ValueError(
            f"state must be [{hv}, {dv}, {dk}] {ops.v.dtype}, got {tuple(state.shape)} {state.dtype}"
        )
    if q.shape[0] != tree.rows:
        raise ValueError(f"operands have {q.shape[0]} rows, the tree has {tree.rows}")
    n, cd = tree.n_active, ops.v.dtype
    anc = tree.ancestry[:n, :n]
    c = (anc.to(cd) @ ops.g[:n]).T  # [HV, n]
    kk = ops.k[:n].repeat_interleave(ops.group, dim=1).transpose(0, 1)  # [HV, n, K]
    qq = ops.q[:n].repeat_interleave(ops.group, dim=1).transpose(0, 1)
    beta = ops.beta[:n].T[:, :, None]  # [HV, n, 1]
    decay = torch.exp((c[:, :, None] - c[:, None, :]).masked_fill(~anc, float("-inf")))  # [HV, n, n]
    system = (decay * (kk @ kk.transpose(1, 2))).tril(-1) * beta
    system.diagonal(dim1=1, dim2=2).fill_(1.0)
    ec = torch.exp(c)[:, :, None]
    s0t = state.transpose(1, 2)  # [HV, K, V]
    u = torch.linalg.solve_triangular(
        system, beta * (ops.v[:n].transpose(0, 1) - ec * (kk @ s0t)), upper=False, unitriangular=True
    )  # [HV, n, V]
    out = ec * (qq @ s0t) + (decay * (qq @ kk.transpose(1, 2))) @ u
    o = torch.zeros_like(ops.v)
    o[:n] = out.transpose(0, 1)
    cut = tree.paths.cut_nodes
    weights = decay[:, cut, :]  # [HV, C, n]
    cuts = torch.exp(c[:, cut]).T[:, :, None, None] * state[None] + torch.einsum(
        "hcj,hjv,hjk->chvk", weights, u, kk
    )
    return GdnVerifyResult(o=o.to(v.dtype), operands=ops, cut_states=cuts)


def replay_layers_(
    states: Sequence[Tensor], operands: Sequence[GdnOperands], accepted: Tensor, path_len: int
) -> None:
    """Publish accepted[0:path_len] into every layer's state [HV, V, K] in place, all layers per step."""
    path = accepted[:path_len]
    stacked = torch.stack(list(states))  # [L, HV, V, K]
    group = operands[0].group
    k = torch.stack([o.k[path] for o in operands], dim=1).repeat_interleave(group, dim=2)  # [P, L, HV, K]
    v = torch.stack([o.v[path] for o in operands], dim=1)
    decay = torch.exp(torch.stack([o.g[path] for o in operands], dim=1))
    beta = torch.stack([o.beta[path] for o in operands], dim=1)
    for i in range(path_len):
        ki = k[i][:, :, None, :]
        stacked = stacked * decay[i][:, :, None, None]
        u = (v[i] - (stacked * ki).sum(-1)) * beta[i][:, :, None]
        stacked = stacked + u[..., None] * ki
    for dst, src in zip(states, stacked, strict=True):
        dst.copy_(src)


def tree_attention_gqa(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, tree: TreeDescriptor, scale: float | None = None
) -> tuple[Tensor, Tensor]:
    """Same arguments and results as `tree_attention` (o [R, Hq, D], lse [R, Hq])."""
    rows, hq, dim = q.shape
    hkv = k_cache.shape[1]
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of KV heads ({hkv})")
    if tree.prefix_len + rows > k_cache.shape[0]:
        raise ValueError(
            f"prefix {tree.prefix_len} + {rows} tree rows exceed the cache's {k_cache.shape[0]} rows"
        )
    group, keys, cd = hq // hkv, tree.prefix_len + rows, compute_dtype(q.dtype)
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    bias = _masks.get(tree)
    if bias is None:
        bias = torch.zeros((rows, keys), dtype=cd).masked_fill_(~tree_attention_mask(tree), float("-inf"))
        _masks[tree] = bias
    qg = q.to(cd).reshape(rows, hkv, group, dim).permute(1, 0, 2, 3).reshape(hkv, rows * group, dim)
    kt = k_cache[:keys].to(cd).permute(1, 2, 0)  # [Hkv, D, T]
    vt = v_cache[:keys].to(cd).transpose(0, 1)  # [Hkv, T, D]
    scores = (torch.bmm(qg, kt) * scale).view(hkv, rows, group, keys) + bias[None, :, None, :]
    lse = torch.logsumexp(scores, dim=-1)  # [Hkv, R, g]
    probs = torch.exp(scores - lse[..., None]).view(hkv, rows * group, keys)
    o = torch.bmm(probs, vt).view(hkv, rows, group, dim).permute(1, 0, 2, 3).reshape(rows, hq, dim)
    return o.to(q.dtype), lse.permute(1, 0, 2).reshape(rows, hq)


CPU_FAST = TreeKernels(
    name="cpu-fast",
    tree_conv=REFERENCE.tree_conv,
    gdn_verify=gdn_verify_wy,
    write_tree_kv=REFERENCE.write_tree_kv,
    tree_attention=tree_attention_gqa,
    replay=replay_layers_,
    publish_conv=REFERENCE.publish_conv,
    publish_kv=REFERENCE.publish_kv,
)
