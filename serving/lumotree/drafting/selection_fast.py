"""CPU-fast exact variants of the core's ordered top-k selection (`selection.ordered_topk`).

The core defines top-k order by a stable descending sort of the whole vocabulary, which costs
~0.5 ms per 8k-token row on one CPU core. These variants find the same tokens with torch.topk and
sort only the few candidates: the k-set of a stable descending sort is every value above the k-th
largest plus the lowest-index values equal to it. Results are bitwise those of
`lumotree.drafting.selection.ordered_topk` (tested); where a shortcut cannot guarantee that, they
call the core function. `fused_selection.py` is the Triton form.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lumotree.drafting.selection import ordered_topk


def topk_set(scores: Tensor, k: int) -> Tensor:
    """Ascending indices of the first k entries of a stable descending sort. scores [V] float."""
    if torch.isnan(scores).any():
        raise ValueError("selection scores contain NaN")
    threshold = torch.topk(scores, k, sorted=False).values.min()
    above = (scores > threshold).nonzero()[:, 0]
    tied = (scores == threshold).nonzero()[:, 0][: k - above.numel()]
    return torch.cat([above, tied]).sort().values


def stable_desc(scores: Tensor, idx: Tensor) -> Tensor:
    """idx (ascending) reordered by scores descending, ties keeping index order."""
    return idx[torch.sort(scores[idx], descending=True, stable=True).indices]


def ordered_topk_fast(scores: Tensor, k: int) -> Tensor:
    """Equal to ordered_topk(scores, k). scores [..., V] float -> int64 [..., k]."""
    vocab = scores.shape[-1]
    if not 1 <= k <= vocab:
        return ordered_topk(scores, k)  # raises the core's error
    flat = scores.reshape(-1, vocab)
    if torch.isnan(flat).any():
        raise ValueError("selection scores contain NaN")
    top = torch.topk(flat, k, dim=-1)
    if bool(((flat >= top.values[:, -1:]).sum(-1) != k).any()):  # a tie straddles the k-th value
        out = torch.stack([stable_desc(row, topk_set(row, k)) for row in flat])
    else:
        cand = top.indices.sort(dim=-1).values  # the exact k-set, ascending
        out = cand.gather(-1, torch.sort(flat.gather(-1, cand), dim=-1, descending=True, stable=True).indices)
    return out.reshape(*scores.shape[:-1], k)
