"""Draft selection semantics with pinned tie rules (paper §V-D).

spine (and greedy) token = argmax with the lowest index among maximal values; ordered top-k =
values descending, ties broken by index ascending. Both are defined on the values alone, so they
never depend on the order in which torch.topk happens to return tied entries. NaN scores are
rejected.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check_scores(scores: Tensor) -> None:
    if not scores.is_floating_point():
        raise TypeError(f"selection needs floating-point scores, got {scores.dtype}")
    if torch.isnan(scores).any():
        raise ValueError("selection scores contain NaN")


def argmax_lowest_index(scores: Tensor) -> Tensor:
    """The spine (and greedy) token: lowest index of the maximal value. scores [..., V] -> int64 [...]."""
    _check_scores(scores)
    is_max = scores == scores.amax(dim=-1, keepdim=True)
    # argmax over a 0/1 integer tensor returns the first maximal position; keep it integer so
    # there is no float tie to reason about.
    return is_max.to(torch.uint8).argmax(dim=-1)


def ordered_topk(scores: Tensor, k: int) -> Tensor:
    """The k best indices along the last dim, values descending, ties by index ascending.

    scores [..., V] float -> int64 [..., k]. Exactly k indices even when ties cross the boundary.
    """
    _check_scores(scores)
    vocab = scores.shape[-1]
    if not 1 <= k <= vocab:
        raise ValueError(f"k must be in 1..{vocab}, got {k}")
    # A stable descending sort keeps equal values in index order; torch.topk gives no such promise.
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]
