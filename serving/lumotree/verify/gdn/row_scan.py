"""Gated DeltaNet tree verification in Triton with the autoregressive step's bits: the row scan.

One program per (value tile, value head, row) loads the committed state tile [BV, K] and carries it
down the row's ancestry, root first (a parent precedes its children in a tree's logical order), one
recurrence step per ancestor and the row itself, with the replay kernel's arithmetic (`replay.py`:
decay, predict with the decayed state, rank-1 write; the same tile height and warps, so the same
reduction order); its output is the last step's read S q. A row at depth d thus computes exactly
what d + 1 autoregressive steps compute, each published by the replay before the next: a chain row
of an MTP-5 or tree cycle has the AR arm's bits (the tree WY form of `tree_scan.py` solves all rows at
once, with other rounding, and parts from AR in a last bit now and then: results/h200/row-invariance).
Shared ancestors are recomputed by every row below them (depth x more arithmetic than the path scan),
all rows in parallel, so a layer costs max depth + 1 dependent steps.

The rows' operands arrive prepared (`prepare.py`: normalised q/k, v, g, beta in fp32, the records
the replay publishes from), so a step is the recurrence alone. Padding rows (past the tree's active
count) get zero outputs. `gdn_rows_prepared_` reads records made beforehand (the forward's fused
conv writes them); `gdn_rows_` prepares raw inputs into the caller's records first (one launch more)
and takes the caller-owned buffers of `tree_scan.gdn_tree_` and the same ancestry tables.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from lumotree.verify.gdn.common import default_block_v
from lumotree.verify.gdn.plan import AncestryTables
from lumotree.verify.gdn.prepare import prepare_operands_
from lumotree.verify.gdn.reference import GdnInputs, GdnOperands
from lumotree.verify.gdn.replay import DEFAULT_REPLAY_WARPS
from lumotree.verify.gdn.scan import _advance, _load_prepared, _read, _store_output


def row_strided(x: GdnInputs) -> tuple[GdnInputs, tuple[int, int, int]]:
    """x with every operand's features contiguous, q and k on one row stride and a and b on one
    (column slices of one output are taken as they are; anything else is copied), and the row
    strides (q and k, v, a and b) in elements."""

    def dense_rows(t: Tensor) -> bool:  # [R, ...] whose trailing dims are contiguous
        return t.is_contiguous() or t[:1].is_contiguous()

    q, k, v, a, b = (t if dense_rows(t) else t.contiguous() for t in (x.q, x.k, x.v, x.a, x.b))
    if q.stride(0) != k.stride(0):
        q, k = q.contiguous(), k.contiguous()
    if a.stride(0) != b.stride(0):
        a, b = a.contiguous(), b.contiguous()
    return GdnInputs(q, k, v, a, b, x.A_log.contiguous(), x.dt_bias.contiguous()), (
        q.stride(0),
        v.stride(0),
        a.stride(0),
    )


@triton.jit
def carry_down(
    rq_ptr, rk_ptr, rv_ptr, rg_ptr, rb_ptr, S, on_path, offs_r, h, hv, offs_v, offs_k, H: tl.constexpr,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, RP: tl.constexpr,
):  # fmt: skip
    """Carry the tile S [BV, K] down the rows where `on_path` (root side first, at least one), one
    update each; each step issues the next row's loads before its own arithmetic, so their latency
    hides behind it. Returns the tile after the last row."""
    steps = tl.sum(on_path.to(tl.int32), axis=0)
    node = tl.min(tl.where(on_path, offs_r, RP), axis=0)
    _, k, v, g, beta = _load_prepared(
        rq_ptr, rk_ptr, rv_ptr, rg_ptr, rb_ptr, node, True, False, h, hv, offs_v, offs_k, H, HV, K, V
    )
    for _ in range(steps):
        node = tl.min(tl.where(on_path & (offs_r > node), offs_r, RP), axis=0)
        _, nk, nv, ng, nbeta = _load_prepared(
            rq_ptr, rk_ptr, rv_ptr, rg_ptr, rb_ptr, node, node < RP, False, h, hv, offs_v, offs_k, H, HV,
            K, V,
        )  # fmt: skip
        S = _advance(S, k, v, g, beta)
        k, v, g, beta = nk, nv, ng, nbeta
    return S


@triton.jit
def gdn_rows_kernel(
    rq_ptr,
    rk_ptr,
    rv_ptr,
    rg_ptr,
    rb_ptr,
    state_ptr,
    anc_ptr,
    nactive_ptr,
    o_ptr,
    R,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    RP: tl.constexpr,
    ADVANCE: tl.constexpr = False,
):
    NVT: tl.constexpr = V // BV
    GROUP: tl.constexpr = HV // H
    pid = tl.program_id(0)
    row = tl.program_id(1)
    hv = pid // NVT
    vt = pid % NVT
    h = hv // GROUP
    offs_v = vt * BV + tl.arange(0, BV)
    offs_k = tl.arange(0, K)
    if row < tl.load(nactive_ptr):
        # the row's ancestry (itself included) in registers, walked root first
        offs_r = tl.arange(0, RP)
        on_path = tl.load(anc_ptr + row * R + offs_r, mask=offs_r <= row, other=0) != 0
        q = tl.load(rq_ptr + (row.to(tl.int64) * H + h) * K + offs_k)
        S = tl.load(state_ptr + hv * V * K + offs_v[:, None] * K + offs_k[None, :])
        S = carry_down(
            rq_ptr, rk_ptr, rv_ptr, rg_ptr, rb_ptr, S, on_path, offs_r, h, hv, offs_v, offs_k, H, HV, K, V,
            RP,
        )  # fmt: skip
        _store_output(o_ptr, row, hv, offs_v, _read(S, q), HV, V)
        if ADVANCE:  # one row: this program is its tile's only reader
            tl.store(state_ptr + hv * V * K + offs_v[:, None] * K + offs_k[None, :], S)
    else:
        _store_output(o_ptr, row, hv, offs_v, tl.zeros([BV], dtype=tl.float32), HV, V)


def gdn_rows_prepared_(
    ops: GdnOperands, state: Tensor, tables: AncestryTables, o: Tensor, advance: bool = False
) -> None:
    """One layer from prepared records: ops q, k [R, H, K], v [R, HV, V], g, beta [R, HV]
    (contiguous fp32), state [HV, V, K] fp32 (read only), ancestry tables of R rows on the device;
    writes o [R, HV, V]. advance: a one-row tree whose root is accepted whatever is sampled (the AR
    step) also leaves its updated state in `state`, in place (what publication's replay of the root
    would write, by the same arithmetic), so publication need not replay it."""
    rows, heads, dk = ops.q.shape
    hv, dv = ops.v.shape[1], ops.v.shape[2]
    if advance and (rows != 1 or not state.is_contiguous()):
        raise ValueError(
            f"the state advances in place for one contiguous row's tree, got {rows} rows, "
            f"contiguous={state.is_contiguous()}"
        )
    bv = default_block_v(dv, state.device)
    gdn_rows_kernel[(hv * (dv // bv), rows)](
        ops.q, ops.k, ops.v, ops.g, ops.beta, state, tables.ancestry, tables.n_active, o, rows,
        H=heads, HV=hv, K=dk, V=dv, BV=bv, RP=triton.next_power_of_2(rows), ADVANCE=advance,
        num_warps=DEFAULT_REPLAY_WARPS,
    )  # fmt: skip


def gdn_rows_(x: GdnInputs, state: Tensor, tables: AncestryTables, o: Tensor, ops: GdnOperands) -> None:
    """One layer from raw inputs: x's q, k [R, H, K], v [R, HV, V], a, b [R, HV] (rows may be
    strided, as column slices of a wider output: `row_strided`) prepared into the records `ops`,
    then `gdn_rows_prepared_`."""
    prepare_operands_(row_strided(x)[0], ops)
    gdn_rows_prepared_(ops, state, tables, o)
