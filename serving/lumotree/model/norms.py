"""RMS norms as Qwen3.5 / Qwen3-Next checkpoints define them (formulas: `fused/reference.py`)."""

from __future__ import annotations

import torch
from torch import nn

from lumotree.model.fused import ops


class RMSNorm(nn.Module):
    """Zero-centred RMSNorm: y = x / rms(x) * (1 + w), computed in fp32, cast back to x's dtype.

    The stored weight is the offset from one (initialised to zeros), as in the checkpoints.
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., dim] -> [..., dim], same dtype."""
        return ops.rms_norm(x, self.weight, self.eps)


class GatedRMSNorm(nn.Module):
    """GDN output norm: y = w * (x / rms(x)) * silu(z), per value head (plain weight, initialised to ones)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """x, gate: [..., dim] -> [..., dim] in x's dtype (fp32 norm, checkpoint cast points)."""
        return ops.gated_rms_norm(x, gate, self.weight, self.eps)
