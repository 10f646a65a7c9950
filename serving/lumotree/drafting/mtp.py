"""The MTP drafter: the model's multi-token-prediction head proposes the spine and, at every depth,
the ordered runner-ups (DESIGN §3.2, paper §V-D).

MTP row t takes the target's hidden row h_t and token x_{t+1}, sits at position t and predicts
x_{t+2}; its KV cache is the drafter's own state. Rows whose inputs are both true (target hidden
rows of materialised tokens and the tokens that follow them) are committed; a proposal then chains
`depth - 1` speculative rows (the MTP's own hidden row and its spine draft) past them and rolls the
cache back to the committed length afterwards (rows beyond it are overwritten later).

Cycle protocol, for a pending root token r at position P: the committed rows end at P - 2; the
proposal for the tree below r takes the true rows (h_{P-1}, r) and, after a cycle, the accepted
path's target rows with the tokens that follow each (the accepted drafts, then the new pending
token): `propose(hidden, next_tokens)` runs pass 1 over them (committing them; the last row's
logits give depth 1), then passes 2..depth on single speculative rows. Prompt rows are committed
chunk by chunk during prefill (`commit`).

Three MTP sources share this protocol: `MTPDrafter` (PyTorch, the model's one MTP pass
`HybridLM.mtp_hidden`), `NativeMTPDrafter` (the native CPU forward) and `DeviceMTP` (static device
buffers, captured in the device cycle's graph).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from lumotree.drafting.draft_vocab import draft_head
from lumotree.drafting.selection import argmax_lowest_index, ordered_topk
from lumotree.drafting.selection_fast import ordered_topk_fast
from lumotree.model.model import HybridLM
from lumotree.model.state import KVCache

TopK = Callable[[Tensor, int], Tensor]
#: post-norm MTP hidden row(s) [..., H] -> draft logits [..., V'] (the vocabulary projection of a pass)
DraftHead = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class MTPProposal:
    """spine[d] is the depth-(d+1) draft; topk[d] that depth's ordered top-k (spine first)."""

    spine: list[int]
    topk: list[list[int]]


class MTPSource(Protocol):
    """What the engine needs of an MTP drafter (PyTorch, native or device)."""

    depth: int
    k: int

    @property
    def cache(self) -> KVCache: ...

    def reset(self, committed: int = 0) -> None: ...

    def commit(self, hidden: Tensor, next_tokens: Sequence[int]) -> None: ...

    def propose(self, hidden: Tensor, next_tokens: Sequence[int]) -> MTPProposal: ...


def check_mtp_model(model: HybridLM, depth: int, k: int) -> None:
    """ValueError unless `model` has the one MTP layer (Qwen3.5's) these drafters run."""
    if model.mtp is None:
        raise ValueError("the model has no MTP module; use the 'ar' drafter")
    if len(model.mtp.layers) != 1:
        raise ValueError(
            f"the MTP drafter supports one MTP layer (Qwen3.5's), the model has {len(model.mtp.layers)}"
        )
    if depth < 1 or k < 1:
        raise ValueError(f"depth and topk must be >= 1, got {depth}, {k}")


class MTPDrafter:
    """Spine + ordered top-k from the MTP head of `model`, with cache rollback.

    depth: MTP passes per proposal; topk: ordered candidates per depth (1 + siblings); capacity:
    MTP KV rows (the engine's max context); head: the passes' vocabulary projection (default the
    model's lm_head); select_topk must equal the core's `ordered_topk` (a faster equivalent may be
    passed).
    """

    def __init__(
        self,
        model: HybridLM,
        depth: int,
        topk: int,
        capacity: int,
        head: DraftHead | None = None,
        select_topk: TopK = ordered_topk,
    ) -> None:
        check_mtp_model(model, depth, topk)
        self.model, self.depth, self.k = model, depth, topk
        self.state = model.new_mtp_state(capacity)
        self.head = head or model.compute_logits
        self.select_topk = select_topk

    @classmethod
    def for_engine(
        cls, model: HybridLM, depth: int, topk: int, capacity: int, head_dtype: str, draft_ids: Tensor | None
    ) -> MTPDrafter:
        """The PyTorch drafter the engine and the vLLM plugin run: the projection in `head_dtype`
        over `draft_ids` (`draft_vocab.draft_head`), the vectorised top-k."""
        head = draft_head(model.lm_head.weight, head_dtype, draft_ids)
        return cls(model, depth, topk, capacity, head=head, select_topk=ordered_topk_fast)

    @property
    def committed(self) -> int:
        """MTP rows whose inputs are true (positions 0..committed-1)."""
        return self.state.length

    @property
    def cache(self) -> KVCache:
        """The MTP layer's KV cache (saved and restored by the prefix cache)."""
        cache = self.state.layers[0]
        assert isinstance(cache, KVCache)
        return cache

    def reset(self, committed: int = 0) -> None:
        """Start a request whose first `committed` MTP rows are already in the cache (prefix hit)."""
        self.state.length = committed

    def _pass(self, hidden: Tensor, tokens: Tensor, step_idx: int) -> tuple[Tensor, Tensor]:
        """One MTP pass over rows at positions committed.. (which advance): (draft logits [V'] of
        the last row, MTP hidden rows [T, H])."""
        out = self.model.mtp_hidden(hidden, tokens, self.state, step_idx)
        return self.head(out[-1]), out

    @staticmethod
    def _tokens(next_tokens: Sequence[int], hidden: Tensor) -> Tensor:
        if hidden.shape[0] != len(next_tokens):
            raise ValueError(f"{hidden.shape[0]} hidden rows but {len(next_tokens)} next tokens")
        return torch.tensor([int(t) for t in next_tokens], dtype=torch.long, device=hidden.device)

    @torch.inference_mode()
    def commit(self, hidden: Tensor, next_tokens: Sequence[int]) -> None:
        """Write true rows now (prefill): hidden [n, H] rows at positions committed.. and the tokens
        that follow them."""
        if len(next_tokens):
            self._pass(hidden, self._tokens(next_tokens, hidden), 0)

    @torch.inference_mode()
    def propose(self, hidden: Tensor, next_tokens: Sequence[int]) -> MTPProposal:
        """`depth` MTP passes: the true rows hidden [n >= 1, H] with their next tokens (committed),
        then speculative single rows (rolled back)."""
        if not len(next_tokens):
            raise ValueError("a proposal needs at least the last target row and the pending token")
        logits, out = self._pass(hidden, self._tokens(next_tokens, hidden), 0)
        committed = self.state.length
        rows = [logits]
        spine = [int(argmax_lowest_index(logits))]
        out = out[-1:]
        for step in range(1, self.depth):
            token = torch.tensor([spine[-1]], dtype=torch.long, device=out.device)
            logits, out = self._pass(out, token, step)
            rows.append(logits)
            spine.append(int(argmax_lowest_index(logits)))
        self.state.length = committed  # roll back the speculative rows
        topk = self.select_topk(torch.stack(rows), self.k).tolist() if self.k > 1 else [[s] for s in spine]
        return MTPProposal(spine, topk)
