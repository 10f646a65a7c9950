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
from lumotree.verify.gdn.prepare import prepare_operands_
from lumotree.verify.gdn.reference import GdnInputs, GdnOperands
from lumotree.verify.gdn.replay import replay_accepted_
from lumotree.verify.gdn.row_scan import gdn_rows_, gdn_rows_prepared_, row_strided

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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_ar_step_advancing_its_state_in_place_writes_the_replays_bits(dtype: torch.dtype) -> None:
    """The AR step's row scan with `advance` (its root is always accepted): the same output as the
    read-only scan, and the state the replay of the root would publish, bit for bit (an element
    left unwritten keeps the last state's value, which the replay changes); five steps in a row,
    each from the last one's state."""
    chain = chain_tree(list(range(5)), prefix_len=40)
    case = gdn_checks.make_case(chain, DIMS, torch.Generator().manual_seed(12))
    x, state0 = case.inputs(dtype)
    advanced, replayed = state0.clone(), state0.clone()
    for d in range(5):
        step = chain_tree([d], prefix_len=40 + d)
        row = x.map(lambda t, d=d: t[d : d + 1] if t.dim() > 1 else t)
        o_read, ops = _rows(row, replayed, step)
        replay_accepted_(replayed, ops, torch.zeros(1, dtype=torch.int64), 1)
        prepared = empty_operands(1, DIMS.H, DIMS.HV, DIMS.K, DIMS.V, torch.device("cpu"))
        prepare_operands_(row_strided(row.map(torch.Tensor.contiguous))[0], prepared)
        o = poisoned((1, DIMS.HV, DIMS.V), x.v.dtype)
        before = advanced.clone()
        gdn_rows_prepared_(prepared, advanced, ancestry_tables(step, "cpu"), o, advance=True)
        assert torch.equal(o, o_read), d
        assert torch.equal(advanced, replayed), d
        assert not torch.equal(advanced, before), d


def test_the_state_advances_in_place_only_for_one_contiguous_row() -> None:
    chain = chain_tree([1, 2], prefix_len=4)
    case = gdn_checks.make_case(chain, DIMS, torch.Generator().manual_seed(13))
    x, state = case.inputs(torch.float32)
    ops = empty_operands(chain.rows, DIMS.H, DIMS.HV, DIMS.K, DIMS.V, torch.device("cpu"))
    o = torch.empty_like(x.v)
    with pytest.raises(ValueError, match="one contiguous row"):
        gdn_rows_prepared_(ops, state, ancestry_tables(chain, "cpu"), o, advance=True)
    root = chain_tree([1], prefix_len=4)
    one = empty_operands(1, DIMS.H, DIMS.HV, DIMS.K, DIMS.V, torch.device("cpu"))
    strided = state.transpose(1, 2)
    with pytest.raises(ValueError, match="one contiguous row"):
        gdn_rows_prepared_(one, strided, ancestry_tables(root, "cpu"), o[:1], advance=True)
