"""The logprobs of emitted tokens as vLLM 0.32 reports them in its default logprobs modes: from the
target row's raw logits (before any filter, bias, penalty or temperature), "raw_logprobs" their
float32 log-softmax, "raw_logits" the logits themselves.

Layout (vLLM's LogprobsTensors): per emitted token one row of k + 1 entries, the token first, then
the row's k best (descending); and the token's rank: the number of tokens scoring at least as high,
itself included (vLLM's count).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

#: the logprobs modes the plugin reports (vLLM's processed modes are refused at start-up)
RAW_MODES = ("raw_logprobs", "raw_logits")


@dataclass(frozen=True, eq=False)
class TokenLogprobs:
    """ids [n, k+1] int32, logprobs [n, k+1] float32, ranks [n] int64 (see the module docstring)."""

    ids: Tensor
    logprobs: Tensor
    ranks: Tensor


def scores(logits: Tensor, mode: str) -> Tensor:
    """Raw logits rows [n, V] -> the float32 scores [n, V] vLLM reports in `mode`."""
    if mode == "raw_logprobs":
        return torch.log_softmax(logits.float(), dim=-1)
    if mode == "raw_logits":
        return logits.float()
    raise ValueError(f"lumotree.vllm reports logprobs modes {RAW_MODES}, not {mode!r}")


def token_logprobs(logits: Tensor, tokens: Sequence[int], k: int, mode: str) -> TokenLogprobs:
    """The logprobs of tokens[i] under raw logits row logits[i] [n, V], with each row's k best."""
    values = scores(logits, mode)
    ids = torch.as_tensor(list(tokens), dtype=torch.long)[:, None]
    chosen = values.gather(-1, ids)
    best, best_ids = torch.topk(values, k, dim=-1)
    return TokenLogprobs(
        ids=torch.cat([ids, best_ids], dim=1).to(torch.int32),
        logprobs=torch.cat([chosen, best], dim=1),
        ranks=(values >= chosen).sum(-1),
    )


def padded(per_request: Sequence[TokenLogprobs | None], width: int, k: int) -> TokenLogprobs:
    """Per-request logprobs (None: nothing emitted) as [len(per_request) * width, k + 1] rows,
    request i's emitted tokens at rows i * width + j: the layout of a speculative step's
    sampled_token_ids [requests, width], whose placeholders vLLM filters out with these rows."""
    n = len(per_request) * width
    out = TokenLogprobs(
        ids=torch.zeros(n, k + 1, dtype=torch.int32),
        logprobs=torch.zeros(n, k + 1, dtype=torch.float32),
        ranks=torch.zeros(n, dtype=torch.long),
    )
    for i, lp in enumerate(per_request):
        if lp is not None:
            rows = slice(i * width, i * width + lp.ids.shape[0])
            out.ids[rows], out.logprobs[rows], out.ranks[rows] = lp.ids, lp.logprobs, lp.ranks
    return out
