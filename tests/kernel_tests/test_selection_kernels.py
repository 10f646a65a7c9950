"""Fused argmax + ordered top-k vs the reference's pinned tie rules (interpreter)."""

from __future__ import annotations

import pytest
import torch

from lumotree.drafting import selection as ref
from lumotree.drafting.fused_selection import BLOCK_VOCAB, rank_rows_, selection_scratch

from .helpers import assert_written, poisoned


def _select(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows, vocab = scores.shape
    spine, topk = poisoned((rows,), torch.int64), poisoned((rows, k), torch.int64)
    rank_rows_(scores, spine, topk, selection_scratch(rows, vocab, k, scores.device))
    assert_written(spine)
    assert_written(topk)
    return spine, topk


@pytest.mark.parametrize("k", [1, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_selection_keeps_the_pinned_tie_rules(k: int, dtype: torch.dtype) -> None:
    # Few distinct values over a vocabulary spanning 3 blocks (last one partial): ties everywhere,
    # including ties that straddle block boundaries.
    gen = torch.Generator().manual_seed(k)
    vocab = 2 * BLOCK_VOCAB + 77
    scores = torch.randint(-3, 4, (5, vocab), generator=gen).to(dtype)
    spine, topk = _select(scores, k)
    assert torch.equal(spine, ref.argmax_lowest_index(scores))
    assert torch.equal(topk, ref.ordered_topk(scores, k))
    assert torch.equal(spine, topk[:, 0])


def test_fused_selection_on_continuous_scores_and_minus_infinity() -> None:
    gen = torch.Generator().manual_seed(9)
    scores = torch.randn(3, BLOCK_VOCAB + 5, generator=gen)
    scores[0] = float("-inf")  # all masked: the lowest indices win the ties
    scores[1, 100:] = float("-inf")
    scores[2, -1] = 50.0  # the maximum sits in the partial last block
    spine, topk = _select(scores, 3)
    assert torch.equal(spine, ref.argmax_lowest_index(scores))
    assert torch.equal(topk, ref.ordered_topk(scores, 3))
    assert topk[0].tolist() == [0, 1, 2] and int(spine[2]) == BLOCK_VOCAB + 4


def test_ranking_a_draft_vocabulary_writes_its_token_ids_as_the_whole_vocabulary_ranking_would() -> None:
    # The ranked columns are a sorted subset of a larger vocabulary: the written ids must be those
    # the whole-vocabulary ranking gives with every other token at -inf (ties included).
    gen = torch.Generator().manual_seed(4)
    vocab = 3 * BLOCK_VOCAB
    ids = torch.randperm(vocab, generator=gen)[: BLOCK_VOCAB + 300].sort().values
    subset = torch.randint(-2, 3, (2, ids.numel()), generator=gen).float()
    whole = torch.full((2, vocab), float("-inf"))
    whole[:, ids] = subset
    spine, topk = poisoned((2,), torch.int64), poisoned((2, 4), torch.int64)
    rank_rows_(subset, spine, topk, selection_scratch(2, ids.numel(), 4, subset.device), ids=ids)
    assert_written(spine)
    assert_written(topk)
    assert torch.equal(spine, ref.argmax_lowest_index(whole))
    assert torch.equal(topk, ref.ordered_topk(whole, 4))
