"""Device acceptance walks vs the reference walks: identical outputs, Philox coins bit for bit."""

from __future__ import annotations

import random

import pytest
import torch

from lumobench.checks.random_trees import SHAPES, random_tree
from lumotree.sampling import walk as ref
from lumotree.sampling.device_walk import DeviceWalk

from .helpers import assert_written, deep_walk_scores, poisoned

VOCAB = 300
FIELDS = ("accepted", "path_len", "emitted", "final_row")


def _poison(walk: DeviceWalk) -> None:
    for name in FIELDS:
        getattr(walk.result, name).copy_(poisoned(tuple(getattr(walk.result, name).shape), torch.int64))


def _assert_same(got, expected) -> None:
    for name in FIELDS:
        assert_written(getattr(got, name))
        assert torch.equal(getattr(got, name), getattr(expected, name)), name


@pytest.mark.parametrize("shape", SHAPES)
def test_greedy_walk_matches_reference(shape: str) -> None:
    seed = SHAPES.index(shape)
    tree = random_tree(shape, random.Random(seed))
    logits = deep_walk_scores(tree, VOCAB, torch.Generator().manual_seed(seed), boost=6.0)
    walk = DeviceWalk(tree.rows, VOCAB, 1, tree.max_depth, child_cap=tree.rows, device=torch.device("cpu"))
    walk.load_tree_(tree)
    _poison(walk)
    walk.greedy_(logits)
    expected = ref.greedy_walk(logits, tree)
    _assert_same(walk.result, expected)


@pytest.mark.parametrize("shape", ["paper", "chain", "deep_and_wide", "wide_fan"])
def test_sampling_walks_match_reference_coin_for_coin(shape: str) -> None:
    seed = 20 + SHAPES.index(shape)
    tree = random_tree(shape, random.Random(seed))
    probs = torch.softmax(deep_walk_scores(tree, VOCAB, torch.Generator().manual_seed(seed), boost=7.0), -1)
    seeds = torch.tensor([3, -1, 2**40 + 17, 123456789], dtype=torch.int64)
    walk = DeviceWalk(
        tree.rows, VOCAB, len(seeds), tree.max_depth, child_cap=tree.rows, device=torch.device("cpu")
    )
    walk.load_tree_(tree)
    _poison(walk)
    walk.sample_(probs, seeds, torch.tensor([5]))
    expected = ref.sample_walk(probs, tree, seeds, 5)
    _assert_same(walk.result, expected)
    if shape == "chain":
        assert int(expected.path_len.max()) > 2  # the boost makes some walks descend


def test_walk_buffers_reject_a_tree_with_more_children_than_they_hold() -> None:
    tree = random_tree("wide_fan", random.Random(0))
    walk = DeviceWalk(tree.rows, VOCAB, 1, tree.max_depth, child_cap=4, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="buffers hold 4"):
        walk.load_tree_(tree)
