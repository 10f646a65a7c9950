"""Tree causal conv1d and conv-state publication in Triton, beside `reference.py`.

One program per (tree row, channel block) gathers the row's window along its ancestry from the
static `conv_gather` indices (taps above the root read the committed conv state [C, W-1]) and
applies the taps in the reference's order with its cast points: acc = bias; acc += w[:, t] * x_t
for t = 0..W-1; y = silu(acc). Multiply-add contraction is switched off so each tap rounds as the
reference's separate multiply and add do. `conv_operands_` is a GDN layer's conv with the scans'
operands prepared in its epilogue (`gdn/prepare.py`) instead of its output stored. Publication
writes the last W-1 pre-conv inputs along the accepted path into the conv state in place, reading
the path on the device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from lumotree.tree import TreeDescriptor
from lumotree.verify.conv.reference import check_conv_shapes
from lumotree.verify.gdn.common import check_records
from lumotree.verify.gdn.prepare import (
    PREPARE_WARPS,
    channel_block,
    prepared_channels,
    store_gates,
    store_operands,
)
from lumotree.verify.gdn.reference import GateInputs, GdnOperands

BLOCK_C = 256


def dense_columns(x: Tensor) -> Tensor:
    """x [R, C] as is when its columns are contiguous (a column slice of a wider output), else a copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


@triton.jit
def tree_conv_kernel(
    x_ptr,
    state_ptr,
    w_ptr,
    bias_ptr,
    gather_ptr,
    y_ptr,
    C,
    stride_x,
    W: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BC: tl.constexpr,
):
    r = tl.program_id(0)
    offs_c = tl.program_id(1) * BC + tl.arange(0, BC)
    y = tree_conv_row(
        x_ptr, state_ptr, w_ptr, bias_ptr, gather_ptr, y_ptr, r, offs_c, C, stride_x, W, HAS_BIAS, False
    )
    tl.store(y_ptr + r * C + offs_c, y.to(y_ptr.dtype.element_ty), mask=offs_c < C)


@triton.jit
def tree_conv_row(
    x_ptr, state_ptr, w_ptr, bias_ptr, gather_ptr, record_ptr, r, offs_c, C, stride_x, W: tl.constexpr,
    HAS_BIAS: tl.constexpr, RECORD: tl.constexpr,
):  # fmt: skip
    """Row r's conv outputs of channels offs_c (any shape) in fp32 (SiLU applied; not yet cast to
    x's dtype), its inputs copied to the record if RECORD (after the taps' loads: in the sm_90 code a
    store ahead of them held every load back until the copy's own load had landed)."""
    mc = offs_c < C
    if HAS_BIAS:
        acc = tl.load(bias_ptr + offs_c, mask=mc, other=0.0).to(tl.float32)
    else:
        acc = tl.zeros(offs_c.shape, dtype=tl.float32)
    for t in tl.static_range(W):
        idx = tl.load(gather_ptr + r * W + t)
        in_state = (tl.zeros(offs_c.shape, dtype=tl.int32) + idx) < W - 1
        row = tl.maximum(idx - (W - 1), 0).to(tl.int64)
        xs = tl.load(state_ptr + offs_c * (W - 1) + tl.minimum(idx, W - 2), mask=mc & in_state, other=0.0)
        xt = tl.load(x_ptr + row * stride_x + offs_c, mask=mc & ~in_state, other=0.0)
        # Cast point: the window value is in x's dtype, then promoted to fp32 (as the reference).
        xv = tl.where(in_state, xs.to(x_ptr.dtype.element_ty), xt).to(tl.float32)
        wt = tl.load(w_ptr + offs_c * W + t, mask=mc, other=0.0).to(tl.float32)
        acc = acc + wt * xv
    if RECORD:  # the row's own input, kept for publication in a contiguous [R, C] record
        own = tl.load(x_ptr + r.to(tl.int64) * stride_x + offs_c, mask=mc)
        tl.store(record_ptr + r * C + offs_c, own, mask=mc)
    return acc * tl.sigmoid(acc)


