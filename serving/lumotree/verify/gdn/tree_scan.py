"""Gated DeltaNet tree verification without a step loop: the tree-masked chunk (WY) form in Triton.

Every path scan (`scan.py`) carries the state through the tree's depth one node at a time, so a layer
costs ~depth dependent steps however the loads are arranged. Here all rows are solved at once.
With gamma_n = exp(G_n), G_n the sum of log-decays g over n's ancestors and n itself, unrolling
the recurrence (decay, predict, rank-1 write) along each node's ancestry gives, per value tile:

    S_n = gamma_n S0 + sum_{a anc-or-self of n} (gamma_n / gamma_a) u_a k_a^T
    (I + A) U = diag(beta) (V - diag(gamma) K S0^T)
        A[n, a] = beta_n (gamma_n / gamma_a) k_n . k_a   for a strict ancestor a of n
    O = diag(gamma) Q S0^T + (M o Gamma o Q K^T) U
        M = ancestry (incl. self), Gamma[n, a] = gamma_n / gamma_a

A is nilpotent (A^(depth+1) = 0) and only links a row to its ancestors, so two solves are exact:
- "substitution" (default): U <- RHS - A U, max_depth times; each round fixes one more depth level,
  with the rounding of fp32 forward substitution (stable);
- "product": (I + A)^-1 = (I - A)(I + A^2)(I + A^4)... (log2 rounds, measured on the H200). Its
  intermediate powers of A grow like binomial coefficients when keys are nearly parallel and decay
  is weak, so fp32 cancellation costs accuracy there (1e-5 of the output scale at key cosine
  ~0.997 without decay, vs 1e-7 for the sequential scan; equal to it for random keys).
One program per (value head, value tile, instance) does all of it with small matmuls (`tl.dot`,
fp32; "ieee" or tensor-core "tf32x3"), reads its state tile once and writes every row's output and
operand records; no path tables, no cut states. Gamma ratios are formed
as exp(G_n - G_a) (ancestors only), never as a quotient, so deep decays underflow to 0 cleanly.
The fp32 rounding differs from the sequential reference (sums of log-decays, matmul order).
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from lumotree.tree import TreeDescriptor
from lumotree.verify.gdn.common import (
    PRECISIONS,
    ancestry_masks,
    check_stacked,
    instance_slices,
    one_instance_,
    record_rows,
    softplus,
    verify_one_layer,
)
from lumotree.verify.gdn.plan import AncestryTables
from lumotree.verify.gdn.reference import GdnInputs, GdnOperands, GdnVerifyResult

SOLVES = ("substitution", "product")
DEFAULT_BLOCK_V = 32
DEFAULT_NUM_WARPS = 4


def solve_rounds(solve: str, max_depth: int) -> int:
    """Rounds that make the solve exact for trees of depth <= max_depth: substitution fixes one
    depth level per round; the product form's D factors cover powers of A up to 2^D - 1."""
    if solve not in SOLVES:
        raise ValueError(f"solve must be one of {', '.join(SOLVES)}, got {solve!r}")
    return max(1, max_depth) if solve == "substitution" else max(1, int(max_depth).bit_length())


