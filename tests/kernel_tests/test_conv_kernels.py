"""Triton tree conv and conv-state publication vs the PyTorch reference (interpreter)."""

from __future__ import annotations

import random

import pytest
import torch

from lumobench.checks.random_trees import SHAPES, random_tree
from lumotree.verify.conv import reference as ref
from lumotree.verify.conv.fused_conv import publish_conv_state_, tree_conv_

from .helpers import assert_written, poisoned

CHANNELS, WIDTH = 40, 4  # 40 channels: the last channel block is partial


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("with_bias", [True, False])
def test_tree_conv_matches_reference(shape: str, dtype: torch.dtype, with_bias: bool) -> None:
    seed = SHAPES.index(shape)
    tree = random_tree(shape, random.Random(seed))
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tree.rows, CHANNELS, generator=gen).to(dtype)
    state = torch.randn(CHANNELS, WIDTH - 1, generator=gen).to(dtype)
    weight = torch.randn(CHANNELS, WIDTH, generator=gen)
    bias = torch.randn(CHANNELS, generator=gen) if with_bias else None
    y = poisoned((tree.rows, CHANNELS), dtype)
    tree_conv_(x, state, weight, bias, tree.conv_gather, y)
    assert_written(y)
    expected = ref.tree_conv(x, state, weight, bias, tree)
    # fp16 outputs may differ by one rounding of the SiLU (exp implementations differ).
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(y, expected, **tol)


@pytest.mark.parametrize("shape", ["paper", "chain", "deep_and_wide"])
def test_conv_state_publication_matches_reference_for_every_path_length(shape: str) -> None:
    tree = random_tree(shape, random.Random(7))
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(tree.rows, CHANNELS, generator=gen)
    state = torch.randn(CHANNELS, WIDTH - 1, generator=gen)
    # Path lengths below and above W-1 exercise both halves of the in-place shift.
    for node in range(tree.n_active):
        path = tree.path_to(node)
        accepted = tree.padded_path(path)
        got, expected = state.clone(), state.clone()
        publish_conv_state_(got, x, accepted, len(path))
        ref.publish_conv_state_(expected, x, accepted, len(path))
        assert torch.equal(got, expected), f"node {node} (path length {len(path)})"


def test_both_conv_kernels_read_a_column_slice_of_a_wider_output_in_place() -> None:
    tree = random_tree("paper", random.Random(3))
    gen = torch.Generator().manual_seed(3)
    wide = torch.full((tree.rows, CHANNELS + 7), float("nan"))
    wide[:, 5 : 5 + CHANNELS] = torch.randn(tree.rows, CHANNELS, generator=gen)
    x = wide[:, 5 : 5 + CHANNELS]  # rows 47 elements apart, NaN on both sides
    state = torch.randn(CHANNELS, WIDTH - 1, generator=gen)
    weight = torch.randn(CHANNELS, WIDTH, generator=gen)
    y, y_dense = (poisoned((tree.rows, CHANNELS), torch.float32) for _ in range(2))
    tree_conv_(x, state, weight, None, tree.conv_gather, y)
    tree_conv_(x.contiguous(), state, weight, None, tree.conv_gather, y_dense)
    assert_written(y)
    assert torch.equal(y, y_dense)
    node = max(range(tree.n_active), key=lambda n: len(tree.path_to(n)))  # the longest path
    path = tree.path_to(node)
    got, expected = state.clone(), state.clone()
    publish_conv_state_(got, x, tree.padded_path(path), len(path))
    ref.publish_conv_state_(expected, x.contiguous(), tree.padded_path(path), len(path))
    assert torch.equal(got, expected)
