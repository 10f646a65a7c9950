"""The PyTorch reference of `skinny_gemm.skinny_linear`."""

from __future__ import annotations

from torch import Tensor


def skinny_linear_reference(x: Tensor, w: Tensor, residual: Tensor | None = None) -> Tensor:
    """y = x @ w^T (nn.Linear layout) in fp32, cast back to x's dtype; plus residual if given (added
    after the cast, in fp32, cast again)."""
    y = (x.float() @ w.float().t()).to(x.dtype)
    return y if residual is None else (y.float() + residual.float()).to(x.dtype)
