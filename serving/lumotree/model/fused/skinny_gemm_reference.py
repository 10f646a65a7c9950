"""The PyTorch reference of `skinny_gemm.skinny_linear` and `skinny_swiglu`."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def prenorm_reference(
    x: Tensor, weight: Tensor, eps: float, delta: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """The norm prologue's operands of x [M, K]: (the row read: x, or x + delta in x's dtype; that
    row times (1 + weight) in x's dtype, the dot's operand; 1 / rms of the row read, fp32 [M, 1])."""
    read = x if delta is None else (x.float() + delta.float()).to(x.dtype)
    xf = read.float()
    inv_rms = (xf.pow(2).mean(-1, keepdim=True) + eps).rsqrt()
    return read, (xf * (1.0 + weight.float())).to(x.dtype), inv_rms


def skinny_linear_reference(
    x: Tensor,
    w: Tensor,
    residual: Tensor | None = None,
    norm: tuple[Tensor, float, Tensor | None] | None = None,
) -> Tensor:
    """y = x @ w^T (nn.Linear layout) in fp32, cast back to x's dtype; plus residual if given (added
    after the cast, in fp32, cast again). norm (weight, eps, delta): x's rows normalised as the
    prologue does it: the products of (x [+ delta]) * (1 + weight) scaled by 1 / rms in fp32."""
    scale = None
    if norm is not None:
        _, x, scale = prenorm_reference(x, *norm)
    y = x.float() @ w.float().t()
    y = (y if scale is None else y * scale).to(x.dtype)
    return y if residual is None else (y.float() + residual.float()).to(x.dtype)


def skinny_swiglu_reference(
    x: Tensor, w: Tensor, norm: tuple[Tensor, float, Tensor | None] | None = None
) -> Tensor:
    """silu(gate) * up of the [gate | up] product `skinny_linear_reference(x, w, norm=norm)`."""
    gate, up = skinny_linear_reference(x, w, norm=norm).chunk(2, dim=-1)
    return F.silu(gate) * up
