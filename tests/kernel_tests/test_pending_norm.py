"""The producer-side pre-norm (`fused/pending_norm.py`) in the skinny GEMM (interpreter, fp32): a
launch that adds the residual stores the next norm's operands, the launches that read them apply
the norm in their epilogue; against the PyTorch references, every output written, a row's bits
independent of the rows beside it (with the dot's order fixed). The model's forward that uses it:
tests/model/test_fused_path.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import Tensor

from lumotree.model.fused import skinny_gemm
from lumotree.model.fused.pending_norm import PendingNorm, pending_norm_reference
from lumotree.model.fused.skinny_gemm import SkinnyConfig, skinny_linear, skinny_linear_normed, skinny_swiglu
from lumotree.model.fused.skinny_gemm_reference import skinny_linear_reference

from .helpers import assert_written

K, N = 160, 150  # neither a multiple of the blocks: the last K step and output block are masked
EPS = 1e-6
UNSPLIT = SkinnyConfig(block_n=64, block_k=64, num_warps=4, num_stages=2)
SPLIT = SkinnyConfig(block_n=64, block_k=32, num_warps=4, num_stages=2, splits=3)


@pytest.fixture
def poisoned_allocations(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """torch.empty fills with NaN while the test runs (the skinny GEMM's launchers allocate their
    outputs with it), so an output element the kernel never writes fails `assert_written`."""

    def nan_empty(*shape: int, dtype: torch.dtype, device: torch.device | str) -> Tensor:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(skinny_gemm.torch, "empty", nan_empty)
    yield


def _producer_case(m: int, seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x, w = torch.randn(m, K, generator=gen), torch.randn(N, K, generator=gen) * 0.1
    residual, norm_weight = torch.randn(m, N, generator=gen), torch.randn(N, generator=gen) * 0.3
    return x, w, residual, norm_weight


@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("config", [UNSPLIT, SPLIT], ids=["unsplit", "split"])
@pytest.mark.parametrize("m", [1, 6, 17, 32])
def test_a_product_that_adds_the_residual_stores_the_next_norms_operands(
    m: int, config: SkinnyConfig
) -> None:
    x, w, residual, norm_weight = _producer_case(m, seed=m)
    h, pending = skinny_linear_normed(x, w, residual, norm_weight, EPS, config=config)
    for t in (h, pending.scaled, pending.block_sums):
        assert_written(t)
    assert torch.equal(h, skinny_linear(x, w, config=config, residual=residual))
    torch.testing.assert_close(h, skinny_linear_reference(x, w, residual), rtol=1e-5, atol=1e-5)
    want = pending_norm_reference(h, norm_weight, EPS, config.block_n)
    assert torch.equal(pending.scaled, want.scaled)  # one multiply an element: exact
    assert pending.block_sums.shape == (m, 3) and (m == 1 or pending.block_sums.stride() == (4, 1))
    torch.testing.assert_close(pending.block_sums, want.block_sums, rtol=1e-5, atol=1e-5)
    assert pending.eps == EPS


def _consumer_case(m: int, n: int, seed: int) -> tuple[PendingNorm, Tensor, Tensor]:
    """A pending norm of h [m, K] in blocks of 64 (as a producer leaves it), a weight [n, K], and the
    normalised rows h / rms(h) * (1 + w) computed in fp64."""
    gen = torch.Generator().manual_seed(seed)
    h, norm_weight = torch.randn(m, K, generator=gen) * 3, torch.randn(K, generator=gen) * 0.3
    w = torch.randn(n, K, generator=gen) * 0.1
    pending = pending_norm_reference(h, norm_weight, EPS, 64)
    hd = h.double()
    normed = hd * torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + EPS) * (1 + norm_weight.double())
    return pending, w, normed


@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("config", [UNSPLIT, SPLIT], ids=["unsplit", "split"])
@pytest.mark.parametrize("m", [1, 6, 17, 32])
def test_a_product_applies_the_pending_norm_of_its_input_rows(m: int, config: SkinnyConfig) -> None:
    pending, w, normed = _consumer_case(m, 130, seed=10 + m)
    y = skinny_linear(pending.scaled, w, config=config, in_norm=pending)
    assert_written(y)
    torch.testing.assert_close(y.double(), normed @ w.double().t(), rtol=1e-4, atol=1e-4)
    # the same as the materialised rows' product, to fp32 rounding
    torch.testing.assert_close(
        y, skinny_linear(pending.materialize(), w, config=config), rtol=1e-5, atol=1e-5
    )


@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("m", [1, 6, 17, 32])
def test_the_swiglu_epilogue_applies_the_pending_norm_to_both_halves(m: int) -> None:
    pending, w, normed = _consumer_case(m, 200, seed=20 + m)
    y = skinny_swiglu(pending.scaled, w, config=UNSPLIT, in_norm=pending)
    assert_written(y)
    gate, up = (normed @ w.double().t()).chunk(2, dim=-1)
    torch.testing.assert_close(y.double(), torch.nn.functional.silu(gate) * up, rtol=1e-4, atol=1e-4)


# dot_in_k_order: the interpreter's tl.dot sums in k order, so the comparison is of the kernel's own
# arithmetic per row; the GPU test (test_gpu_skinny_gemm.py) checks the MMA's.
@pytest.mark.usefixtures("dot_in_k_order")
@pytest.mark.parametrize("config", [UNSPLIT, SPLIT], ids=["unsplit", "split"])
def test_a_rows_bits_through_producer_and_consumers_do_not_depend_on_the_row_count(
    config: SkinnyConfig,
) -> None:
    x, w, residual, norm_weight = _producer_case(32, seed=40)
    consumer = torch.randn(2 * 96, N, generator=torch.Generator().manual_seed(41)) * 0.1

    def chain(rows: slice) -> tuple[Tensor, ...]:  # each [rows, ...]
        h, pending = skinny_linear_normed(x[rows], w, residual[rows], norm_weight, EPS, config=config)
        out = skinny_linear(pending.scaled, consumer, config=UNSPLIT, in_norm=pending)
        act = skinny_swiglu(pending.scaled, consumer, config=UNSPLIT, in_norm=pending)
        return h, pending.scaled, pending.block_sums, out, act

    whole = chain(slice(None))
    names = ("h", "scaled", "sums", "out", "act")
    for i in (0, 5, 31):
        for name, got, want in zip(names, chain(slice(i, i + 1)), whole, strict=True):
            assert torch.equal(got, want[i : i + 1]), f"row {i}: {name}"


def test_bad_pending_norm_operands_raise_value_error() -> None:
    x, w, residual, norm_weight = _producer_case(3, seed=1)
    with pytest.raises(ValueError, match="norm weight must be"):
        skinny_linear_normed(x, w, residual, norm_weight[:-1], EPS)
    with pytest.raises(ValueError, match=r"1\.\.32 rows"):
        skinny_linear_normed(torch.randn(33, K), w, torch.randn(33, N), norm_weight, EPS)
    pending = PendingNorm(torch.randn(3, K), torch.zeros(3, 3, dtype=torch.float64), EPS)
    with pytest.raises(ValueError, match="block sums must be fp32"):
        skinny_linear(pending.scaled, w, in_norm=pending)
    pending = PendingNorm(torch.randn(3, K), torch.zeros(3, 3), EPS)  # rows 3 apart, not 4
    with pytest.raises(ValueError, match="strides"):
        skinny_linear(pending.scaled, w, in_norm=pending)
    with pytest.raises(ValueError, match="is not the pending norm's rows"):
        skinny_linear(torch.randn(4, K), w, in_norm=pending)


def test_above_32_rows_a_pending_norm_is_read_materialised() -> None:
    pending, w, normed = _consumer_case(40, 24, seed=3)
    torch.testing.assert_close(
        skinny_linear(pending.scaled, w, in_norm=pending).double(),
        normed @ w.double().t(),
        rtol=1e-4,
        atol=1e-4,
    )
