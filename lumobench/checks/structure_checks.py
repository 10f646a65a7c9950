"""Descriptor and draft-selection checks: invariants over random trees, rejection of invalid
topologies, and the pinned tie rules of argmax / ordered top-k against a plain-Python oracle."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

import torch
from torch import Tensor

from lumobench.checks.random_trees import SHAPES, random_tree
from lumobench.checks.result import CheckResult
from lumotree.drafting.geometry import GeometryConfig, build_paper_tree, mtp_proposals
from lumotree.drafting.selection import argmax_lowest_index, ordered_topk
from lumotree.tree import MAX_DEPTH, TreeDescriptor, TreeError, build_tree


def descriptor_violations(tree: TreeDescriptor) -> list[str]:
    """Every broken invariant of a descriptor, by name (empty when it is sound)."""
    bad = []
    n, rows = tree.n_active, tree.rows
    spine = tree.spine.tolist()
    if sorted(tree.slot_map.tolist()) != list(range(rows)):
        bad.append("slot_map is not a permutation")
    if tree.slot_map[tree.spine].tolist() != list(range(len(spine))):
        bad.append("spine is not first and contiguous in physical slots")
    if sorted(tree.slot_map[n:].tolist()) != list(range(n, rows)):
        bad.append("padding does not occupy the trailing slots")
    for i in range(n):
        path = tree.path_to(i)
        if (
            path[0] != 0
            or path[-1] != i
            or any(int(tree.parent[b]) != a for a, b in itertools.pairwise(path))
        ):
            bad.append(f"ancestor_at_depth of node {i} is not its parent chain")
        if set(torch.nonzero(tree.ancestry[i]).flatten().tolist()) != set(path):
            bad.append(f"ancestry row {i} differs from its path")
        if int(tree.position[i]) != tree.prefix_len + len(path) - 1:
            bad.append(f"position of node {i} is not prefix_len + depth")
        window = [tree.conv_gather[i, t].item() for t in range(tree.conv_gather.shape[1])]
        width = len(window)
        expect = [
            (width - 1 + d) if d < 0 else width - 1 + path[d] for d in range(len(path) - width, len(path))
        ]
        if window != expect:
            bad.append(f"conv window of node {i} does not follow its ancestry")
    plan = tree.paths
    owned = [int(x) for x in plan.nodes[plan.owner]] + plan.leaf_node.tolist()
    if sorted(owned) != list(range(n)):
        bad.append("path plan does not cover every active node exactly once")
    if plan.nodes[0][plan.nodes[0] >= 0].tolist() != spine:
        bad.append("path 0 is not the spine")
    for p in range(1, plan.nodes.shape[0]):
        nodes = [x for x in plan.nodes[p].tolist() if x >= 0]
        cut = int(plan.cut_nodes[plan.start_cut[p]])
        if int(tree.parent[nodes[0]]) != cut or cut not in spine:
            bad.append(f"branch path {p} does not start below its spine cut node")
        if any(int(tree.parent[b]) != a for a, b in itertools.pairwise(nodes)):
            bad.append(f"branch path {p} is not a chain")
    for leaf, p, step in zip(
        plan.leaf_node.tolist(), plan.leaf_path.tolist(), plan.leaf_step.tolist(), strict=True
    ):
        if int(tree.child_nodes[leaf, 0]) != -1 or int(tree.parent[leaf]) != int(plan.nodes[p, step]):
            bad.append(f"node {leaf} is attached as a leaf but is not a leaf child of its path step")
    return bad


INVALID_TREES: dict[str, tuple[list[int], list[int]]] = {
    "cycle": ([5, 6, 7, 8], [-1, 3, 1, 2]),
    "out-of-range parent": ([5, 6, 7], [-1, 0, 9]),
    "self parent": ([5, 6, 7], [-1, 0, 2]),
    "duplicate sibling tokens": ([5, 6, 6], [-1, 0, 0]),
    "depth > max": (list(range(MAX_DEPTH + 2)), [-1, *range(MAX_DEPTH + 1)]),
    "parent after child": ([5, 6, 7], [-1, 2, 0]),
    "root not first": ([5, 6, 7], [1, -1, 1]),
}


def check_descriptor(trees_per_shape: int, seed: int = 0) -> CheckResult:
    """Invariants on random trees of every shape; each invalid topology must be rejected."""
    rng = random.Random(seed)
    result = CheckResult("Tree descriptor")
    for _ in range(trees_per_shape):
        for shape in SHAPES:
            result.case(not descriptor_violations(random_tree(shape, rng, prefix_len=rng.randrange(64))))
    for tokens, parents in INVALID_TREES.values():
        try:
            build_tree(tokens, parents, prefix_len=0)
            result.fault(False)
        except TreeError:
            result.fault(True)
    paper = random_tree("paper", rng)
    result.detail = (
        f"paper geometry: {paper.n_active} active of {paper.rows} rows, depth {int(paper.depth.max())}; "
        f"rejected: {', '.join(INVALID_TREES)}"
    )
    return result


def oracle_topk(scores: list[float], k: int) -> list[int]:
    """Values descending, index ascending, by Python's sort."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:k]


