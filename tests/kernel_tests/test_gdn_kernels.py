"""Triton GDN path scan and replay vs the PyTorch reference (interpreter, fp32, small heads)."""

from __future__ import annotations

import random

import pytest
import torch

from lumobench.checks import gdn_checks
from lumobench.checks.paired import paired_check
from lumobench.checks.random_trees import SHAPES, random_tree
from lumotree.verify.gdn import reference as ref
from lumotree.verify.gdn.common import empty_operands
from lumotree.verify.gdn.plan import scan_tables
from lumotree.verify.gdn.reference import GdnOperands
from lumotree.verify.gdn.replay import replay_accepted_, replay_layers_
from lumotree.verify.gdn.scan import gdn_scan_, gdn_verify

from .helpers import assert_written, poisoned

DIMS = gdn_checks.GdnDims(H=2, HV=4, K=16, V=16)
TOL = dict(rtol=1e-5, atol=1e-5)


def _case(shape: str, seed: int) -> gdn_checks.GdnCase:
    return gdn_checks.make_case(
        random_tree(shape, random.Random(seed)), DIMS, torch.Generator().manual_seed(seed)
    )


def _run_poisoned(case: gdn_checks.GdnCase, schedule: str, block_v: int = 8, warm: bool = False):
    """Run the caller-owned scan into NaN-poisoned buffers; return o, records, cut bank."""
    rows = case.tree.rows
    inputs = case.inputs(torch.float32)
    tables = scan_tables(case.tree, "cpu", schedule)
    o = poisoned((rows, DIMS.HV, DIMS.V), torch.float32)
    ops = GdnOperands(
        *(
            poisoned(tuple(t.shape), torch.float32)
            for t in vars(empty_operands(rows, DIMS.H, DIMS.HV, DIMS.K, DIMS.V, torch.device("cpu"))).values()
        )
    )
    bank = poisoned((rows, DIMS.HV, DIMS.V, DIMS.K), torch.float32)
    gdn_scan_(*inputs, tables, o, ops, bank, block_v=block_v, warm=warm)
    return o, ops, bank


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("schedule", ["cut", "recompute"])
def test_scan_outputs_records_and_cuts_match_reference(shape: str, schedule: str) -> None:
    case = _case(shape, seed=SHAPES.index(shape))
    n = case.tree.n_active
    o, ops, bank = _run_poisoned(case, schedule)
    expected = ref.gdn_verify(*case.inputs(torch.float32), case.tree)
    assert_written(o)
    torch.testing.assert_close(o, expected.o, **TOL)
    assert bool((o[n:] == 0).all()), "padding rows must be zero"
    for field in ("q", "k", "v", "g", "beta"):
        got = getattr(ops, field)[:n]
        assert_written(got)
        torch.testing.assert_close(got, getattr(expected.operands, field)[:n], **TOL)
    if schedule == "cut":
        cuts = bank[: len(case.tree.paths.cut_nodes)]
        assert_written(cuts)
        torch.testing.assert_close(cuts, expected.cut_states, **TOL)
    else:
        assert bool(torch.isnan(bank).all()), "the recompute schedule must not touch the cut bank"


@pytest.mark.parametrize("shape", ["paper", "deep_and_wide", "wide_fan"])
def test_scan_meets_the_paired_rule_against_float64(shape: str) -> None:
    case = _case(shape, seed=40 + SHAPES.index(shape))
    n = case.tree.n_active
    o, _, _ = _run_poisoned(case, "cut", block_v=16)
    native = ref.gdn_verify(*case.inputs(torch.float32), case.tree).o
    truth, _ = ref.gdn_sequential_reference(*case.truth(torch.float32), case.tree)
    result = paired_check(o[:n], native[:n], truth[:n], cell_dims=2, storage=torch.float32)
    assert result.ok, result


@pytest.mark.parametrize("shape", ["paper", "wide_fan"])
def test_warm_up_prologue_leaves_every_result_bitwise_unchanged(shape: str) -> None:
    case = _case(shape, seed=50 + SHAPES.index(shape))
    cold = _run_poisoned(case, "cut", warm=False)
    warm = _run_poisoned(case, "cut", warm=True)
    n, cuts = case.tree.n_active, len(case.tree.paths.cut_nodes)
    assert torch.equal(cold[0], warm[0])
    for field in ("q", "k", "v", "g", "beta"):
        assert torch.equal(getattr(cold[1], field)[:n], getattr(warm[1], field)[:n]), field
    assert torch.equal(cold[2][:cuts], warm[2][:cuts])


