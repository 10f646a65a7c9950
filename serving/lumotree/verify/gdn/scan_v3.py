"""Gated DeltaNet path scan v3 in Triton: every operand preloaded, a step loop without memory reads.

Scan v2 (`scan.py`) measured ~2 us per node evaluation on the H200, waiting inside its step loop on
dependent loads (table entry -> operand address -> operand). v3 moves every load out of the loop.
One program per (value tile, path, instance) carries an fp32 state tile [BV, K] (V-first layout):

1. Prologue, one round trip: the path's node ids, owner flags and cut slots as [L] vectors and its
   leaf children as a dense [L, J] table (`ScanTables.leaf_table`), then every operand of the path
   and of its leaves as 2-D tiles (q, k [L, K] and [L*J, K]; v [L, BV] and [L*J, BV]; a, b). q/k
   normalisation, gates and decays are computed for all rows at once with the reference's formulas
   and cast points, and the operand records of owned nodes are stored here.
2. Step loop, unrolled (`tl.static_range(L)`; steps past the path's end are skipped): row i of each
   preloaded tile is picked by a masked reduction, which does not depend on the state, so the only
   dependent chain per step is decay -> S k -> rank-1 write. The node's output S q is stored
   (stores do not stall). Each leaf child l of the node is read from the post-step tile without
   forming its state: with d = exp(g_l), u = beta_l (v_l - d (S k_l)), o_l = d (S q_l) + u (k_l q_l),
   algebraically the reference's step + read (fp32 rounding order differs slightly).

A third grid axis runs independent GDN instances (e.g. the 48 layers of a model, all sharing one
tree) in one launch; `gdn_scan_v3_` is the one-layer form. Schedules: "recompute" (one launch) and
"cut" (spine launch exporting cut states, then branch launch); "store_all" stays with scan v2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from lumotree.tree import TreeDescriptor
from lumotree.verify.gdn.plan import ScanTables, scan_tables
from lumotree.verify.gdn.reference import GdnOperands, GdnVerifyResult
from lumotree.verify.gdn.scan import _check_power_of_two, _softplus, check_verify_inputs, empty_operands

V3_SCHEDULES = ("recompute", "cut")
DEFAULT_BLOCK_V = 8
DEFAULT_NUM_WARPS = 2


@triton.jit
def _row(T, rows, i):
    """Row i of a 2-D register tile (masked reduction: no memory access)."""
    return tl.sum(tl.where(rows[:, None] == i, T, -0.0), axis=0)


@triton.jit
def _entry(x, rows, i):
    """Entry i of a 1-D register vector."""
    return tl.sum(tl.where(rows == i, x, 0), axis=0)


@triton.jit
def _instance_slices(
    inst,
    q_ptr,
    k_ptr,
    rq_ptr,
    rk_ptr,
    v_ptr,
    o_ptr,
    rv_ptr,
    a_ptr,
    b_ptr,
    rg_ptr,
    rb_ptr,
    alog_ptr,
    dtb_ptr,
    stride_qk,
    stride_v,
    stride_ab,
    stride_param,
):
    """Operand, output and record pointers moved to GDN instance `inst` (int64)."""
    return (
        q_ptr + inst * stride_qk,
        k_ptr + inst * stride_qk,
        rq_ptr + inst * stride_qk,
        rk_ptr + inst * stride_qk,
        v_ptr + inst * stride_v,
        o_ptr + inst * stride_v,
        rv_ptr + inst * stride_v,
        a_ptr + inst * stride_ab,
        b_ptr + inst * stride_ab,
        rg_ptr + inst * stride_ab,
        rb_ptr + inst * stride_ab,
        alog_ptr + inst * stride_param,
        dtb_ptr + inst * stride_param,
    )


@triton.jit
def _gather_operands(
    q_ptr,
    k_ptr,
    v_ptr,
    a_ptr,
    b_ptr,
    nodes,
    valid,
    h,
    hv,
    offs_v,
    offs_k,
    neg_a,
    dt_bias,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
):
    """Operands of a vector of nodes as tiles, prepared in fp32 as the reference does: normalised q
    (scaled by K^-1/2) and k [N, K], v [N, BV], g, beta [N]. Invalid rows load zeros."""
    n = tl.maximum(nodes, 0).to(tl.int64)
    row_qk = (n * H + h) * K
    mqk = valid[:, None] & (offs_k[None, :] < K)
    q = tl.load(q_ptr + row_qk[:, None] + offs_k[None, :], mask=mqk, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + row_qk[:, None] + offs_k[None, :], mask=mqk, other=0.0).to(tl.float32)
    mv = valid[:, None] & (offs_v[None, :] < V)
    v = tl.load(v_ptr + (n * HV + hv)[:, None] * V + offs_v[None, :], mask=mv, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + n * HV + hv, mask=valid, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + n * HV + hv, mask=valid, other=0.0).to(tl.float32)
    k = k * tl.rsqrt(tl.sum(k * k, axis=1) + 1e-6)[:, None]
    q = q * tl.rsqrt(tl.sum(q * q, axis=1) + 1e-6)[:, None] * (K**-0.5)
    g = neg_a * _softplus(a + dt_bias)
    return q, k, v, g, tl.sigmoid(b)


@triton.jit
def _record_rows(
    rq_ptr,
    rk_ptr,
    rv_ptr,
    rg_ptr,
    rb_ptr,
    nodes,
    own,
    h,
    hv,
    first_tile,
    key_writer,
    offs_v,
    offs_k,
    q,
    k,
    v,
    g,
    beta,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    WITH_KEYS: tl.constexpr,
):
    """Store the prepared operands of the owned rows: v by every value tile, g/beta by the first
    tile, q/k (if WITH_KEYS) by the first tile of the first value head of each key head."""
    n = tl.maximum(nodes, 0).to(tl.int64)
    tl.store(rv_ptr + (n * HV + hv)[:, None] * V + offs_v[None, :], v, mask=own[:, None])
    # (scalar conditions enter masks through tl.where: `tensor & scalar` is wrong in the interpreter)
    own_first = tl.where(first_tile, own, False)
    tl.store(rg_ptr + n * HV + hv, g, mask=own_first)
    tl.store(rb_ptr + n * HV + hv, beta, mask=own_first)
    if WITH_KEYS:
        mk = tl.where(key_writer, own_first, False)[:, None] & (offs_k[None, :] < K)
        tl.store(rq_ptr + ((n * H + h) * K)[:, None] + offs_k[None, :], q, mask=mk)
        tl.store(rk_ptr + ((n * H + h) * K)[:, None] + offs_k[None, :], k, mask=mk)


@triton.jit
def gdn_scan_v3_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    a_ptr,
    b_ptr,
    alog_ptr,
    dtb_ptr,
    state_ptr,
    cut_ptr,
    o_ptr,
    rq_ptr,
    rk_ptr,
    rv_ptr,
    rg_ptr,
    rb_ptr,
    nodes_ptr,
    steps_ptr,
    start_ptr,
    owner_ptr,
    cutslot_ptr,
    leaf_ptr,
    nactive_ptr,
    path_offset,
    R,
    stride_qk,
    stride_v,
    stride_ab,
    stride_param,
    stride_state,
    stride_cut,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    L: tl.constexpr,
    LP: tl.constexpr,
    J: tl.constexpr,
    JP: tl.constexpr,
    RP: tl.constexpr,
):
    NVT: tl.constexpr = V // BV
    GROUP: tl.constexpr = HV // H
    pid = tl.program_id(0)
    p = tl.program_id(1) + path_offset
    inst = tl.program_id(2).to(tl.int64)
    hv = pid // NVT
    vt = pid % NVT
    h = hv // GROUP
    # This instance's slices (instances share the tables: one tree per cycle).
    q_ptr, k_ptr, rq_ptr, rk_ptr, v_ptr, o_ptr, rv_ptr, a_ptr, b_ptr, rg_ptr, rb_ptr, alog_ptr, dtb_ptr = (
        _instance_slices(
            inst, q_ptr, k_ptr, rq_ptr, rk_ptr, v_ptr, o_ptr, rv_ptr, a_ptr, b_ptr, rg_ptr, rb_ptr,
            alog_ptr, dtb_ptr, stride_qk, stride_v, stride_ab, stride_param,
        )
    )  # fmt: skip
    state_ptr += inst * stride_state
    cut_ptr += inst * stride_cut

    offs_v = vt * BV + tl.arange(0, BV)
    offs_k = tl.arange(0, K)
    tile = hv * V * K + offs_v[:, None] * K + offs_k[None, :]
    slab: tl.constexpr = HV * V * K

    # ---- prologue: tables, then every operand, in as few round trips as the dependencies allow ----
    n_steps = tl.load(steps_ptr + p)
    if n_steps == 0:  # unused path slots of fixed-capacity tables (path 0 always has the root)
        return
    start = tl.load(start_ptr + p)
    rows = tl.arange(0, LP)
    on_path = rows < n_steps
    nodes = tl.load(nodes_ptr + p * L + rows, mask=on_path, other=-1)
    own = tl.load(owner_ptr + p * L + rows, mask=on_path, other=0) != 0
    cut_slot = tl.where(own, tl.load(cutslot_ptr + tl.maximum(nodes, 0), mask=on_path, other=-1), -1)
    lrows = tl.arange(0, LP * JP)
    lstep = lrows // JP
    lslot = lrows % JP
    leaf_ok = (lstep < n_steps) & (lslot < J)
    leaves = tl.load(leaf_ptr + (p * L + lstep) * J + lslot, mask=leaf_ok, other=-1)
    is_leaf = leaves >= 0

    neg_a = -tl.exp(tl.load(alog_ptr + hv).to(tl.float32))
    dt_bias = tl.load(dtb_ptr + hv).to(tl.float32)
    from_durable = (tl.zeros([BV, K], dtype=tl.int32) + start) < 0
    S = tl.load(state_ptr + tile, mask=from_durable, other=0.0) + tl.load(
        cut_ptr + tl.maximum(start, 0).to(tl.int64) * slab + tile, mask=~from_durable, other=0.0
    )
    q, k, v, g, beta = _gather_operands(
        q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, nodes, on_path, h, hv, offs_v, offs_k, neg_a, dt_bias, H, HV, K, V
    )
    lq, lk, lv, lg, lbeta = _gather_operands(
        q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, leaves, is_leaf, h, hv, offs_v, offs_k, neg_a, dt_bias, H, HV, K, V
    )
    decay = tl.exp(g)
    ldecay = tl.exp(lg)
    lkq = tl.sum(lk * lq, axis=1)  # k_l . q_l, independent of the state

    first_tile = vt == 0
    key_writer = hv % GROUP == 0
    _record_rows(
        rq_ptr, rk_ptr, rv_ptr, rg_ptr, rb_ptr, nodes, own, h, hv, first_tile, key_writer,
        offs_v, offs_k, q, k, v, g, beta, H, HV, K, V, True,
    )  # fmt: skip
    _record_rows(
        rq_ptr, rk_ptr, rv_ptr, rg_ptr, rb_ptr, leaves, is_leaf, h, hv, first_tile, key_writer,
        offs_v, offs_k, lq, lk, lv, lg, lbeta, H, HV, K, V, True,
    )  # fmt: skip
    # Path 0 zeroes the outputs of padding rows (they never advance anything).
    offs_r = tl.arange(0, RP)
    pad = tl.where(p == 0, (offs_r >= tl.load(nactive_ptr)) & (offs_r < R), False)
    tl.store(
        o_ptr + (offs_r * HV + hv)[:, None] * V + offs_v[None, :],
        tl.zeros([RP, BV], dtype=o_ptr.dtype.element_ty),
        mask=pad[:, None],
    )

    # ---- step loop: registers only, apart from fire-and-forget stores ----
    for i in tl.static_range(L):
        if i < n_steps:
            ki = _row(k, rows, i)
            S = S * _entry(decay, rows, i)
            u = (_row(v, rows, i) - tl.sum(S * ki[None, :], axis=1)) * _entry(beta, rows, i)
            S = S + u[:, None] * ki[None, :]
            node = _entry(nodes, rows, i).to(tl.int64)
            o = tl.sum(S * _row(q, rows, i)[None, :], axis=1)
            own_i = _entry(own.to(tl.int32), rows, i) != 0
            tl.store(
                o_ptr + (node * HV + hv) * V + offs_v,
                o.to(o_ptr.dtype.element_ty),
                mask=tl.where(own_i, offs_v < V, False),
            )
            slot = _entry(cut_slot, rows, i)
            cut_mask = (tl.zeros([BV, K], dtype=tl.int32) + slot) >= 0
            tl.store(cut_ptr + tl.maximum(slot, 0).to(tl.int64) * slab + tile, S, mask=cut_mask)
            for j in tl.static_range(J):
                r = i * JP + j
                leaf = _entry(leaves, lrows, r)
                if leaf >= 0:
                    d = _entry(ldecay, lrows, r)
                    sk = tl.sum(S * _row(lk, lrows, r)[None, :], axis=1)
                    sq = tl.sum(S * _row(lq, lrows, r)[None, :], axis=1)
                    ul = (_row(lv, lrows, r) - d * sk) * _entry(lbeta, lrows, r)
                    ol = d * sq + ul * _entry(lkq, lrows, r)
                    tl.store(
                        o_ptr + (leaf.to(tl.int64) * HV + hv) * V + offs_v, ol.to(o_ptr.dtype.element_ty)
                    )


def _check_layout(name: str, t: Tensor, shape: tuple[int, ...]) -> None:
    if tuple(t.shape) != shape or not t.is_contiguous():
        raise ValueError(
            f"{name} must be contiguous {list(shape)}, got {list(t.shape)} (contiguous: {t.is_contiguous()})"
        )


def check_stacked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    state: Tensor,
    o: Tensor,
    ops: GdnOperands,
    block_v: int,
) -> None:
    """Shapes and layouts of a stack of N instances (see `gdn_scan_v3_layers_`), as the kernels
    index them: contiguous, power-of-two K and value tile, V a multiple of the tile."""
    n, rows, heads, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    _check_power_of_two("K", dk)
    _check_power_of_two("block_v", block_v)
    if dv % block_v:
        raise ValueError(f"V={dv} must be a multiple of block_v={block_v}")
    for name, t, shape in (
        ("q", q, (n, rows, heads, dk)),
        ("k", k, (n, rows, heads, dk)),
        ("v", v, (n, rows, hv, dv)),
        ("a", a, (n, rows, hv)),
        ("b", b, (n, rows, hv)),
        ("A_log", A_log, (n, hv)),
        ("dt_bias", dt_bias, (n, hv)),
        ("state", state, (n, hv, dv, dk)),
        ("o", o, (n, rows, hv, dv)),
        ("records q", ops.q, (n, rows, heads, dk)),
        ("records k", ops.k, (n, rows, heads, dk)),
        ("records v", ops.v, (n, rows, hv, dv)),
        ("records g", ops.g, (n, rows, hv)),
        ("records beta", ops.beta, (n, rows, hv)),
    ):
        _check_layout(name, t, shape)


def gdn_scan_v3_layers_(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    state: Tensor,
    tables: ScanTables,
    o: Tensor,
    ops: GdnOperands,
    cut_bank: Tensor | None = None,
    block_v: int = DEFAULT_BLOCK_V,
    num_warps: int = DEFAULT_NUM_WARPS,
) -> None:
    """Path scan of N independent GDN instances sharing one tree, into caller-owned buffers.

    All contiguous with a leading instance dim N: q, k [N, R, H, K]; v [N, R, HV, V]; a, b [N, R, HV];
    A_log, dt_bias [N, HV]; state [N, HV, V, K] fp32 durable, read only; o [N, R, HV, V] (v's dtype);
    ops: fp32 record buffers with the same leading dim. cut_bank [N, C, HV, V, K] fp32 scratch, needed
    for the "cut" schedule only (C >= the cut states of the tree). "recompute": one launch for all
    instances; "cut": two (spine, then branch paths). No allocation, no host sync.
    """
    if tables.schedule not in V3_SCHEDULES:
        raise ValueError(f"scan v3 runs the {' and '.join(V3_SCHEDULES)} schedules, not {tables.schedule!r}")
    n, rows, heads, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    check_stacked(q, k, v, a, b, A_log, dt_bias, state, o, ops, block_v)
    if tables.schedule == "cut":
        if cut_bank is None or cut_bank.shape[0] != n or cut_bank.shape[2:] != (hv, dv, dk):
            raise ValueError(f"the cut schedule needs a cut bank [{n}, C, {hv}, {dv}, {dk}]")
        _check_layout("cut_bank", cut_bank, tuple(cut_bank.shape))
        bank, bank_stride = cut_bank, cut_bank.stride(0)
    else:
        bank, bank_stride = state, 0  # never written: the recompute tables have no cut slots
    args = (
        q, k, v, a, b, A_log, dt_bias, state, bank, o, ops.q, ops.k, ops.v, ops.g, ops.beta,
        tables.nodes, tables.steps, tables.start, tables.owner, tables.cut_slot, tables.leaf_table,
        tables.n_active,
    )  # fmt: skip
    strides = (q.stride(0), v.stride(0), a.stride(0), A_log.stride(0), state.stride(0), bank_stride)
    leaf_slots = tables.leaf_slots
    meta = dict(
        H=heads,
        HV=hv,
        K=dk,
        V=dv,
        BV=block_v,
        L=tables.max_steps,
        LP=triton.next_power_of_2(tables.max_steps),
        J=leaf_slots,
        JP=triton.next_power_of_2(leaf_slots),
        RP=triton.next_power_of_2(rows),
        num_warps=num_warps,
    )
    programs = hv * (dv // block_v)
    if tables.schedule == "recompute":
        gdn_scan_v3_kernel[(programs, tables.paths, n)](*args, 0, rows, *strides, **meta)
        return
    gdn_scan_v3_kernel[(programs, 1, n)](*args, 0, rows, *strides, **meta)
    if tables.paths > 1:
        gdn_scan_v3_kernel[(programs, tables.paths - 1, n)](*args, 1, rows, *strides, **meta)


def gdn_scan_v3_(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    state: Tensor,
    tables: ScanTables,
    o: Tensor,
    ops: GdnOperands,
    cut_bank: Tensor | None = None,
    block_v: int = DEFAULT_BLOCK_V,
    num_warps: int = DEFAULT_NUM_WARPS,
) -> None:
    """One layer (shapes of `scan.gdn_scan_`, no instance dim; cut_bank [C, HV, V, K] for "cut")."""
    ops1 = GdnOperands(*(t[None] for t in (ops.q, ops.k, ops.v, ops.g, ops.beta)))
    bank = None if cut_bank is None else cut_bank[None]
    inputs = (t[None] for t in (q, k, v, a, b, A_log, dt_bias, state))
    gdn_scan_v3_layers_(*inputs, tables, o[None], ops1, bank, block_v=block_v, num_warps=num_warps)


def gdn_verify_v3(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    state: Tensor,
    tree: TreeDescriptor,
    schedule: str = "recompute",
    block_v: int = DEFAULT_BLOCK_V,
    num_warps: int = DEFAULT_NUM_WARPS,
) -> GdnVerifyResult:
    """Scan v3 with the reference's signature and result (fp32 compute only). Records cover the
    active rows; padding rows' outputs are zero. cut_states: [C] ("cut") or none ("recompute")."""
    check_verify_inputs(q, k, v, a, b, A_log, dt_bias, state, tree)
    rows, heads, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    tables = scan_tables(tree, q.device, schedule)
    ops = empty_operands(rows, heads, hv, dk, dv, q.device)
    o = torch.empty_like(v)
    n_cuts = len(tree.paths.cut_nodes) if schedule == "cut" else 0
    bank = torch.empty((max(n_cuts, 1), hv, dv, dk), dtype=torch.float32, device=q.device)
    inputs = [t.contiguous() for t in (q, k, v, a, b, A_log, dt_bias, state)]
    gdn_scan_v3_(*inputs, tables, o, ops, bank if schedule == "cut" else None, block_v, num_warps)
    return GdnVerifyResult(o=o, operands=ops, cut_states=bank[:n_cuts])
