"""CPU-fast exact variants of the core's per-row sampling distribution (`logits.probabilities`).

The core's top-k and top-p sort the whole vocabulary row; these find the same kept set from a
torch.topk candidate set or a sorted prefix (`drafting.selection_fast`), so results are bitwise
those of `lumotree.sampling.logits.probabilities` (tested); where a shortcut cannot guarantee that,
they call the core function.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lumotree.drafting.selection_fast import stable_desc, topk_set
from lumotree.sampling.logits import SamplingParams, probabilities

_TOP_P_FIRST_GUESS = 64  # candidates sorted first when top-p runs on a full-vocabulary row


def _top_p_keep(p: Tensor, top_p: float) -> Tensor | None:
    """The core's top-p keep mask from probabilities p [V], found from a sorted prefix; None when
    the prefix would have to cover the whole support (the caller then uses the core)."""
    positive = (p > 0).nonzero()[:, 0]  # ascending
    support = positive.numel()
    m = min(support, _TOP_P_FIRST_GUESS)
    while True:
        # the whole support when it is small (after top-k, say): no selection needed
        order = stable_desc(p, positive if m == support else topk_set(p, m))
        cum = torch.cumsum(p[order], dim=-1)
        # tokens after the prefix have at least cum[-1] of mass before them: dropped when >= top_p
        if bool(cum[-1] >= top_p):
            mass_before = cum.roll(1)
            mass_before[0] = 0.0
            keep = torch.zeros_like(p, dtype=torch.bool)
            keep[order] = mass_before < top_p
            return keep
        if m == support:
            return None
        m = min(support, 4 * m)


def probabilities_rows(logits: Tensor, params: SamplingParams) -> tuple[Tensor, Tensor | None]:
    """Equal to probabilities(logits, params), rows [n, V] at once; also returns, when top-k
    applies, the ascending k-set of each row [n, k] (it holds the row's whole support).

    Vectorised when top-k is on and no row has ties across its k-th value; otherwise row by row.
    """
    vocab = logits.shape[-1]
    k = params.top_k
    if params.greedy or not 0 < k < vocab:
        return torch.stack([probabilities_fast(row, params) for row in logits]), None
    if torch.isnan(logits).any():
        raise ValueError("selection scores contain NaN")
    neg_inf = torch.tensor(float("-inf"))
    x = logits.float() / params.temperature
    if params.min_p > 0.0:
        p = torch.softmax(x, dim=-1)
        x = torch.where(p >= params.min_p * p.amax(dim=-1, keepdim=True), x, neg_inf)
    top = torch.topk(x, k, dim=-1)
    if bool(((x >= top.values[:, -1:]).sum(-1) != k).any()):  # a tie straddles the k-th value
        return torch.stack([probabilities_fast(row, params) for row in logits]), None
    cand = top.indices.sort(dim=-1).values
    x = torch.where(torch.zeros_like(x, dtype=torch.bool).scatter_(-1, cand, True), x, neg_inf)
    if params.top_p < 1.0:
        # the core sorts the whole row; outside the k-set p is 0, so the k-set's stable order and
        # running sums are the head of it (and every later token has mass_before >= the k-set's)
        pc = torch.softmax(x, dim=-1).gather(-1, cand)
        order = torch.sort(pc, dim=-1, descending=True, stable=True).indices
        mass_before = torch.cumsum(pc.gather(-1, order), dim=-1).roll(1, dims=-1)
        mass_before[:, 0] = 0.0
        keep = torch.zeros_like(x, dtype=torch.bool).scatter_(
            -1, cand.gather(-1, order), mass_before < params.top_p
        )
        x = torch.where(keep, x, neg_inf)
    return torch.softmax(x, dim=-1), cand


def probabilities_fast(logits: Tensor, params: SamplingParams) -> Tensor:
    """Equal to probabilities(logits[None], params)[0]. logits [V] penalised -> probs [V] float32."""
    if params.greedy:
        return probabilities(logits[None], params)[0]  # raises the core's error
    vocab = logits.shape[-1]
    neg_inf = torch.tensor(float("-inf"))
    x = logits.float() / params.temperature
    if params.min_p > 0.0:
        p = torch.softmax(x, dim=-1)
        x = torch.where(p >= params.min_p * p.amax(dim=-1, keepdim=True), x, neg_inf)
    if 0 < params.top_k < vocab:
        keep = torch.zeros(vocab, dtype=torch.bool)
        keep[topk_set(x, params.top_k)] = True
        x = torch.where(keep, x, neg_inf)
    if params.top_p < 1.0:
        keep_p = _top_p_keep(torch.softmax(x, dim=-1), params.top_p)
        if keep_p is None:
            return probabilities(logits[None], params)[0]
        x = torch.where(keep_p, x, neg_inf)
    return torch.softmax(x, dim=-1)
