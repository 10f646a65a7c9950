"""Skinny GEMM at Qwen3.5-27B projection shapes on a CUDA GPU (bf16, compiled kernel, float64 reference).

Run on the device machine with: TRITON_INTERPRET=0 pytest -m gpu tests/kernel_tests/test_gpu_skinny_gemm.py
"""

from __future__ import annotations

import functools

import pytest
import torch

from lumotree.model.fused.elementwise import silu_mul
from lumotree.model.fused.skinny_gemm import (
    SkinnyConfig,
    skinny_linear,
    skinny_linear_normed,
    skinny_swiglu,
    split_counts,
)
from lumotree.verify.graphs import CapturedStage

from .helpers import GPU_ONLY, assert_written, poisoned

pytestmark = GPU_ONLY
CUDA = torch.device("cuda")
# (N, K): QKV + gate of full attention and GDN, the MLP's gate-up, the lm_head; the two down projections.
SHAPES = [(16480, 5120), (14336, 5120), (34816, 5120), (248320, 5120), (5120, 6144), (5120, 17408)]
ROWS = [1, 6, 32]


@functools.lru_cache(maxsize=1)
def _weights(n: int, k: int) -> torch.Tensor:
    gen = torch.Generator(device=CUDA).manual_seed(n + k)
    return (0.02 * torch.randn(n, k, generator=gen, device=CUDA)).to(torch.bfloat16)


def _rows(m: int, k: int) -> torch.Tensor:
    gen = torch.Generator(device=CUDA).manual_seed(m)
    return torch.randn(m, k, generator=gen, device=CUDA).to(torch.bfloat16)


@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("m", ROWS)
def test_skinny_linear_matches_float64_at_qwen_shapes(n: int, k: int, m: int) -> None:
    w, x = _weights(n, k), _rows(m, k)
    y = poisoned((m, n), torch.bfloat16, CUDA)
    skinny_linear(x, w, out=y)
    assert_written(y)
    expected = x.double() @ w.double().t()
    error = torch.linalg.norm(y.double() - expected) / torch.linalg.norm(expected)
    assert error < 1e-2, f"relative Frobenius error {float(error):.2e}"


@pytest.mark.parametrize("m", ROWS)
def test_fp32_outputs_keep_the_accumulators_at_the_27b_vocabulary(m: int) -> None:
    # the engine's logits: bf16 operands, fp32 accumulation written without rounding to bf16
    w, x = _weights(248320, 5120), _rows(m, 5120)
    y = poisoned((m, 248320), torch.float32, CUDA)
    skinny_linear(x, w, out=y, out_dtype=torch.float32)
    assert_written(y)
    expected = x.double() @ w.double().t()
    error = torch.linalg.norm(y.double() - expected) / torch.linalg.norm(expected)
    assert error < 1e-4, f"relative Frobenius error {float(error):.2e}"


# Expected to hold on the GPU: every row tile is the same [BLOCK_N, BLOCK_K] x [BLOCK_K, 16] dot in the
# same K order for every M, and an MMA computes each output element from its own row and column only.
# What is not documented is that the tensor core's per-element sum order is the same in every column
# of the tile, hence row 31 (column 15 of the second tile) against the 1-row call (column 0).
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("row", [0, 31])
def test_a_row_of_32_equals_the_one_row_call_bitwise(n: int, k: int, row: int) -> None:
    w, x = _weights(n, k), _rows(32, k)
    batch = skinny_linear(x, w)
    single = skinny_linear(x[row : row + 1].clone(), w)
    assert torch.equal(batch[row : row + 1], single)


@pytest.mark.parametrize(("n", "k"), [(16480, 5120), (5120, 6144)])
def test_fp32_operands_keep_fp32_accuracy_and_row_invariance(n: int, k: int) -> None:
    # fp32 runs three TF32 products (tf32x3): fp32-level error, the same bits for a row at any M
    w, x = _weights(n, k).float(), _rows(32, k).float()
    for m in ROWS:
        y = skinny_linear(x[:m], w)
        expected = x[:m].double() @ w.double().t()
        error = torch.linalg.norm(y.double() - expected) / torch.linalg.norm(expected)
        assert error < 1e-5, f"{m} rows: relative Frobenius error {float(error):.2e}"
        assert torch.equal(y[-1:], skinny_linear(x[m - 1 : m].clone(), w)), m


