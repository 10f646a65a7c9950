"""The acceptance walk of one request's cycle (DESIGN §3.4), evaluated only where it goes.

Same walk as the core's `greedy_walk` / `sample_walk` over `tree_penalized_logits` /
`tree_probabilities`: at node u take x from u's row (greedy: argmax of the biased, penalised logits,
lowest index on ties; sampled: exponential race with Philox coins keyed by (seed, output position,
token), node u sampling position len(output) + depth(u)); descend
if a child carries x, else emit x and stop. The spine's rows are processed together (the walk
usually stays on it), other rows only when the walk reaches them, and coins are drawn only for
tokens of nonzero probability (the race ignores the rest): on a CPU that is most of the cost of
sampling. Tested equal to the core.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from lumotree.drafting.selection import argmax_lowest_index
from lumotree.drafting.selection_fast import ordered_topk_fast
from lumotree.engine.sequence import TokenLogprob
from lumotree.sampling.forced import forced_path
from lumotree.sampling.logits import SamplingParams, apply_logit_bias, apply_penalties
from lumotree.sampling.logits_fast import probabilities_rows
from lumotree.sampling.rng import philox4x32, position_words, seed_key, uint_to_uniform_float
from lumotree.tree import TreeDescriptor

#: (seed, output position(s), tokens [k] or [n, k]) -> float32 coins of the tokens' shape
Coins = Callable[[int, "int | Sequence[int]", Tensor], Tensor]


def support_coins(seed: int, positions: int | Sequence[int], tokens: Tensor) -> Tensor:
    """The core's `uniform_coins` at the given tokens only: tokens [k] of one output position, or
    [n, k] of n positions -> float32 coins of the same shape (NumPy; the native forward computes
    the same bits, `lumotree.model.native.coins.philox_coins`)."""
    lo, hi = position_words(np.asarray(positions, dtype=np.int64)[..., None])
    word, _, _, _ = philox4x32(np.int64(seed_key(seed)), tokens.numpy(), lo, hi, 0)
    return torch.from_numpy(uint_to_uniform_float(word).reshape(tokens.shape))


def history_counts(tokens: Sequence[int], vocab: int) -> Tensor:
    """Token counts [V] float32 of a history."""
    counts = torch.zeros(vocab, dtype=torch.float32)
    if len(tokens):
        counts += torch.bincount(torch.as_tensor(list(tokens), dtype=torch.long), minlength=vocab).float()
    return counts


class RowSampler:
    """Chooses the tokens of tree rows with the request's processing: penalties over prompt +
    `generated` + each row's own path drafts, then greedy argmax or the seeded exponential race.
    A row whose path holds d drafts samples output position len(generated) + d."""

    def __init__(
        self,
        params: SamplingParams,
        prompt_seen: Tensor,
        generated: Sequence[int],
        seed: int,
        coins: Coins = support_coins,
    ) -> None:
        self.params, self.prompt_seen, self.seed, self.coins = params, prompt_seen, seed, coins
        self.position = len(generated)
        self.vocab = int(prompt_seen.shape[0])
        needs_history = (
            params.repetition_penalty != 1.0
            or params.frequency_penalty != 0.0
            or params.presence_penalty != 0.0
        )
        # counted only when a penalty reads them (a full-vocabulary bincount per cycle otherwise)
        self._generated = history_counts(generated, self.vocab) if needs_history else None

    def advance(self, emitted: Sequence[int]) -> None:
        """`emitted` tokens were appended to the output: they join the history."""
        self.position += len(emitted)
        if self._generated is not None and len(emitted):
            self._generated += history_counts(emitted, self.vocab)

    def penalised(self, logits: Tensor, path_drafts: Sequence[Sequence[int]]) -> Tensor:
        """logits [n, V] -> float32 [n, V] after the logit bias and penalties; row i's history adds
        path_drafts[i]."""
        logits = apply_logit_bias(logits, self.params)
        if self._generated is None:
            return logits
        counts = self._generated.repeat(len(path_drafts), 1)
        rows = [i for i, path in enumerate(path_drafts) for _ in path]
        if rows:
            tokens = [t for path in path_drafts for t in path]
            counts.index_put_(
                (torch.tensor(rows), torch.tensor(tokens)), torch.ones(len(rows)), accumulate=True
            )
        return apply_penalties(logits, self.prompt_seen, counts, self.params)

    def choose(self, logits: Tensor, path_drafts: Sequence[Sequence[int]]) -> list[int]:
        """The token each row yields: logits [n, V] of rows with these path drafts (root excluded,
        the node included)."""
        x = self.penalised(logits, path_drafts)
        if self.params.greedy:
            return argmax_lowest_index(x).tolist()
        probs, cand = probabilities_rows(x, self.params)
        positions = [self.position + len(path) for path in path_drafts]
        if cand is None:
            return [
                self._race(row, row.nonzero()[:, 0], pos) for row, pos in zip(probs, positions, strict=True)
            ]
        coins = self.coins(self.seed, positions, cand)
        pc = probs.gather(-1, cand)
        score = torch.where(pc > 0, pc / -torch.log(coins), torch.tensor(-1.0))
        return cand.gather(-1, score.argmax(dim=-1, keepdim=True))[:, 0].tolist()

    def _race(self, probs: Tensor, support: Tensor, position: int) -> int:
        """The exponential race of one row over its support (ascending token ids)."""
        p = probs[support]
        score = p / -torch.log(self.coins(self.seed, position, support))
        return int(support[int(score.argmax())])


@dataclass(frozen=True)
class Acceptance:
    """accepted: logical nodes root..last; emitted: the accepted drafts then the chosen token
    (len(accepted) of them); each emitted token comes from the row accepted[i]."""

    accepted: list[int]
    emitted: list[int]


def walk(tree: TreeDescriptor, rows_logits: Callable[[list[int]], Tensor], sampler: RowSampler) -> Acceptance:
    """The acceptance walk from the root; rows_logits(nodes) -> raw logits [n, V] of those rows.

    The spine's rows are evaluated together first (the walk usually stays on it); a node off the
    spine is evaluated when the walk reaches it. Every row's choice depends only on its own
    logits, path and coins, so the order of evaluation does not change the result.
    """
    children = tree.child_nodes.tolist()
    child_tokens = tree.child_tokens.tolist()
    tokens = tree.tokens.tolist()
    spine = tree.spine.tolist()
    spine_paths = [[tokens[s] for s in spine[1 : i + 1]] for i in range(len(spine))]
    on_spine = dict(zip(spine, sampler.choose(rows_logits(spine), spine_paths), strict=True))
    node, accepted, path_drafts, emitted = 0, [0], [], []
    while True:
        x = on_spine.get(node)
        if x is None:
            x = sampler.choose(rows_logits([node]), [path_drafts])[0]
        emitted.append(x)
        nxt = next(
            (c for c, t in zip(children[node], child_tokens[node], strict=True) if c >= 0 and t == x), None
        )
        if nxt is None:
            return Acceptance(accepted, emitted)
        node = nxt
        accepted.append(node)
        path_drafts = [*path_drafts, tokens[node]]


def forced_walk(
    tree: TreeDescriptor, rows_logits: Callable[[list[int]], Tensor], sampler: RowSampler, count: int
) -> Acceptance:
    """A forced-acceptance cycle (speed work, `lumotree.sampling.forced`): the first `count` spine
    drafts are accepted whatever the rows say, then the last accepted node's row chooses."""
    nodes, drafts = forced_path(tree.spine.tolist(), tree.tokens.tolist(), count)
    return Acceptance(nodes, [*drafts, sampler.choose(rows_logits(nodes[-1:]), [drafts])[0]])


def token_logprobs(logits: Tensor, tokens: Sequence[int], k: int) -> list[TokenLogprob]:
    """Raw-distribution logprobs of tokens[i] under row logits[i] and each row's top-k.
    logits [n, V] -> n TokenLogprob."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    top = ordered_topk_fast(logp, k).tolist() if k > 0 else [[] for _ in tokens]
    out = []
    for row, token, best in zip(logp, tokens, top, strict=True):
        best_values = row[best].tolist() if best else []
        out.append(
            TokenLogprob(int(token), float(row[int(token)]), tuple(zip(best, best_values, strict=True)))
        )
    return out