@pytest.mark.parametrize("shape", ["paper", "deep_and_wide", "repeated_subtrees"])
def test_store_all_bank_holds_every_node_state(shape: str) -> None:
    case = _case(shape, seed=60 + SHAPES.index(shape))
    n = case.tree.n_active
    o, _, bank = _run_poisoned(case, "store_all")
    o_seq, states = ref.gdn_sequential_reference(*case.inputs(torch.float32), case.tree)
    assert_written(bank[:n])
    torch.testing.assert_close(bank[:n], states[:n], **TOL)
    torch.testing.assert_close(o, o_seq, **TOL)


def test_refilled_tables_reproduce_fresh_tables() -> None:
    # A captured graph keeps its tables' storage; fill_ must make them equal to a fresh build.
    first, second = _case("paper", seed=80), _case("deep_and_wide", seed=81)
    capacity = dict(paths=8, steps=second.tree.max_depth + 1)
    tables = scan_tables(first.tree, "cpu", "cut", **capacity).fill_(second.tree)
    fresh = scan_tables(second.tree, "cpu", "cut", **capacity)
    names = ("nodes", "steps", "start", "owner", "cut_slot", "leaf_lo", "leaf_hi", "leaves", "n_active")
    for name in names:
        assert torch.equal(getattr(tables, name), getattr(fresh, name)), name
    o = poisoned((second.tree.rows, DIMS.HV, DIMS.V), torch.float32)
    ops = empty_operands(second.tree.rows, DIMS.H, DIMS.HV, DIMS.K, DIMS.V, torch.device("cpu"))
    bank = poisoned((second.tree.rows, DIMS.HV, DIMS.V, DIMS.K), torch.float32)
    gdn_scan_(*second.inputs(torch.float32), tables, o, ops, bank)
    torch.testing.assert_close(o, ref.gdn_verify(*second.inputs(torch.float32), second.tree).o, **TOL)


def test_tables_reject_a_tree_beyond_their_capacity() -> None:
    case = _case("deep_and_wide", seed=90)
    with pytest.raises(ValueError, match="tables hold 1 x"):
        scan_tables(case.tree, "cpu", "cut", paths=1)


@pytest.mark.parametrize("shape", ["paper", "chain", "random_order"])
def test_replay_publishes_the_accepted_path_like_the_reference(shape: str) -> None:
    case = _case(shape, seed=100 + SHAPES.index(shape))
    tree = case.tree
    inputs = case.inputs(torch.float32)
    result = gdn_verify(*inputs, tree)
    expected = ref.gdn_verify(*inputs, tree)
    gen = torch.Generator().manual_seed(5)
    for node in torch.randint(tree.n_active, (3,), generator=gen).tolist():
        path = tree.path_to(node)
        accepted = tree.padded_path(path)
        state_kernel, state_ref = case.state.clone(), case.state.clone()
        replay_accepted_(state_kernel, result.operands, accepted, len(path))
        ref.replay_accepted_(state_ref, expected.operands, accepted, len(path))
        torch.testing.assert_close(state_kernel, state_ref, **TOL)
        assert not torch.equal(state_kernel, case.state)  # the root alone already moves the state


@pytest.mark.parametrize("one_launch", [True, False])
def test_replay_of_a_layer_stack_matches_per_layer_reference(one_launch: bool) -> None:
    tree = _case("paper", seed=120).tree
    # Every layer shares the tree (one cycle) but has its own operands and state.
    layers = [gdn_checks.make_case(tree, DIMS, torch.Generator().manual_seed(130 + i)) for i in range(3)]
    records = [ref.gdn_verify(*c.inputs(torch.float32), tree).operands for c in layers]
    stacked = GdnOperands(
        *(torch.stack([getattr(r, f) for r in records]) for f in ("q", "k", "v", "g", "beta"))
    )
    states = torch.stack([c.state for c in layers])
    path = tree.path_to(tree.n_active - 1)
    accepted = tree.padded_path(path)
    replay_layers_(states, stacked, accepted, torch.tensor([len(path)]), one_launch=one_launch, block_v=8)
    for layer, (case, rec) in enumerate(zip(layers, records, strict=True)):
        expected = case.state.clone()
        ref.replay_accepted_(expected, rec, accepted, len(path))
        torch.testing.assert_close(states[layer], expected, **TOL)


def test_scan_rejects_a_key_dim_that_is_not_a_power_of_two() -> None:
    dims = gdn_checks.GdnDims(H=1, HV=1, K=12, V=16)
    case = gdn_checks.make_case(
        random_tree("chain", random.Random(0)), dims, torch.Generator().manual_seed(0)
    )
    with pytest.raises(ValueError, match="K must be a power of two"):
        gdn_verify(*case.inputs(torch.float32), case.tree)
