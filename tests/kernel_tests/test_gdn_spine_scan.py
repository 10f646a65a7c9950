"""The GDN spine scan (`verify/gdn/spine_scan.py`): every output and record bit for bit the row
scan's on random trees of every shape (so the one-row step's bits, which the row scan's tests pin),
against the PyTorch reference, and its scratch checked (interpreter, NaN-poisoned outputs and
records)."""

from __future__ import annotations

import random

import pytest
import torch

from lumobench.checks import gdn_checks
from lumobench.checks.random_trees import SHAPES, random_tree
from lumotree.verify.device_tree import DeviceTree
from lumotree.verify.gdn.common import empty_operands
from lumotree.verify.gdn.reference import GdnInputs, GdnOperands
from lumotree.verify.gdn.row_scan import gdn_rows_
from lumotree.verify.gdn.spine_scan import cut_buffer, gdn_spine_rows_

from .helpers import assert_gdn_matches_reference, poisoned

DIMS = gdn_checks.GdnDims(H=1, HV=2, K=16, V=16)  # one key head, two value heads: grouped, cheap
#: the default run's trees (the paper tree and a deep, wide one); the other shapes are slow-marked
QUICK = {"paper", "deep_and_wide"}
CPU = torch.device("cpu")


def _verify(
    form: str, x: GdnInputs, state: torch.Tensor, tables: DeviceTree, contiguous: bool = True
) -> tuple[torch.Tensor, GdnOperands]:
    rows = tables.rows
    o = poisoned((rows, DIMS.HV, DIMS.V), x.v.dtype)
    empty = empty_operands(rows, DIMS.H, DIMS.HV, DIMS.K, DIMS.V, CPU)
    ops = GdnOperands(*(poisoned(tuple(t.shape), torch.float32) for t in vars(empty).values()))
    before = state.clone()
    xs = x.map(torch.Tensor.contiguous) if contiguous else x
    if form == "rows":
        gdn_rows_(xs, state, tables.gdn, o, ops)
    else:
        cut = poisoned((tables.max_depth + 1, DIMS.HV, DIMS.V, DIMS.K), torch.float32)
        gdn_spine_rows_(xs, state, tables.gdn, tables.spine_nodes, cut, o, ops)
    assert torch.equal(state, before), "the committed state is read only"
    return o, ops


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal, NaN (unwritten poison of padding rows) where the other has NaN."""
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [
        pytest.param(s, torch.bfloat16, marks=() if s in QUICK else pytest.mark.slow, id=f"{s}-bf16")
        for s in SHAPES
    ]
    + [pytest.param("paper", torch.float32, id="paper-fp32")],
)
def test_the_spine_scan_gives_every_row_the_row_scans_bits(shape: str, dtype: torch.dtype) -> None:
    tree = random_tree(shape, random.Random(900 + SHAPES.index(shape)))
    case = gdn_checks.make_case(tree, DIMS, torch.Generator().manual_seed(9))
    x, state = case.inputs(dtype)
    tables = DeviceTree(tree.rows, tree.max_depth, CPU).load_(tree)
    o_rows, ops_rows = _verify("rows", x, state, tables)
    o_spine, ops_spine = _verify("spine", x, state, tables)
    active = tree.n_active
    assert not o_spine[:active].isnan().any(), "an active row's output was not written"
    assert _same_bits(o_rows, o_spine)
    for field in ("q", "k", "v", "g", "beta"):
        assert _same_bits(getattr(ops_rows, field)[:active], getattr(ops_spine, field)[:active]), field


def _column_slices(x: GdnInputs) -> GdnInputs:
    """x's q, k, v as column slices of one [R, 2HK + HV*V + 3] tensor and a, b of one [R, 2HV + 5]
    (as the engine's conv and projection outputs hold them), NaN in the columns around them."""
    rows = x.q.shape[0]

    def flat(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(rows, -1)

    def nan(n: int) -> torch.Tensor:
        return torch.full((rows, n), float("nan"), dtype=x.q.dtype)

    qkv = torch.cat([flat(x.q), flat(x.k), flat(x.v), nan(3)], dim=1)
    ba = torch.cat([nan(2), flat(x.b), flat(x.a), nan(3)], dim=1)
    hk, hvv, hv = flat(x.q).shape[1], flat(x.v).shape[1], x.a.shape[1]
    return GdnInputs(
        qkv[:, :hk].view(x.q.shape),
        qkv[:, hk : 2 * hk].view(x.k.shape),
        qkv[:, 2 * hk : 2 * hk + hvv].view(x.v.shape),
        ba[:, 2 + hv : 2 + 2 * hv],
        ba[:, 2 : 2 + hv],
        x.A_log,
        x.dt_bias,
    )


@pytest.mark.parametrize("form", ["rows", "spine"])
def test_column_slices_of_one_output_are_read_in_place_with_the_same_bits(form: str) -> None:
    tree = random_tree("paper", random.Random(11))
    case = gdn_checks.make_case(tree, DIMS, torch.Generator().manual_seed(11))
    x, state = case.inputs(torch.bfloat16)
    tables = DeviceTree(tree.rows, tree.max_depth, CPU).load_(tree)
    sliced = _column_slices(x)
    assert not sliced.q.is_contiguous() and not sliced.a.is_contiguous()
    o, ops = _verify(form, x, state, tables)
    o_sliced, ops_sliced = _verify(form, sliced, state, tables, contiguous=False)
    assert not o_sliced[: tree.n_active].isnan().any(), "a read strayed into the NaN columns"
    assert _same_bits(o, o_sliced)
    for field in ("q", "k", "v", "g", "beta"):
        assert _same_bits(getattr(ops, field)[: tree.n_active], getattr(ops_sliced, field)[: tree.n_active])


def test_the_spine_scan_matches_the_reference() -> None:
    tree = random_tree("paper", random.Random(5))
    case = gdn_checks.make_case(tree, DIMS, torch.Generator().manual_seed(5))
    x, state = case.inputs(torch.float32)
    o, ops = _verify("spine", x, state, DeviceTree(tree.rows, tree.max_depth, CPU).load_(tree))
    assert_gdn_matches_reference(o, ops, case)


def test_a_cut_buffer_of_the_wrong_shape_is_refused() -> None:
    tree = random_tree("chain", random.Random(1))
    case = gdn_checks.make_case(tree, DIMS, torch.Generator().manual_seed(1))
    x, state = case.inputs(torch.float32)
    tables = DeviceTree(tree.rows, tree.max_depth, CPU).load_(tree)
    o = torch.empty((tree.rows, DIMS.HV, DIMS.V))
    ops = empty_operands(tree.rows, DIMS.H, DIMS.HV, DIMS.K, DIMS.V, CPU)
    short = cut_buffer(2, DIMS.HV, DIMS.V, DIMS.K, CPU)
    with pytest.raises(ValueError, match="cut must be fp32"):
        gdn_spine_rows_(x.map(torch.Tensor.contiguous), state, tables.gdn, tables.spine_nodes, short, o, ops)
