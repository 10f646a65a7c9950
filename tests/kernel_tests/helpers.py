"""Shared helpers for the kernel parity tests: poisoned outputs, walk-friendly scores and the hard
GDN case for the tree-parallel solves."""

from __future__ import annotations

import os

import pytest
import torch
from torch import Tensor

from lumobench.checks import gdn_checks
from lumobench.checks.paired import paired_check_envelope
from lumotree.tree import TreeDescriptor
from lumotree.verify.gdn import reference as ref
from lumotree.verify.gdn.reference import GdnOperands

INT_POISON = -777
# The marks of every test that needs a CUDA GPU and compiled (not interpreted) Triton kernels.
GPU_ONLY = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
        reason="needs a CUDA GPU and compiled (not interpreted) Triton kernels",
    ),
]


def poisoned(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> Tensor:
    """An output buffer no kernel would write by accident: NaN for floats, INT_POISON for ints."""
    fill = float("nan") if dtype.is_floating_point else INT_POISON
    return torch.full(shape, fill, dtype=dtype, device=device)


def assert_written(t: Tensor) -> None:
    """Every element was written (no NaN / INT_POISON left)."""
    bad = torch.isnan(t) if t.is_floating_point() else t == INT_POISON
    assert not bool(bad.any()), f"{int(bad.sum())} of {t.numel()} elements were never written"


def deep_walk_scores(tree: TreeDescriptor, vocab: int, gen: torch.Generator, boost: float = 4.0) -> Tensor:
    """Random logits [R, V] that favour one child token per row, so walks descend several levels."""
    logits = torch.randn(tree.rows, vocab, generator=gen)
    for row in range(tree.rows):
        tokens = tree.child_tokens[row][tree.child_tokens[row] >= 0]
        if len(tokens):
            pick = tokens[torch.randint(len(tokens), (1,), generator=gen)]
            logits[row, pick] += boost
    return logits


def parallel_keys_case(
    tree: TreeDescriptor, dims: gdn_checks.GdnDims, gen: torch.Generator
) -> gdn_checks.GdnCase:
    """The hard case for a tree-parallel solve: nearly parallel keys (cosine ~0.997), no decay and
    beta ~1, so every power of the ancestry matrix A matters along the deepest path."""
    base = gdn_checks.make_case(tree, dims, gen)
    q, k, v, a, _ = base.raw
    key = torch.randn(1, dims.H, dims.K, generator=gen, dtype=torch.float64)
    k = key + 0.05 * torch.randn(k.shape, generator=gen, dtype=torch.float64)
    b = torch.full_like(a, 8.0)
    return gdn_checks.GdnCase(
        tree, (q, k, v, a, b), torch.full_like(base.A_log, -20.0), base.dt_bias, base.state
    )


def assert_gdn_matches_reference(o: Tensor, ops: GdnOperands, case: gdn_checks.GdnCase) -> None:
    """Outputs within the paired rule's envelope form of the float64 truth, padding rows zero, every
    record written. The bound follows the fp32 reference's own error here (C_PAIRED times its
    largest cell error, plus the rounding floor), not a tolerance measured on one CPU: under the
    interpreter the kernel's dots sum in the order of the CPU's BLAS kernel, the reference's in
    torch's, so the two round independently and their errors are draws of one size."""
    n = case.tree.n_active
    expected = ref.gdn_verify(*case.inputs(torch.float32), case.tree)
    truth, _ = ref.gdn_sequential_reference(*case.truth(torch.float32), case.tree)
    assert_written(o)
    (result,) = paired_check_envelope([(o[:n], expected.o[:n], truth[:n])], 2, torch.float32)
    assert result.ok, result
    assert bool((o[n:] == 0).all()), "padding rows must be zero"
    for field in ("q", "k", "v", "g", "beta"):
        got = getattr(ops, field)[:n]
        assert_written(got)
        torch.testing.assert_close(got, getattr(expected.operands, field)[:n], rtol=1e-5, atol=1e-5)
