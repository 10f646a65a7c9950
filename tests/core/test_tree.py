"""Tree descriptor, builders and the paper geometry."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lumobench.checks.random_trees import SHAPES, paper_tree, random_tree
from lumobench.checks.structure_checks import INVALID_TREES, check_descriptor, descriptor_violations
from lumotree.drafting import GeometryConfig, RescueBranch, build_paper_tree
from lumotree.tree import PAD_TOKEN, TreeError, build_tree, chain_tree, root_tree
from lumotree.verify.attention.reference import tree_attention_mask


def paper(**config: object) -> object:
    spine = [10, 11, 12, 13, 14]
    top3 = [[s, s + 20, s + 30] for s in spine]
    rescues = [RescueBranch((10, 11), (40, 41, 42, 43)), RescueBranch((30,), (44, 45))]
    return build_paper_tree(
        1,
        spine,
        top3,
        tail=[50, 51, 52, 53, 54, 55],
        rescues=rescues,
        prefix_len=100,
        config=GeometryConfig(**config),
    )


def test_paper_geometry_is_27_drafts_plus_root_padded_to_32_with_depth_11() -> None:
    tree = paper()
    assert (tree.n_active, tree.rows, int(tree.depth.max()), tree.merges) == (28, 32, 11, 0)
    assert tree.spine.tolist() == tree.path_to(int(tree.spine[-1]))
    assert tree.tokens[tree.spine].tolist() == [1, 10, 11, 12, 13, 14, 50, 51, 52, 53, 54, 55]
    assert tree.position[: tree.n_active].tolist() == (100 + tree.depth[: tree.n_active]).tolist()
    # Two sibling leaves per MTP depth, under the spine node one level up.
    for d, s in enumerate([10, 11, 12, 13, 14]):
        parent = int(tree.spine[d])
        kids = {int(tree.tokens[c]) for c in tree.child_nodes[parent] if c >= 0}
        assert {s, s + 20, s + 30} <= kids


def test_geometry_counts_are_configurable() -> None:
    tree = paper(depth_mtp=3, siblings_per_depth=1, tail_len=2, rescue_lens=(2,), rows=16, max_depth=5)
    # 3 spine + 3 siblings + 2 tail + 2 rescue tokens + root
    assert (tree.n_active, tree.rows, int(tree.depth.max())) == (11, 16, 5)


def test_duplicate_proposals_are_merged_and_counted() -> None:
    # The rescue branch repeats the spine (10, 11) below the root, then diverges.
    spine = [10, 11, 12]
    top3 = [[10, 20, 30], [21, 11, 31], [12, 22, 32]]  # depth 2's top-3 does not lead with the spine token
    rescue = RescueBranch((), (10, 11, 40))
    tree = build_paper_tree(
        1,
        spine,
        top3,
        rescues=[rescue],
        prefix_len=0,
        config=GeometryConfig(depth_mtp=3, tail_len=0, rescue_lens=(3,)),
    )
    assert tree.merges == 2
    depth2_siblings = {int(tree.tokens[c]) for c in tree.child_nodes[int(tree.spine[1])] if c >= 0}
    assert depth2_siblings == {11, 21, 31}  # runner-ups that differ from the spine token, in order
    assert tree.n_active == 1 + 3 * 3 + 1


def test_rescue_branch_below_a_missing_node_is_rejected() -> None:
    with pytest.raises(TreeError, match="not in the tree"):
        build_paper_tree(1, [2], [[2, 3, 4]], rescues=[RescueBranch((9,), (5,))], prefix_len=0)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("cycle", "cycle"),
        ("out-of-range parent", "out-of-range parent"),
        ("self parent", "its own parent"),
        ("duplicate sibling tokens", "repeats token"),
        ("depth > max", "max_depth"),
        ("parent after child", "before its parent"),
        ("root not first", "must be the root"),
    ],
)
def test_invalid_topologies_are_rejected_with_clear_errors(name: str, message: str) -> None:
    tokens, parents = INVALID_TREES[name]
    with pytest.raises(TreeError, match=message):
        build_tree(tokens, parents, prefix_len=0)


@pytest.mark.parametrize("shape", SHAPES)
def test_descriptor_invariants_hold_for_every_shape(shape: str) -> None:
    rng = random.Random(7)
    for _ in range(3):
        tree = random_tree(shape, rng, prefix_len=rng.randrange(50))
        assert descriptor_violations(tree) == []


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10**6), min_size=0, max_size=30), st.integers(0, 2**31))
def test_descriptor_invariants_hold_for_arbitrary_trees(choices: list[int], token_seed: int) -> None:
    parents, depth = [-1], [0]
    for c in choices:
        candidates = [i for i in range(len(parents)) if depth[i] < 11]
        p = candidates[c % len(candidates)]
        parents.append(p)
        depth.append(depth[p] + 1)
    rng = random.Random(token_seed)
    tokens = [rng.randrange(1000) for _ in parents]
    for i in range(1, len(tokens)):
        while tokens[i] in [tokens[j] for j in range(1, i) if parents[j] == parents[i]]:
            tokens[i] = rng.randrange(1000)
    assert descriptor_violations(build_tree(tokens, parents, prefix_len=5, rows=32)) == []


def test_invariant_checker_reports_a_corrupted_descriptor() -> None:
    tree = random_tree("paper", random.Random(0))
    swapped = tree.slot_map.clone()
    swapped[[1, 2]] = swapped[[2, 1]]
    assert "spine is not first and contiguous in physical slots" in descriptor_violations(
        replace(tree, slot_map=swapped)
    )
    gather = tree.conv_gather.clone()
    gather[5] = gather[4]
    assert any("conv window of node 5" in v for v in descriptor_violations(replace(tree, conv_gather=gather)))


def test_slot_map_permutes_kv_slots_and_mask_columns_together_while_rows_stay_logical() -> None:
    tree = paper()
    mask = tree_attention_mask(tree)
    p = tree.prefix_len
    assert mask[:, :p].all()
    for i in range(tree.n_active):
        for j in range(tree.rows):
            assert bool(mask[i, p + tree.slot_map[j]]) == (bool(tree.ancestry[i, j]) and j < tree.n_active)
    # the logical order is breadth-first, so the spine is not the first logical rows
    assert tree.spine.tolist() != list(range(len(tree.spine)))


def test_padding_rows_are_invisible_to_attention_and_selection() -> None:
    tree = paper()
    pad = torch.arange(tree.n_active, tree.rows)
    mask = tree_attention_mask(tree)
    assert not mask[: tree.n_active, tree.prefix_len + tree.slot_map[pad]].any()
    assert not torch.isin(tree.child_nodes, pad).any()
    assert (tree.tokens[pad] == PAD_TOKEN).all() and not tree.active[pad].any()


def test_leaf_children_need_no_cut_state() -> None:
    tree = paper()
    plan = tree.paths
    # cuts only where a non-leaf branch leaves the spine: the rescue branches below spine depth 0 and 2
    assert plan.cut_nodes.tolist() == [int(tree.spine[0]), int(tree.spine[2])]
    # 9 of the 10 MTP siblings stay leaves (one carries a rescue branch), plus each rescue branch's last token
    assert len(plan.leaf_node) == 9 + 1 + 1
    assert all(int(tree.child_nodes[leaf, 0]) == -1 for leaf in plan.leaf_node)


def test_conv_gather_reads_committed_state_above_the_root() -> None:
    tree = chain_tree([5, 6, 7, 8, 9], prefix_len=3)
    # buffer = [state col 0, col 1, col 2, row 0, row 1, ...]
    assert tree.conv_gather.tolist() == [[0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6], [4, 5, 6, 7]]


def test_descriptor_check_rejects_every_invalid_tree() -> None:
    result = check_descriptor(1, seed=3)
    assert result.ok and result.faults_planted == len(INVALID_TREES)


@pytest.mark.parametrize("shape", SHAPES)
def test_without_padding_equals_the_same_tree_built_without_padding(shape: str) -> None:
    tree = random_tree(shape, random.Random(7))
    n = tree.n_active
    bare = build_tree(
        tree.tokens[:n].tolist(),
        tree.parent[:n].tolist(),
        prefix_len=tree.prefix_len,
        max_depth=tree.max_depth,
    )
    cut = tree.without_padding()
    assert cut.rows == n and (cut is tree) == (n == tree.rows)
    for name in ("tokens", "parent", "depth", "position", "active", "slot_map", "ancestry",
                 "ancestor_at_depth", "child_nodes", "child_tokens", "spine", "conv_gather"):  # fmt: skip
        assert torch.equal(getattr(cut, name), getattr(bare, name)), name


@pytest.mark.parametrize("seed", range(6))
def test_builder_trees_skip_validation_but_equal_the_validated_build(seed: int) -> None:
    tree = paper_tree(random.Random(seed), vocab=50, prefix_len=9)  # TreeBuilder: trusted depths
    n = tree.n_active
    validated = build_tree(
        tree.tokens[:n].tolist(),
        tree.parent[:n].tolist(),
        prefix_len=9,
        rows=tree.rows,
        max_depth=tree.max_depth,
    )
    for name in ("tokens", "parent", "depth", "position", "active", "slot_map", "ancestry",
                 "ancestor_at_depth", "child_nodes", "child_tokens", "spine", "conv_gather"):  # fmt: skip
        assert torch.equal(getattr(tree, name), getattr(validated, name)), name
    assert torch.equal(tree.paths.nodes, validated.paths.nodes)


@pytest.mark.parametrize("prefix_len", [0, 7, 4000])
def test_root_tree_equals_the_built_root_only_chain(prefix_len: int) -> None:
    fast, built = root_tree(4321, prefix_len=prefix_len), chain_tree([4321], prefix_len=prefix_len)
    for f in dataclasses.fields(built):
        a, b = getattr(fast, f.name), getattr(built, f.name)
        if isinstance(b, torch.Tensor):
            assert a.dtype == b.dtype and torch.equal(a, b), f.name
        else:
            assert a == b, f.name
    for g in dataclasses.fields(built.paths):  # the lazily planned GDN scan schedule too
        assert torch.equal(getattr(fast.paths, g.name), getattr(built.paths, g.name)), g.name
