"""Gated DeltaNet tree verification in Triton with the autoregressive step's bits, one launch and no
saved states: the paths scan.

The row scan (`row_scan.py`) carries a copy of the committed state tile down every row's ancestry,
so a shared ancestor is recomputed once per row below it. Here the tree falls into walks
(`plan.first_child_paths`): every non-leaf node continues into its lowest-index child, so the tree
falls into paths, each ending at a leaf that is the root or a first child; the other leaves (the
paper tree's runner-up siblings) are evaluated, a parent's group at a time, by a walk that passes
the parent (`leaf_walk`), which may be a walk of their own to the parent, owning none of its nodes.
For the paper tree that is the spine, one path per rescue branch and one or two walks for the
siblings; MTP-5's chain and the AR step are one path.

One program per (value tile, value head, walk) loads the committed state tile [BV, K] and carries it
down its end's ancestry, root first, one update per node, with the replay's arithmetic, from the
prepared operands (`prepare.py`: each node's normalisations and gates done once, not in every walk
and value tile). The nodes above the walk's start belong to other walks: the program updates the
tile through them without reading it (nor loading q); at its own nodes it reads the output. At a
node whose leaf group is the walk's, it then steps the node's tile once per leaf child, reading each
without keeping its state. Every row's output is thus the last read of the same steps in the same
order as the row scan's (so the one-row step's bits) with no state written to memory (the spine scan
this replaced saved every spine node's state for a second launch to reload, and evaluating the
siblings in the spine's own program put 22 steps in series: results/h200/gdn-forms.md).

The next node's loads are issued before each update, and a leaf group's first leaf's before its
parent's. Padding rows (past the active count) get zero outputs. A launch runs
`tables.paths` programs per value tile; a tree with more walks is verified all the same, program p
taking walks p, p + paths, ...
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
from lumotree.verify.gdn.row_scan import row_strided
from lumotree.verify.gdn.scan import _advance, _load_prepared, _read, _step, _store_output


@triton.jit
def _leaf_children(
    rq_ptr, rk_ptr, rv_ptr, rg_ptr, rb_ptr, o_ptr, S, leaf_parent, node, leaf, q, k, v, g, beta, offs_r,
    h, hv, offs_v, offs_k, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    RP: tl.constexpr,
):  # fmt: skip
    """Evaluate `node`'s leaf children from its tile S, the first (`leaf`, its operands q..beta
    already issued) onwards in index order: one step each, output written."""
    while leaf < RP:
        following = tl.min(tl.where((leaf_parent == node) & (offs_r > leaf), offs_r, RP), axis=0)
        nq, nk, nv, ng, nbeta = _load_prepared(
            rq_ptr, rk_ptr, rv_ptr, rg_ptr, rb_ptr, following, following < RP, True, h, hv, offs_v,
            offs_k, H, HV, K, V,
        )  # fmt: skip
        _, o = _step(S, q, k, v, g, beta)
        _store_output(o_ptr, leaf, hv, offs_v, o, HV, V)
        q, k, v, g, beta = nq, nk, nv, ng, nbeta
        leaf = following


@triton.jit
def gdn_paths_kernel(
    rq_ptr,
    rk_ptr,
    rv_ptr,
    rg_ptr,
    rb_ptr,
    state_ptr,
    anc_ptr,
    nactive_ptr,
    end_ptr,
    start_ptr,
    leaf_parent_ptr,
    leaf_walk_ptr,
    o_ptr,
    R,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    RP: tl.constexpr,
    PATHS: tl.constexpr,
):
    NVT: tl.constexpr = V // BV
    GROUP: tl.constexpr = HV // H
    pid = tl.program_id(0)
    first_path = tl.program_id(1)
    hv = pid // NVT
    vt = pid % NVT
    h = hv // GROUP
    offs_v = vt * BV + tl.arange(0, BV)
    offs_k = tl.arange(0, K)
    offs_r = tl.arange(0, RP)
    n_active = tl.load(nactive_ptr)
    if first_path == 0:  # padding rows: zero outputs
        for row in range(n_active, R):  # (a tree's outputs are far below 2**31 elements)
            _store_output(o_ptr, row, hv, offs_v, tl.zeros([BV], dtype=tl.float32), HV, V)
    ends = tl.load(end_ptr + offs_r, mask=offs_r < R, other=-1)
    leaf_parent = tl.load(leaf_parent_ptr + offs_r, mask=offs_r < R, other=-1)
    leaf_walk = tl.load(leaf_walk_ptr + offs_r, mask=offs_r < R, other=-1)
    n_paths = tl.sum((ends >= 0).to(tl.int32), axis=0)
    tile = offs_v[:, None] * K + offs_k[None, :]
    for p in range(first_path, n_paths, PATHS):
        end = tl.sum(tl.where(offs_r == p, ends, 0), axis=0)
        start = tl.load(start_ptr + p)  # R: a walk to a parent for leaf children only
        on_path = tl.load(anc_ptr + end * R + offs_r, mask=offs_r <= end, other=0) != 0
        S = tl.load(state_ptr + hv * V * K + tile)
        node = tl.min(tl.where(on_path, offs_r, RP), axis=0)
        q, k, v, g, beta = _load_prepared(
            rq_ptr, rk_ptr, rv_ptr, rg_ptr, rb_ptr, node, True, node >= start, h, hv, offs_v, offs_k, H,
            HV, K, V,
        )  # fmt: skip
        for _ in range(tl.sum(on_path.to(tl.int32), axis=0)):
            following = tl.min(tl.where(on_path & (offs_r > node), offs_r, RP), axis=0)
            leaf = tl.min(tl.where(leaf_parent == node, offs_r, RP), axis=0)
            mine = tl.sum(tl.where(offs_r == node, leaf_walk, 0), axis=0) == p
            leaf = tl.where(mine, leaf, RP)
            lq, lk, lv, lg, lbeta = _load_prepared(
                rq_ptr, rk_ptr, rv_ptr, rg_ptr, rb_ptr, leaf, leaf < RP, True, h, hv, offs_v, offs_k, H,
                HV, K, V,
            )  # fmt: skip
            nq, nk, nv, ng, nbeta = _load_prepared(
                rq_ptr, rk_ptr, rv_ptr, rg_ptr, rb_ptr, following, following < RP, following >= start,
                h, hv, offs_v, offs_k, H, HV, K, V,
            )  # fmt: skip
            S = _advance(S, k, v, g, beta)
            if node >= start:
                _store_output(o_ptr, node, hv, offs_v, _read(S, q), HV, V)
            _leaf_children(
                rq_ptr, rk_ptr, rv_ptr, rg_ptr, rb_ptr, o_ptr, S, leaf_parent, node, leaf, lq, lk, lv, lg,
                lbeta, offs_r, h, hv, offs_v, offs_k, H, HV, K, V, RP,
            )  # fmt: skip
            q, k, v, g, beta = nq, nk, nv, ng, nbeta
            node = following


def gdn_paths_prepared_(
    ops: GdnOperands, state: Tensor, tables: AncestryTables, o: Tensor, max_registers: int | None = None
) -> None:
    """One layer from prepared records: ops q, k [R, H, K], v [R, HV, V], g, beta [R, HV]
    (contiguous fp32), state [HV, V, K] fp32 (read only), the tables of R rows on the device; writes
    o [R, HV, V]. max_registers caps the kernel's registers a thread (more programs resident; None:
    the compiler's choice); the arithmetic is the same whatever the cap."""
    rows, heads, dk = ops.q.shape
    hv, dv = ops.v.shape[1], ops.v.shape[2]
    bv = default_block_v(dv, state.device)
    gdn_paths_kernel[(hv * (dv // bv), tables.paths)](
        ops.q, ops.k, ops.v, ops.g, ops.beta, state, tables.ancestry, tables.n_active, tables.path_end,
        tables.path_start, tables.leaf_parent, tables.leaf_walk, o, rows, H=heads, HV=hv, K=dk, V=dv, BV=bv,
        RP=triton.next_power_of_2(rows), PATHS=tables.paths, num_warps=DEFAULT_REPLAY_WARPS,
        maxnreg=max_registers,
    )  # fmt: skip


def gdn_paths_(
    x: GdnInputs,
    state: Tensor,
    tables: AncestryTables,
    o: Tensor,
    ops: GdnOperands,
    max_registers: int | None = None,
) -> None:
    """One layer from raw inputs: x's q, k [R, H, K], v [R, HV, V], a, b [R, HV] (rows may be
    strided, as column slices of a wider output: `row_scan.row_strided`) prepared into the records
    `ops`, then `gdn_paths_prepared_`."""
    prepare_operands_(row_strided(x)[0], ops)
    gdn_paths_prepared_(ops, state, tables, o, max_registers)
