"""vLLM's token filters, per tree row: allowed_token_ids and bad_words (vLLM 0.32's Sampler applies
them first, then logit bias and penalties, which the engine's `RowSampler` applies).

A filtered token's logit becomes -inf. allowed_token_ids bans every other token; a bad word
(its token ids) bans its last token where the row's history ends with the rest of it. A tree row's
history is what single-row decoding would have had at that row: the request's output so far (ending
with the tree's root) and the drafts on the row's own path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lumotree.engine.acceptance import Coins, RowSampler, support_coins
from lumotree.sampling import SamplingParams


@dataclass(frozen=True)
class TokenFilters:
    """allowed: the only token ids a row may yield (empty: all); bad_words: token-id sequences whose
    last token is banned after the rest."""

    allowed: tuple[int, ...] = ()
    bad_words: tuple[tuple[int, ...], ...] = ()

    @classmethod
    def of(cls, params: object) -> TokenFilters:
        """The filters a vLLM SamplingParams asks for (bad words as its tokenizer encoded them)."""
        allowed = getattr(params, "allowed_token_ids", None) or ()
        bad = getattr(params, "bad_words_token_ids", None) or ()
        return cls(tuple(int(t) for t in allowed), tuple(tuple(int(t) for t in w) for w in bad))

    def __bool__(self) -> bool:
        return bool(self.allowed or self.bad_words)

    @property
    def context(self) -> int:
        """How many history tokens a bad word can look back on."""
        return max((len(w) - 1 for w in self.bad_words), default=0)

    def banned(self, history: Sequence[int]) -> list[int]:
        """The bad words' last tokens banned after `history`."""
        return [
            w[-1]
            for w in self.bad_words
            if len(w) - 1 <= len(history) and tuple(history[len(history) - len(w) + 1 :]) == w[:-1]
        ]

    def apply(self, logits: Tensor, histories: Sequence[Sequence[int]]) -> Tensor:
        """logits [n, V] -> float32 [n, V] with the filtered tokens at -inf (a new tensor); row i
        has history histories[i]."""
        out = logits.float().clone()
        if self.allowed:
            keep = torch.zeros(out.shape[-1], dtype=torch.bool)
            keep[list(self.allowed)] = True
            out.masked_fill_(~keep, float("-inf"))
        for row, history in zip(out, histories, strict=True):
            banned = self.banned(history)
            if banned:
                row[banned] = float("-inf")
        return out


class FilteredRowSampler(RowSampler):
    """The engine's `RowSampler` with vLLM's token filters applied before its logit bias and
    penalties (the same choices, coins and positions otherwise)."""

    def __init__(
        self,
        params: SamplingParams,
        filters: TokenFilters,
        prompt_seen: Tensor,
        generated: Sequence[int],
        seed: int,
        coins: Coins = support_coins,
    ) -> None:
        super().__init__(params, prompt_seen, generated, seed, coins)
        self.filters = filters
        self._tail = list(generated[max(0, len(generated) - filters.context) :])

    def advance(self, emitted: Sequence[int]) -> None:
        super().advance(emitted)
        self._tail = [*self._tail, *emitted][max(0, len(self._tail) + len(emitted) - self.filters.context) :]

    def penalised(self, logits: Tensor, path_drafts: Sequence[Sequence[int]]) -> Tensor:
        if self.filters:
            logits = self.filters.apply(logits, [[*self._tail, *path] for path in path_drafts])
        return super().penalised(logits, path_drafts)
