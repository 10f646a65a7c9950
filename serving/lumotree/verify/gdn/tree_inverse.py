"""GDN tree verification, value-major with an explicit triangular inverse (tree-parallel, value-major).

The same algebra as `tree_scan` (read its docstring for the derivation), arranged for Hopper's
tensor cores and for fewer dependent steps per program:

- Value-major products. The products with the state run as S0 [BV, K] x k^T [K, R], so the value
  tile (64 or 128 rows) is the matmul's M dimension, as wgmma wants it (M >= 64 per warp group);
  `tree_scan` put the 32 tree rows there. Everything per value column is kept transposed:
  KS^T, QS^T, U^T, O^T [BV, R].
- One inverse per program instead of one solve per value column. T = (I + A)^-1 [R, R] is formed by
  substitution (T <- I - A T, max_depth rounds: forward substitution on the identity's columns,
  the stable solve) on [R, R] only, then U^T = RHS^T T^T is one product. `tree_scan` ran its
  max_depth rounds on [R, BV]; here they cost R/BV as much, and the per-column work is 1 product.
- One load round trip for q and k. The whole [R, K] tiles are loaded once; their norms, records and
  k k^T, q k^T come from those registers. Only the state is streamed, in BK-column chunks.

One program per (value head, value tile, instance); block_v = V (one program per value head)
forms T once per head.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from lumotree.tree import TreeDescriptor
from lumotree.verify.gdn.reference import GdnOperands, GdnVerifyResult
from lumotree.verify.gdn.scan import _softplus, check_verify_inputs, empty_operands
from lumotree.verify.gdn.scan_v3 import _instance_slices, _record_rows, check_stacked
from lumotree.verify.gdn.tree_scan import PRECISIONS, AncestryTables, ancestry_tables, solve_rounds

DEFAULT_BLOCK_V = 64
DEFAULT_NUM_WARPS = 4
DEFAULT_BLOCK_K = 32


@triton.jit
def gdn_tree_inverse_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    a_ptr,
    b_ptr,
    alog_ptr,
    dtb_ptr,
    state_ptr,
    o_ptr,
    rq_ptr,
    rk_ptr,
    rv_ptr,
    rg_ptr,
    rb_ptr,
    anc_ptr,
    nactive_ptr,
    R,
    stride_qk,
    stride_v,
    stride_ab,
    stride_param,
    stride_state,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    RP: tl.constexpr,
    BK: tl.constexpr,
    ROUNDS: tl.constexpr,
    INVERSE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    NVT: tl.constexpr = V // BV
    GROUP: tl.constexpr = HV // H
    pid = tl.program_id(0)
    inst = tl.program_id(1).to(tl.int64)
    hv = pid // NVT
    vt = pid % NVT
    h = hv // GROUP
    q_ptr, k_ptr, rq_ptr, rk_ptr, v_ptr, o_ptr, rv_ptr, a_ptr, b_ptr, rg_ptr, rb_ptr, alog_ptr, dtb_ptr = (
        _instance_slices(
            inst, q_ptr, k_ptr, rq_ptr, rk_ptr, v_ptr, o_ptr, rv_ptr, a_ptr, b_ptr, rg_ptr, rb_ptr,
            alog_ptr, dtb_ptr, stride_qk, stride_v, stride_ab, stride_param,
        )
    )  # fmt: skip
    state_ptr += inst * stride_state + hv * V * K

    offs_v = vt * BV + tl.arange(0, BV)
    offs_k = tl.arange(0, K)
    rows = tl.arange(0, RP)
    in_range = rows < R
    valid = rows < tl.load(nactive_ptr)
    in_square = in_range[:, None] & in_range[None, :]
    anc = tl.load(anc_ptr + rows[:, None] * R + rows[None, :], mask=in_square, other=0)
    anc = (anc != 0) & valid[:, None]
    strict = anc & (rows[:, None] != rows[None, :])

    neg_a = -tl.exp(tl.load(alog_ptr + hv).to(tl.float32))
    dt_bias = tl.load(dtb_ptr + hv).to(tl.float32)
    n = rows.to(tl.int64)
    row_qk = (n * H + h) * K
    mrow = valid[:, None]
    v = tl.load(v_ptr + (n * HV + hv)[:, None] * V + offs_v[None, :], mask=mrow, other=0.0).to(tl.float32)
    g = neg_a * _softplus(tl.load(a_ptr + n * HV + hv, mask=valid, other=0.0).to(tl.float32) + dt_bias)
    beta = tl.sigmoid(tl.load(b_ptr + n * HV + hv, mask=valid, other=0.0).to(tl.float32))
    _record_rows(
        rq_ptr, rk_ptr, rv_ptr, rg_ptr, rb_ptr, rows, valid, h, hv, vt == 0, False,
        offs_v, offs_k, 0.0, 0.0, v, g, beta, H, HV, K, V, False,  # q/k: below
    )  # fmt: skip

    # One pass over K in BK-key chunks on the raw q/k (input dtype): the row norms, k k^T, q k^T
    # and, value-major, S0 k^T and S0 q^T. Normalisation is a row scaling, applied to the products
    # afterwards (for bf16 q/k the q/k products are exact in fp32 before accumulation).
    ssq = tl.zeros([RP], dtype=tl.float32)
    ssk = tl.zeros([RP], dtype=tl.float32)
    kk = tl.zeros([RP, RP], dtype=tl.float32)
    qk = tl.zeros([RP, RP], dtype=tl.float32)
    ksT = tl.zeros([BV, RP], dtype=tl.float32)
    qsT = tl.zeros([BV, RP], dtype=tl.float32)
    offs_c = tl.arange(0, BK)
    for c in range(K // BK):
        cols = c * BK + offs_c
        qc = tl.load(q_ptr + row_qk[:, None] + cols[None, :], mask=mrow, other=0.0)
        kc = tl.load(k_ptr + row_qk[:, None] + cols[None, :], mask=mrow, other=0.0)
        sc = tl.load(state_ptr + offs_v[:, None] * K + cols[None, :])
        kk = tl.dot(kc, tl.trans(kc), kk, input_precision=PRECISION)
        qk = tl.dot(qc, tl.trans(kc), qk, input_precision=PRECISION)
        qc = qc.to(tl.float32)
        kc = kc.to(tl.float32)
        ssq += tl.sum(qc * qc, axis=1)
        ssk += tl.sum(kc * kc, axis=1)
        ksT = tl.dot(sc, tl.trans(kc), ksT, input_precision=PRECISION)
        qsT = tl.dot(sc, tl.trans(qc), qsT, input_precision=PRECISION)
    scale_k = tl.rsqrt(ssk + 1e-6)
    scale_q = tl.rsqrt(ssq + 1e-6) * (K**-0.5)
    kk = kk * scale_k[:, None] * scale_k[None, :]
    qk = qk * scale_q[:, None] * scale_k[None, :]
    ksT = ksT * scale_k[None, :]
    qsT = qsT * scale_q[None, :]
    if tl.where(vt == 0, hv % GROUP == 0, False):
        # The key head's records, by one program: normalised q/k (chunks reloaded, cache hits).
        for c in range(K // BK):
            cols = c * BK + offs_c
            at = row_qk[:, None] + cols[None, :]
            qc = tl.load(q_ptr + at, mask=mrow, other=0.0).to(tl.float32)
            kc = tl.load(k_ptr + at, mask=mrow, other=0.0).to(tl.float32)
            tl.store(rq_ptr + at, qc * tl.rsqrt(ssq + 1e-6)[:, None] * (K**-0.5), mask=mrow)
            tl.store(rk_ptr + at, kc * scale_k[:, None], mask=mrow)

    # Cumulative log-decay along each row's ancestry, and the decay ratios to its ancestors.
    G = tl.sum(tl.where(anc, g[None, :], 0.0), axis=1)
    ratio = tl.where(anc, tl.exp(tl.where(anc, G[:, None] - G[None, :], 0.0)), 0.0)
    gamma = tl.exp(G)

    A = tl.where(strict, beta[:, None] * ratio * kk, 0.0)
    rhsT = (tl.trans(v) - ksT * gamma[None, :]) * beta[None, :]
    if INVERSE:
        # T = (I + A)^-1 by substitution; A is nilpotent (A^(depth+1) = 0).
        eye = tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)
        T = eye - A
        for _ in tl.static_range(ROUNDS - 1):
            T = eye - tl.dot(A, T, input_precision=PRECISION)
        uT = tl.dot(rhsT, tl.trans(T), input_precision=PRECISION)
    else:
        At = tl.trans(A)
        uT = rhsT
        for _ in tl.static_range(ROUNDS):
            uT = rhsT - tl.dot(uT, At, input_precision=PRECISION)
    outT = qsT * gamma[None, :] + tl.dot(uT, tl.trans(ratio * qk), input_precision=PRECISION)
    outT = tl.where(valid[None, :], outT, 0.0)  # padding rows read as zero
    tl.store(
        o_ptr + (n * HV + hv)[None, :] * V + offs_v[:, None],
        outT.to(o_ptr.dtype.element_ty),
        mask=in_range[None, :] & (offs_v[:, None] < V),
    )


SOLVES = ("inverse", "substitution")


def gdn_tree_inverse_layers_(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    state: Tensor,
    tables: AncestryTables,
    o: Tensor,
    ops: GdnOperands,
    block_v: int = DEFAULT_BLOCK_V,
    num_warps: int = DEFAULT_NUM_WARPS,
    precision: str = "tf32x3",
    solve: str = "inverse",
    block_k: int = DEFAULT_BLOCK_K,
    max_registers: int | None = None,
) -> None:
    """Verify N independent GDN instances sharing one tree in one launch, into caller-owned buffers.

    Shapes as `tree_scan.gdn_tree_layers_`: q, k [N, R, H, K]; v [N, R, HV, V]; a, b [N, R, HV];
    A_log, dt_bias [N, HV]; state [N, HV, V, K] fp32 (read only); o [N, R, HV, V]; ops fp32
    records. block_v >= 16 on the GPU (64 or more for wgmma); block_k divides K.
    precision: "ieee" (CUDA-core fp32) or "tf32x3" (tensor cores, three-pass fp32 emulation).
    solve: "inverse" (T = (I + A)^-1 by substitution on [R, R], then one product) or
    "substitution" (max_depth rounds on U^T [BV, R]); both round like forward substitution.
    max_registers: the compiler's per-thread register cap (None: its choice).
    """
    n, rows, heads, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if solve not in SOLVES:
        raise ValueError(f"solve must be one of {', '.join(SOLVES)}, got {solve!r}")
    if tables.ancestry.shape != (rows, rows):
        raise ValueError(f"ancestry tables are for {tables.ancestry.shape[0]} rows, operands have {rows}")
    bk = min(block_k, dk)
    if dk % bk:
        raise ValueError(f"block_k={block_k} must divide K={dk}")
    check_stacked(q, k, v, a, b, A_log, dt_bias, state, o, ops, block_v)
    gdn_tree_inverse_kernel[(hv * (dv // block_v), n)](
        q, k, v, a, b, A_log, dt_bias, state, o, ops.q, ops.k, ops.v, ops.g, ops.beta,
        tables.ancestry, tables.n_active, rows,
        q.stride(0), v.stride(0), a.stride(0), A_log.stride(0), state.stride(0),
        H=heads, HV=hv, K=dk, V=dv, BV=block_v, RP=max(16, triton.next_power_of_2(rows)), BK=bk,
        ROUNDS=solve_rounds("substitution", tables.max_depth), INVERSE=solve == "inverse",
        PRECISION=precision, num_warps=num_warps, maxnreg=max_registers,
    )  # fmt: skip


def gdn_tree_inverse_(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    state: Tensor,
    tables: AncestryTables,
    o: Tensor,
    ops: GdnOperands,
    **config: object,
) -> None:
    """One layer (shapes of `scan.gdn_scan_` without the instance dim); config as the stacked form."""
    ops1 = GdnOperands(*(t[None] for t in (ops.q, ops.k, ops.v, ops.g, ops.beta)))
    inputs = (t[None] for t in (q, k, v, a, b, A_log, dt_bias, state))
    gdn_tree_inverse_layers_(*inputs, tables, o[None], ops1, **config)


def gdn_verify_tree_inverse(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    state: Tensor,
    tree: TreeDescriptor,
    block_v: int | None = None,
    **config: object,
) -> GdnVerifyResult:
    """One layer with the reference's signature (fp32 compute; no cut states)."""
    check_verify_inputs(q, k, v, a, b, A_log, dt_bias, state, tree)
    rows, heads, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    bv = min(DEFAULT_BLOCK_V, dv) if block_v is None else block_v
    ops = empty_operands(rows, heads, hv, dk, dv, q.device)
    o = torch.empty_like(v)
    inputs = [t.contiguous() for t in (q, k, v, a, b, A_log, dt_bias, state)]
    gdn_tree_inverse_(*inputs, ancestry_tables(tree, q.device), o, ops, block_v=bv, **config)
    return GdnVerifyResult(o=o, operands=ops, cut_states=state.new_empty((0, hv, dv, dk)))
