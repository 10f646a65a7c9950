"""The device tree tables built on the device (`DeviceTree.derive_`) equal the host descriptor's
(`build_tree`, `tree_visibility_bits`, the GDN scan's `first_child_paths`) on every tree shape,
poisoned first so an unwritten entry fails; chained mode takes its tokens from the last cycle's
results; the forced-acceptance kernel equals its host reference."""

from __future__ import annotations

import random

import pytest
import torch

from lumobench.checks.random_trees import SHAPES, random_tree
from lumotree.sampling.device_walk import DeviceForcing
from lumotree.sampling.forced import ForcedAcceptance, forced_path
from lumotree.tree import MAX_DEPTH, TreeDescriptor, build_tree, chain_tree
from lumotree.verify.attention.decode import tree_visibility_bits
from lumotree.verify.device_tree import DeviceTree
from lumotree.verify.gdn.plan import first_child_paths

from .helpers import INT_POISON, assert_written

GDN_PATHS = ("path_end", "path_start", "leaf_parent", "leaf_walk")  # the first-child decomposition
TABLES = ("tokens", "position", "depth", "slot_map", "bits", "conv_gather", "child_nodes", "child_tokens")


def _poison(tables: DeviceTree) -> None:
    for name in (*TABLES, "ancestry", "n_active", "spine_nodes"):
        getattr(tables, name).fill_(INT_POISON)
    for name in ("ancestry", "n_active", *GDN_PATHS):
        getattr(tables.gdn, name).fill_(INT_POISON)


def _assert_tables(tables: DeviceTree, tree: TreeDescriptor) -> None:
    for name in (*TABLES, "ancestry", "n_active", "spine_nodes"):
        assert_written(getattr(tables, name))
    assert torch.equal(tables.tokens, tree.tokens)
    assert torch.equal(tables.position, tree.position)
    assert torch.equal(tables.depth, tree.depth)
    assert torch.equal(tables.slot_map, tree.slot_map)
    assert torch.equal(tables.bits, tree_visibility_bits(tree))
    assert torch.equal(tables.conv_gather, tree.conv_gather)
    assert torch.equal(tables.ancestry.bool(), tree.ancestry)
    assert torch.equal(tables.gdn.ancestry, tree.ancestry.to(torch.int32))
    assert int(tables.n_active) == tree.n_active == int(tables.gdn.n_active)
    cmax = tree.child_nodes.shape[1]
    assert torch.equal(tables.child_nodes[:, :cmax], tree.child_nodes)
    assert torch.equal(tables.child_tokens[:, :cmax], tree.child_tokens)
    assert bool((tables.child_nodes[:, cmax:] == -1).all()) and bool(
        (tables.child_tokens[:, cmax:] == -1).all()
    )
    spine = tree.spine.tolist()
    assert tables.spine_nodes.tolist() == spine + [-1] * (MAX_DEPTH + 1 - len(spine))
    decomposition = first_child_paths(tree.parent.tolist(), tree.n_active)
    for name in GDN_PATHS:
        assert getattr(tables.gdn, name).tolist() == decomposition[name], name


@pytest.mark.parametrize("shape", SHAPES)
def test_derived_tables_equal_the_host_descriptor(shape: str) -> None:
    rng = random.Random(SHAPES.index(shape))
    for _ in range(2):
        tree = random_tree(shape, rng, prefix_len=rng.randrange(0, 500))
        tables = DeviceTree(tree.rows, MAX_DEPTH, "cpu")
        _poison(tables)
        tables.load_(tree)
        _assert_tables(tables, tree)


def test_a_tree_as_wide_as_its_rows_and_a_root_alone() -> None:
    """A fan whose root has every other row as a child, and the 1-row tree of an AR step."""
    fan = build_tree([7, *range(10, 19)], [-1] * 1 + [0] * 9, prefix_len=3, rows=12)
    root = chain_tree([5], prefix_len=40)
    for tree in (fan, root):
        tables = DeviceTree(tree.rows, MAX_DEPTH, "cpu")
        _poison(tables)
        tables.load_(tree)
        _assert_tables(tables, tree)


def test_chained_tables_take_the_root_and_drafts_from_the_last_results() -> None:
    """Chained mode: tokens = [emitted[path_len - 1], *spine]; everything else is the chain's."""
    rows = 6
    tables = DeviceTree(rows, MAX_DEPTH, "cpu")
    tables.load_(chain_tree([0] * rows, prefix_len=0, rows=rows))  # the chain's parents, once
    emitted = torch.tensor([11, 12, 13, 14, -1, -1, -1, -1, -1, -1, -1, -1])
    spine = torch.tensor([21, 22, 23, 24, 25])
    for path_len, prefix in ((3, 90), (1, 93)):
        _poison(tables)
        tables.prefix_len.fill_(prefix)
        tables.derive_(chained=(emitted, torch.tensor([path_len]), spine))
        root = int(emitted[path_len - 1])
        _assert_tables(tables, chain_tree([root, *spine.tolist()], prefix_len=prefix, rows=rows))


@pytest.mark.parametrize("shape", ["paper", "deep_and_wide", "single_root"])
def test_forced_path_kernel_equals_its_reference(shape: str) -> None:
    tree = random_tree(shape, random.Random(5))
    tables = DeviceTree(tree.rows, MAX_DEPTH, "cpu").load_(tree)
    schedule = ForcedAcceptance((0, 3, 9, 1), "test")
    forcing = DeviceForcing(schedule, torch.device("cpu"))
    choice = torch.randint(0, 100, (tree.rows,), generator=torch.Generator().manual_seed(1))
    width = MAX_DEPTH + 1
    for count in schedule.counts * 2:
        accepted, emitted = torch.full((width,), INT_POISON), torch.full((width,), INT_POISON)
        path_len, final = torch.full((1,), INT_POISON), torch.full((1,), INT_POISON)
        forcing.force_(tables.spine_nodes, tables.tokens, choice, accepted, path_len, emitted, final)
        nodes, drafts = forced_path(tree.spine.tolist(), tree.tokens.tolist(), count)
        assert int(path_len) == len(nodes) and int(final) == nodes[-1]
        assert accepted.tolist() == nodes + [-1] * (width - len(nodes))
        assert emitted.tolist() == [*drafts, int(choice[nodes[-1]])] + [-1] * (width - len(nodes))
    assert int(forcing.counter) == 2 * len(schedule.counts)