@triton.jit
def conv_operands_kernel(
    x_ptr, state_ptr, w_ptr, gather_ptr, record_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, rq_ptr, rk_ptr,
    rv_ptr, rg_ptr, rb_ptr, C, stride_x, stride_ab, W: tl.constexpr, HK: tl.constexpr, K: tl.constexpr,
    HVV: tl.constexpr, HV: tl.constexpr, HVP: tl.constexpr, BC: tl.constexpr,
):  # fmt: skip
    """The tree conv of a GDN layer's [q | k | v] channels with the operands prepared in its
    epilogue: each output cast to x's dtype (the value the unfused conv stores), then as
    `prepare.prepare_kernel` prepares it; the inputs copied to the record."""
    r = tl.program_id(0)
    block = tl.program_id(1)
    if block * BC < C:
        offs_c = block * BC + tl.arange(0, BC)  # flat: `prepared_channels` says why
        y = tree_conv_row(
            x_ptr, state_ptr, w_ptr, w_ptr, gather_ptr, record_ptr, r, offs_c, C, stride_x, W, False, True
        )
        y = y.to(x_ptr.dtype.element_ty).to(tl.float32)
        ops = prepared_channels(y, offs_c, HK, K)
        store_operands(ops, offs_c, offs_c < C, r, rq_ptr, rk_ptr, rv_ptr, HK, HVV)
    else:  # the gates: a program of their own (no wait behind the conv's loads)
        store_gates(a_ptr, b_ptr, stride_ab, alog_ptr, dtb_ptr, rg_ptr, rb_ptr, r, HV, HVP)


@triton.jit
def publish_conv_kernel(
    state_ptr,
    x_ptr,
    accepted_ptr,
    len_ptr,
    C,
    stride_x,
    stride_xl,
    W: tl.constexpr,
    WP: tl.constexpr,
    BC: tl.constexpr,
):
    """Program (channel block, layer): the layer's conv state [C, W-1] (layer-major after
    state_ptr) <- its last W-1 inputs along the accepted path (x rows of the layer at x_ptr +
    layer * stride_xl)."""
    offs_c = tl.program_id(0) * BC + tl.arange(0, BC)
    layer = tl.program_id(1).to(tl.int64)
    state_ptr += layer * C * (W - 1)
    x_ptr += layer * stride_xl
    j = tl.arange(0, WP)
    n = tl.load(len_ptr)
    pos = n + j  # position in history = cat(old state columns, x[path]); keep the last W-1
    from_state = pos < W - 1
    node = tl.load(accepted_ptr + tl.maximum(pos - (W - 1), 0), mask=(~from_state) & (j < W - 1), other=0)
    valid = (offs_c[:, None] < C) & (j[None, :] < W - 1)
    old = tl.load(
        state_ptr + offs_c[:, None] * (W - 1) + tl.minimum(pos, W - 2)[None, :],
        mask=valid & from_state[None, :],
        other=0.0,
    )
    rows = node.to(tl.int64)[None, :] * stride_x
    new = tl.load(x_ptr + rows + offs_c[:, None], mask=valid & ~from_state[None, :], other=0.0)
    # Every value is loaded before any is stored: a program owns its channels, so in place is safe.
    val = tl.where(from_state[None, :], old, new.to(state_ptr.dtype.element_ty))
    tl.store(state_ptr + offs_c[:, None] * (W - 1) + j[None, :], val, mask=valid)


def tree_conv_(
    x: Tensor, conv_state: Tensor, weight: Tensor, bias: Tensor | None, gather: Tensor, y: Tensor
) -> None:
    """x [R, C] (rows may be strided: a column slice of the projection), conv_state [C, W-1] (x's
    dtype), weight [C, W], bias [C] or None, gather [R, W] int64 device (tree.conv_gather) -> y [R, C]
    in x's dtype (caller-owned). All else contiguous."""
    x = dense_columns(x)
    rows, channels = x.shape
    width = weight.shape[1]
    grid = (rows, triton.cdiv(channels, BLOCK_C))
    tree_conv_kernel[grid](
        x,
        conv_state,
        weight,
        weight if bias is None else bias,
        gather,
        y,
        channels,
        x.stride(0),
        W=width,
        HAS_BIAS=bias is not None,
        BC=BLOCK_C,
        enable_fp_fusion=False,
    )


