"""The MTP drafter: the model's multi-token-prediction head proposes the spine and, at every depth,
the ordered runner-ups (DESIGN §3.2, paper §V-D).

MTP row t takes the target's hidden row h_t and token x_{t+1}, sits at position t and predicts
x_{t+2}; its KV cache is the drafter's own state. Rows whose inputs are both true (target hidden
rows of materialised tokens and the tokens that follow them) are committed; a proposal then chains
`depth - 1` speculative rows (the MTP's own hidden row and its spine draft) past them and rolls the
cache back to the committed length afterwards (rows beyond it are overwritten later).

Cycle protocol, for a pending root token r at position P: the committed rows end at P - 2, and the
queued rows are (h_{P-1}, r) plus any accepted path rows before it. `propose()` runs pass 1 over
the queued rows (committing them; the last row's logits give depth 1), then passes 2..depth on
single speculative rows. After the target accepts a path, `queue()` the path's hidden rows with the
tokens that follow each (the accepted drafts, then the new pending token).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lumotree.drafting.selection import argmax_lowest_index, ordered_topk
from lumotree.model.model import HybridLM
from lumotree.model.state import ModelState

TopK = Callable[[Tensor, int], Tensor]
# (hidden [T, H], next tokens [T], MTP state, step index) -> (logits [V] of the last row, MTP hidden [T, H])
MTPStep = Callable[[Tensor, Tensor, ModelState, int], tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class MTPProposal:
    """spine[d] is the depth-(d+1) draft; topk[d] that depth's ordered top-k (spine first)."""

    spine: list[int]
    topk: list[list[int]]


class MTPDrafter:
    """Spine + ordered top-k from the MTP head of `model`, with cache rollback.

    depth: MTP passes per proposal; topk: how many ordered candidates per depth (1 + siblings);
    capacity: MTP KV rows (the engine's max context). `select_topk` must equal the core's
    `ordered_topk` and `step` the model's `mtp_step` (faster equivalents may be passed).
    """

    def __init__(
        self,
        model: HybridLM,
        depth: int,
        topk: int,
        capacity: int,
        select_topk: TopK = ordered_topk,
        step: MTPStep | None = None,
    ) -> None:
        if model.mtp is None:
            raise ValueError("the model has no MTP module; use the 'ar' drafter")
        if len(model.mtp.layers) != 1:
            raise ValueError(
                f"the MTP drafter supports one MTP layer (Qwen3.5's), the model has {len(model.mtp.layers)}"
            )
        if depth < 1 or topk < 1:
            raise ValueError(f"depth and topk must be >= 1, got {depth}, {topk}")
        self.model, self.depth, self.k = model, depth, topk
        self.state = model.new_mtp_state(capacity)
        self.select_topk = select_topk
        self.step = step or self._model_step
        self._queued_hidden: list[Tensor] = []
        self._queued_tokens: list[int] = []

    def _model_step(
        self, hidden: Tensor, tokens: Tensor, state: ModelState, step_idx: int
    ) -> tuple[Tensor, Tensor]:
        logits, out = self.model.mtp_step(hidden, tokens, state, step_idx)
        return logits[-1], out

    @property
    def committed(self) -> int:
        """MTP rows whose inputs are true (positions 0..committed-1)."""
        return self.state.length

    def reset(self, committed: int = 0) -> None:
        """Start a request whose first `committed` MTP rows are already in the cache (prefix hit)."""
        self.state.length = committed
        self._queued_hidden, self._queued_tokens = [], []

    @torch.inference_mode()
    def commit(self, hidden: Tensor, next_tokens: Sequence[int]) -> None:
        """Write true rows now (prefill): hidden [n, H] rows at positions committed.. and the tokens
        that follow them. Queued rows go first."""
        self.queue(hidden, next_tokens)
        if self._queued_tokens:
            self.step(*self._take_queue(), self.state, 0)

    def queue(self, hidden: Tensor, next_tokens: Sequence[int]) -> None:
        """Queue true rows for the next proposal's first pass (hidden [n, H], n tokens)."""
        if hidden.shape[0] != len(next_tokens):
            raise ValueError(f"{hidden.shape[0]} hidden rows but {len(next_tokens)} next tokens")
        if len(next_tokens):
            self._queued_hidden.append(hidden)
            self._queued_tokens.extend(int(t) for t in next_tokens)

    def _take_queue(self) -> tuple[Tensor, Tensor]:
        hidden = torch.cat(self._queued_hidden) if len(self._queued_hidden) > 1 else self._queued_hidden[0]
        tokens = torch.tensor(self._queued_tokens, dtype=torch.long, device=hidden.device)
        self._queued_hidden, self._queued_tokens = [], []
        return hidden, tokens

    @torch.inference_mode()
    def propose(self) -> MTPProposal:
        """`depth` MTP passes: the queued true rows (committed), then speculative single rows."""
        if not self._queued_tokens:
            raise RuntimeError("nothing queued: queue the last target row and the pending token first")
        logits, hidden = self.step(*self._take_queue(), self.state, 0)
        committed = self.state.length
        rows = [logits]
        spine = [int(argmax_lowest_index(logits))]
        out = hidden[-1:]
        for step in range(1, self.depth):
            token = torch.tensor([spine[-1]], dtype=torch.long, device=out.device)
            logits, out = self.step(out, token, self.state, step)
            rows.append(logits)
            spine.append(int(argmax_lowest_index(logits)))
        self.state.length = committed  # roll back the speculative rows
        topk = self.select_topk(torch.stack(rows), self.k).tolist() if self.k > 1 else [[s] for s in spine]
        return MTPProposal(spine, topk)
