"""Triton skinny GEMM vs the PyTorch reference, batch invariance (with the dot's order fixed) and operand
checks (interpreter, fp32)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import Tensor

from lumotree.model.fused import elementwise, ops, skinny_gemm
from lumotree.model.fused.skinny_gemm import (
    SkinnyConfig,
    beats_cublas,
    skinny_linear,
    skinny_swiglu,
    split_counts,
)
from lumotree.model.fused.skinny_gemm_reference import skinny_linear_reference

from .helpers import assert_written, poisoned

K = 160  # not a multiple of BLOCK_K: the last K step is masked
CONFIG = SkinnyConfig(block_n=64, block_k=64, num_warps=4, num_stages=2)  # tiny: few interpreted steps


def _case(m: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(m, K, generator=gen), torch.randn(n, K, generator=gen)


def _into_poisoned_output(x: torch.Tensor, w: torch.Tensor, config: SkinnyConfig | None = None) -> Tensor:
    """skinny_linear into a poisoned output, which must be wholly written and match the reference."""
    y = poisoned((x.shape[0], w.shape[0]), torch.float32)
    assert skinny_linear(x, w, out=y, config=config) is y
    assert_written(y)
    torch.testing.assert_close(y, skinny_linear_reference(x, w), rtol=1e-5, atol=1e-5)
    return y


@pytest.mark.parametrize(("m", "n"), [(1, 96), (5, 200), (16, 130), (32, 150)])
def test_skinny_linear_matches_reference(m: int, n: int) -> None:
    x, w = _case(m, n, seed=m * 1000 + n)
    _into_poisoned_output(x, w, CONFIG)


def test_skinny_linear_reads_strided_rows_of_x_and_allocates_its_output() -> None:
    gen = torch.Generator().manual_seed(3)
    wide = torch.randn(7, 2 * K + 8, generator=gen)
    x = wide[:, 8 : 8 + K]  # row stride 2K + 8, columns contiguous
    w = torch.randn(100, K, generator=gen)
    y = skinny_linear(x, w, config=CONFIG)
    assert y.shape == (7, 100) and y.dtype == torch.float32
    torch.testing.assert_close(y, skinny_linear_reference(x, w), rtol=1e-5, atol=1e-5)


def test_default_config_covers_a_shape_that_is_not_a_tile_multiple() -> None:
    x, w = _case(3, 90, seed=11)
    _into_poisoned_output(x, w)


# dot_in_k_order: the interpreter's tl.dot is numpy's matmul, whose order follows the CPU's BLAS kernel
# and a row's column in its 16-row tile; with the order fixed, what is compared is the kernel's own
# arithmetic per row (the same K steps, tiles and splits for every M). The GPU test checks the MMA.
@pytest.mark.usefixtures("dot_in_k_order")
@pytest.mark.parametrize("m", [5, 17, 32])
def test_each_row_equals_the_one_row_call_bitwise(m: int) -> None:
    x, w = _case(m, 130, seed=50 + m)
    batch = skinny_linear(x, w, config=CONFIG)
    for i in range(m):
        assert torch.equal(batch[i : i + 1], skinny_linear(x[i : i + 1], w, config=CONFIG)), f"row {i}"


def test_bf16_operands_can_write_fp32_outputs_above_32_rows_too() -> None:
    # (the interpreter's tl.dot multiplies bf16 bit patterns: the kernel's bf16 -> fp32 products are
    # checked on the GPU, test_gpu_skinny_gemm.py; here the fallback and the checks)
    x, w = (t.to(torch.bfloat16) for t in _case(33, 70, seed=61))
    y = poisoned((33, 70), torch.float32)
    assert skinny_linear(x, w, out=y, out_dtype=torch.float32) is y
    assert_written(y)
    torch.testing.assert_close(y, skinny_linear_reference(x.float(), w.float()), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="output dtype"):
        skinny_linear(x[:3], w, out_dtype=torch.float16)
    with pytest.raises(ValueError, match="out must be"):
        skinny_linear(x[:3], w, out=torch.zeros(3, 70, dtype=torch.bfloat16), out_dtype=torch.float32)


def test_more_than_32_rows_fall_back_to_f_linear() -> None:
    x, w = _case(33, 40, seed=9)
    _into_poisoned_output(x, w)


@pytest.mark.parametrize(
    ("x", "w", "out", "message"),
    [
        (torch.zeros(2, K), torch.zeros(8, K + 1), None, "K=160"),
        (torch.zeros(2, K), torch.zeros(K, 8).t(), None, "contiguous"),
        (torch.zeros(K, 2).t(), torch.zeros(8, K), None, "stride"),
        (torch.zeros(2, K), torch.zeros(8, K, dtype=torch.float64), None, "bfloat16 or float32"),
        (torch.zeros(2, K, dtype=torch.float16), torch.zeros(8, K, dtype=torch.float16), None, "bfloat16"),
        (torch.zeros(2, K), torch.zeros(8, K), torch.zeros(2, 9), r"out must be \[2, 8\]"),
        (torch.zeros(K), torch.zeros(8, K), None, "2-D"),
    ],
)
def test_bad_operands_raise_value_error(
    x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        skinny_linear(x, w, out=out, config=CONFIG)


def test_for_shape_fills_the_sms_with_wide_blocks_or_k_splits() -> None:
    sms = 132
    for n, k in ((16480, 5120), (14336, 5120), (34816, 5120), (248320, 5120), (5120, 6144), (5120, 17408)):
        cfg = SkinnyConfig.for_shape(n, k, "cpu")
        programs = -(-n // cfg.block_n) * cfg.splits
        assert programs >= 1.6 * sms, (n, k, cfg)
        assert cfg.block_n * cfg.block_k * 2 <= 16 * 1024, (n, k, cfg)
        assert (cfg.splits > 1) == (n == 5120), (n, k, cfg)
        if cfg.splits > 1:  # every program of a split launch on the SMs at once (3 an SM fit at 32 rows)
            assert programs <= 3 * sms, (n, k, cfg)
            assert k // (cfg.block_k * cfg.splits) >= 8, (n, k, cfg)


SPLIT = SkinnyConfig(block_n=64, block_k=32, num_warps=4, num_stages=2, splits=3)  # K ranges 64, 64, 32


@pytest.mark.usefixtures("dot_in_k_order")  # for the rows' bitwise invariance, as above
@pytest.mark.parametrize(("m", "n"), [(1, 70), (20, 130)])
def test_split_k_sums_its_partials_to_the_reference(m: int, n: int) -> None:
    x, w = _case(m, n, seed=7 * m + n)
    y = _into_poisoned_output(x, w, SPLIT)
    for i in (0, m - 1):
        assert torch.equal(y[i : i + 1], skinny_linear(x[i : i + 1], w, config=SPLIT)), f"row {i}"


def test_split_k_sums_the_ranges_in_order_and_leaves_its_counts_zeroed() -> None:
    """The last K range to finish sums every range's partials in split order: the result equals the
    three ranges computed apart and added left to right, and the per-block counts are 0 again."""
    m, n = 3, 150
    x, w = _case(m, n, seed=11)
    y = poisoned((m, n), torch.float32)
    skinny_linear(x, w, out=y, config=SPLIT)
    ranges = [(0, 64), (64, 128), (128, K)]
    whole = replace(SPLIT, splits=1)  # the same K steps, one range
    parts = [skinny_linear(x[:, a:b].contiguous(), w[:, a:b].contiguous(), config=whole) for a, b in ranges]
    assert torch.equal(y, (parts[0] + parts[1]) + parts[2])
    blocks = -(-n // SPLIT.block_n)
    assert int(split_counts(torch.device("cpu"), blocks).abs().sum()) == 0
    again = skinny_linear(x, w, config=SPLIT)
    assert torch.equal(again, y)


def test_the_skinny_kernel_is_chosen_only_where_it_beat_cublas() -> None:
    cpu = torch.device("cpu")
    for n, k in ((16480, 5120), (14336, 5120), (34816, 5120), (248320, 5120), (5120, 17408)):
        assert beats_cublas(n, k, cpu, torch.bfloat16), (n, k)
    assert not beats_cublas(5120, 6144, cpu, torch.bfloat16)


@pytest.mark.parametrize(("m", "n", "config"), [(3, 150, CONFIG), (20, 130, SPLIT)])
def test_a_residual_is_added_as_the_product_stores_with_the_bits_of_the_add_after(
    m: int, n: int, config: SkinnyConfig
) -> None:
    """The epilogue's sum equals the product stored and then added to the residual, bit for bit, in
    the unsplit launch and in the split launch's final sum; every output element written."""
    x, w = _case(m, n, seed=13 * m + n)
    residual = torch.randn(m, n, generator=torch.Generator().manual_seed(m))
    y = poisoned((m, n), torch.float32)
    skinny_linear(x, w, out=y, config=config, residual=residual)
    assert_written(y)
    assert torch.equal(y, skinny_linear(x, w, config=config) + residual)
    torch.testing.assert_close(y, skinny_linear_reference(x, w, residual), rtol=1e-5, atol=1e-5)


