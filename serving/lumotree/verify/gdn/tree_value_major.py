"""GDN tree verification, value-major, in two launches (the split solve).

The algebra of `tree_scan` (its docstring derives it), rearranged after the H200 measurements of
results/h200 (runs 5-8) showed `tree_scan` bound by its chain of small dependent products:

- Value-major products. The products with the state run as S0 [BV, K] x k^T [K, R]: the value
  tile (64 or 128 rows) is the matmul's M dimension, as wgmma wants it (M >= 64 per warp group);
  `tree_scan` put the 32 tree rows there. Quantities per value column are kept transposed:
  KS^T, QS^T, U^T, O^T [BV, R].
- Two launches. The prepare launch, one program per (key head, instance), loads q and k once,
  forms k k^T and q k^T from the raw operands (bf16 products are exact in fp32), writes the
  q/k/g/beta records and, for each of the key head's value heads,
  P = (Gamma o M o Q K^T) (I + A)^-1 [R, R] and gamma. The inverse is built by depth blocks: plain
  substitution inside blocks of 3 levels, then exact merges T <- T - T A_across T, so a depth-11
  tree costs 5 small products instead of 11 substitution rounds, with no powers of A (the product
  form's cancellation). The apply launch, one program per (value head, value tile, instance),
  streams the state and computes O^T = gamma o (S0 Q^T) + (beta o (V^T - gamma o S0 K^T)) P^T.
  A one-launch variant that ran max_depth rounds U^T <- RHS^T - U^T A^T after the same products
  measured 0.47 ms against 0.29 (runs 5-7; removed): its 11 dependent wgmma rounds per program
  were the cost.

Each launch covers N independent instances (e.g. the 48 GDN layers of a model sharing one tree);
`gdn_value_major_` is the one-layer form, `gdn_verify_value_major` the reference's signature.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from lumotree.tree import TreeDescriptor
from lumotree.verify.gdn.common import (
    PRECISIONS,
    ancestry_masks,
    check_stacked,
    one_instance_,
    softplus,
    verify_one_layer,
)
from lumotree.verify.gdn.plan import AncestryTables
from lumotree.verify.gdn.reference import GdnInputs, GdnOperands, GdnVerifyResult

# The fastest measured on the H200 (runs 6-7, 48 instances in one launch): apply bv128 w4 with a
# 4-stage state loop, prepare on 2 warps.
DEFAULT_BLOCK_V = 128
DEFAULT_NUM_WARPS = 4
DEFAULT_BLOCK_K = 32
DEFAULT_PREPARE_WARPS = 2
DEFAULT_NUM_STAGES = 4


@triton.jit
def gdn_tree_prepare_kernel(
    q_ptr,
    k_ptr,
    a_ptr,
    b_ptr,
    alog_ptr,
    dtb_ptr,
    rq_ptr,
    rk_ptr,
    rg_ptr,
    rb_ptr,
    p_ptr,
    gamma_ptr,
    anc_ptr,
    nactive_ptr,
    R,
    stride_qk,
    stride_ab,
    stride_param,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    RP: tl.constexpr,
    LEVELS: tl.constexpr,
    MERGES: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Split solve, launch 1, one program per (key head, instance): for each of its value heads the
    [R, R] part of the tree, P = (Gamma o M o Q K^T) (I + A)^-1 and gamma; q/k/g/beta records."""
    GROUP: tl.constexpr = HV // H
    h = tl.program_id(0)
    inst = tl.program_id(1).to(tl.int64)
    q_ptr += inst * stride_qk
    k_ptr += inst * stride_qk
    rq_ptr += inst * stride_qk
    rk_ptr += inst * stride_qk
    a_ptr += inst * stride_ab
    b_ptr += inst * stride_ab
    rg_ptr += inst * stride_ab
    rb_ptr += inst * stride_ab
    alog_ptr += inst * stride_param
    dtb_ptr += inst * stride_param
    p_ptr += inst * HV * RP * RP
    gamma_ptr += inst * HV * RP

    offs_k = tl.arange(0, K)
    rows, _in_range, valid, anc, strict = ancestry_masks(anc_ptr, nactive_ptr, R, RP)

    n = rows.to(tl.int64)
    at = ((n * H + h) * K)[:, None] + offs_k[None, :]
    q_in = tl.load(q_ptr + at, mask=valid[:, None], other=0.0)
    k_in = tl.load(k_ptr + at, mask=valid[:, None], other=0.0)
    # k k^T and q k^T on the raw operands (bf16 products are exact in fp32), then the row scales.
    kk = tl.dot(k_in, tl.trans(k_in), input_precision=PRECISION)
    qk = tl.dot(q_in, tl.trans(k_in), input_precision=PRECISION)
    q = q_in.to(tl.float32)
    k = k_in.to(tl.float32)
    scale_q = tl.rsqrt(tl.sum(q * q, axis=1) + 1e-6)
    scale_k = tl.rsqrt(tl.sum(k * k, axis=1) + 1e-6)
    kk = kk * scale_k[:, None] * scale_k[None, :]
    qk = qk * (scale_q * (K**-0.5))[:, None] * scale_k[None, :]
    tl.store(rq_ptr + at, q * scale_q[:, None] * (K**-0.5), mask=valid[:, None])
    tl.store(rk_ptr + at, k * scale_k[:, None], mask=valid[:, None])

    # T = (I + A)^-1 by blocks of depth levels. Inside a block of LEVELS levels, substitution
    # (T <- I - A T, forward substitution on the identity's columns) is exact after LEVELS - 1
    # terms. Then pairs of neighbouring blocks merge, exactly and without powers of A:
    # (I + A_in + A_across)^-1 = T - T A_across T, as A_across T A_across = 0 (ancestors are
    # shallower). MERGES rounds cover LEVELS * 2^MERGES >= max_depth + 1 levels.
    depth = tl.sum(strict.to(tl.int32), axis=1)
    eye = tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)
    for j in range(GROUP):
        hv = h * GROUP + j
        neg_a = -tl.exp(tl.load(alog_ptr + hv).to(tl.float32))
        dt_bias = tl.load(dtb_ptr + hv).to(tl.float32)
        g = neg_a * softplus(tl.load(a_ptr + n * HV + hv, mask=valid, other=0.0).to(tl.float32) + dt_bias)
        beta = tl.sigmoid(tl.load(b_ptr + n * HV + hv, mask=valid, other=0.0).to(tl.float32))
        tl.store(rg_ptr + n * HV + hv, g, mask=valid)
        tl.store(rb_ptr + n * HV + hv, beta, mask=valid)
        G = tl.sum(tl.where(anc, g[None, :], 0.0), axis=1)
        ratio = tl.where(anc, tl.exp(tl.where(anc, G[:, None] - G[None, :], 0.0)), 0.0)
        A = tl.where(strict, beta[:, None] * ratio * kk, 0.0)
        block = depth // LEVELS
        inside = block[:, None] == block[None, :]
        A_in = tl.where(inside, A, 0.0)
        T = eye - A_in
        for _ in tl.static_range(LEVELS - 2):
            T = eye - tl.dot(A_in, T, input_precision=PRECISION)
        for m in tl.static_range(MERGES):
            block = depth // (LEVELS * 2 ** (m + 1))
            merged = block[:, None] == block[None, :]
            across = tl.where(merged & ~inside, A, 0.0)
            T = T - tl.dot(T, tl.dot(across, T, input_precision=PRECISION), input_precision=PRECISION)
            inside = merged
        P = tl.dot(ratio * qk, T, input_precision=PRECISION)
        tl.store(p_ptr + hv * RP * RP + rows[:, None] * RP + rows[None, :], P)
        tl.store(gamma_ptr + hv * RP + rows, tl.exp(G))


