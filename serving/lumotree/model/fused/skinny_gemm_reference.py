"""The PyTorch reference of `skinny_gemm.skinny_linear`."""

from __future__ import annotations

from torch import Tensor


def skinny_linear_reference(x: Tensor, w: Tensor) -> Tensor:
    """y = x @ w^T (nn.Linear layout) in fp32, cast back to x's dtype."""
    return (x.float() @ w.float().t()).to(x.dtype)