@triton.jit
def gdn_tree_kernel(
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
    PRODUCT: tl.constexpr,
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
        instance_slices(
            inst, q_ptr, k_ptr, rq_ptr, rk_ptr, v_ptr, o_ptr, rv_ptr, a_ptr, b_ptr, rg_ptr, rb_ptr,
            alog_ptr, dtb_ptr, stride_qk, stride_v, stride_ab, stride_param,
        )
    )  # fmt: skip
    state_ptr += inst * stride_state

    offs_v = vt * BV + tl.arange(0, BV)
    offs_k = tl.arange(0, K)
    rows, in_range, valid, anc, strict = ancestry_masks(anc_ptr, nactive_ptr, R, RP)

    neg_a = -tl.exp(tl.load(alog_ptr + hv).to(tl.float32))
    dt_bias = tl.load(dtb_ptr + hv).to(tl.float32)
    n = rows.to(tl.int64)
    v_rows = v_ptr + (n * HV + hv)[:, None] * V + offs_v[None, :]
    v = tl.load(v_rows, mask=valid[:, None], other=0.0).to(tl.float32)
    g = neg_a * softplus(tl.load(a_ptr + n * HV + hv, mask=valid, other=0.0).to(tl.float32) + dt_bias)
    beta = tl.sigmoid(tl.load(b_ptr + n * HV + hv, mask=valid, other=0.0).to(tl.float32))
    first_tile = vt == 0
    key_writer = hv % GROUP == 0
    record_rows(
        rq_ptr, rk_ptr, rv_ptr, rg_ptr, rb_ptr, rows, valid, h, hv, first_tile, key_writer,
        offs_v, offs_k, 0.0, 0.0, v, g, beta, H, HV, K, V, False,  # q/k: below
    )  # fmt: skip

    # The K contraction in chunks of BK keys, so q, k and S0 never sit in registers whole: a first
    # pass for the row norms, a second (L1 hits) that normalises each chunk as the reference does,
    # records it and accumulates k k^T, q k^T, k S0^T and q S0^T.
    row_qk = (n * H + h) * K
    mrow = valid[:, None]
    offs_c = tl.arange(0, BK)
    ssq = tl.zeros([RP], dtype=tl.float32)
    ssk = tl.zeros([RP], dtype=tl.float32)
    for c in range(K // BK):
        cols = c * BK + offs_c
        qc = tl.load(q_ptr + row_qk[:, None] + cols[None, :], mask=mrow, other=0.0).to(tl.float32)
        kc = tl.load(k_ptr + row_qk[:, None] + cols[None, :], mask=mrow, other=0.0).to(tl.float32)
        ssq += tl.sum(qc * qc, axis=1)
        ssk += tl.sum(kc * kc, axis=1)
    rq = tl.rsqrt(ssq + 1e-6)
    rk = tl.rsqrt(ssk + 1e-6)
    key_rows = tl.where(tl.where(first_tile, key_writer, False), valid, False)[:, None]
    kk = tl.zeros([RP, RP], dtype=tl.float32)
    qk = tl.zeros([RP, RP], dtype=tl.float32)
    ks = tl.zeros([RP, BV], dtype=tl.float32)
    qs = tl.zeros([RP, BV], dtype=tl.float32)
    for c in range(K // BK):
        cols = c * BK + offs_c
        qc = tl.load(q_ptr + row_qk[:, None] + cols[None, :], mask=mrow, other=0.0).to(tl.float32)
        kc = tl.load(k_ptr + row_qk[:, None] + cols[None, :], mask=mrow, other=0.0).to(tl.float32)
        qc = qc * rq[:, None] * (K**-0.5)
        kc = kc * rk[:, None]
        tl.store(rq_ptr + row_qk[:, None] + cols[None, :], qc, mask=key_rows)
        tl.store(rk_ptr + row_qk[:, None] + cols[None, :], kc, mask=key_rows)
        sc = tl.load(state_ptr + hv * V * K + offs_v[:, None] * K + cols[None, :])
        kk = tl.dot(kc, tl.trans(kc), kk, input_precision=PRECISION)
        qk = tl.dot(qc, tl.trans(kc), qk, input_precision=PRECISION)
        ks = tl.dot(kc, tl.trans(sc), ks, input_precision=PRECISION)
        qs = tl.dot(qc, tl.trans(sc), qs, input_precision=PRECISION)

    # Cumulative log-decay along each row's ancestry, and the decay ratios to its ancestors.
    G = tl.sum(tl.where(anc, g[None, :], 0.0), axis=1)
    ratio = tl.where(anc, tl.exp(tl.where(anc, G[:, None] - G[None, :], 0.0)), 0.0)
    gamma = tl.exp(G)

    # (I + A) U = beta (V - gamma K S0^T); A is nilpotent (see the module docstring).
    A = tl.where(strict, beta[:, None] * ratio * kk, 0.0)
    U = beta[:, None] * (v - gamma[:, None] * ks)
    if PRODUCT:
        U = U - tl.dot(A, U, input_precision=PRECISION)
        P = A
        for _ in tl.static_range(ROUNDS - 1):
            P = tl.dot(P, P, input_precision=PRECISION)
            U = U + tl.dot(P, U, input_precision=PRECISION)
    else:
        rhs = U
        for _ in tl.static_range(ROUNDS):
            U = rhs - tl.dot(A, U, input_precision=PRECISION)

    out = gamma[:, None] * qs + tl.dot(ratio * qk, U, input_precision=PRECISION)
    out = tl.where(valid[:, None], out, 0.0)  # padding rows read as zero
    tl.store(
        o_ptr + (rows * HV + hv)[:, None] * V + offs_v[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=in_range[:, None] & (offs_v[None, :] < V),
    )


def gdn_tree_layers_(
    x: GdnInputs,
    state: Tensor,
    tables: AncestryTables,
    o: Tensor,
    ops: GdnOperands,
    block_v: int = DEFAULT_BLOCK_V,
    num_warps: int = DEFAULT_NUM_WARPS,
    precision: str = "ieee",
    solve: str = "substitution",
) -> None:
    """Verify N independent GDN instances sharing one tree in one launch, into caller-owned buffers.

    x: inputs with a leading instance dim N, all contiguous (q, k [N, R, H, K]; v [N, R, HV, V];
    a, b [N, R, HV]; A_log, dt_bias [N, HV]); state [N, HV, V, K] fp32 (read only); o [N, R, HV, V];
    ops fp32 records. block_v >= 16 on the GPU (matmul tiles).
    precision: "ieee" (CUDA-core fp32) or "tf32x3" (tensor cores, three-pass fp32 emulation).
    solve: "substitution" (stable) or "product" (fewer rounds; see the module docstring).
    """
    n, rows, heads, dk = x.q.shape
    hv, dv = x.v.shape[2], x.v.shape[3]
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if tables.ancestry.shape != (rows, rows):
        raise ValueError(f"ancestry tables are for {tables.ancestry.shape[0]} rows, operands have {rows}")
    check_stacked(x, state, o, ops, block_v)
    gdn_tree_kernel[(hv * (dv // block_v), n)](
        *x.tensors(), state, o, ops.q, ops.k, ops.v, ops.g, ops.beta,
        tables.ancestry, tables.n_active, rows,
        x.q.stride(0), x.v.stride(0), x.a.stride(0), x.A_log.stride(0), state.stride(0),
        H=heads, HV=hv, K=dk, V=dv, BV=block_v, RP=max(16, triton.next_power_of_2(rows)), BK=min(32, dk),
        ROUNDS=solve_rounds(solve, tables.max_depth), PRODUCT=solve == "product", PRECISION=precision,
        num_warps=num_warps,
    )  # fmt: skip


def gdn_tree_(
    x: GdnInputs, state: Tensor, tables: AncestryTables, o: Tensor, ops: GdnOperands, **config: object
) -> None:
    """One layer (shapes of `scan.gdn_scan_` without the instance dim); config as `gdn_tree_layers_`."""
    one_instance_(gdn_tree_layers_, x, state, tables, o, ops, **config)


def gdn_verify_tree(
    x: GdnInputs,
    state: Tensor,
    tree: TreeDescriptor,
    block_v: int | None = None,
    num_warps: int = DEFAULT_NUM_WARPS,
    precision: str = "ieee",
    solve: str = "substitution",
) -> GdnVerifyResult:
    """The tree-parallel kernel with the reference's signature (fp32 compute; no cut states)."""
    config = dict(num_warps=num_warps, precision=precision, solve=solve)
    return verify_one_layer(gdn_tree_layers_, DEFAULT_BLOCK_V, x, state, tree, block_v, **config)
