"""Partial rotary position embedding (rotate-half layout on the leading `rotary_dim` head dims)."""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """cos/sin tables for integer positions; Qwen3.5's multimodal sections coincide for text-only input."""

    def __init__(self, rotary_dim: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
        self.inv_freq = nn.Buffer(inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: int [...] -> (cos, sin) fp32 [..., rotary_dim]."""
        freqs = positions.float()[..., None] * self.inv_freq.to(positions.device)
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos(), emb.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, T, heads, D]; cos/sin: [B or 1, T, rotary_dim] -> x with its first rotary_dim dims rotated."""
    rot = cos.shape[-1]
    cos = cos[:, :, None].to(x.dtype)
    sin = sin[:, :, None].to(x.dtype)
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotated = torch.cat([-x_rot[..., half:], x_rot[..., :half]], dim=-1)
    return torch.cat([x_rot * cos + rotated * sin, x_pass], dim=-1)
