"""Where the model's dense elementwise ops run: the Triton kernels of `elementwise.py` on CUDA
tensors that need no gradient, the PyTorch references everywhere else.

`kernel_mode` chooses: "auto" (the default: kernels on CUDA), "off" (references everywhere: the
unfused path, for side-by-side benchmarks) or "always" (kernels on any device: CPU tests under
TRITON_INTERPRET=1). The same switch gates the fused projections (`weights.py`). Its `gemm` picks
the projections' GEMM on the fused path:
- "exact" (the default): `skinny_gemm.py` on every shape for 1 to 32 rows, F.linear above. A row's
  result then does not depend on how many rows are computed with it (the skinny kernel's batch
  invariance), so a tree's rows get the bits of the AR step's; cuBLAS picks its algorithm by the
  row count, and its rows part in a last bit (at the 27B shapes it runs other kernels at 1 and 32
  rows). On the H200 the skinny kernel ran 0.88-1.14x cuBLAS per shape at 1-32 rows
  (results/h200/skinny_gemm.md).
- "skinny": the skinny kernel where it beat cuBLAS (up to SKINNY_ROWS rows), F.linear otherwise:
  the fastest mix measured, not row-invariant (a benchmark variant);
- "cublas": F.linear always.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lumotree.model.fused import reference
from lumotree.model.fused.pending_norm import PendingNorm

KernelMode = Literal["auto", "off", "always"]
GemmBackend = Literal["exact", "skinny", "cublas"]
GEMM_BACKENDS = ("exact", "skinny", "cublas")
NormPlacement = Literal["pending", "launched"]
NORM_PLACEMENTS = ("pending", "launched")
SKINNY_ROWS = 16
MAX_ROWS = 32  # skinny_gemm.MAX_ROWS (not imported here: CPU-only installs may lack Triton)
_mode: KernelMode = "auto"
_gemm: GemmBackend = "exact"
_norms: NormPlacement = "pending"


@contextmanager
def kernel_mode(
    mode: KernelMode, gemm: GemmBackend | None = None, norms: NormPlacement | None = None
) -> Iterator[None]:
    """Run the enclosed code with the dense kernels in `mode`, the projections' GEMM `gemm` and the
    pre-norms `norms` ("pending": left to the GEMMs that read them where the fused path can,
    `linear_add_norm`; "launched": a norm launch each, the form before session 22, for side-by-side
    benchmarks); None: unchanged. All restored afterwards."""
    global _mode, _gemm, _norms
    if mode not in ("auto", "off", "always"):
        raise ValueError(f"kernel mode must be auto, off or always, got {mode!r}")
    if gemm is not None and gemm not in GEMM_BACKENDS:
        raise ValueError(f"gemm must be one of {', '.join(GEMM_BACKENDS)}, got {gemm!r}")
    if norms is not None and norms not in NORM_PLACEMENTS:
        raise ValueError(f"norms must be one of {', '.join(NORM_PLACEMENTS)}, got {norms!r}")
    previous = _mode, _gemm, _norms
    _mode, _gemm, _norms = mode, gemm or _gemm, norms or _norms
    try:
        yield
    finally:
        _mode, _gemm, _norms = previous


def kernels_for(x: Tensor | PendingNorm) -> bool:
    """Whether ops on `x` take the fused path (kernels and fused projections)."""
    if isinstance(x, PendingNorm):
        return True  # (only the fused path leaves a norm pending)
    if _mode == "off" or x.requires_grad:
        return False
    return _mode == "always" or x.is_cuda


def normalized(x: Tensor | PendingNorm) -> Tensor:
    """x itself, or a pending norm's rows normalised (for a reader that cannot apply it)."""
    return x.materialize() if isinstance(x, PendingNorm) else x


def _kernels() -> ModuleType:
    """The Triton module, imported on demand (CPU-only installs may lack Triton)."""
    from lumotree.model.fused import elementwise

    return elementwise


def _skinny_rows(x: Tensor | PendingNorm, weight: Tensor) -> int:
    """x's rows where the skinny Triton GEMM takes x @ weight^T under the current backend, else 0."""
    rows = math.prod(x.shape[:-1]) if x.shape[-1] else 0
    limit = MAX_ROWS if _gemm == "exact" else SKINNY_ROWS
    if _gemm == "cublas" or not kernels_for(x) or not 0 < rows <= limit or weight.dtype != x.dtype:
        return 0
    from lumotree.model.fused.skinny_gemm import beats_cublas

    return rows if _gemm == "exact" or beats_cublas(*weight.shape, x.device, x.dtype) else 0


def _rows_of(x: Tensor | PendingNorm, rows: int) -> tuple[Tensor, PendingNorm | None]:
    """x's rows [rows, in] for the skinny GEMM, and the pending norm it applies (or None)."""
    if isinstance(x, PendingNorm):
        return x.scaled.reshape(rows, -1), x
    return x.reshape(rows, x.shape[-1]), None


def linear(x: Tensor | PendingNorm, weight: Tensor, residual: Tensor | None = None) -> Tensor:
    """x [..., in] @ weight [out, in]^T, plus `residual` [..., out] if given: the skinny Triton GEMM
    on the fused path when chosen and the rows fit it (the residual added as it stores: one launch
    where the product and the add were two, the same bits; a pending norm applied in its epilogue),
    F.linear and an add otherwise."""
    rows = _skinny_rows(x, weight)
    if rows:
        from lumotree.model.fused.skinny_gemm import skinny_linear

        n = weight.shape[0]
        add = None if residual is None else residual.reshape(rows, n)
        flat, norm = _rows_of(x, rows)
        y = skinny_linear(flat, weight.contiguous(), residual=add, in_norm=norm)
        return y.view(*x.shape[:-1], n)
    y = F.linear(normalized(x), weight)
    return y if residual is None else residual + y


