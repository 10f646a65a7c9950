"""Tree causal conv1d and conv-state publication in Triton, beside `reference.py`.

One program per (tree row, channel block) gathers the row's window along its ancestry from the
static `conv_gather` indices (taps above the root read the committed conv state [C, W-1]) and
applies the taps in the reference's order with its cast points: acc = bias; acc += w[:, t] * x_t
for t = 0..W-1; y = silu(acc). Multiply-add contraction is switched off so each tap rounds as the
reference's separate multiply and add do. Publication writes the last W-1 pre-conv inputs along
the accepted path into the conv state in place, reading the path on the device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from lumotree.tree import TreeDescriptor
from lumotree.verify.conv.reference import check_conv_shapes

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
    record_ptr,
    C,
    stride_x,
    W: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RECORD: tl.constexpr,
    BC: tl.constexpr,
):
    r = tl.program_id(0)
    offs_c = tl.program_id(1) * BC + tl.arange(0, BC)
    mc = offs_c < C
    if RECORD:  # the row's own input, kept for publication in a contiguous [R, C] record
        own = tl.load(x_ptr + r.to(tl.int64) * stride_x + offs_c, mask=mc)
        tl.store(record_ptr + r * C + offs_c, own, mask=mc)
    if HAS_BIAS:
        acc = tl.load(bias_ptr + offs_c, mask=mc, other=0.0).to(tl.float32)
    else:
        acc = tl.zeros([BC], dtype=tl.float32)
    for t in tl.static_range(W):
        idx = tl.load(gather_ptr + r * W + t)
        in_state = (tl.zeros([BC], dtype=tl.int32) + idx) < W - 1
        row = tl.maximum(idx - (W - 1), 0).to(tl.int64)
        xs = tl.load(state_ptr + offs_c * (W - 1) + tl.minimum(idx, W - 2), mask=mc & in_state, other=0.0)
        xt = tl.load(x_ptr + row * stride_x + offs_c, mask=mc & ~in_state, other=0.0)
        # Cast point: the window value is in x's dtype, then promoted to fp32 (as the reference).
        xv = tl.where(in_state, xs.to(x_ptr.dtype.element_ty), xt).to(tl.float32)
        wt = tl.load(w_ptr + offs_c * W + t, mask=mc, other=0.0).to(tl.float32)
        acc = acc + wt * xv
    y = acc * tl.sigmoid(acc)
    tl.store(y_ptr + r * C + offs_c, y.to(y_ptr.dtype.element_ty), mask=mc)


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
    x: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    gather: Tensor,
    y: Tensor,
    record: Tensor | None = None,
) -> None:
    """x [R, C] (rows may be strided: a column slice of the projection), conv_state [C, W-1] (x's
    dtype), weight [C, W], bias [C] or None, gather [R, W] int64 device (tree.conv_gather) -> y [R, C]
    in x's dtype (caller-owned). All else contiguous. `record` (contiguous [R, C], x's dtype), if
    given, receives a copy of x's rows, written by the same launch."""
    x = dense_columns(x)
    rows, channels = x.shape
    width = weight.shape[1]
    if record is not None and (
        record.shape != x.shape or record.dtype != x.dtype or not record.is_contiguous()
    ):
        raise ValueError(
            f"the conv input record must be a contiguous {list(x.shape)} {x.dtype}, got "
            f"{list(record.shape)} {record.dtype} (contiguous: {record.is_contiguous()})"
        )
    grid = (rows, triton.cdiv(channels, BLOCK_C))
    tree_conv_kernel[grid](
        x,
        conv_state,
        weight,
        weight if bias is None else bias,
        gather,
        y,
        y if record is None else record,
        channels,
        x.stride(0),
        W=width,
        HAS_BIAS=bias is not None,
        RECORD=record is not None,
        BC=BLOCK_C,
        enable_fp_fusion=False,
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
