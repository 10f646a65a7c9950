"""Gated DeltaNet tree verification in Triton: the path scan beside `reference.py`.

One program per (path, value head, value tile) carries an fp32 state tile [BV, K] through its path
(state layout V-first, [HV, V, K]: a program's slab is BV*K contiguous floats). Per step it
normalises q/k and evaluates the gates in-kernel from the raw inputs, applies the exact recurrence
(decay, predict with the decayed state, rank-1 write, read), writes the node's output and records
its operands (normalised q/k, v, g, beta) for replay, exports the tile where the node is a cut, and
evaluates the node's leaf children from the tile without a state of their own. The loads of the
next node and of the node's first two leaf children are issued before the current step's
arithmetic and their own arithmetic runs after it, so their latency hides behind the step.

`gdn_verify` has the reference's signature; `gdn_scan_` writes into caller-owned buffers (the
form CUDA graphs capture). Schedules: see `plan.py`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from lumotree.tree import TreeDescriptor
from lumotree.verify.gdn.common import (
    check_power_of_two,
    check_verify_inputs,
    default_block_v,
    empty_operands,
    softplus,
)
from lumotree.verify.gdn.plan import ScanTables, scan_tables
from lumotree.verify.gdn.reference import GdnInputs, GdnOperands, GdnVerifyResult


@triton.jit
def _issue_loads(
    q_ptr,
    k_ptr,
    v_ptr,
    a_ptr,
    b_ptr,
    node,
    ok,
    h,
    hv,
    offs_v,
    offs_k,
    stride_qk,
    stride_v,
    stride_ab,
    K: tl.constexpr,
    V: tl.constexpr,
):
    """Raw q, k [K], v slice [BV], a, b of `node` in their storage dtype (zeros if not ok), rows at
    the given strides (elements) of q and k, of v, and of a and b: contiguous operands have H K,
    HV V and HV; column slices of a wider projection or conv output are read in place."""
    n = tl.maximum(node, 0).to(tl.int64)
    # (scalar conditions enter masks through tl.where: `tensor & scalar` is wrong in the interpreter)
    mk = tl.where(ok, offs_k < K, False)
    q = tl.load(q_ptr + n * stride_qk + h * K + offs_k, mask=mk, other=0.0)
    k = tl.load(k_ptr + n * stride_qk + h * K + offs_k, mask=mk, other=0.0)
    v = tl.load(v_ptr + n * stride_v + hv * V + offs_v, mask=tl.where(ok, offs_v < V, False), other=0.0)
    a = tl.load(a_ptr + n * stride_ab + hv, mask=ok, other=0.0)
    b = tl.load(b_ptr + n * stride_ab + hv, mask=ok, other=0.0)
    return q, k, v, a, b


@triton.jit
def _prepare(q, k, v, a, b, neg_a, dt_bias, K: tl.constexpr):
    """Normalised q (scaled), normalised k, v, g and beta in fp32, from raw operands (this kernel's
    own preparation; the row and paths scans read records prepared once: `prepare.py`)."""
    q, k, v = q.to(tl.float32), k.to(tl.float32), v.to(tl.float32)
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
    g = neg_a * softplus(a.to(tl.float32) + dt_bias)
    beta = tl.sigmoid(b.to(tl.float32))
    return q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * (K**-0.5), k, v, g, beta


@triton.jit
def _load_operands(
    q_ptr,
    k_ptr,
    v_ptr,
    a_ptr,
    b_ptr,
    node,
    ok,
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
    """Prepared operands of `node` (loads and arithmetic back to back)."""
    q, k, v, a, b = _issue_loads(
        q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, node, ok, h, hv, offs_v, offs_k, H * K, HV * V, HV, K, V
    )
    return _prepare(q, k, v, a, b, neg_a, dt_bias, K)


@triton.jit
def _touch(
    q_ptr,
    k_ptr,
    v_ptr,
    a_ptr,
    b_ptr,
    nodes,
    valid,
    h,
    hv,
    v0,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
):
    """Read one element of every 32-byte sector holding an operand of `nodes`, all at once, and fold
    them into one number: a single memory round trip that leaves the operands in L2 for the
    dependent per-step loads of the scan (a sector is the unit L2 fetches from memory)."""
    n = tl.maximum(nodes, 0).to(tl.int64)
    SECTOR: tl.constexpr = 256 // q_ptr.dtype.element_ty.primitive_bitwidth  # elements per 32 bytes
    offs_s = tl.arange(0, K // SECTOR) * SECTOR
    rows = (n[:, None] * H + h) * K + offs_s[None, :]
    total = tl.sum(
        tl.sum(tl.load(q_ptr + rows, mask=valid[:, None], other=0.0).to(tl.float32), axis=1), axis=0
    )
    total += tl.sum(
        tl.sum(tl.load(k_ptr + rows, mask=valid[:, None], other=0.0).to(tl.float32), axis=1), axis=0
    )
    vv = tl.load(v_ptr + (n * HV + hv) * V + v0, mask=valid, other=0.0)
    total += tl.sum(vv.to(tl.float32), axis=0)
    total += tl.sum(tl.load(a_ptr + n * HV + hv, mask=valid, other=0.0).to(tl.float32), axis=0)
    total += tl.sum(tl.load(b_ptr + n * HV + hv, mask=valid, other=0.0).to(tl.float32), axis=0)
    return total


@triton.jit
def _load_prepared(
    rq_ptr, rk_ptr, rv_ptr, rg_ptr, rb_ptr, node, ok, with_q, h, hv, offs_v, offs_k, H: tl.constexpr,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
):  # fmt: skip
    """`node`'s prepared fp32 operands from the records (`prepare.py`): q, k [K], v slice [BV], g,
    beta; zeros unless ok, and q zeros unless with_q too (only a row whose output is read needs it)."""
    n = tl.maximum(node, 0).to(tl.int64)
    # (scalar conditions enter masks through tl.where: `tensor & scalar` is wrong in the interpreter)
    mk = tl.where(ok, offs_k < K, False)
    q = tl.load(rq_ptr + (n * H + h) * K + offs_k, mask=tl.where(with_q, mk, False), other=0.0)
    k = tl.load(rk_ptr + (n * H + h) * K + offs_k, mask=mk, other=0.0)
    v = tl.load(rv_ptr + (n * HV + hv) * V + offs_v, mask=tl.where(ok, offs_v < V, False), other=0.0)
    g = tl.load(rg_ptr + n * HV + hv, mask=ok, other=0.0)
    beta = tl.load(rb_ptr + n * HV + hv, mask=ok, other=0.0)
    return q, k, v, g, beta


@triton.jit
def _store_output(o_ptr, node, hv, offs_v, o, HV: tl.constexpr, V: tl.constexpr):
    """Write a node's output slice S q."""
    n = tl.maximum(node, 0).to(tl.int64)
    tl.store(o_ptr + (n * HV + hv) * V + offs_v, o.to(o_ptr.dtype.element_ty), mask=offs_v < V)


