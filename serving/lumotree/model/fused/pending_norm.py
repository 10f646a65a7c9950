"""Rows whose pre-norm is left to the GEMMs that read them (the producer-side RMSNorm).

The decoder's residual stream h is normalised before every projection that reads it:
x = h / rms(h) * (1 + w). On the fused path the GEMM that produces h (an output projection adding
the residual) also stores what the next pre-norm needs, and the GEMMs that read x apply it in their
epilogue: W @ x = (W @ (h * (1 + w))) / rms(h). So no norm runs as a launch of its own. The
producer stores `scaled` = h * (1 + w) rounded to h's dtype and, per output block of its columns,
the fp32 sum of h squared (`block_sums`); a consumer sums a row's blocks in one fixed order, the
same for every row count, and scales its fp32 accumulators by 1 / rms before rounding.

Against norm-then-product this rounds h * (1 + w) to the activation dtype instead of the normalised
product (a rounding of the same relative size), so the bits differ from the launched norm's; a row's
bits do not depend on how many rows are computed with it (`skinny_gemm.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True, eq=False)
class PendingNorm:
    """scaled [..., D] = h * (1 + w) in h's dtype; block_sums [rows, blocks] fp32, rows
    `block_stride(blocks)` apart (so a reader's tile loads as vectors): each row's sum of h squared
    over each block of the producing GEMM's columns (rows: scaled's leading dims flattened); eps:
    the norm's epsilon."""

    scaled: Tensor
    block_sums: Tensor
    eps: float

    @property
    def shape(self) -> torch.Size:
        return self.scaled.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.scaled.dtype

    @property
    def device(self) -> torch.device:
        return self.scaled.device

    def inverse_rms(self) -> Tensor:
        """fp32 [rows]: 1 / rms(h) of each row, from its block sums (summed in PyTorch's order: this
        serves readers other than the skinny kernel, which sums them in its own)."""
        return torch.rsqrt(self.block_sums.sum(dim=1) / self.scaled.shape[-1] + self.eps)

    def materialize(self) -> Tensor:
        """The normalised rows [..., D] in h's dtype, for a reader that cannot apply the norm itself
        (a GEMM other than the skinny kernel): scaled / rms(h), rounded."""
        rows = self.scaled.reshape(-1, self.scaled.shape[-1]).float()
        return (rows * self.inverse_rms()[:, None]).to(self.scaled.dtype).view(self.scaled.shape)


def pending_norm_reference(h: Tensor, weight: Tensor, eps: float, block: int) -> PendingNorm:
    """What a producer with `block`-wide output blocks stores for h [M, D]: the reference of
    `skinny_gemm.skinny_linear_normed`'s norm operands."""
    hf = h.float()
    scaled = (hf * (1.0 + weight.float())).to(h.dtype)
    padded = torch.nn.functional.pad(hf * hf, (0, -h.shape[1] % block))
    sums = padded.view(h.shape[0], -1, block).sum(-1)
    buffer = torch.zeros(h.shape[0], block_stride(sums.shape[1]), dtype=torch.float32, device=h.device)
    buffer[:, : sums.shape[1]] = sums
    return PendingNorm(scaled, buffer[:, : sums.shape[1]], eps)


def block_stride(blocks: int) -> int:
    """The distance between a pending norm's rows of block sums: the power of two from `blocks`."""
    return 1 << max(0, blocks - 1).bit_length()