@pytest.mark.parametrize(("n", "k"), [(5120, 6144), (5120, 17408)])
def test_split_k_in_one_launch_gives_the_same_result_every_time(n: int, k: int) -> None:
    """The last K range of each output block sums the partials: 50 calls, eager and replayed in a
    CUDA graph, give one result bit for bit, and the per-block counts end at zero."""
    w, x = _weights(n, k), _rows(6, k)
    first = skinny_linear(x, w)
    for _ in range(20):
        assert torch.equal(skinny_linear(x, w), first)
    out = torch.empty_like(first)
    graph = CapturedStage(lambda: skinny_linear(x, w, out=out))
    for _ in range(30):
        out.fill_(float("nan"))
        graph.replay()
        assert torch.equal(out, first)
    cfg = SkinnyConfig.for_shape(n, k, CUDA)
    assert cfg.splits > 1
    assert int(split_counts(CUDA, -(-n // cfg.block_n)).abs().sum()) == 0


@pytest.mark.parametrize(("n", "k"), [(5120, 17408), (16480, 5120)])
@pytest.mark.parametrize("m", ROWS)
def test_the_residual_epilogue_has_the_bits_of_the_product_then_the_add(n: int, k: int, m: int) -> None:
    """The MLP's down projection adds the residual as it stores (a split shape and an unsplit one):
    bf16 outputs equal to the product stored and then added by PyTorch, bit for bit."""
    w, x = _weights(n, k), _rows(m, k)
    residual = _rows(m + 100, n)[:m]
    y = poisoned((m, n), torch.bfloat16, CUDA)
    skinny_linear(x, w, out=y, residual=residual)
    assert_written(y)
    assert torch.equal(y, skinny_linear(x, w) + residual)


@pytest.mark.parametrize("m", ROWS)
def test_the_swiglu_epilogue_has_the_bits_of_the_product_then_silu_mul(m: int) -> None:
    """The 27B MLP's gate-up projection [2 x 17408, 5120] with the SwiGLU epilogue: the bits of the
    product (its 128-wide blocks) then silu_mul, and a row's bits whatever the rows beside it."""
    w, x = _weights(34816, 5120), _rows(32, 5120)[:m]
    y = poisoned((m, 17408), torch.bfloat16, CUDA)
    skinny_swiglu(x, w, out=y)
    assert_written(y)
    assert torch.equal(y, silu_mul(skinny_linear(x, w)))
    assert torch.equal(y[-1:], skinny_swiglu(x[m - 1 : m].clone(), w))


@pytest.mark.parametrize("producer", [(5120, 17408), (5120, 6144)], ids=["down", "output"])
def test_a_pending_norm_gives_a_row_the_same_bits_at_1_6_and_32_rows(producer: tuple[int, int]) -> None:
    """The producer-side pre-norm at the 27B shapes (fused/pending_norm.py): a down or output
    projection adds the residual and stores the next norm's operands, then the GDN input
    projection and the MLP's gate-up read them. Every row's h, scaled rows, block sums and both
    consumers' outputs have the one-row call's bits (the block sums run in one layout whatever the
    row tile), every output is written, and the consumers stay within bf16 rounding of float64."""
    n, k = producer
    w, x = _weights(n, k), _rows(32, k)
    residual, norm_weight = _rows(132, n)[100:], 0.3 * _rows(1, n)[0]
    wide, gate_up = _weights(16480, 5120), _weights(34816, 5120)

    def chain(rows: slice) -> tuple[torch.Tensor, ...]:
        h, pending = skinny_linear_normed(x[rows].clone(), w, residual[rows].clone(), norm_weight, 1e-6)
        out = skinny_linear(pending.scaled, wide, in_norm=pending)
        act = skinny_swiglu(pending.scaled, gate_up, in_norm=pending)
        return h, pending.scaled, pending.block_sums, out, act

    for m in ROWS:
        got = chain(slice(0, m))
        for t in got:
            assert_written(t)
        for row in {0, m - 1}:
            single = chain(slice(row, row + 1))
            for name, a, b in zip(("h", "scaled", "sums", "out", "act"), got, single, strict=True):
                assert torch.equal(a[row : row + 1], b), f"{m} rows, row {row}: {name}"
    h = got[0].double()
    normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + norm_weight.double())
    expected = normed @ wide.double().t()
    error = torch.linalg.norm(got[3].double() - expected) / torch.linalg.norm(expected)
    assert error < 1e-2, f"relative Frobenius error {float(error):.2e}"
