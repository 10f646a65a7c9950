"""What the Triton GDN kernels of this folder share: in-kernel helpers and the host-side checks,
buffers and one-layer adapters around them.

In-kernel (`@triton.jit`): `softplus` (torch's, with its threshold of 20), `instance_slices` (move
every operand pointer to one GDN instance of a stacked launch), `record_rows` (store prepared
operands for replay), `ancestry_masks` (the tree-parallel forms' masks from the ancestry table).
Host side: the input checks of the reference-signature wrappers (`check_verify_inputs`) and of the
stacked forms (`check_stacked`), fp32 record buffers (`empty_operands`) and their checks
(`check_records`), and the adapters that run a stacked tree kernel on one layer (`one_instance_`,
`verify_one_layer`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl
from torch import Tensor

from lumotree.tree import TreeDescriptor
from lumotree.verify.gdn.plan import AncestryTables, ancestry_tables
from lumotree.verify.gdn.reference import GdnInputs, GdnOperands, GdnVerifyResult, record_shapes

PRECISIONS = ("ieee", "tf32x3")  # fp32 matmuls: CUDA cores, or tensor cores with three-pass emulation


@triton.jit
def softplus(x):
    # log1p(exp(x)) with the log1p correction (u = 1 + e; log(u) * e / (u - 1)), as accurate as
    # torch's log1p; identity above torch's threshold of 20.
    e = tl.exp(x)
    u = 1.0 + e
    d = u - 1.0
    lp = tl.where(d == 0.0, e, tl.log(u) * (e / tl.where(d == 0.0, 1.0, d)))
    return tl.where(x > 20.0, x, lp)


@triton.jit
def instance_slices(
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
def record_rows(
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
def ancestry_masks(anc_ptr, nactive_ptr, R, RP: tl.constexpr):
    """rows [RP]; in_range, valid (active) [RP]; anc (ancestor-or-self of an active row) and
    strict (proper ancestor) [RP, RP], from the tables' ancestry matrix."""
    rows = tl.arange(0, RP)
    in_range = rows < R
    valid = rows < tl.load(nactive_ptr)
    in_square = in_range[:, None] & in_range[None, :]
    anc = tl.load(anc_ptr + rows[:, None] * R + rows[None, :], mask=in_square, other=0)
    anc = (anc != 0) & valid[:, None]
    return rows, in_range, valid, anc, anc & (rows[:, None] != rows[None, :])


# The step-loop kernels' value-tile height on a GPU (default_block_v): 8 rows, the fastest measured
# (results/h200/gdn-forms-block-v.md: 4 and 2 rows ran the 27B paper tree's scans 1.2-2x slower).
# `lumobench bench gdn-forms --block-v` sets it to time other heights.
DEVICE_BLOCK_V = 8


def default_block_v(dv: int, device: torch.device | None = None) -> int:
    """Value-tile height of the step-loop kernels (path scan, replay, row scan): DEVICE_BLOCK_V
    rows on a GPU (an [8, K<=128] fp32 tile a warp); on a CPU (the
    interpreter) the whole value dim, so that far fewer programs run. The row scan and the replay
    take the same height on a device, so they sum in the same order."""
    if device is not None and device.type == "cpu":
        return triton.next_power_of_2(dv)
    return min(DEVICE_BLOCK_V, triton.next_power_of_2(dv))


def check_power_of_two(name: str, n: int) -> None:
    if n & (n - 1) or n <= 0:
        raise ValueError(f"{name} must be a power of two for the Triton kernel, got {n}")


def empty_operands(
    rows: int, heads: int, v_heads: int, dk: int, dv: int, device: torch.device
) -> GdnOperands:
    """Uninitialised fp32 record buffers of one layer."""
    shapes = record_shapes(rows, heads, v_heads, dk, dv)
    return GdnOperands(**{f: torch.empty(s, dtype=torch.float32, device=device) for f, s in shapes.items()})


def check_records(ops: GdnOperands, rows: int, heads: int, v_heads: int, dk: int, dv: int) -> None:
    """ValueError unless `ops` are contiguous fp32 records of one layer of these shapes."""
    for name, shape in record_shapes(rows, heads, v_heads, dk, dv).items():
        t = getattr(ops, name)
        _check_layout(f"records {name}", t, shape)
        if t.dtype != torch.float32:
            raise ValueError(f"records {name} must be float32, got {t.dtype}")