@triton.jit
def _advance(S, k, v, g, beta):
    """One recurrence update of a [BV, K] tile: decay, predict with the decayed state, rank-1 write."""
    S = S * tl.exp(g)
    u = (v - tl.sum(S * k[None, :], axis=1)) * beta
    return S + u[:, None] * k[None, :]


@triton.jit
def _read(S, q):
    """A tile's read S q [BV]."""
    return tl.sum(S * q[None, :], axis=1)


@triton.jit
def _step(S, q, k, v, g, beta):
    """One recurrence step of a [BV, K] tile (`_advance`); returns the new tile and its read S q."""
    S = _advance(S, k, v, g, beta)
    return S, _read(S, q)


@triton.jit
def _record(
    rq_ptr,
    rk_ptr,
    rv_ptr,
    rg_ptr,
    rb_ptr,
    o_ptr,
    node,
    own,
    h,
    hv,
    vt,
    offs_v,
    offs_k,
    q,
    k,
    v,
    g,
    beta,
    o,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    GROUP: tl.constexpr,
):
    """Write a node's output slice and (once per node) its recorded operands."""
    n = tl.maximum(node, 0).to(tl.int64)
    mv = tl.where(own, offs_v < V, False)
    tl.store(o_ptr + (n * HV + hv) * V + offs_v, o.to(o_ptr.dtype.element_ty), mask=mv)
    tl.store(rv_ptr + (n * HV + hv) * V + offs_v, v, mask=mv)
    first_tile = own & (vt == 0)
    tl.store(rg_ptr + n * HV + hv, g, mask=first_tile)
    tl.store(rb_ptr + n * HV + hv, beta, mask=first_tile)
    mk = tl.where(first_tile & (hv % GROUP == 0), offs_k < K, False)
    tl.store(rq_ptr + (n * H + h) * K + offs_k, q, mask=mk)
    tl.store(rk_ptr + (n * H + h) * K + offs_k, k, mask=mk)


