"""The model's dense elementwise ops as Triton kernels, beside `reference.py`.

One program per row (or per (row, head)) holds the whole normalised vector in registers, so a
row's reduction is the same whatever the number of rows: a 1-row decode step and a 32-row tree
forward normalise a row identically (batch invariance). Every kernel keeps the reference's cast
points (fp32 arithmetic, a rounding to the activation dtype wherever the reference rounds), and
reads its inputs through their strides, so the column slices of a fused projection need no copy.
Outputs are new contiguous tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

ELEMENTS_PER_PROGRAM = 2048  # silu_mul's column block


def _warps(block: int) -> int:
    return max(1, min(16, block // 512))


@triton.jit
def _inv_rms(xf, D, eps):
    """1 / sqrt(mean(x^2) + eps) of one fp32 row (masked lanes hold zeros)."""
    return 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / D + eps)


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    sx_r,
    sx_h,
    d_ptr,
    sd_r,
    sd_h,
    sum_ptr,
    w_ptr,
    y_ptr,
    D,
    eps,
    ADD: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    out = (r * tl.num_programs(1) + h) * D
    offs = tl.arange(0, BLOCK_D)
    m = offs < D
    x = tl.load(x_ptr + r * sx_r + h * sx_h + offs, mask=m, other=0.0)
    # the weights loaded with x: loaded after the sum's store or the reduction's barrier, their
    # latency came on top of x's (results/h200/NOTES.md, session 19)
    w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
    if ADD:
        delta = tl.load(d_ptr + r * sd_r + h * sd_h + offs, mask=m, other=0.0)
        x = (x.to(tl.float32) + delta.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(sum_ptr + out + offs, x, mask=m)
    xf = x.to(tl.float32)
    rstd = _inv_rms(xf, D, eps)
    tl.store(y_ptr + out + offs, (xf * rstd * (1.0 + w)).to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _mtp_inputs_kernel(
    table_ptr,
    tokens_ptr,
    h_ptr,
    sh_r,
    we_ptr,
    wh_ptr,
    y_ptr,
    D,
    eps,
    BLOCK_D: tl.constexpr,
):
    """Program (row r, half): half 0 normalises the embedding-table row of token r, half 1 hidden
    row r; each is `_rms_norm_kernel`'s arithmetic, stored at y[r, half * D:]."""
    r = tl.program_id(0).to(tl.int64)
    half = tl.program_id(1)
    offs = tl.arange(0, BLOCK_D)
    m = offs < D
    if half == 0:
        token = tl.load(tokens_ptr + r).to(tl.int64)
        x = tl.load(table_ptr + token * D + offs, mask=m, other=0.0)
        w = tl.load(we_ptr + offs, mask=m, other=0.0).to(tl.float32)
    else:
        x = tl.load(h_ptr + r * sh_r + offs, mask=m, other=0.0)
        w = tl.load(wh_ptr + offs, mask=m, other=0.0).to(tl.float32)
    xf = x.to(tl.float32)
    rstd = _inv_rms(xf, D, eps)
    tl.store(y_ptr + (2 * r + half) * D + offs, (xf * rstd * (1.0 + w)).to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _gated_rms_norm_kernel(
    x_ptr,
    z_ptr,
    sz_r,
    sz_h,
    w_ptr,
    y_ptr,
    D,
    eps,
    ROUND_WEIGHTED: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    row = (r * tl.num_programs(1) + h) * D
    offs = tl.arange(0, BLOCK_D)
    m = offs < D
    xf = tl.load(x_ptr + row + offs, mask=m, other=0.0).to(tl.float32)
    rstd = _inv_rms(xf, D, eps)
    dtype = y_ptr.dtype.element_ty
    y = (xf * rstd).to(dtype).to(tl.float32)
    y = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32) * y
    if ROUND_WEIGHTED:  # the weight times the normed row rounds when both are in the low dtype
        y = y.to(dtype).to(tl.float32)
    z = tl.load(z_ptr + r * sz_r + h * sz_h + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + row + offs, (y * (z * tl.sigmoid(z))).to(dtype), mask=m)


@triton.jit
def _norm_rope_kernel(
    a_ptr,
    sa_r,
    sa_h,
    wa_ptr,
    ya_ptr,
    heads_a,
    b_ptr,
    sb_r,
    sb_h,
    wb_ptr,
    yb_ptr,
    cos_ptr,
    sc_r,
    sin_ptr,
    ss_r,
    D,
    eps,
    ROT: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Program (row r, head h): head h of tensor a (h < heads_a, weight wa, output ya) or head
    h - heads_a of tensor b, normed then rotated on its first ROT dims (b's heads are the grid's rest)."""
    r = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    in_a = h < heads_a
    hb = h - heads_a
    src = tl.where(in_a, a_ptr + r * sa_r + h * sa_h, b_ptr + r * sb_r + hb * sb_h)
    w_ptr = tl.where(in_a, wa_ptr, wb_ptr)
    heads_b = tl.num_programs(1) - heads_a
    dst = tl.where(in_a, ya_ptr + (r * heads_a + h) * D, yb_ptr + (r * heads_b + hb) * D)
    offs = tl.arange(0, BLOCK_D)
    m = offs < D
    dtype = ya_ptr.dtype.element_ty
    xf = tl.load(src + offs, mask=m, other=0.0).to(tl.float32)
    rstd = _inv_rms(xf, D, eps)
    w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
    y = (xf * rstd * (1.0 + w)).to(dtype)
    # rotate-half on the first ROT dims: each element's partner is ROT/2 away, normed the same way
    half: tl.constexpr = ROT // 2
    rot = offs < ROT
    partner = tl.where(offs < half, offs + half, offs - half)
    xp = tl.load(src + partner, mask=m & rot, other=0.0).to(tl.float32)
    wp = tl.load(w_ptr + partner, mask=m & rot, other=0.0).to(tl.float32)
    yp = (xp * rstd * (1.0 + wp)).to(dtype).to(tl.float32)
    rotated = tl.where(offs < half, -yp, yp)
    c = tl.load(cos_ptr + r * sc_r + offs, mask=rot, other=0.0).to(dtype).to(tl.float32)
    s = tl.load(sin_ptr + r * ss_r + offs, mask=rot, other=0.0).to(dtype).to(tl.float32)
    turned = ((y.to(tl.float32) * c).to(dtype).to(tl.float32) + (rotated * s).to(dtype).to(tl.float32)).to(
        dtype
    )
    tl.store(dst + offs, tl.where(rot, turned, y), mask=m)


@triton.jit
def _silu_mul_kernel(gu_ptr, s_row, y_ptr, N, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    dtype = y_ptr.dtype.element_ty
    g = tl.load(gu_ptr + r * s_row + offs, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + r * s_row + N + offs, mask=m, other=0.0).to(tl.float32)
    act = (g * tl.sigmoid(g)).to(dtype).to(tl.float32)
    tl.store(y_ptr + r * N + offs, (act * u).to(dtype), mask=m)


@triton.jit
def _sigmoid_mul_kernel(x_ptr, g_ptr, sg_r, sg_h, y_ptr, D, BLOCK_D: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    row = (r * tl.num_programs(1) + h) * D
    offs = tl.arange(0, BLOCK_D)
    m = offs < D
    dtype = y_ptr.dtype.element_ty
    x = tl.load(x_ptr + row + offs, mask=m, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + r * sg_r + h * sg_h + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + row + offs, (x * tl.sigmoid(g).to(dtype).to(tl.float32)).to(dtype), mask=m)


def _rows_heads(x: Tensor) -> Tensor:
    """x [..., H, D] as a [rows, H, D] view (a copy only where the leading dims cannot merge)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    return x.reshape(-1, x.shape[-2], x.shape[-1])


def _unit_stride(x: Tensor) -> Tensor:
    """x [rows, D] with its last dim contiguous (a copy only where it is not)."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _block(d: int) -> int:
    return triton.next_power_of_2(d)


def _empty(shape: tuple[int, ...], like: Tensor) -> Tensor:
    """Every output's allocation (tests poison it here)."""
    return torch.empty(shape, dtype=like.dtype, device=like.device)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """reference.rms_norm: x [..., D] -> [..., D] in x's dtype."""
    xs = _rows_heads(x[..., None, :])
    y = _empty(x.shape, x)
    d = x.shape[-1]
    block = _block(d)
    _rms_norm_kernel[(xs.shape[0], 1)](
        xs, xs.stride(0), 0, xs, 0, 0, y, weight, y, d, eps, ADD=False, BLOCK_D=block, num_warps=_warps(block)
    )
    return y


def add_rms_norm(h: Tensor, delta: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """reference.add_rms_norm: (h + delta, rms_norm(h + delta)), both [..., D] in h's dtype."""
    if delta.shape != h.shape or delta.dtype != h.dtype:
        raise ValueError(f"residual {tuple(h.shape)} {h.dtype} != delta {tuple(delta.shape)} {delta.dtype}")
    hs, ds = _rows_heads(h[..., None, :]), _rows_heads(delta[..., None, :])
    total, y = _empty(h.shape, h), _empty(h.shape, h)
    d = h.shape[-1]
    block = _block(d)
    _rms_norm_kernel[(hs.shape[0], 1)](
        hs, hs.stride(0), 0, ds, ds.stride(0), 0, total, weight, y, d, eps,
        ADD=True, BLOCK_D=block, num_warps=_warps(block),
    )  # fmt: skip
    return total, y


def mtp_inputs(
    table: Tensor, tokens: Tensor, hidden: Tensor, w_embed: Tensor, w_hidden: Tensor, eps: float
) -> Tensor:
    """reference.mtp_inputs in one launch: tokens [...] (int), hidden [..., D] -> [..., 2D] in
    hidden's dtype (the embedding rows gathered by the kernel; each half normalised as `rms_norm`)."""
    d = hidden.shape[-1]
    if table.shape[-1] != d or table.dtype != hidden.dtype or tokens.shape != hidden.shape[:-1]:
        raise ValueError(
            f"table {tuple(table.shape)} {table.dtype}, tokens {tuple(tokens.shape)} and hidden "
            f"{tuple(hidden.shape)} {hidden.dtype} do not match"
        )
    hs = _rows_heads(hidden[..., None, :])
    y = _empty((*hidden.shape[:-1], 2 * d), hidden)
    block = _block(d)
    _mtp_inputs_kernel[(hs.shape[0], 2)](
        table.contiguous(), tokens.reshape(-1), hs, hs.stride(0), w_embed, w_hidden, y, d, eps,
        BLOCK_D=block, num_warps=_warps(block),
    )  # fmt: skip
    return y


def gated_rms_norm(x: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    """reference.gated_rms_norm per head: x, gate [..., H, D] -> [..., H, D] in x's dtype."""
    xs, zs = _rows_heads(x.contiguous()), _rows_heads(gate)
    y = _empty(x.shape, x)
    d = x.shape[-1]
    round_weighted = torch.promote_types(weight.dtype, x.dtype) != torch.float32
    block = _block(d)
    _gated_rms_norm_kernel[(xs.shape[0], xs.shape[1])](
        xs, zs, zs.stride(0), zs.stride(1), weight, y, d, eps,
        ROUND_WEIGHTED=round_weighted, BLOCK_D=block, num_warps=_warps(block),
    )  # fmt: skip
    return y


def norm_rope(x: Tensor, weight: Tensor, eps: float, cos: Tensor, sin: Tensor) -> Tensor:
    """reference.norm_rope: x [B, T, H, D], cos/sin [B or 1, T, rot] fp32 -> [B, T, H, D] (cos/sin
    rows read through their stride: views of a wider table need no copy)."""
    return _norm_rope([(x, weight)], eps, cos, sin)[0]


def norm_rope_pair(
    q: Tensor, q_weight: Tensor, k: Tensor, k_weight: Tensor, eps: float, cos: Tensor, sin: Tensor
) -> tuple[Tensor, Tensor]:
    """`norm_rope` of attention's queries and keys (their rows and head dim alike, each head count
    and weight its own) in one launch: the same bits as two."""
    if q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1] or q.dtype != k.dtype:
        shapes = f"queries {tuple(q.shape)} {q.dtype}, keys {tuple(k.shape)} {k.dtype}"
        raise ValueError(f"{shapes}: not the same rows, head dim and dtype")
    yq, yk = _norm_rope([(q, q_weight), (k, k_weight)], eps, cos, sin)
    return yq, yk


def _norm_rope(pairs: list[tuple[Tensor, Tensor]], eps: float, cos: Tensor, sin: Tensor) -> list[Tensor]:
    """One launch over the heads of each (x [B, T, H, D], weight) of `pairs` (one or two)."""
    bsz, seq, heads, d = pairs[0][0].shape
    rot = cos.shape[-1]
    cos, sin = (_unit_stride(t.expand(bsz, seq, rot).reshape(bsz * seq, rot).float()) for t in (cos, sin))
    xs = [_rows_heads(x) for x, _ in pairs]
    ys = [_empty(x.shape, x) for x, _ in pairs]
    (a, wa), (b, wb) = (xs[0], pairs[0][1]), (xs[-1], pairs[-1][1])
    block = _block(d)
    _norm_rope_kernel[(a.shape[0], sum(x.shape[1] for x in xs))](
        a, a.stride(0), a.stride(1), wa, ys[0], heads, b, b.stride(0), b.stride(1), wb, ys[-1], cos,
        cos.stride(0), sin, sin.stride(0), d, eps, ROT=rot, BLOCK_D=block, num_warps=_warps(block),
    )  # fmt: skip
    return ys


def silu_mul(gate_up: Tensor) -> Tensor:
    """reference.silu_mul: [..., 2I] -> [..., I]."""
    n = gate_up.shape[-1] // 2
    gu = _rows_heads(gate_up[..., None, :])
    y = _empty((*gate_up.shape[:-1], n), gate_up)
    block = min(ELEMENTS_PER_PROGRAM, _block(n))
    _silu_mul_kernel[(gu.shape[0], triton.cdiv(n, block))](gu, gu.stride(0), y, n, BLOCK=block, num_warps=4)
    return y


def sigmoid_mul(x: Tensor, gate: Tensor) -> Tensor:
    """reference.sigmoid_mul per head: x, gate [..., H, D] -> [..., H, D] in x's dtype."""
    xs, gs = _rows_heads(x.contiguous()), _rows_heads(gate)
    y = _empty(x.shape, x)
    d = x.shape[-1]
    block = _block(d)
    _sigmoid_mul_kernel[(xs.shape[0], xs.shape[1])](
        xs, gs, gs.stride(0), gs.stride(1), y, d, BLOCK_D=block, num_warps=_warps(block)
    )
    return y
