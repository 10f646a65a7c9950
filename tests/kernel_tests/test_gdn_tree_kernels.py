"""The tree-parallel GDN kernels (tree WY form and its value-major split) vs the PyTorch reference
(interpreter, fp32, small heads, NaN-poisoned outputs)."""

from __future__ import annotations

import random

import pytest
import torch

from lumobench.checks import gdn_checks
from lumobench.checks.paired import paired_check
from lumobench.checks.random_trees import SHAPES, random_tree
from lumotree.tree import build_tree
from lumotree.verify.gdn import reference as ref
from lumotree.verify.gdn.common import empty_operands
from lumotree.verify.gdn.plan import ancestry_tables
from lumotree.verify.gdn.reference import GdnInputs, GdnOperands
from lumotree.verify.gdn.tree_scan import gdn_tree_layers_, gdn_verify_tree
from lumotree.verify.gdn.tree_value_major import gdn_value_major_layers_, gdn_verify_value_major

from .helpers import assert_gdn_matches_reference, parallel_keys_case, poisoned

DIMS = gdn_checks.GdnDims(H=2, HV=4, K=16, V=16)


def _case(shape: str, seed: int) -> gdn_checks.GdnCase:
    return gdn_checks.make_case(
        random_tree(shape, random.Random(seed)), DIMS, torch.Generator().manual_seed(seed)
    )


def _stack(cases: list[gdn_checks.GdnCase]) -> tuple[GdnInputs, torch.Tensor]:
    """The inputs and states of several instances, each with a leading instance dim."""
    inputs, states = zip(*(c.inputs(torch.float32) for c in cases), strict=True)
    return GdnInputs.stack(inputs), torch.stack(states).contiguous()


def _poisoned_records(n: int, rows: int) -> GdnOperands:
    empty = empty_operands(rows, DIMS.H, DIMS.HV, DIMS.K, DIMS.V, torch.device("cpu"))
    return GdnOperands(*(poisoned((n, *t.shape), torch.float32) for t in vars(empty).values()))


TREE_SOLVES = ["substitution", "product", "value-major"]


def _run_tree(cases: list[gdn_checks.GdnCase], block_v: int = 16, solve: str = "substitution"):
    """The tree-parallel kernel (solve "substitution" or "product"), or the value-major split solve
    (solve "value-major"; 8-key chunks so its state loop runs twice)."""
    rows, n = cases[0].tree.rows, len(cases)
    o = poisoned((n, rows, DIMS.HV, DIMS.V), torch.float32)
    ops = _poisoned_records(n, rows)
    tables = ancestry_tables(cases[0].tree, "cpu")
    if solve == "value-major":
        gdn_value_major_layers_(*_stack(cases), tables, o, ops, block_v=block_v, block_k=8)
    else:
        gdn_tree_layers_(*_stack(cases), tables, o, ops, block_v=block_v, solve=solve)
    return o, ops


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("solve", TREE_SOLVES)
def test_tree_parallel_outputs_and_records_match_reference(shape: str, solve: str) -> None:
    case = _case(shape, seed=300 + SHAPES.index(shape))
    o, ops = _run_tree([case], solve=solve)
    assert_gdn_matches_reference(o[0], GdnOperands(*(t[0] for t in vars(ops).values())), case)


@pytest.mark.parametrize("kernel", ["tree", "value-major"])
def test_one_launch_over_instances_matches_each_instance_alone(kernel: str) -> None:
    # Instances share the tree (one cycle) but have their own operands, parameters and states.
    tree = _case("paper", seed=400).tree
    cases = [gdn_checks.make_case(tree, DIMS, torch.Generator().manual_seed(410 + i)) for i in range(3)]
    o, ops = _run_tree(cases, solve="value-major" if kernel == "value-major" else "substitution")
    for i, case in enumerate(cases):
        assert_gdn_matches_reference(o[i], GdnOperands(*(t[i] for t in vars(ops).values())), case)