@triton.jit
def gdn_scan_kernel(
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
    leaflo_ptr,
    leafhi_ptr,
    leaves_ptr,
    nactive_ptr,
    path_offset,
    R,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    L: tl.constexpr,
    STORE_LEAF_STATES: tl.constexpr,
    LP: tl.constexpr,
    RP: tl.constexpr,
    WARM: tl.constexpr,
):
    NVT: tl.constexpr = V // BV
    GROUP: tl.constexpr = HV // H
    ROW_QK: tl.constexpr = H * K  # the operands' row strides (contiguous)
    ROW_V: tl.constexpr = HV * V
    pid = tl.program_id(0)
    p = tl.program_id(1) + path_offset
    hv = pid // NVT
    vt = pid % NVT
    h = hv // GROUP
    offs_v = vt * BV + tl.arange(0, BV)
    offs_k = tl.arange(0, K)
    tile = hv * V * K + offs_v[:, None] * K + offs_k[None, :]
    slab: tl.constexpr = HV * V * K

    neg_a = -tl.exp(tl.load(alog_ptr + hv).to(tl.float32))
    dt_bias = tl.load(dtb_ptr + hv).to(tl.float32)
    n_steps = tl.load(steps_ptr + p)
    start = tl.load(start_ptr + p)
    # Start tile: the durable state or a cut state (two masked loads; the unused one moves no data).
    from_durable = (tl.zeros([BV, K], dtype=tl.int32) + start) < 0
    S = tl.load(state_ptr + tile, mask=from_durable, other=0.0) + tl.load(
        cut_ptr + tl.maximum(start, 0).to(tl.int64) * slab + tile, mask=~from_durable, other=0.0
    )

    # Path 0 zeroes the outputs of padding rows (they never advance anything).
    pad_lo = tl.where(p == 0, tl.load(nactive_ptr), R)
    for r in range(pad_lo, R):
        tl.store(o_ptr + (r * HV + hv) * V + offs_v, tl.zeros([BV], dtype=o_ptr.dtype.element_ty))

    # Optional warm-up: one round trip brings every operand this program reads (its path's nodes and
    # their leaf children, contiguous in `leaves`) into L2 before the first step. Measured 29% slower
    # on the H200 (results/h200/NOTES.md): the steps wait on table loads, not on operand loads.
    if WARM:
        offs_l = tl.arange(0, LP)
        on_path = offs_l < n_steps
        path_nodes = tl.load(nodes_ptr + p * L + offs_l, mask=on_path, other=-1)
        lo_vec = tl.load(leaflo_ptr + p * L + offs_l, mask=on_path, other=0)
        hi_vec = tl.load(leafhi_ptr + p * L + offs_l, mask=on_path, other=0)
        has_leaves = hi_vec > lo_vec
        first_leaf = tl.min(tl.where(has_leaves, lo_vec, R), axis=0)
        last_leaf = tl.max(tl.where(has_leaves, hi_vec, 0), axis=0)
        offs_r = tl.arange(0, RP)
        is_leaf = first_leaf + offs_r < last_leaf
        leaf_nodes = tl.load(leaves_ptr + tl.minimum(first_leaf + offs_r, R - 1), mask=is_leaf, other=-1)
        warm = _touch(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, path_nodes, on_path, h, hv, vt * BV, H, HV, K, V)
        warm += _touch(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, leaf_nodes, is_leaf, h, hv, vt * BV, H, HV, K, V)
        # Never stored (no path has a negative length); the store keeps the loads from being dropped.
        tl.store(o_ptr + hv * V, warm.to(o_ptr.dtype.element_ty), mask=n_steps < 0)

    node = tl.load(nodes_ptr + p * L)
    q, k, v, g, beta = _load_operands(
        q_ptr,
        k_ptr,
        v_ptr,
        a_ptr,
        b_ptr,
        node,
        n_steps > 0,
        h,
        hv,
        offs_v,
        offs_k,
        neg_a,
        dt_bias,
        H,
        HV,
        K,
        V,
    )
    for step in range(0, n_steps):
        # Issue the next node's loads now and do their arithmetic after this step: the loads are
        # independent of the tile, so their latency hides behind the step.
        has_next = step + 1 < n_steps
        nxt = tl.load(nodes_ptr + p * L + step + 1, mask=has_next, other=-1)
        rq2, rk2, rv2, ra2, rb2 = _issue_loads(
            q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, nxt, has_next, h, hv, offs_v, offs_k, ROW_QK, ROW_V, HV, K, V
        )
        own = tl.load(owner_ptr + p * L + step) != 0
        # Likewise the first two leaf children of this node (the paper tree has at most two).
        lo = tl.load(leaflo_ptr + p * L + step)
        hi = tl.load(leafhi_ptr + p * L + step)
        leaf0 = tl.load(leaves_ptr + lo, mask=lo < hi, other=-1)
        leaf1 = tl.load(leaves_ptr + lo + 1, mask=lo + 1 < hi, other=-1)
        pq0, pk0, pv0, pa0, pb0 = _issue_loads(
            q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, leaf0, lo < hi, h, hv, offs_v, offs_k, ROW_QK, ROW_V, HV, K, V
        )
        pq1, pk1, pv1, pa1, pb1 = _issue_loads(
            q_ptr,
            k_ptr,
            v_ptr,
            a_ptr,
            b_ptr,
            leaf1,
            lo + 1 < hi,
            h,
            hv,
            offs_v,
            offs_k,
            ROW_QK,
            ROW_V,
            HV,
            K,
            V,
        )

        S, o = _step(S, q, k, v, g, beta)
        _record(
            rq_ptr,
            rk_ptr,
            rv_ptr,
            rg_ptr,
            rb_ptr,
            o_ptr,
            node,
            own,
            h,
            hv,
            vt,
            offs_v,
            offs_k,
            q,
            k,
            v,
            g,
            beta,
            o,
            H,
            HV,
            K,
            V,
            GROUP,
        )
        slot = tl.load(cutslot_ptr + node)
        cut_mask = (tl.zeros([BV, K], dtype=tl.int32) + tl.where(own, slot, -1)) >= 0
        tl.store(cut_ptr + tl.maximum(slot, 0).to(tl.int64) * slab + tile, S, mask=cut_mask)

        for li in range(lo, hi):
            j = li - lo
            leaf = tl.load(leaves_ptr + li)
            # Leaves past the second load here (their load is masked off otherwise).
            fq, fk, fv, fa, fb = _issue_loads(
                q_ptr,
                k_ptr,
                v_ptr,
                a_ptr,
                b_ptr,
                leaf,
                j >= 2,
                h,
                hv,
                offs_v,
                offs_k,
                ROW_QK,
                ROW_V,
                HV,
                K,
                V,
            )
            lq, lk, lv, lg, lbeta = _prepare(
                tl.where(j == 0, pq0, tl.where(j == 1, pq1, fq)),
                tl.where(j == 0, pk0, tl.where(j == 1, pk1, fk)),
                tl.where(j == 0, pv0, tl.where(j == 1, pv1, fv)),
                tl.where(j == 0, pa0, tl.where(j == 1, pa1, fa)),
                tl.where(j == 0, pb0, tl.where(j == 1, pb1, fb)),
                neg_a,
                dt_bias,
                K,
            )
            SL, lo_out = _step(S, lq, lk, lv, lg, lbeta)
            _record(
                rq_ptr,
                rk_ptr,
                rv_ptr,
                rg_ptr,
                rb_ptr,
                o_ptr,
                leaf,
                leaf >= 0,
                h,
                hv,
                vt,
                offs_v,
                offs_k,
                lq,
                lk,
                lv,
                lg,
                lbeta,
                lo_out,
                H,
                HV,
                K,
                V,
                GROUP,
            )
            if STORE_LEAF_STATES:
                lslot = tl.load(cutslot_ptr + tl.maximum(leaf, 0))
                lmask = (tl.zeros([BV, K], dtype=tl.int32) + lslot) >= 0
                tl.store(cut_ptr + tl.maximum(lslot, 0).to(tl.int64) * slab + tile, SL, mask=lmask)

        q2, k2, v2, g2, beta2 = _prepare(rq2, rk2, rv2, ra2, rb2, neg_a, dt_bias, K)
        node, q, k, v, g, beta = nxt, q2, k2, v2, g2, beta2


