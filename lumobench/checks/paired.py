"""The paired error rule: how close an implementation must be to a float64 reference.

A cell is one (output node x value head) vector or one (state x value head) matrix; its error is
the max absolute difference over the cell's entries. For every cell of a compared tensor

    err(impl vs float64) <= C * err(native vs float64) + abs_floor,      C = 2 (frozen, as in the paper)
    abs_floor = (2 u(storage) + 8 u(fp32)) * max |float64 tensor|

where "native" is a plain sequential computation in the same working precision (fp32 arithmetic,
fp32 or bf16 storage) and u the unit roundoff (fp32 2^-24, bf16 2^-8).
Why this floor: a cell that cancels toward zero keeps the absolute rounding noise of the terms
that produced it, which is set by the tensor's scale, not the cell's, so a purely relative rule
rejects correct code on such cells. The floor allows two roundings to storage (impl and native may
round one final value in opposite directions) and eight fp32 roundings of accumulated noise, at
the tensor's largest magnitude. Measured on correct fp32 GDN code, the largest cell errors are ~6
such roundings at K = 32 and ~40 at K = 128, where the native error grows alike and the C term
carries them; every planted fault moves values by orders of magnitude more.
Non-finite values in the implementation always violate the rule.

End-to-end comparisons (a stack of layers against step-by-step decoding over several cycles) use
the native envelope instead of the native cell error: C * the largest err(native vs float64) of
any cell of that quantity over the whole run, and the floor at the run's largest |float64|. There
the two computations round their intermediate activations (projections, conv outputs) separately,
so their errors are independent draws of one size, and a pairing cell by cell (or even cycle by
cycle: a root-only cycle has 4 attention cells) rejects correct code wherever the native draw
happens to be small.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

C_PAIRED = 2.0
# The end-to-end form over a whole model, for kernels whose arithmetic differs from the native path
# (e.g. the WY-form GDN): layer L's inputs already carry up to C_PAIRED times the native error, and
# layer L's projections can turn that error towards their largest gain, so two per-op bounds compound.
C_COMPOUNDED = C_PAIRED**2
STORAGE_ROUNDINGS = 2.0
COMPUTE_ROUNDINGS = 8.0
_UNIT_ROUNDOFF = {
    torch.float64: 2.0**-53,
    torch.float32: 2.0**-24,
    torch.bfloat16: 2.0**-8,
    torch.float16: 2.0**-11,
}


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half an ulp at 1.0 for the storage dtype."""
    return _UNIT_ROUNDOFF[dtype]


@dataclass(frozen=True)
class PairedResult:
    """Outcome over all cells: counts, and the worst err_impl / bound ratio (<= 1 passes)."""

    cells: int
    violations: int
    worst_ratio: float
    max_err: float

    @property
    def ok(self) -> bool:
        return self.violations == 0

    def __add__(self, other: PairedResult) -> PairedResult:
        return PairedResult(
            self.cells + other.cells,
            self.violations + other.violations,
            max(self.worst_ratio, other.worst_ratio),
            max(self.max_err, other.max_err),
        )


def _cells(t: Tensor, cell_dims: int) -> Tensor:
    t = t.double()
    return t.flatten(cell_dims) if t.dim() > cell_dims else t[..., None]


def _judge(err_impl: Tensor, bound: Tensor, impl_cells: Tensor) -> PairedResult:
    finite = torch.isfinite(impl_cells).all(-1)
    passed = finite & (err_impl <= bound)
    ratio = torch.where(bound > 0, err_impl / bound, torch.where(err_impl > 0, torch.inf, 0.0))
    ratio = torch.where(finite, ratio, torch.inf)
    return PairedResult(
        cells=int(passed.numel()),
        violations=int((~passed).sum()),
        worst_ratio=float(ratio.max()) if ratio.numel() else 0.0,
        max_err=float(err_impl.nan_to_num(torch.inf).max()) if err_impl.numel() else 0.0,
    )


def _floor(storage: torch.dtype, scale: float) -> float:
    return (
        STORAGE_ROUNDINGS * unit_roundoff(storage) + COMPUTE_ROUNDINGS * unit_roundoff(torch.float32)
    ) * scale


def paired_check(
    impl: Tensor, native: Tensor, ref: Tensor, cell_dims: int, storage: torch.dtype
) -> PairedResult:
    """Apply the rule to one tensor; the leading `cell_dims` dims index cells, the rest are reduced.

    impl, native, ref: same shape, any float dtype (ref should be float64); storage: the dtype the
    implementation stores the compared tensor in (sets u).
    """
    if not impl.shape == native.shape == ref.shape:
        raise ValueError(f"shapes differ: {tuple(impl.shape)}, {tuple(native.shape)}, {tuple(ref.shape)}")
    ref_c = _cells(ref, cell_dims)
    err_impl = (_cells(impl, cell_dims) - ref_c).abs().amax(-1)
    err_native = (_cells(native, cell_dims) - ref_c).abs().amax(-1)
    bound = C_PAIRED * err_native + _floor(storage, float(ref_c.abs().max()))
    return _judge(err_impl, bound, _cells(impl, cell_dims))


def paired_check_envelope(
    triples: Sequence[tuple[Tensor, Tensor, Tensor]],
    cell_dims: int,
    storage: torch.dtype,
    c: float = C_PAIRED,
) -> list[PairedResult]:
    """The end-to-end form: one (impl, native, ref) triple per cycle of a run, all of one quantity.

    Every cell is bounded by c (C_PAIRED unless given) times the native envelope (the largest native
    cell error over the whole run) plus the floor at the run's largest |ref|. Returns one result per triple.
    """
    for impl, native, ref in triples:
        if not impl.shape == native.shape == ref.shape:
            raise ValueError(f"shapes differ: {tuple(impl.shape)}, {tuple(native.shape)}, {tuple(ref.shape)}")
    refs = [_cells(ref, cell_dims) for _, _, ref in triples]
    envelope = max(
        float((_cells(nat, cell_dims) - r).abs().max()) for (_, nat, _), r in zip(triples, refs, strict=True)
    )
    bound = c * envelope + _floor(storage, max(float(r.abs().max()) for r in refs))
    out = []
    for (impl, _, _), ref_c in zip(triples, refs, strict=True):
        impl_c = _cells(impl, cell_dims)
        out.append(_judge((impl_c - ref_c).abs().amax(-1), torch.full(ref_c.shape[:-1], bound), impl_c))
    return out
