"""The MTP drafter over the native CPU forward: a proposal's passes and selection (spine argmax,
ordered top-k) are one native call instead of `depth` PyTorch passes and their selections."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from lumotree.drafting.mtp import MTPDrafter, MTPProposal
from lumotree.model.model import HybridLM
from lumotree.model.native.model import NativeModel


class NativeMTPDrafter(MTPDrafter):
    """`MTPDrafter` with the same proposals (tested), its passes run by `native`."""

    def __init__(self, model: HybridLM, depth: int, topk: int, capacity: int, native: NativeModel) -> None:
        super().__init__(model, depth, topk, capacity)
        self.native = native

    def _pass(self, hidden: Tensor, tokens: Tensor, step_idx: int) -> tuple[Tensor, Tensor]:
        return self.native.mtp_step(hidden, tokens, self.state, step_idx)

    @torch.inference_mode()
    def propose(self, hidden: Tensor, next_tokens: Sequence[int]) -> MTPProposal:
        if not len(next_tokens):
            raise ValueError("a proposal needs at least the last target row and the pending token")
        tokens = self._tokens(next_tokens, hidden)
        spine, ranked = self.native.mtp_propose(hidden, tokens, self.state, self.depth, self.k)
        return MTPProposal(spine, ranked)