@triton.jit
def gdn_tree_apply_kernel(
    v_ptr,
    state_ptr,
    o_ptr,
    rq_ptr,
    rk_ptr,
    rv_ptr,
    rb_ptr,
    p_ptr,
    gamma_ptr,
    nactive_ptr,
    R,
    stride_qk,
    stride_v,
    stride_ab,
    stride_state,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    RP: tl.constexpr,
    BK: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Split solve, launch 2, one program per (value head, value tile, instance), value-major:
    O^T = gamma o (S0 Q^T) + (beta o (V^T - gamma o S0 K^T)) P^T, q/k read from the records."""
    NVT: tl.constexpr = V // BV
    GROUP: tl.constexpr = HV // H
    pid = tl.program_id(0)
    inst = tl.program_id(1).to(tl.int64)
    hv = pid // NVT
    vt = pid % NVT
    h = hv // GROUP
    v_ptr += inst * stride_v
    o_ptr += inst * stride_v
    rv_ptr += inst * stride_v
    rq_ptr += inst * stride_qk
    rk_ptr += inst * stride_qk
    rb_ptr += inst * stride_ab
    state_ptr += inst * stride_state + hv * V * K
    p_ptr += (inst * HV + hv) * RP * RP
    gamma_ptr += (inst * HV + hv) * RP

    offs_v = vt * BV + tl.arange(0, BV)
    rows = tl.arange(0, RP)
    valid = rows < tl.load(nactive_ptr)
    n = rows.to(tl.int64)
    at_v = (n * HV + hv)[None, :] * V + offs_v[:, None]
    vT = tl.load(v_ptr + at_v, mask=valid[None, :], other=0.0).to(tl.float32)
    tl.store(rv_ptr + at_v, vT, mask=valid[None, :])
    beta = tl.load(rb_ptr + n * HV + hv, mask=valid, other=0.0)
    gamma = tl.load(gamma_ptr + rows)
    P = tl.load(p_ptr + rows[:, None] * RP + rows[None, :])

    row_qk = (n * H + h) * K
    offs_c = tl.arange(0, BK)
    ksT = tl.zeros([BV, RP], dtype=tl.float32)
    qsT = tl.zeros([BV, RP], dtype=tl.float32)
    for c in range(K // BK):
        cols = c * BK + offs_c
        sc = tl.load(state_ptr + offs_v[:, None] * K + cols[None, :])
        kc = tl.load(rk_ptr + row_qk[:, None] + cols[None, :], mask=valid[:, None], other=0.0)
        qc = tl.load(rq_ptr + row_qk[:, None] + cols[None, :], mask=valid[:, None], other=0.0)
        ksT = tl.dot(sc, tl.trans(kc), ksT, input_precision=PRECISION)
        qsT = tl.dot(sc, tl.trans(qc), qsT, input_precision=PRECISION)
    rhsT = (vT - ksT * gamma[None, :]) * beta[None, :]
    outT = qsT * gamma[None, :] + tl.dot(rhsT, tl.trans(P), input_precision=PRECISION)
    outT = tl.where(valid[None, :], outT, 0.0)  # padding rows read as zero
    tl.store(o_ptr + at_v, outT.to(o_ptr.dtype.element_ty), mask=(rows < R)[None, :])


BLOCK_LEVELS = 3  # depth levels per diagonal block of the split solve's inverse (1 product each)


def block_merges(max_depth: int) -> int:
    """Merge rounds that grow BLOCK_LEVELS-level blocks to cover max_depth + 1 levels."""
    return max(0, math.ceil(math.log2(math.ceil((max_depth + 1) / BLOCK_LEVELS))))


def gdn_value_major_layers_(
    x: GdnInputs,
    state: Tensor,
    tables: AncestryTables,
    o: Tensor,
    ops: GdnOperands,
    block_v: int = DEFAULT_BLOCK_V,
    num_warps: int = DEFAULT_NUM_WARPS,
    precision: str = "tf32x3",
    block_k: int = DEFAULT_BLOCK_K,
    max_registers: int | None = None,
    prepare_warps: int = DEFAULT_PREPARE_WARPS,
    num_stages: int | None = DEFAULT_NUM_STAGES,
    only: str | None = None,
) -> None:
    """Verify N independent GDN instances sharing one tree in one launch, into caller-owned buffers.

    Shapes as `tree_scan.gdn_tree_layers_`: x with a leading instance dim N, all contiguous; state
    [N, HV, V, K] fp32 (read only); o [N, R, HV, V]; ops fp32 records. block_v >= 16 on the GPU
    (64 or more for wgmma); block_k divides K.
    precision: "ieee" (CUDA-core fp32) or "tf32x3" (tensor cores, three-pass fp32 emulation).
    block_v, num_warps, block_k, max_registers (the compiler's per-thread register cap; None: its
    choice) and num_stages (pipelining depth of the state loop) tune the apply launch;
    prepare_warps the prepare launch. only: "prepare" or "apply" runs that launch alone (to time
    it; the outputs are then incomplete).
    """
    n, rows, heads, dk = x.q.shape
    hv, dv = x.v.shape[2], x.v.shape[3]
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if only not in (None, "prepare", "apply"):
        raise ValueError(f"only must be None, 'prepare' or 'apply', got {only!r}")
    if tables.ancestry.shape != (rows, rows):
        raise ValueError(f"ancestry tables are for {tables.ancestry.shape[0]} rows, operands have {rows}")
    bk = min(block_k, dk)
    if dk % bk:
        raise ValueError(f"block_k={block_k} must divide K={dk}")
    check_stacked(x, state, o, ops, block_v)
    meta = dict(H=heads, HV=hv, K=dk, V=dv, BV=block_v, RP=max(16, triton.next_power_of_2(rows)), BK=bk)
    meta |= dict(PRECISION=precision, num_warps=num_warps, maxnreg=max_registers, num_stages=num_stages)
    p = torch.empty((n, hv, meta["RP"], meta["RP"]), dtype=torch.float32, device=x.q.device)
    gamma = torch.empty((n, hv, meta["RP"]), dtype=torch.float32, device=x.q.device)
    if only != "apply":
        gdn_tree_prepare_kernel[(heads, n)](
            x.q, x.k, x.a, x.b, x.A_log, x.dt_bias, ops.q, ops.k, ops.g, ops.beta, p, gamma,
            tables.ancestry, tables.n_active, rows, x.q.stride(0), x.a.stride(0), x.A_log.stride(0),
            H=heads, HV=hv, K=dk, RP=meta["RP"], LEVELS=BLOCK_LEVELS, MERGES=block_merges(tables.max_depth),
            PRECISION=precision, num_warps=prepare_warps,
        )  # fmt: skip
    if only != "prepare":
        gdn_tree_apply_kernel[(hv * (dv // block_v), n)](
            x.v, state, o, ops.q, ops.k, ops.v, ops.beta, p, gamma, tables.n_active, rows,
            x.q.stride(0), x.v.stride(0), x.a.stride(0), state.stride(0), **meta,
        )  # fmt: skip


def gdn_value_major_(
    x: GdnInputs, state: Tensor, tables: AncestryTables, o: Tensor, ops: GdnOperands, **config: object
) -> None:
    """One layer (shapes of `scan.gdn_scan_` without the instance dim); config as the stacked form."""
    one_instance_(gdn_value_major_layers_, x, state, tables, o, ops, **config)


def gdn_verify_value_major(
    x: GdnInputs, state: Tensor, tree: TreeDescriptor, block_v: int | None = None, **config: object
) -> GdnVerifyResult:
    """One layer with the reference's signature (fp32 compute; no cut states)."""
    return verify_one_layer(gdn_value_major_layers_, DEFAULT_BLOCK_V, x, state, tree, block_v, **config)
