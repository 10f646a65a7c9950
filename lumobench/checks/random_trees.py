"""Random draft trees of every shape the verifier must handle (`SHAPES`, `random_tree`) and of the
paper geometry from random proposals (`paper_tree`): the cases of the component checks
(`lumobench verify`), the benchmarks and the tests."""

from __future__ import annotations

import random

from lumotree.drafting.geometry import GeometryConfig, RescueBranch, build_paper_tree
from lumotree.tree import DEFAULT_ROWS, MAX_DEPTH, TreeDescriptor, build_tree

SHAPES = ("single_root", "chain", "wide_fan", "deep_and_wide", "repeated_subtrees", "random_order", "paper")


def _fresh_token(rng: random.Random, vocab: int, taken: set[int]) -> int:
    while True:
        t = rng.randrange(vocab)
        if t not in taken:
            taken.add(t)
            return t


def _from_parents(
    parents: list[int], rng: random.Random, vocab: int, prefix_len: int, rows: int
) -> TreeDescriptor:
    tokens, taken = [rng.randrange(vocab)], {}
    for p in parents[1:]:
        tokens.append(_fresh_token(rng, vocab, taken.setdefault(p, set())))
    return build_tree(tokens, parents, prefix_len=prefix_len, rows=rows)


def paper_tree(
    rng: random.Random,
    vocab: int,
    prefix_len: int,
    config: GeometryConfig = GeometryConfig(),
    root: int | None = None,
) -> TreeDescriptor:
    """The paper geometry from random proposals: rescue branches hang below a spine node and a sibling."""
    spine = [rng.randrange(vocab) for _ in range(config.depth_mtp)]
    topk = [[s, *rng.sample([t for t in range(vocab) if t != s], 2)] for s in spine]
    tail = [rng.randrange(vocab) for _ in range(config.tail_len)]
    d = rng.randrange(1, max(2, config.depth_mtp))
    rescues = [
        RescueBranch(tuple(spine[:d]), tuple(rng.randrange(vocab) for _ in range(4))),
        RescueBranch((topk[0][1],), tuple(rng.randrange(vocab) for _ in range(2))),
    ]
    root = rng.randrange(vocab) if root is None else root
    return build_paper_tree(root, spine, topk, tail, rescues, prefix_len=prefix_len, config=config)


def random_tree(
    shape: str, rng: random.Random, *, vocab: int = 64, prefix_len: int = 8, rows: int = DEFAULT_ROWS
) -> TreeDescriptor:
    """A padded tree of the named shape (see SHAPES) with at most `rows` nodes and depth <= MAX_DEPTH."""
    if shape == "single_root":
        return _from_parents([-1], rng, vocab, prefix_len, rows)
    if shape == "chain":
        return _from_parents([-1, *range(MAX_DEPTH)], rng, vocab, prefix_len, rows)
    if shape == "wide_fan":
        return _from_parents([-1] + [0] * (rows - 5), rng, vocab, prefix_len, rows)
    if shape == "deep_and_wide":
        parents, depth = [-1], [0]
        while len(parents) < rows - 2:
            deep = [i for i, d in enumerate(depth) if d < MAX_DEPTH]
            p = (
                max(rng.sample(deep, min(3, len(deep))), key=lambda i: depth[i])
                if rng.random() < 0.6
                else rng.choice(deep)
            )
            parents.append(p)
            depth.append(depth[p] + 1)
        return _from_parents(parents, rng, vocab, prefix_len, rows)
    if shape == "repeated_subtrees":
        # The same token pattern (a -> b -> c, a -> d) under four different heads.
        a, b, c, d = rng.sample(range(vocab), 4)
        tokens, parents = [rng.randrange(vocab)], [-1]

        def add(token: int, parent: int) -> int:
            tokens.append(token)
            parents.append(parent)
            return len(tokens) - 1

        for head in rng.sample([t for t in range(vocab) if t not in (a, b, c, d)], 4):
            node_a = add(a, add(head, 0))
            add(c, add(b, node_a))
            add(d, node_a)
        return build_tree(tokens, parents, prefix_len=prefix_len, rows=rows)
    if shape == "random_order":
        parents, depth = [-1], [0]
        for i in range(1, rng.randrange(rows // 2, rows + 1)):
            p = rng.randrange(i)
            while depth[p] >= MAX_DEPTH:
                p = rng.randrange(i)
            parents.append(p)
            depth.append(depth[p] + 1)
        return _from_parents(parents, rng, vocab, prefix_len, rows)
    if shape == "paper":
        return paper_tree(rng, vocab, prefix_len)
    raise ValueError(f"unknown tree shape {shape!r}; choose from {', '.join(SHAPES)}")