def _tie_reversed_topk(scores: Tensor, k: int) -> Tensor:
    # A top-k that returns tied entries highest index first: an order torch.topk is free to use.
    vocab = scores.shape[-1]
    return vocab - 1 - torch.sort(scores.flip(-1), dim=-1, descending=True, stable=True).indices[..., :k]


SELECTION_FAULTS: dict[str, Callable[[Tensor], tuple[Tensor, Tensor]]] = {
    "spine = first of a tie-reversed top-k": lambda x: (_tie_reversed_topk(x, 1)[..., 0], ordered_topk(x, 3)),
    "top-3 ties by index descending": lambda x: (argmax_lowest_index(x), _tie_reversed_topk(x, 3)),
}


def selection_cases(n: int, seed: int) -> list[Tensor]:
    """Score rows [V] with heavy ties: quantised, constant, -inf filled, a 248,320-token vocabulary."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        vocab = 248_320 if i == 0 else 64 + i
        x = torch.round(torch.randn(vocab, generator=gen) * (0.7 if i % 3 else 3.0))
        if i % 5 == 1:
            x = torch.zeros(vocab)
        if i % 5 == 2:
            x[torch.rand(vocab, generator=gen) < 0.8] = float("-inf")
        out.append(x)
    return out


def check_selection(n_cases: int, seed: int = 0) -> CheckResult:
    """argmax / ordered top-3 equal the oracle on tie-heavy rows; tie-order faults are caught; the
    paper tree built from the selections has the documented geometry."""
    result = CheckResult("Draft selection")
    rows = selection_cases(n_cases, seed)
    for x in rows:
        want = oracle_topk(x.tolist(), 3)
        result.case(int(argmax_lowest_index(x)) == want[0] and ordered_topk(x, 3).tolist() == want)
    for fault in SELECTION_FAULTS.values():
        result.fault(
            any(
                (int(s) != oracle_topk(x.tolist(), 1)[0]) or (t.tolist() != oracle_topk(x.tolist(), 3))
                for x in rows
                for s, t in [fault(x)]
            )
        )
    gen = torch.Generator().manual_seed(seed)
    spine, top3 = mtp_proposals(torch.randn(5, 128, generator=gen))
    tree = build_paper_tree(
        1, spine, top3, tail=list(range(6)), prefix_len=0, config=GeometryConfig(rescue_lens=())
    )
    result.case(tree.n_active == 1 + 5 * 3 + 6 and int(tree.depth.max()) == 11)
    result.detail = f"{len(rows)} tie-heavy rows (one of 248,320 tokens); paper tree from MTP selections"
    return result
