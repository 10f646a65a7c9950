"""Gated DeltaNet tree verification in Triton with the autoregressive step's bits, each node's state
computed once along the spine: the spine scan.

The row scan (`row_scan.py`) carries a copy of the committed state tile down every row's ancestry,
so a shared ancestor is recomputed once per row below it (at 27B, 32 rows x up to 12 steps of a
[BV, K] tile per value tile and head: most of a tree cycle's GDN time). Here two launches share that
work with the same arithmetic:

1. the spine launch, one program per (value tile, value head), walks the spine (the tree's first
   path, `DeviceTree.spine_nodes`) from the committed state, one step per node, writing each spine
   row's output and records as the row scan would and the tile after each step into `cut` [depth];
2. the branch launch, one program per (value tile, value head, row), starts every row off the
   spine from the cut state of its deepest spine ancestor and carries it down the rest of its
   ancestry; spine rows and padding rows are left to the spine launch and to zero outputs.

A row's steps are the row scan's steps in the row scan's order (its spine ancestors, root first,
then the others); a cut state is the fp32 tile itself, so a row gets the row scan's bits, which are
the one-row step's bits (the replay's arithmetic, tile height and warps). Loads of the next node
are issued before each step, as in the row scan.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from lumotree.verify.gdn.common import default_block_v
from lumotree.verify.gdn.plan import AncestryTables
from lumotree.verify.gdn.reference import GdnInputs, GdnOperands
from lumotree.verify.gdn.replay import DEFAULT_REPLAY_WARPS
from lumotree.verify.gdn.row_scan import carry_down, row_strided
from lumotree.verify.gdn.scan import _issue_loads, _prepare, _record, _step


@triton.jit
def gdn_spine_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    a_ptr,
    b_ptr,
    alog_ptr,
    dtb_ptr,
    state_ptr,
    spine_ptr,
    nactive_ptr,
    cut_ptr,
    o_ptr,
    rq_ptr,
    rk_ptr,
    rv_ptr,
    rg_ptr,
    rb_ptr,
    stride_qk,
    stride_v,
    stride_ab,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    DEPTHS: tl.constexpr,
    DP: tl.constexpr,
):
    NVT: tl.constexpr = V // BV
    GROUP: tl.constexpr = HV // H
    pid = tl.program_id(0)
    hv = pid // NVT
    vt = pid % NVT
    h = hv // GROUP
    offs_v = vt * BV + tl.arange(0, BV)
    offs_k = tl.arange(0, K)
    offs_d = tl.arange(0, DP)
    neg_a = -tl.exp(tl.load(alog_ptr + hv).to(tl.float32))
    dt_bias = tl.load(dtb_ptr + hv).to(tl.float32)
    spine = tl.load(spine_ptr + offs_d, mask=offs_d < DEPTHS, other=-1)
    spine = tl.where(spine < tl.load(nactive_ptr), spine, -1)
    steps = tl.sum((spine >= 0).to(tl.int32), axis=0)
    tile = offs_v[:, None] * K + offs_k[None, :]
    S = tl.load(state_ptr + hv * V * K + tile)
    node = tl.sum(tl.where(offs_d == 0, spine, 0), axis=0)
    rq, rk, rv, ra, rb = _issue_loads(
        q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, node, True, h, hv, offs_v, offs_k, stride_qk, stride_v, stride_ab,
        K, V,
    )  # fmt: skip
    for d in range(steps):
        nxt = tl.sum(tl.where(offs_d == d + 1, spine, 0), axis=0)
        q, k, v, g, beta = _prepare(rq, rk, rv, ra, rb, neg_a, dt_bias, K)
        rq, rk, rv, ra, rb = _issue_loads(
            q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, nxt, d + 1 < steps, h, hv, offs_v, offs_k, stride_qk,
            stride_v, stride_ab, K, V,
        )  # fmt: skip
        S, o = _step(S, q, k, v, g, beta)
        _record(
            rq_ptr, rk_ptr, rv_ptr, rg_ptr, rb_ptr, o_ptr, node, True, h, hv, vt, offs_v, offs_k,
            q, k, v, g, beta, o, H, HV, K, V, GROUP,
        )  # fmt: skip
        tl.store(cut_ptr + (hv + d * HV).to(tl.int64) * V * K + tile, S)
        node = nxt


@triton.jit
def gdn_branch_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    a_ptr,
    b_ptr,
    alog_ptr,
    dtb_ptr,
    anc_ptr,
    spine_ptr,
    nactive_ptr,
    cut_ptr,
    o_ptr,
    rq_ptr,
    rk_ptr,
    rv_ptr,
    rg_ptr,
    rb_ptr,
    R,
    stride_qk,
    stride_v,
    stride_ab,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    RP: tl.constexpr,
    DEPTHS: tl.constexpr,
    DP: tl.constexpr,
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
    offs_d = tl.arange(0, DP)
    n_active = tl.load(nactive_ptr)
    spine = tl.load(spine_ptr + offs_d, mask=offs_d < DEPTHS, other=-1)
    spine = tl.where(spine < n_active, spine, -1)
    if row >= n_active:
        n = row.to(tl.int64)
        tl.store(o_ptr + (n * HV + hv) * V + offs_v, tl.zeros([BV], dtype=o_ptr.dtype.element_ty))
    elif tl.max((spine == row).to(tl.int32), axis=0) == 0:  # spine rows: the spine launch's
        neg_a = -tl.exp(tl.load(alog_ptr + hv).to(tl.float32))
        dt_bias = tl.load(dtb_ptr + hv).to(tl.float32)
        # the deepest spine ancestor (the root at least) and its cut state
        spine_anc = tl.load(anc_ptr + row * R + spine, mask=spine >= 0, other=0) != 0
        base = tl.max(tl.where(spine_anc, offs_d, 0), axis=0)
        base_node = tl.sum(tl.where(offs_d == base, spine, 0), axis=0)
        tile = offs_v[:, None] * K + offs_k[None, :]
        S = tl.load(cut_ptr + (hv + base * HV).to(tl.int64) * V * K + tile)
        # the rest of the ancestry (itself included), root side first, as the row scan walks it
        offs_r = tl.arange(0, RP)
        rest = (offs_r <= row) & (offs_r > base_node)
        on_path = tl.load(anc_ptr + row * R + offs_r, mask=rest, other=0) != 0
        o, q, k, v, g, beta = carry_down(
            q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, stride_qk, stride_v, stride_ab, S, on_path, offs_r, h, hv,
            offs_v, offs_k, neg_a, dt_bias, K, V, BV, RP,
        )  # fmt: skip
        _record(
            rq_ptr, rk_ptr, rv_ptr, rg_ptr, rb_ptr, o_ptr, row, True, h, hv, vt, offs_v, offs_k,
            q, k, v, g, beta, o, H, HV, K, V, GROUP,
        )  # fmt: skip


def cut_buffer(max_depth: int, hv: int, dv: int, dk: int, device: torch.device) -> Tensor:
    """Scratch for the spine's states [max_depth + 1, HV, V, K] fp32 (any layer's: the branch launch
    of a layer reads it before the next layer's spine launch writes it)."""
    return torch.empty((max_depth + 1, hv, dv, dk), dtype=torch.float32, device=device)