def test_the_fallback_above_32_rows_adds_the_residual_too() -> None:
    x, w = _case(40, 24, seed=5)
    residual = torch.randn(40, 24, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(skinny_linear(x, w, residual=residual), x @ w.t() + residual)


@pytest.mark.parametrize(
    ("residual", "message"),
    [
        (torch.zeros(3, 9), r"residual must be \[3, 8\]"),
        (torch.zeros(3, 8, dtype=torch.float64), r"residual must be \[3, 8\] torch.float32"),
        (torch.zeros(8, 3).t(), "residual's rows must be contiguous"),
    ],
)
def test_a_bad_residual_raises_value_error(residual: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        skinny_linear(torch.zeros(3, K), torch.zeros(8, K), config=CONFIG, residual=residual)


def _swiglu_reference(x: Tensor, w: Tensor) -> Tensor:
    gate, up = skinny_linear_reference(x, w).chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


@pytest.mark.usefixtures("dot_in_k_order")
@pytest.mark.parametrize("m", [1, 6, 17, 32])
def test_the_swiglu_epilogue_has_the_bits_of_the_product_then_silu_mul(m: int) -> None:
    # a [gate | up] projection of 2 x 100 rows (100: not a multiple of the 32-wide halves' blocks)
    x, w = _case(m, 200, seed=70 + m)
    y = poisoned((m, 100), torch.float32)
    assert skinny_swiglu(x, w, config=CONFIG, out=y) is y
    assert_written(y)
    torch.testing.assert_close(y, _swiglu_reference(x, w), rtol=1e-4, atol=1e-4)
    assert torch.equal(y, elementwise.silu_mul(skinny_linear(x, w, config=CONFIG)))
    for i in (0, m - 1):  # a row's bits do not depend on the rows beside it
        assert torch.equal(y[i : i + 1], skinny_swiglu(x[i : i + 1], w, config=CONFIG)), f"row {i}"


@pytest.mark.parametrize(
    ("x", "w", "config", "message"),
    [
        (torch.randn(2, K), torch.randn(101, K), CONFIG, "gate | up"),
        (torch.randn(33, K), torch.randn(100, K), CONFIG, "1..32 rows"),
        (torch.randn(2, K), torch.randn(100, K), replace(CONFIG, splits=2), "one K range"),
    ],
)
def test_the_swiglu_epilogue_refuses_what_it_cannot_compute(
    x: Tensor, w: Tensor, config: SkinnyConfig, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        skinny_swiglu(x, w, config=config)


def test_the_fused_mlp_activation_takes_the_epilogue_where_k_stays_in_one_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # ops.linear_silu_mul on the fused path: one launch for a wide [gate | up] projection (its
    # for_shape config keeps K whole), the product then silu_mul for a narrow one; both the same
    # values as the unfused activation.
    epilogues: list[int] = []

    def counted(x: Tensor, w: Tensor, **options: object) -> Tensor:
        epilogues.append(w.shape[0])
        return skinny_swiglu(x, w, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(skinny_gemm, "skinny_swiglu", counted)
    gen = torch.Generator().manual_seed(8)
    for n, k, splits in ((2 * 16480, 256, 1), (2 * 96, 1024, 2)):  # wide halves; narrow ones split K
        assert SkinnyConfig.for_shape(n, k, "cpu", torch.float32).splits == splits
        x, w = torch.randn(3, k, generator=gen), torch.randn(n, k, generator=gen) * 0.05
        with ops.kernel_mode("always"):
            y = ops.linear_silu_mul(x, w)
        torch.testing.assert_close(y, _swiglu_reference(x, w), rtol=1e-4, atol=1e-4)
    assert epilogues == [2 * 16480]
