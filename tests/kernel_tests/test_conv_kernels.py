"""Triton tree conv and conv-state publication vs the PyTorch reference (interpreter)."""

from __future__ import annotations

import random

import pytest
import torch

from lumobench.checks.random_trees import SHAPES, random_tree
from lumotree.verify.conv import reference as ref
from lumotree.verify.conv.fused_conv import publish_conv_state_, tree_conv_
from lumotree.verify.device_ops import publish_conv_layers, stacked_view
from tests.model.conftest import perturbed_model, tiny_config

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


@pytest.mark.parametrize("path_len", [1, 2, 5])
def test_every_layers_publication_in_one_launch_matches_the_reference_per_layer(path_len: int) -> None:
    # 3 layers' conv states as views of one bank, their inputs column slices of wider outputs (as
    # the projection's): the banked launch equals the reference layer by layer (path lengths below,
    # at and above W-1), and states that are not a bank's views take the per-layer launches.
    tree = random_tree("paper", random.Random(path_len))
    node = next(n for n in range(tree.n_active) if len(tree.path_to(n)) == path_len)
    path = tree.path_to(node)
    gen = torch.Generator().manual_seed(path_len)
    bank = torch.randn(3, CHANNELS, WIDTH - 1, generator=gen)
    wide = [torch.randn(tree.rows, CHANNELS + 9, generator=gen) for _ in range(3)]
    xs = [w[:, 9:] for w in wide]
    accepted, length = tree.padded_path(path), torch.tensor([len(path)])
    expected = bank.clone()
    for layer in range(3):
        ref.publish_conv_state_(expected[layer], xs[layer].contiguous(), accepted, len(path))
    banked = bank.clone()
    publish_conv_layers(list(banked), xs, accepted, length)
    assert torch.equal(banked, expected)
    separate = [state.clone() for state in bank]  # not views of one tensor
    publish_conv_layers(separate, xs, accepted, length)
    assert all(torch.equal(s, e) for s, e in zip(separate, expected, strict=True))


def test_a_new_state_holds_its_conv_states_in_one_bank() -> None:
    model = perturbed_model(tiny_config(vocab_size=64), seed=1)
    state = model.new_state(16)
    convs = [layer.conv for layer in state.layers if hasattr(layer, "conv")]
    bank = stacked_view(convs)
    assert bank is not None and bank.shape[0] == len(convs) >= 2
