"""GDN tree verification in the tree WY form, in PyTorch: the CPU-fast kernel set's GDN verify.

The chunked delta rule with the ancestry mask in place of the causal one, as TreeWY and Bole
evaluate trees: one unit-triangular solve per layer instead of a Python loop over path steps. On a
CPU the sequential scan is bound by per-op overhead (~1.7 ms per layer for the paper tree, 0.5 ms in
this form). Same recurrence, different arithmetic: equal to the reference within the paired rule,
not bitwise. Publication still replays the recorded operands through the sequential recurrence
(`stacked_replay.py`). `tree_scan.py` is the same algebra as a Triton kernel.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lumotree.tree import TreeDescriptor
from lumotree.verify.gdn.reference import GdnInputs, GdnVerifyResult, prepare_operands


def gdn_verify_wy(x: GdnInputs, state: Tensor, tree: TreeDescriptor) -> GdnVerifyResult:
    """Same arguments and results as `gdn_verify` (outputs, operands, cut states), in the tree WY form.

    Per value head, over the n active nodes (logical order: ancestors first) with the ancestry mask
    M (self included), cumulative log decay c = M g and D[i, j] = exp(c_i - c_j) on M:
        (I + strict(beta_i D_ij k_i.k_j)) U = beta (v - e^c K S0^T)      unit lower triangular
        o = e^c Q S0^T + (D * Q K^T) U
        S_n = e^{c_n} S0 + sum_{j in anc(n)} D_nj u_j k_j^T              (cut states only)
    """
    ops = prepare_operands(x)
    hv, dv, dk = ops.v.shape[1], ops.v.shape[2], ops.k.shape[2]
    if state.shape != (hv, dv, dk) or state.dtype != ops.v.dtype:
        raise ValueError(
            f"state must be [{hv}, {dv}, {dk}] {ops.v.dtype}, got {tuple(state.shape)} {state.dtype}"
        )
    if x.q.shape[0] != tree.rows:
        raise ValueError(f"operands have {x.q.shape[0]} rows, the tree has {tree.rows}")
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
    return GdnVerifyResult(o=o.to(x.v.dtype), operands=ops, cut_states=cuts)
