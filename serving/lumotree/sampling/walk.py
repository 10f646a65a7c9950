"""Acceptance walks over the tree (DESIGN §3.4), batched over independent walks W.

Target-only walk for point-mass drafts: at node u sample x ~ p_u; if a child of u carries x,
descend; otherwise emit x and stop (at a leaf the sample is the bonus token). Every emitted token is
then distributed exactly as single-row sampling from the target rows would give it. The greedy walk
uses argmax with the lowest index on ties instead of sampling.

Outputs are fixed-shape (D = tree.max_depth): accepted [W, D+1] logical nodes root..last (-1
padded), path_len [W] (>= 1, counts the root), emitted [W, D+1] tokens (the accepted drafts, then
the sampled token; -1 padded; path_len of them), final_row [W] the node whose row produced the last
emitted token (its hidden row feeds the drafter).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from lumotree.drafting.selection import argmax_lowest_index
from lumotree.sampling.rng import exponential_race, uniform_coins
from lumotree.tree import TreeDescriptor

CoinFn = Callable[[Tensor, Tensor, int], Tensor]  # (seeds [w], positions [w], vocab) -> coins [w, V]


@dataclass(frozen=True, eq=False)
class WalkResult:
    """See the module docstring for shapes."""

    accepted: Tensor
    path_len: Tensor
    emitted: Tensor
    final_row: Tensor

    def tensors(self) -> list[Tensor]:
        return [self.accepted, self.path_len, self.emitted, self.final_row]


def _walk(tree: TreeDescriptor, walks: int, choose: Callable[[Tensor, Tensor], Tensor]) -> WalkResult:
    """choose(walk_ids [w], nodes [w]) -> tokens [w] for the walks still running."""
    width = tree.max_depth + 1
    accepted = torch.full((walks, width), -1, dtype=torch.long)
    emitted = torch.full((walks, width), -1, dtype=torch.long)
    accepted[:, 0] = 0
    path_len = torch.ones(walks, dtype=torch.long)
    node = torch.zeros(walks, dtype=torch.long)
    running = torch.arange(walks)
    for depth in range(width):
        cur = node[running]
        x = choose(running, cur)
        emitted[running, depth] = x
        match = (tree.child_tokens[cur] == x[:, None]) & (tree.child_nodes[cur] >= 0)
        descend = match.any(dim=-1)
        child = tree.child_nodes[cur].gather(1, match.to(torch.uint8).argmax(dim=-1, keepdim=True))[:, 0]
        running = running[descend]
        if running.numel() == 0:  # every walk has stopped (always true below a leaf at max depth)
            break
        node[running] = child[descend]
        accepted[running, depth + 1] = child[descend]
        path_len[running] += 1
    return WalkResult(accepted=accepted, path_len=path_len, emitted=emitted, final_row=node)


def sample_walk(
    probs: Tensor, tree: TreeDescriptor, seeds: Tensor, position: int, coins: CoinFn = uniform_coins
) -> WalkResult:
    """Target-only sampling walks. probs [R, V] float32 (processed rows); seeds [W] int64, one per walk;
    position: the output index of the token the root row samples (node u samples position + depth(u)).

    Coins come from `coins(seeds, positions, V)`: by default the Philox coins keyed by
    (seed, output position, token).
    """
    vocab = probs.shape[-1]

    def choose(walk_ids: Tensor, nodes: Tensor) -> Tensor:
        return exponential_race(probs[nodes], coins(seeds[walk_ids], position + tree.depth[nodes], vocab))

    return _walk(tree, int(seeds.shape[0]), choose)


def greedy_walk(logits: Tensor, tree: TreeDescriptor) -> WalkResult:
    """Greedy walk over penalised logits [R, V]; one walk (leading dim 1)."""
    return _walk(tree, 1, lambda _ids, nodes: argmax_lowest_index(logits[nodes]))