def gdn_spine_rows_(
    x: GdnInputs,
    state: Tensor,
    tables: AncestryTables,
    spine_nodes: Tensor,
    cut: Tensor,
    o: Tensor,
    ops: GdnOperands,
) -> None:
    """One layer: x's q, k [R, H, K], v [R, HV, V], a, b [R, HV] (rows may be strided:
    `row_scan.row_strided`), state [HV, V, K] fp32 (read only), ancestry tables of R rows and
    spine_nodes [D + 1] int64 (-1 past the spine) on the device, cut from `cut_buffer`; writes
    o [R, HV, V] and the records (as `row_scan.gdn_rows_`)."""
    rows, heads, dk = x.q.shape
    hv, dv = x.v.shape[1], x.v.shape[2]
    depths = spine_nodes.shape[0]
    if cut.shape[0] < depths or tuple(cut.shape[1:]) != (hv, dv, dk) or cut.dtype != torch.float32:
        raise ValueError(
            f"cut must be fp32 [>= {depths}, {hv}, {dv}, {dk}], got {tuple(cut.shape)} {cut.dtype}"
        )
    bv = default_block_v(dv, state.device)
    common = dict(H=heads, HV=hv, K=dk, V=dv, BV=bv, DEPTHS=depths, DP=triton.next_power_of_2(depths))
    records = (o, ops.q, ops.k, ops.v, ops.g, ops.beta)
    programs = hv * (dv // bv)
    x, strides = row_strided(x)
    gdn_spine_kernel[(programs,)](
        *x.tensors(), state, spine_nodes, tables.n_active, cut, *records, *strides, **common,
        num_warps=DEFAULT_REPLAY_WARPS,
    )  # fmt: skip
    gdn_branch_kernel[(programs, rows)](
        *x.tensors(), tables.ancestry, spine_nodes, tables.n_active, cut, *records, rows, *strides,
        RP=triton.next_power_of_2(rows), **common, num_warps=DEFAULT_REPLAY_WARPS,
    )  # fmt: skip