def check_verify_inputs(x: GdnInputs, state: Tensor, tree: TreeDescriptor) -> None:
    """The reference's shape rules, plus what the Triton kernels need: fp32 compute (no float64),
    one operand row per tree row, an fp32 state [HV, V, K]."""
    x.check()
    if x.v.dtype == torch.float64:
        raise TypeError("the Triton kernels compute in fp32; use reference.gdn_verify for float64")
    rows, _, dk = x.q.shape
    hv, dv = x.v.shape[1], x.v.shape[2]
    if rows != tree.rows:
        raise ValueError(f"operands have {rows} rows, the tree has {tree.rows}")
    if state.shape != (hv, dv, dk) or state.dtype != torch.float32:
        raise ValueError(
            f"state must be [HV, V, K] = [{hv}, {dv}, {dk}] float32, got {tuple(state.shape)} {state.dtype}"
        )


def _check_layout(name: str, t: Tensor, shape: tuple[int, ...]) -> None:
    if tuple(t.shape) != shape or not t.is_contiguous():
        raise ValueError(
            f"{name} must be contiguous {list(shape)}, got {list(t.shape)} (contiguous: {t.is_contiguous()})"
        )


def check_stacked(x: GdnInputs, state: Tensor, o: Tensor, ops: GdnOperands, block_v: int) -> None:
    """Shapes and layouts of a stack of N instances (see `tree_scan.gdn_tree_layers_`), as the
    kernels index them: contiguous, power-of-two K and value tile, V a multiple of the tile."""
    n, rows, heads, dk = x.q.shape
    hv, dv = x.v.shape[2], x.v.shape[3]
    check_power_of_two("K", dk)
    check_power_of_two("block_v", block_v)
    if dv % block_v:
        raise ValueError(f"V={dv} must be a multiple of block_v={block_v}")
    for name, t, shape in (
        ("q", x.q, (n, rows, heads, dk)),
        ("k", x.k, (n, rows, heads, dk)),
        ("v", x.v, (n, rows, hv, dv)),
        ("a", x.a, (n, rows, hv)),
        ("b", x.b, (n, rows, hv)),
        ("A_log", x.A_log, (n, hv)),
        ("dt_bias", x.dt_bias, (n, hv)),
        ("state", state, (n, hv, dv, dk)),
        ("o", o, (n, rows, hv, dv)),
        ("records q", ops.q, (n, rows, heads, dk)),
        ("records k", ops.k, (n, rows, heads, dk)),
        ("records v", ops.v, (n, rows, hv, dv)),
        ("records g", ops.g, (n, rows, hv)),
        ("records beta", ops.beta, (n, rows, hv)),
    ):
        _check_layout(name, t, shape)


def one_instance_(
    layers_fn: Callable[..., None],
    x: GdnInputs,
    state: Tensor,
    tables: AncestryTables,
    o: Tensor,
    ops: GdnOperands,
    **config: object,
) -> None:
    """Run a stacked tree kernel (`*_layers_`) on one layer: every tensor gets the instance dim."""
    layers_fn(x.map(_one), state[None], tables, o[None], ops.map(_one), **config)


def _one(t: Tensor) -> Tensor:
    return t[None]


def verify_one_layer(
    layers_fn: Callable[..., None],
    block_v_cap: int,
    x: GdnInputs,
    state: Tensor,
    tree: TreeDescriptor,
    block_v: int | None = None,
    **config: object,
) -> GdnVerifyResult:
    """A stacked tree kernel with the reference's signature: allocates outputs and records, fp32
    compute, no cut states; block_v defaults to min(block_v_cap, V)."""
    check_verify_inputs(x, state, tree)
    rows, heads, dk = x.q.shape
    hv, dv = x.v.shape[1], x.v.shape[2]
    bv = min(block_v_cap, dv) if block_v is None else block_v
    ops = empty_operands(rows, heads, hv, dk, dv, x.q.device)
    o = torch.empty_like(x.v)
    tables = ancestry_tables(tree, x.q.device)
    one_instance_(
        layers_fn, x.map(Tensor.contiguous), state.contiguous(), tables, o, ops, block_v=bv, **config
    )
    return GdnVerifyResult(o=o, operands=ops, cut_states=state.new_empty((0, hv, dv, dk)))
