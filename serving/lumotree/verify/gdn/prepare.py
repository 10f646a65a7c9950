"""Gated DeltaNet operands prepared once a node in Triton, beside `reference.prepare_operands`.

The scans (`row_scan.py`, `paths_scan.py`) read prepared fp32 operands: q normalised and scaled, k
normalised, v, the log decay g and the write strength beta, the records the replay publishes from.
Preparing them inside the scans repeated each node's normalisations and gates in every value tile of
a head and in every walk through the node (~23 % of a scan step's instructions on the H200:
results/h200/NOTES.md, session 17); here each is done once.

The channels of a GDN layer's conv output are [q (H K) | k (H K) | v (HV V)]. One program per (row,
channel block of a whole number of heads) prepares its block (`prepared_channels`,
`store_operands`), and one more program a row its gates (`store_gates`); the fused tree conv
(`conv/fused_conv.py`) runs the same helpers on its output, so the forward prepares the operands in
the conv's launch. `prepare_operands_` prepares raw `GdnInputs` (the scans' reference-signature
forms and the vLLM plugin), one launch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from lumotree.verify.gdn.common import softplus
from lumotree.verify.gdn.reference import GdnInputs, GdnOperands

BLOCK_C = 256
# Warps a program (a block of two key heads at 27B), the standalone launch's and the fused conv's:
# the fastest conv for every row count since the block is flat (the 27B's 48 layers, paper tree /
# chain / one row: 0.204 / 0.130 / 0.120 ms, 2 warps 0.220 / 0.148 / 0.141,
# results/h200/gdn-forms-conv.md, session 19)
PREPARE_WARPS = 4


def channel_block(dk: int) -> int:
    """Channels a program prepares: BLOCK_C, or one key head if wider (a block holds whole heads)."""
    return max(BLOCK_C, triton.next_power_of_2(dk))


@triton.jit
def prepared_channels(y, offs_c, HK: tl.constexpr, K: tl.constexpr):
    """y [BC] fp32 of the channels offs_c = block * BC + arange(BC) (whole key heads) -> q
    normalised and scaled where c < HK, k normalised where HK <= c < 2 HK, v as it is beyond (the
    reference's arithmetic: x * rsqrt(sum x^2 + 1e-6), then * K^-0.5 for q). The block stays flat
    for its loads and stores and is viewed as [heads, K] only for the norms: held as [heads, K]
    throughout, Triton 3.6 laid the loads out along the heads, uncoalesced (the conv 1.1 us a launch
    slower on the H200, results/h200/NOTES.md, session 19)."""
    BC: tl.constexpr = y.shape[0]
    heads = tl.reshape(y, [BC // K, K])
    normed = tl.reshape(heads * tl.rsqrt(tl.sum(heads * heads, axis=1) + 1e-6)[:, None], [BC])
    normed = tl.where(offs_c < HK, normed * (K**-0.5), normed)
    return tl.where(offs_c < 2 * HK, normed, y)


@triton.jit
def store_operands(
    ops, offs_c, mc, row, rq_ptr, rk_ptr, rv_ptr, HK: tl.constexpr, HVV: tl.constexpr
):  # fmt: skip
    """Store a row's prepared channels into the records q, k [R, H, K] and v [R, HV, V]."""
    r = row.to(tl.int64)
    tl.store(rq_ptr + r * HK + offs_c, ops, mask=mc & (offs_c < HK))
    tl.store(rk_ptr + r * HK + offs_c - HK, ops, mask=mc & (offs_c >= HK) & (offs_c < 2 * HK))
    tl.store(rv_ptr + r * HVV + offs_c - 2 * HK, ops, mask=mc & (offs_c >= 2 * HK))


@triton.jit
def store_gates(
    a_ptr, b_ptr, stride_ab, alog_ptr, dtb_ptr, rg_ptr, rb_ptr, row, HV: tl.constexpr, HVP: tl.constexpr
):  # fmt: skip
    """Store a row's gates g = -exp(A_log) softplus(a + dt_bias) and beta = sigmoid(b) [HV]
    (a and b rows at stride_ab elements)."""
    r = row.to(tl.int64)
    offs = tl.arange(0, HVP)
    m = offs < HV
    a = tl.load(a_ptr + r * stride_ab + offs, mask=m, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + r * stride_ab + offs, mask=m, other=0.0).to(tl.float32)
    neg_a = -tl.exp(tl.load(alog_ptr + offs, mask=m, other=0.0).to(tl.float32))
    dt_bias = tl.load(dtb_ptr + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(rg_ptr + r * HV + offs, neg_a * softplus(a + dt_bias), mask=m)
    tl.store(rb_ptr + r * HV + offs, tl.sigmoid(b), mask=m)


@triton.jit
def prepare_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, rq_ptr, rk_ptr, rv_ptr, rg_ptr, rb_ptr,
    stride_qk, stride_v, stride_ab, HK: tl.constexpr, K: tl.constexpr, HVV: tl.constexpr,
    HV: tl.constexpr, HVP: tl.constexpr, BC: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    block = tl.program_id(1)
    r = row.to(tl.int64)
    if block * BC < 2 * HK + HVV:
        offs_c = block * BC + tl.arange(0, BC)
        in_q = offs_c < HK
        in_k = (offs_c >= HK) & (offs_c < 2 * HK)
        in_v = (offs_c >= 2 * HK) & (offs_c < 2 * HK + HVV)
        y = tl.load(q_ptr + r * stride_qk + offs_c, mask=in_q, other=0.0).to(tl.float32)
        y += tl.load(k_ptr + r * stride_qk + offs_c - HK, mask=in_k, other=0.0).to(tl.float32)
        y += tl.load(v_ptr + r * stride_v + offs_c - 2 * HK, mask=in_v, other=0.0).to(tl.float32)
        ops = prepared_channels(y, offs_c, HK, K)
        store_operands(ops, offs_c, offs_c < 2 * HK + HVV, row, rq_ptr, rk_ptr, rv_ptr, HK, HVV)
    else:  # the gates: a program of their own
        store_gates(a_ptr, b_ptr, stride_ab, alog_ptr, dtb_ptr, rg_ptr, rb_ptr, row, HV, HVP)


def prepare_operands_(x: GdnInputs, ops: GdnOperands) -> None:
    """x's q, k [R, H, K], v [R, HV, V], a, b [R, HV] (each row's features contiguous, q and k on
    one row stride, a and b on one: `row_scan.row_strided`) -> ops (contiguous fp32 records of
    those shapes), one launch."""
    rows, heads, dk = x.q.shape
    hv, dv = x.v.shape[1], x.v.shape[2]
    bc = channel_block(dk)
    channels = 2 * heads * dk + hv * dv
    prepare_kernel[(rows, triton.cdiv(channels, bc) + 1)](
        *x.tensors(), ops.q, ops.k, ops.v, ops.g, ops.beta, x.q.stride(0), x.v.stride(0), x.a.stride(0),
        HK=heads * dk, K=dk, HVV=hv * dv, HV=hv, HVP=triton.next_power_of_2(hv), BC=bc,
        enable_fp_fusion=False,  # as the fused conv's epilogue (each sum's order is its layout's)
        num_warps=PREPARE_WARPS,
    )  # fmt: skip
