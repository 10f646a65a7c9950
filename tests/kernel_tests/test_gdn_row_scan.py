"""The GDN row scan (`verify/gdn/row_scan.py`): against the PyTorch reference on random trees, and a
chain's rows bit for bit against one-row steps published by the replay kernel, as the AR arm runs
them (interpreter, NaN-poisoned outputs and records)."""

from __future__ import annotations

import random

import pytest
import torch

from lumobench.checks import gdn_checks
from lumobench.checks.random_trees import SHAPES, random_tree
from lumotree.tree import chain_tree
from lumotree.verify.gdn.common import empty_operands
from lumotree.verify.gdn.plan import ancestry_tables
from lumotree.verify.gdn.reference import GdnInputs, GdnOperands
from lumotree.verify.gdn.replay import replay_accepted_
from lumotree.verify.gdn.row_scan import gdn_rows_

from .helpers import assert_gdn_matches_reference, poisoned

DIMS = gdn_checks.GdnDims(H=2, HV=4, K=16, V=16)


def _rows(x: GdnInputs, state: torch.Tensor, tree) -> tuple[torch.Tensor, GdnOperands]:
    rows = tree.rows
    o = poisoned((rows, DIMS.HV, DIMS.V), x.v.dtype)
    empty = empty_operands(rows, DIMS.H, DIMS.HV, DIMS.K, DIMS.V, torch.device("cpu"))
    ops = GdnOperands(*(poisoned(tuple(t.shape), torch.float32) for t in vars(empty).values()))
    before = state.clone()
    gdn_rows_(x.map(torch.Tensor.contiguous), state, ancestry_tables(tree, "cpu"), o, ops)
    assert torch.equal(state, before), "the committed state is read only"
    return o, ops


@pytest.mark.parametrize("shape", SHAPES)
def test_row_scan_outputs_and_records_match_the_reference(shape: str) -> None:
    case = gdn_checks.make_case(
        random_tree(shape, random.Random(700 + SHAPES.index(shape))), DIMS, torch.Generator().manual_seed(7)
    )
    x, state = case.inputs(torch.float32)
    o, ops = _rows(x, state, case.tree)
    assert_gdn_matches_reference(o, ops, case)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_chain_row_has_the_bits_of_the_one_row_steps_published_by_the_replay(dtype: torch.dtype) -> None:
    # The AR arm: verify one row, publish it with the replay kernel, verify the next from there. A
    # chain (MTP-5) or a tree holding it verifies all rows from the first state. Both sum in the same
    # tile shapes (no dots), so the interpreter's sums agree on any CPU.
    chain = chain_tree(list(range(6)), prefix_len=40, rows=8)
    case = gdn_checks.make_case(chain, DIMS, torch.Generator().manual_seed(11))
    x, state0 = case.inputs(dtype)
    o_chain, _ = _rows(x, state0.clone(), chain)
    state = state0.clone()
    for d in range(6):
        step = chain_tree([d], prefix_len=40 + d)
        row = x.map(lambda t, d=d: t[d : d + 1] if t.dim() > 1 else t)
        o_step, ops = _rows(row, state, step)
        assert torch.equal(o_step[0], o_chain[d]), d
        replay_accepted_(state, ops, torch.zeros(1, dtype=torch.int64), 1)
