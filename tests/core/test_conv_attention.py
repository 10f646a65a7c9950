"""Tree conv, tree attention, partial RoPE and their publication."""

from __future__ import annotations

import random

import pytest
import torch

from lumobench.checks import op_checks
from lumobench.checks.random_trees import random_tree
from lumotree.tree import chain_tree
from lumotree.verify.attention import apply_partial_rope, publish_kv_, write_tree_kv_
from lumotree.verify.conv import publish_conv_state_, tree_conv


@pytest.fixture(scope="module")
def trees() -> list:
    return op_checks.attention_trees(10, seed=4)


def test_tree_conv_matches_stepwise_conv_and_gather_faults_are_caught(trees: list) -> None:
    result = op_checks.check_tree_conv(trees, seed=4)
    assert result.ok and result.cases == len(trees) and result.faults_planted >= 8, result


def test_tree_attention_matches_stepwise_sdpa_and_wrong_remap_is_caught(trees: list) -> None:
    result = op_checks.check_tree_attention(trees, seed=4)
    assert result.ok and result.cases == len(trees) and result.faults_planted >= 3, result


def test_tree_conv_keeps_pinned_tap_order_and_cast_points() -> None:
    tree = chain_tree([1, 2], prefix_len=0)
    x = torch.tensor([[1.0], [2.0]], dtype=torch.bfloat16)
    state = torch.tensor([[3.0, 4.0, 5.0]], dtype=torch.bfloat16)
    w = torch.tensor([[0.5, 0.25, 0.125, 1.0]], dtype=torch.bfloat16)
    acc = 0.1 + 0.5 * 4.0 + 0.25 * 5.0 + 0.125 * 1.0 + 1.0 * 2.0  # row 1's window: state[1:], x0, x1
    y = tree_conv(x, state, w, torch.tensor([0.1]), tree)
    assert y.dtype == torch.bfloat16
    expected = torch.nn.functional.silu(torch.tensor(acc, dtype=torch.float32)).to(torch.bfloat16)
    assert y[1, 0] == expected


def test_conv_state_publication_keeps_the_last_inputs_of_the_accepted_path() -> None:
    tree = random_tree("paper", random.Random(2))
    x = torch.arange(tree.rows, dtype=torch.float32)[:, None].repeat(1, 2)
    state = torch.full((2, 3), -1.0)
    node = int(tree.paths.leaf_node[3])
    path = torch.tensor(tree.path_to(node) + [-1] * 4)
    publish_conv_state_(state, x, path, len(tree.path_to(node)))
    assert state[0].tolist() == [float(i) for i in tree.path_to(node)[-3:]]


def test_kv_publication_does_not_move_a_spine_prefix_and_remaps_a_branch() -> None:
    tree = random_tree("paper", random.Random(1), prefix_len=5)
    k_cache = torch.zeros(5 + tree.rows, 1, 2)
    v_cache = torch.zeros_like(k_cache)
    k = torch.arange(tree.rows, dtype=torch.float32)[:, None, None].repeat(1, 1, 2)
    write_tree_kv_(k_cache, v_cache, k, -k, tree)
    before = k_cache.clone()
    spine = tree.spine[:4]
    assert publish_kv_(k_cache, v_cache, tree, spine, 4) is False and torch.equal(k_cache, before)
    branch = torch.tensor(tree.path_to(int(tree.paths.leaf_node[-1])))
    assert publish_kv_(k_cache, v_cache, tree, branch, len(branch)) is True
    assert k_cache[5 : 5 + len(branch), 0, 0].tolist() == branch.float().tolist()
    assert v_cache[5 : 5 + len(branch), 0, 0].tolist() == (-branch.float()).tolist()


def test_partial_rope_matches_transformers_qwen3_next() -> None:
    modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    config_mod = pytest.importorskip("transformers.models.qwen3_next.configuration_qwen3_next")
    config = config_mod.Qwen3NextConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    )
    rotary = modeling.Qwen3NextRotaryEmbedding(config)
    positions = torch.tensor([0, 3, 17, 4095])
    for dtype in (torch.float32, torch.bfloat16):
        q = torch.randn(4, 4, 32).to(dtype)
        cos, sin = rotary(q, positions[None])
        want, _ = modeling.apply_rotary_pos_emb(q.transpose(0, 1)[None], q.transpose(0, 1)[None], cos, sin)
        got = apply_partial_rope(q, positions, rotary_dim=8, theta=10000.0)
        assert torch.equal(got, want[0].transpose(0, 1))
