"""The GDN operands prepared once a node (`verify/gdn/prepare.py`) and in the tree conv's epilogue
(`fused_conv.conv_operands_`): against the PyTorch reference's `prepare_operands`, the fused conv
with the bits of the conv then the standalone preparation (the interpreter sums both in one order;
on the GPU each kernel's layout sets it: `test_gpu_scans.py`), every record written (interpreter,
NaN-poisoned records; inputs read in place as column slices of wider outputs)."""

from __future__ import annotations

import random

import pytest
import torch

from lumobench.checks.random_trees import random_tree
from lumotree.verify.conv.fused_conv import conv_operands_, tree_conv_
from lumotree.verify.gdn.common import empty_operands
from lumotree.verify.gdn.prepare import prepare_operands_
from lumotree.verify.gdn.reference import GateInputs, GdnInputs, GdnOperands, prepare_operands

from .helpers import assert_written, poisoned

FIELDS = ("q", "k", "v", "g", "beta")
#: (key heads, value heads, key dim, value dim): the shipped model's; a block holding q, k and v
#: with value heads not a power of two; key heads wider than a channel block's default
DIMS = [(2, 4, 64, 64), (1, 3, 16, 32), (1, 2, 512, 16)]
WIDTH = 4


def _poisoned_records(rows: int, heads: int, hv: int, dk: int, dv: int) -> GdnOperands:
    empty = empty_operands(rows, heads, hv, dk, dv, torch.device("cpu"))
    return GdnOperands(*(poisoned(tuple(getattr(empty, f).shape), torch.float32) for f in FIELDS))


def _gates(rows: int, hv: int, gen: torch.Generator, dtype: torch.dtype) -> GateInputs:
    """a, b as column slices of one wider output (the projection's), A_log and dt_bias."""
    wide = torch.randn(rows, 2 * hv + 5, generator=gen).to(dtype)
    return GateInputs(
        wide[:, 3 : 3 + hv],
        wide[:, 3 + hv : 3 + 2 * hv],
        torch.randn(hv, generator=gen),
        torch.randn(hv, generator=gen),
    )


def _split(y: torch.Tensor, heads: int, hv: int, dk: int, dv: int) -> tuple[torch.Tensor, ...]:
    """[R, C] -> q, k [R, H, K], v [R, HV, V]: column slices, not copies."""
    hk = heads * dk
    return (
        y[:, :hk].unflatten(1, (heads, dk)),
        y[:, hk : 2 * hk].unflatten(1, (heads, dk)),
        y[:, 2 * hk :].unflatten(1, (hv, dv)),
    )


def _assert_records_close(got: GdnOperands, expected: GdnOperands) -> None:
    for field in FIELDS:
        assert_written(getattr(got, field))
        # the sums of squares run in another order than torch's: a few ulps apart
        torch.testing.assert_close(getattr(got, field), getattr(expected, field), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("dims", DIMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prepared_operands_match_the_reference(dims: tuple[int, int, int, int], dtype: torch.dtype) -> None:
    heads, hv, dk, dv = dims
    rows = 7
    gen = torch.Generator().manual_seed(sum(dims))
    wide = torch.randn(rows, 2 * heads * dk + hv * dv + 9, generator=gen).to(dtype)
    q, k, v = _split(wide[:, 9:], heads, hv, dk, dv)
    gates = _gates(rows, hv, gen, dtype)
    x = GdnInputs(q, k, v, gates.a, gates.b, gates.A_log, gates.dt_bias)
    ops = _poisoned_records(rows, heads, hv, dk, dv)
    prepare_operands_(x, ops)
    _assert_records_close(ops, prepare_operands(x.map(torch.Tensor.contiguous)))


@pytest.mark.parametrize("dims", DIMS[:2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_conv_prepares_the_operands_of_its_own_output(
    dims: tuple[int, int, int, int], dtype: torch.dtype
) -> None:
    heads, hv, dk, dv = dims
    tree = random_tree("paper", random.Random(5))
    gen = torch.Generator().manual_seed(5)
    channels = 2 * heads * dk + hv * dv
    wide = torch.full((tree.rows, channels + 3), float("nan"), dtype=dtype)
    wide[:, 3:] = torch.randn(tree.rows, channels, generator=gen).to(dtype)
    x = wide[:, 3:]  # the projection's column slice (rows apart, NaN around them), read in place
    state = torch.randn(channels, WIDTH - 1, generator=gen).to(dtype)
    weight = torch.randn(channels, WIDTH, generator=gen)
    gates = _gates(tree.rows, hv, gen, dtype)
    record = poisoned((tree.rows, channels), dtype)
    ops = _poisoned_records(tree.rows, heads, hv, dk, dv)
    conv_operands_(x, state, weight, tree.conv_gather, gates, record, ops)
    assert torch.equal(record, x), "the record holds the conv's inputs"

    y = torch.empty(tree.rows, channels, dtype=dtype)
    tree_conv_(x, state, weight, None, tree.conv_gather, y)
    q, k, v = _split(y, heads, hv, dk, dv)
    unfused = _poisoned_records(tree.rows, heads, hv, dk, dv)
    prepare_operands_(GdnInputs(q, k, v, gates.a, gates.b, gates.A_log, gates.dt_bias), unfused)
    for field in FIELDS:
        assert_written(getattr(ops, field))
        assert torch.equal(getattr(ops, field), getattr(unfused, field)), field
    raw = GdnInputs(q, k, v, gates.a, gates.b, gates.A_log, gates.dt_bias)
    _assert_records_close(ops, prepare_operands(raw.map(torch.Tensor.contiguous)))


def test_the_conv_refuses_inputs_records_and_buffers_that_do_not_fit() -> None:
    tree = random_tree("chain", random.Random(1))
    heads, hv, dk, dv = DIMS[1]
    channels = 2 * heads * dk + hv * dv
    gates = _gates(tree.rows, hv, torch.Generator().manual_seed(1), torch.float32)
    ops = _poisoned_records(tree.rows, heads, hv, dk, dv)

    def conv(x: torch.Tensor, record: torch.Tensor, records: GdnOperands) -> None:
        width = x.shape[1]
        state, weight = torch.zeros(width, WIDTH - 1), torch.zeros(width, WIDTH)
        conv_operands_(x, state, weight, tree.conv_gather, gates, record, records)

    x = torch.randn(tree.rows, channels)
    with pytest.raises(ValueError, match=r"must be \[q \| k \| v\]"):
        wider = torch.randn(tree.rows, channels + 1)
        conv(wider, torch.empty_like(wider), ops)
    with pytest.raises(ValueError, match="conv input record"):
        conv(x, torch.empty(tree.rows, channels - 1), ops)
    with pytest.raises(ValueError, match="records g must be float32"):
        conv(x, torch.empty_like(x), GdnOperands(ops.q, ops.k, ops.v, ops.g.double(), ops.beta))
    with pytest.raises(ValueError, match="records v"):
        conv(x, torch.empty_like(x), GdnOperands(ops.q, ops.k, ops.v[:, :1], ops.g, ops.beta))
    assert ops.v.isnan().all(), "nothing written by a refused call"
