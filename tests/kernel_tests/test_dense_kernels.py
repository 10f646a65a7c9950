"""The model's dense elementwise Triton kernels (model/fused/elementwise.py) vs their PyTorch
references (interpreter, fp32 and fp16): strided inputs as fused projections give them, outputs
poisoned, and batch invariance (a row's result does not depend on the other rows)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from lumotree.model.fused import elementwise as kernels
from lumotree.model.fused import reference as ref
from lumotree.model.rope import RotaryEmbedding

from .helpers import assert_written

EPS = 1e-6
DTYPES = [torch.float32, torch.float16]
pytestmark = pytest.mark.usefixtures("poisoned_outputs")  # every kernel output starts as NaN
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3)}


def _columns(gen: torch.Generator, rows: int, width: int, offset: int, dtype: torch.dtype) -> Tensor:
    """[1, rows, width] as a column slice of a wider projection output (row stride > width)."""
    wide = torch.randn(1, rows, offset + width + 5, generator=gen).to(dtype)
    return wide[..., offset : offset + width]


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_and_add_rms_norm_match_reference(
    dtype: torch.dtype, poisoned_outputs: list[Tensor]
) -> None:
    gen = torch.Generator().manual_seed(1)
    h = _columns(gen, 5, 48, 7, dtype)
    delta = _columns(gen, 5, 48, 3, dtype)
    w = torch.randn(48, generator=gen).to(dtype)
    torch.testing.assert_close(kernels.rms_norm(h, w, EPS), ref.rms_norm(h, w, EPS), **TOL[dtype])
    total, y = kernels.add_rms_norm(h, delta, w, EPS)
    want_total, want_y = ref.add_rms_norm(h, delta, w, EPS)
    assert torch.equal(total, want_total)  # the add rounds once, as the reference's
    torch.testing.assert_close(y, want_y, **TOL[dtype])
    for out in poisoned_outputs:
        assert_written(out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weight_dtype", ["same", "fp32"])
def test_gated_rms_norm_matches_reference(
    dtype: torch.dtype, weight_dtype: str, poisoned_outputs: list[Tensor]
) -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(1, 3, 4, 16, generator=gen).to(dtype)
    z = _columns(gen, 3, 64, 10, dtype).view(1, 3, 4, 16)
    w = torch.randn(16, generator=gen).to(dtype if weight_dtype == "same" else torch.float32)
    torch.testing.assert_close(
        kernels.gated_rms_norm(x, z, w, EPS), ref.gated_rms_norm(x, z, w, EPS), **TOL[dtype]
    )
    assert_written(poisoned_outputs[-1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_rope_matches_reference_on_a_strided_query(
    dtype: torch.dtype, poisoned_outputs: list[Tensor]
) -> None:
    gen = torch.Generator().manual_seed(3)
    heads, dim, rows = 3, 32, 4
    q_gate = _columns(gen, rows, heads * 2 * dim, 6, dtype).reshape(1, rows, heads, 2 * dim)
    q = q_gate[..., :dim]  # the query half of a [query | gate] head: strided heads and rows
    w = torch.randn(dim, generator=gen).to(dtype)
    cos, sin = RotaryEmbedding(8, 10000.0)(torch.tensor([[3, 9, 4, 100]]))
    got = kernels.norm_rope(q, w, EPS, cos, sin)
    torch.testing.assert_close(got, ref.norm_rope(q, w, EPS, cos, sin), **TOL[dtype])
    assert_written(poisoned_outputs[-1])
    table = torch.stack([cos[0], sin[0]], dim=1)  # [T, 2, rot]: cos/sin as row-strided views
    assert torch.equal(kernels.norm_rope(q, w, EPS, table[None, :, 0], table[None, :, 1]), got)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_and_sigmoid_mul_match_reference(dtype: torch.dtype, poisoned_outputs: list[Tensor]) -> None:
    gen = torch.Generator().manual_seed(4)
    gate_up = _columns(gen, 3, 2 * 40, 2, dtype)
    torch.testing.assert_close(kernels.silu_mul(gate_up), ref.silu_mul(gate_up), **TOL[dtype])
    attn = torch.randn(1, 3, 2, 16, generator=gen).to(dtype)
    gate = _columns(gen, 3, 2 * 32, 0, dtype).view(1, 3, 2, 32)[..., 16:]
    torch.testing.assert_close(kernels.sigmoid_mul(attn, gate), ref.sigmoid_mul(attn, gate), **TOL[dtype])
    for out in poisoned_outputs:
        assert_written(out)


@pytest.mark.parametrize("dtype", DTYPES)
def test_mtp_inputs_gathers_and_normalises_both_halves_like_the_reference(
    dtype: torch.dtype, poisoned_outputs: list[Tensor]
) -> None:
    gen = torch.Generator().manual_seed(6)
    table = torch.randn(50, 48, generator=gen).to(dtype)
    tokens = torch.tensor([[49, 0, 7, 7, 23]])
    hidden = _columns(gen, 5, 48, 9, dtype)  # strided rows, as the drafter's queued rows may be
    w_e, w_h = (torch.randn(48, generator=gen).to(dtype) for _ in range(2))
    got = kernels.mtp_inputs(table, tokens, hidden, w_e, w_h, EPS)
    want = ref.mtp_inputs(table, tokens, hidden, w_e, w_h, EPS)
    assert got.shape == (1, 5, 96)
    torch.testing.assert_close(got, want, **TOL[dtype])
    # each half has the bits of the rms_norm kernel on its rows
    assert torch.equal(got[..., :48], kernels.rms_norm(table[tokens], w_e, EPS))
    assert torch.equal(got[..., 48:], kernels.rms_norm(hidden, w_h, EPS))
    assert_written(poisoned_outputs[0])


def test_mtp_inputs_refuses_operands_that_do_not_match() -> None:
    table, hidden, w = torch.randn(10, 8), torch.randn(1, 2, 8), torch.zeros(8)
    with pytest.raises(ValueError, match="do not match"):
        kernels.mtp_inputs(table, torch.tensor([[1, 2, 3]]), hidden, w, w, EPS)
    with pytest.raises(ValueError, match="do not match"):
        kernels.mtp_inputs(table.half(), torch.tensor([[1, 2]]), hidden, w, w, EPS)


def _row_by_row(op: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    return torch.cat([op(x[:, i : i + 1]) for i in range(x.shape[1])], dim=1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_rope_pair_has_the_bits_of_two_launches(
    dtype: torch.dtype, poisoned_outputs: list[Tensor]
) -> None:
    # attention's queries (the query half of [query | gate] heads) and keys (a column slice of the
    # fused projection) in one launch, each with its own heads and weight
    gen = torch.Generator().manual_seed(4)
    heads, kv_heads, dim, rows = 6, 2, 32, 5
    q = _columns(gen, rows, heads * 2 * dim, 3, dtype).reshape(1, rows, heads, 2 * dim)[..., :dim]
    k = _columns(gen, rows, kv_heads * dim, 9, dtype).reshape(1, rows, kv_heads, dim)
    wq, wk = (torch.randn(dim, generator=gen).to(dtype) for _ in range(2))
    cos, sin = RotaryEmbedding(8, 10000.0)(torch.tensor([[3, 9, 4, 100, 7]]))
    got_q, got_k = kernels.norm_rope_pair(q, wq, k, wk, EPS, cos, sin)
    for out in poisoned_outputs[-2:]:
        assert_written(out)
    assert torch.equal(got_q, kernels.norm_rope(q, wq, EPS, cos, sin))
    assert torch.equal(got_k, kernels.norm_rope(k, wk, EPS, cos, sin))
    torch.testing.assert_close(got_k, ref.norm_rope(k, wk, EPS, cos, sin), **TOL[dtype])
    with pytest.raises(ValueError, match="not the same rows"):
        kernels.norm_rope_pair(q, wq, k[:, :2], wk, EPS, cos, sin)


def test_every_row_normalises_the_same_whatever_the_rows_beside_it() -> None:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, 6, 200, generator=gen) * 3
    w = torch.randn(200, generator=gen)
    cos, sin = RotaryEmbedding(8, 10000.0)(torch.arange(6)[None])
    heads = x[..., :192].reshape(1, 6, 6, 32)
    ops: list[Callable[[Tensor], Tensor]] = [
        lambda t: kernels.rms_norm(t, w, EPS),
        lambda t: kernels.silu_mul(t),
    ]
    for op in ops:
        assert torch.equal(op(x), _row_by_row(op, x))
    per_row = torch.cat(
        [
            kernels.norm_rope(heads[:, i : i + 1], w[:32], EPS, cos[:, i : i + 1], sin[:, i : i + 1])
            for i in range(6)
        ],
        dim=1,
    )
    assert torch.equal(kernels.norm_rope(heads, w[:32], EPS, cos, sin), per_row)


def test_add_rms_norm_refuses_mismatched_operands() -> None:
    h = torch.randn(1, 2, 8)
    with pytest.raises(ValueError, match="residual"):
        kernels.add_rms_norm(h, torch.randn(1, 2, 8, dtype=torch.float64), torch.zeros(8), EPS)