def conv_operands_(
    x: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    gather: Tensor,
    gates: GateInputs,
    record: Tensor,
    ops: GdnOperands,
    num_warps: int = PREPARE_WARPS,
) -> None:
    """A GDN layer's tree conv with its operands prepared in the same launch: x [R, C] pre-conv
    [q | k | v] inputs (rows may be strided), conv_state [C, W-1] (x's dtype), weight [C, W] (no
    bias), gather [R, W] (tree.conv_gather) -> the records `ops` (contiguous fp32: q, k [R, H, K],
    v [R, HV, V], g, beta [R, HV]; `gates` gives a, b [R, HV] on one row stride, A_log and dt_bias)
    and x's rows copied into `record` (contiguous [R, C], x's dtype). The conv output itself is not
    stored: the scans read only the records."""
    x = dense_columns(x)
    rows, channels = x.shape
    heads, dk = ops.q.shape[1], ops.q.shape[2]
    hv, dv = ops.v.shape[1], ops.v.shape[2]
    check_records(ops, rows, heads, hv, dk, dv)
    if channels != 2 * heads * dk + hv * dv or dk & (dk - 1):
        raise ValueError(
            f"conv channels {channels} must be [q | k | v] of the records ({heads} x {dk}, {heads} x {dk}, "
            f"{hv} x {dv}) with a power-of-two key head dim"
        )
    check_record(record, x)
    a, b = gates.a, gates.b
    if a.stride(0) != b.stride(0) or a.stride(1) != 1 or b.stride(1) != 1:
        a, b = a.contiguous(), b.contiguous()
    bc = channel_block(dk)
    conv_operands_kernel[(rows, triton.cdiv(channels, bc) + 1)](
        x, conv_state, weight, gather, record, a, b, gates.A_log, gates.dt_bias, ops.q, ops.k, ops.v,
        ops.g, ops.beta, channels, x.stride(0), a.stride(0), W=weight.shape[1], HK=heads * dk, K=dk,
        HVV=hv * dv, HV=hv, HVP=triton.next_power_of_2(hv), BC=bc, enable_fp_fusion=False,
        num_warps=num_warps,
    )  # fmt: skip


def check_record(record: Tensor, x: Tensor) -> None:
    """ValueError unless `record` is a contiguous tensor of x's shape and dtype."""
    if record.shape != x.shape or record.dtype != x.dtype or not record.is_contiguous():
        raise ValueError(
            f"the conv input record must be a contiguous {list(x.shape)} {x.dtype}, got "
            f"{list(record.shape)} {record.dtype} (contiguous: {record.is_contiguous()})"
        )


def tree_conv(
    x: Tensor, conv_state: Tensor, weight: Tensor, bias: Tensor | None, tree: TreeDescriptor
) -> Tensor:
    """The reference's signature: x [R, C], conv_state [C, W-1], weight [C, W], bias [C] -> y [R, C]."""
    check_conv_shapes(x, conv_state, weight, tree)
    y = torch.empty_like(x)
    tree_conv_(
        x.contiguous(),
        conv_state.to(x.dtype).contiguous(),
        weight.contiguous(),
        None if bias is None else bias.contiguous(),
        tree.conv_gather.to(x.device),
        y,
    )
    return y


def publish_conv_state_(conv_state: Tensor, x: Tensor, accepted: Tensor, path_len: Tensor | int) -> None:
    """The reference's signature: conv_state [C, W-1] (contiguous) <- last W-1 inputs along
    accepted[0:path_len]; x [R, C] (rows may be strided); accepted [D+1] int64 (-1 padded); path_len
    int or [1] tensor."""
    channels, keep = conv_state.shape
    if not conv_state.is_contiguous() or x.shape[1] != channels:
        raise ValueError(
            f"conv_state must be contiguous [C, W-1] with C = x.shape[1]; got {tuple(conv_state.shape)}"
        )
    length = torch.as_tensor(path_len, dtype=torch.int64, device=conv_state.device).reshape(1)
    x = dense_columns(x)
    publish_conv_kernel[(triton.cdiv(channels, BLOCK_C), 1)](
        conv_state, x, accepted.to(conv_state.device), length, channels, x.stride(0), 0, W=keep + 1,
        WP=triton.next_power_of_2(keep), BC=BLOCK_C,
    )  # fmt: skip


def publish_conv_layers_(bank: Tensor, x: Tensor, accepted: Tensor, path_len: Tensor) -> None:
    """Every layer's publication in one launch: bank [L, C, W-1] (contiguous: the layers' conv
    states) <- the last W-1 inputs along accepted[0:path_len] of x [L, R, C] (each row's channels
    contiguous); accepted [D+1] int64 and path_len [1] on the device."""
    layers, channels, keep = bank.shape
    if not bank.is_contiguous() or x.dim() != 3 or x.shape[0] != layers or x.shape[2] != channels:
        raise ValueError(
            f"bank must be a contiguous [L, C, W-1] and x [L, R, C], got {tuple(bank.shape)} and "
            f"{tuple(x.shape)}"
        )
    if x.stride(2) != 1:
        x = x.contiguous()
    publish_conv_kernel[(triton.cdiv(channels, BLOCK_C), layers)](
        bank, x, accepted, path_len, channels, x.stride(1), x.stride(0), W=keep + 1,
        WP=triton.next_power_of_2(keep), BC=BLOCK_C,
    )  # fmt: skip