DEFAULT_NUM_WARPS = 2  # with 8-row value tiles: the fastest measured configuration (results/h200)


def gdn_scan_(
    x: GdnInputs,
    state: Tensor,
    tables: ScanTables,
    o: Tensor,
    ops: GdnOperands,
    cut_bank: Tensor,
    block_v: int | None = None,
    num_warps: int = DEFAULT_NUM_WARPS,
    warm: bool = False,
) -> None:
    """Path scan of one layer into caller-owned buffers (no allocation, no host sync).

    x: one layer's inputs, all contiguous; state [HV, V, K] fp32 durable, read only; o [R, HV, V]
    (v's dtype); ops: record buffers (fp32, shapes of GdnOperands); cut_bank [>= tables.cut_rows,
    HV, V, K] fp32 scratch (the "cut" and "store_all" schedules write it; for store_all, slot =
    node). Schedules "cut"/"store_all" take two launches (spine, then branch paths); "recompute"
    takes one. warm: first load every operand of the program's path in one round trip (measured
    slower on the H200: off by default).
    """
    rows, heads, dk = x.q.shape
    hv, dv = x.v.shape[1], x.v.shape[2]
    check_power_of_two("K", dk)
    bv = default_block_v(dv) if block_v is None else block_v
    check_power_of_two("block_v", bv)
    if dv % bv:
        raise ValueError(f"V={dv} must be a multiple of block_v={bv}")
    args = (
        *x.tensors(),
        state,
        cut_bank,
        o,
        ops.q,
        ops.k,
        ops.v,
        ops.g,
        ops.beta,
        tables.nodes,
        tables.steps,
        tables.start,
        tables.owner,
        tables.cut_slot,
        tables.leaf_lo,
        tables.leaf_hi,
        tables.leaves,
        tables.n_active,
    )
    meta = dict(
        H=heads,
        HV=hv,
        K=dk,
        V=dv,
        BV=bv,
        L=tables.max_steps,
        STORE_LEAF_STATES=tables.schedule == "store_all",
        LP=triton.next_power_of_2(tables.max_steps),
        RP=triton.next_power_of_2(rows),
        WARM=warm,
        num_warps=num_warps,
    )
    programs = hv * (dv // bv)
    if tables.schedule == "recompute":
        gdn_scan_kernel[(programs, tables.paths)](*args, 0, rows, **meta)
        return
    gdn_scan_kernel[(programs, 1)](*args, 0, rows, **meta)
    if tables.paths > 1:
        gdn_scan_kernel[(programs, tables.paths - 1)](*args, 1, rows, **meta)


def gdn_verify(x: GdnInputs, state: Tensor, tree: TreeDescriptor, schedule: str = "cut") -> GdnVerifyResult:
    """The Triton path scan with the reference's signature and result (fp32 compute only).

    Records cover the active rows; padding rows' outputs are zero and their records unwritten.
    cut_states: [C] cut states ("cut"), none ("recompute"), or every node's state by node index
    ("store_all"; padding rows unwritten).
    """
    check_verify_inputs(x, state, tree)
    rows, heads, dk = x.q.shape
    hv, dv = x.v.shape[1], x.v.shape[2]
    tables = scan_tables(tree, x.q.device, schedule)
    ops = empty_operands(rows, heads, hv, dk, dv, x.q.device)
    o = torch.empty_like(x.v)
    n_cuts = {"cut": len(tree.paths.cut_nodes), "recompute": 0, "store_all": rows}[schedule]
    bank = torch.empty((max(n_cuts, 1), hv, dv, dk), dtype=torch.float32, device=x.q.device)
    gdn_scan_(x.map(Tensor.contiguous), state.contiguous(), tables, o, ops, bank)
    return GdnVerifyResult(o=o, operands=ops, cut_states=bank[:n_cuts])
