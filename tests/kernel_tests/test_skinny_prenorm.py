"""The skinny GEMM's RMSNorm prologue (`PreNorm`) under the interpreter: against its reference and
against the model's norm-then-product, the residual sum it stores, batch invariance with the dot's
order fixed, and what it refuses."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import Tensor

from lumotree.model.fused import reference
from lumotree.model.fused.skinny_gemm import PreNorm, SkinnyConfig, skinny_linear, skinny_swiglu
from lumotree.model.fused.skinny_gemm_reference import skinny_linear_reference, skinny_swiglu_reference

from .helpers import assert_written, poisoned

K = 160  # not a multiple of BLOCK_K: the last K step is masked
CONFIG = SkinnyConfig(block_n=64, block_k=64, num_warps=4, num_stages=2)
EPS = 1e-6


def _case(m: int, n: int, seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """x [m, K] off the unit scale (the norm has something to do), w [n, K], a norm weight, a delta."""
    gen = torch.Generator().manual_seed(seed)
    x = 3.0 * torch.randn(m, K, generator=gen) + 0.5
    w = torch.randn(n, K, generator=gen)
    return x, w, 0.1 * torch.randn(K, generator=gen), torch.randn(m, K, generator=gen)


@pytest.mark.parametrize("m", [1, 6, 17, 32])
@pytest.mark.parametrize("add", [False, True])
def test_the_prologue_computes_the_norm_then_the_product(m: int, add: bool) -> None:
    x, w, g, delta = _case(m, 130, seed=m + 100 * add)
    total = poisoned((m, K), torch.float32) if add else None
    norm = PreNorm(g, EPS, delta if add else None, total)
    y = poisoned((m, 130), torch.float32)
    skinny_linear(x, w, out=y, config=CONFIG, norm=norm)
    assert_written(y)
    read = x + delta if add else x
    if total is not None:
        assert_written(total)
        assert torch.equal(total, read)
    torch.testing.assert_close(
        y, skinny_linear_reference(x, w, norm=(g, EPS, norm.delta)), rtol=1e-5, atol=1e-5
    )
    # the model's definition: the normed rows, then the product
    torch.testing.assert_close(y, reference.rms_norm(read, g, EPS) @ w.t(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m", [1, 17])
def test_the_swiglu_epilogue_takes_the_prologue_too(m: int) -> None:
    x, w, g, delta = _case(m, 200, seed=7 * m)
    total = poisoned((m, K), torch.float32)
    y = poisoned((m, 100), torch.float32)
    skinny_swiglu(x, w, config=CONFIG, out=y, norm=PreNorm(g, EPS, delta, total))
    assert_written(y)
    assert_written(total)
    assert torch.equal(total, x + delta)
    torch.testing.assert_close(y, skinny_swiglu_reference(x, w, norm=(g, EPS, delta)), rtol=1e-4, atol=1e-4)
    gate, up = (reference.rms_norm(x + delta, g, EPS) @ w.t()).chunk(2, dim=-1)
    torch.testing.assert_close(y, torch.nn.functional.silu(gate) * up, rtol=1e-4, atol=1e-4)


@pytest.mark.usefixtures("dot_in_k_order")
@pytest.mark.parametrize("m", [6, 32])
def test_each_normed_row_equals_the_one_row_call_bitwise(m: int) -> None:
    x, w, g, delta = _case(m, 200, seed=30 + m)
    batch = skinny_swiglu(x, w, config=CONFIG, norm=PreNorm(g, EPS, delta, torch.empty(m, K)))
    for i in (0, m // 2, m - 1):
        one = PreNorm(g, EPS, delta[i : i + 1], torch.empty(1, K))
        assert torch.equal(batch[i : i + 1], skinny_swiglu(x[i : i + 1], w, config=CONFIG, norm=one)), (
            f"row {i}"
        )


def test_above_32_rows_the_norm_runs_before_f_linear() -> None:
    x, w, g, delta = _case(40, 24, seed=3)
    total = torch.empty(40, K)
    y = skinny_linear(x, w, norm=PreNorm(g, EPS, delta, total))
    assert torch.equal(total, x + delta)
    torch.testing.assert_close(y, reference.rms_norm(x + delta, g, EPS) @ w.t(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("norm", "config", "message"),
    [
        (PreNorm(torch.zeros(K - 1), EPS), CONFIG, r"norm weight must be \[160\]"),
        (PreNorm(torch.zeros(K), EPS, torch.zeros(3, K)), CONFIG, "delta and total come together"),
        (
            PreNorm(torch.zeros(K), EPS, torch.zeros(3, K), torch.zeros(2, K)),
            CONFIG,
            r"total must be \[3, 160\]",
        ),
        (PreNorm(torch.zeros(K), EPS), replace(CONFIG, splits=2), "one K range"),
    ],
)
def test_a_prologue_that_does_not_fit_raises_value_error(
    norm: PreNorm, config: SkinnyConfig, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        skinny_linear(torch.zeros(3, K), torch.zeros(8, K), config=config, norm=norm)