@pytest.mark.parametrize("shape", ["paper", "deep_and_wide", "wide_fan", "chain"])
@pytest.mark.parametrize("kernel", ["tree", "tree product", "value-major"])
def test_paired_rule_against_float64(shape: str, kernel: str) -> None:
    # The chunk form (tree) rounds differently from the reference: the kernel's error against
    # float64 must stay within the paired rule's bound of the reference's.
    case = _case(shape, seed=500 + SHAPES.index(shape))
    n = case.tree.n_active
    inputs = case.inputs(torch.float32)
    if kernel == "value-major":
        o = gdn_verify_value_major(*inputs, case.tree, block_v=16).o
    else:
        o = gdn_verify_tree(*inputs, case.tree, solve=kernel.removeprefix("tree").strip() or "substitution").o
    native = ref.gdn_verify(*inputs, case.tree).o
    truth, _ = ref.gdn_sequential_reference(*case.truth(torch.float32), case.tree)
    result = paired_check(o[:n], native[:n], truth[:n], cell_dims=2, storage=torch.float32)
    assert result.ok, result


@pytest.mark.parametrize("solve", ["substitution", "value-major"])
def test_substitution_solve_stays_exact_on_a_deep_chain_with_parallel_keys_and_no_decay(solve: str) -> None:
    # No decay, beta ~ 1 and nearly parallel keys make every power of A matter along a depth-11
    # chain: a missing round shows up here, and the product form loses fp32 accuracy here (its
    # powers of A grow like binomial coefficients), which is why substitution is the default.
    chain = _case("chain", seed=800).tree
    case = parallel_keys_case(chain, DIMS, torch.Generator().manual_seed(801))
    o, ops = _run_tree([case], solve=solve)
    assert_gdn_matches_reference(o[0], GdnOperands(*(t[0] for t in vars(ops).values())), case)


def test_the_product_solve_fails_the_check_on_that_chain() -> None:
    # the check of _assert_matches_reference can fail: the product form's error there is many times
    # the reference's
    chain = _case("chain", seed=800).tree
    case = parallel_keys_case(chain, DIMS, torch.Generator().manual_seed(801))
    o, ops = _run_tree([case], solve="product")
    with pytest.raises(AssertionError, match="violations"):
        assert_gdn_matches_reference(o[0], GdnOperands(*(t[0] for t in vars(ops).values())), case)


def test_refilled_ancestry_tables_serve_a_new_tree() -> None:
    # A captured graph keeps the tables' storage: fill_ must retarget them to another tree.
    first, second = _case("paper", seed=600), _case("deep_and_wide", seed=601)
    tables = ancestry_tables(first.tree, "cpu").fill_(second.tree)
    o = poisoned((1, second.tree.rows, DIMS.HV, DIMS.V), torch.float32)
    ops = _poisoned_records(1, second.tree.rows)
    gdn_tree_layers_(*_stack([second]), tables, o, ops, block_v=16)
    assert_gdn_matches_reference(o[0], GdnOperands(*(t[0] for t in vars(ops).values())), second)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"block_k": 12}, "must divide K"),
        ({"precision": "tf32"}, "precision"),
    ],
)
def test_tree_value_major_rejects_bad_configurations(config: dict, message: str) -> None:
    case = _case("chain", seed=720)
    with pytest.raises(ValueError, match=message):
        gdn_verify_value_major(*case.inputs(torch.float32), case.tree, block_v=16, **config)


@pytest.mark.parametrize(("depth", "cap"), [(2, 2), (5, 5), (11, 11), (5, 23), (23, 23)])
def test_split_solve_merges_enough_blocks_for_the_tables_depth(depth: int, cap: int) -> None:
    # The blocked inverse merges blocks until they span cap + 1 depth levels: a chain as deep as
    # the cap must be exact, and a shallower tree under a deeper cap (extra merges) too.
    tree = build_tree(list(range(depth + 1)), [-1, *range(depth)], prefix_len=8, rows=32, max_depth=cap)
    case = gdn_checks.make_case(tree, DIMS, torch.Generator().manual_seed(731))
    o = poisoned((1, tree.rows, DIMS.HV, DIMS.V), torch.float32)
    ops = _poisoned_records(1, tree.rows)
    tables = ancestry_tables(tree, "cpu", max_depth=cap)
    gdn_value_major_layers_(*_stack([case]), tables, o, ops, block_v=16, block_k=8)
    assert_gdn_matches_reference(o[0], GdnOperands(*(t[0] for t in vars(ops).values())), case)
