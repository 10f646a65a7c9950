"""Fused projections: the linears that read the same input (GDN's in_proj_qkv/z/b/a, attention's
q/k/v, the MLP's gate/up) concatenated into one weight, so a decode step streams each layer's
input projections in one GEMM instead of two to four.

Each block declares which of its linears are fused (`FUSED_INPUTS`, in output order) and keeps
the fusion in its `fused` attribute; this module knows no block types.

The original `nn.Linear` weights become views of the fused tensor (no extra memory; checkpoint
names, `state_dict` and `load_state_dict` keep working and write through to it). A module uses
its `FusedProjection` only while the views still point into it (a later `.to()` breaks that and
silently brings back the separate GEMMs) and only on the fused path (`ops.kernels_for`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from lumotree.model.fused import ops
from lumotree.model.fused.pending_norm import PendingNorm


class FusedProjection:
    """One weight [sum of outs, in] standing for `parts`, whose weights are views of it."""

    def __init__(self, parts: Sequence[nn.Linear]) -> None:
        if any(p.bias is not None for p in parts):
            raise ValueError("fused projections take bias-free linears only")
        self.parts = tuple(parts)
        self.sizes = [p.out_features for p in parts]
        with torch.no_grad():
            self.weight = torch.cat([p.weight for p in parts])
            for part, view in zip(parts, self.weight.split(self.sizes), strict=True):
                part.weight.data = view

    def current(self) -> bool:
        """Whether every part's weight is still the view into `weight` this fusion made."""
        offset, row = 0, self.weight.stride(0) * self.weight.element_size()
        base = self.weight.data_ptr()
        for part, size in zip(self.parts, self.sizes, strict=True):
            w = part.weight
            moved = w.dtype != self.weight.dtype or w.device != self.weight.device
            if moved or w.data_ptr() != base + offset:
                return False
            offset += size * row
        return True

    def __call__(self, x: Tensor | PendingNorm) -> list[Tensor]:
        """x [..., in] (or its pending norm) -> each part's output [..., out_i] (column slices of
        one GEMM)."""
        return list(ops.linear(x, self.weight).split(self.sizes, dim=-1))


def fuse_projections_(model: nn.Module) -> int:
    """Fuse the input projections of every block of `model` (its MTP module included) that declares
    them: a module whose class names its bias-free input linears in `FUSED_INPUTS` (GDN, attention,
    MLP) and has a `fused` attribute. Modules already fused are left alone. Returns how many were fused."""
    fused = 0
    for module in model.modules():
        parts: tuple[str, ...] | None = getattr(type(module), "FUSED_INPUTS", None)
        if parts is None or (module.fused is not None and module.fused.current()):
            continue
        module.fused = FusedProjection([getattr(module, n) for n in parts])
        fused += 1
    return fused