def linear_add_norm(
    x: Tensor | PendingNorm, weight: Tensor, residual: Tensor, norm_weight: Tensor, eps: float
) -> tuple[Tensor, Tensor | PendingNorm]:
    """(h = residual + x @ weight^T, the zero-centred RMSNorm of h): on the fused path where the
    skinny GEMM takes the product, one launch that leaves the norm pending for the GEMMs that read
    it (`pending_norm.py`); the product, then add_rms_norm (the same bits as before) otherwise."""
    rows = _skinny_rows(x, weight)
    if rows and norm_weight.dtype == weight.dtype and _norms == "pending":
        from lumotree.model.fused.skinny_gemm import skinny_linear_normed

        n = weight.shape[0]
        flat, norm = _rows_of(x, rows)
        h, pending = skinny_linear_normed(
            flat, weight.contiguous(), residual.reshape(rows, n), norm_weight, eps, in_norm=norm
        )
        shape = (*x.shape[:-1], n)
        return h.view(shape), PendingNorm(pending.scaled.view(shape), pending.block_sums, eps)
    return add_rms_norm(residual, linear(x, weight), norm_weight, eps)


def linear_silu_mul(x: Tensor | PendingNorm, weight: Tensor) -> Tensor:
    """SwiGLU of a fused [gate | up] projection weight [2I, in]: silu_mul(linear(x, weight)) [..., I].
    One launch where the skinny GEMM takes the product and keeps K in one range (its SwiGLU
    epilogue, `skinny_swiglu`: the 27B MLPs); the product and silu_mul otherwise."""
    rows = _skinny_rows(x, weight)
    if rows:
        from lumotree.model.fused.skinny_gemm import SkinnyConfig, skinny_swiglu

        n2, k = weight.shape
        if SkinnyConfig.for_shape(n2, k, x.device, x.dtype).splits == 1:
            flat, norm = _rows_of(x, rows)
            y = skinny_swiglu(flat, weight.contiguous(), in_norm=norm)
            return y.view(*x.shape[:-1], n2 // 2)
    return silu_mul(linear(x, weight))


class Linear(nn.Linear):
    """A bias-free nn.Linear (same parameters and checkpoint names) whose product is `linear`."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features, bias=False)

    def forward(self, x: Tensor | PendingNorm) -> Tensor:
        return linear(x, self.weight)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Zero-centred RMSNorm (reference.rms_norm)."""
    return (_kernels() if kernels_for(x) else reference).rms_norm(x, weight, eps)


def add_rms_norm(h: Tensor, delta: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """Residual add and pre-norm (reference.add_rms_norm)."""
    return (_kernels() if kernels_for(h) else reference).add_rms_norm(h, delta, weight, eps)


def mtp_inputs(
    table: Tensor, tokens: Tensor, hidden: Tensor, w_embed: Tensor, w_hidden: Tensor, eps: float
) -> Tensor:
    """The MTP fc's input (reference.mtp_inputs): one launch on the fused path, where the embedding
    gather, two norms and a concatenation were four. The reference wherever autograd would track
    the table or the norm weights (the kernel has no backward)."""
    tracked = torch.is_grad_enabled() and any(t.requires_grad for t in (table, w_embed, w_hidden))
    ops = _kernels() if kernels_for(hidden) and not tracked else reference
    return ops.mtp_inputs(table, tokens, hidden, w_embed, w_hidden, eps)


def gated_rms_norm(x: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    """GDN output norm (reference.gated_rms_norm)."""
    return (_kernels() if kernels_for(x) else reference).gated_rms_norm(x, gate, weight, eps)


def norm_rope(x: Tensor, weight: Tensor, eps: float, cos: Tensor, sin: Tensor) -> Tensor:
    """q/k norm + partial RoPE (reference.norm_rope)."""
    return (_kernels() if kernels_for(x) else reference).norm_rope(x, weight, eps, cos, sin)


def norm_rope_pair(
    q: Tensor, q_weight: Tensor, k: Tensor, k_weight: Tensor, eps: float, cos: Tensor, sin: Tensor
) -> tuple[Tensor, Tensor]:
    """Attention's q and k norms + partial RoPE, one launch on the fused path (reference.norm_rope
    of each)."""
    if kernels_for(q):
        return _kernels().norm_rope_pair(q, q_weight, k, k_weight, eps, cos, sin)
    return reference.norm_rope(q, q_weight, eps, cos, sin), reference.norm_rope(k, k_weight, eps, cos, sin)


def silu_mul(gate_up: Tensor) -> Tensor:
    """SwiGLU activation of a fused [gate | up] projection (reference.silu_mul)."""
    return (_kernels() if kernels_for(gate_up) else reference).silu_mul(gate_up)


def sigmoid_mul(x: Tensor, gate: Tensor) -> Tensor:
    """Attention output gate (reference.sigmoid_mul)."""
    return (_kernels() if kernels_for(x) else reference).sigmoid_mul(x, gate)
