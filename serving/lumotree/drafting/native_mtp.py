"""The MTP drafter over the native CPU forward: a proposal's passes and selection (spine argmax,
ordered top-k) are one native call instead of `depth` PyTorch passes and their selections."""

from __future__ import annotations

from lumotree.drafting.mtp import MTPDrafter, MTPProposal
from lumotree.model.model import HybridLM
from lumotree.model.native.model import NativeModel


class NativeMTPDrafter(MTPDrafter):
    """`MTPDrafter` with the same proposals (tested), its passes run by `native`."""

    def __init__(self, model: HybridLM, depth: int, topk: int, capacity: int, native: NativeModel) -> None:
        super().__init__(model, depth, topk, capacity, step=native.mtp_step)
        self.native = native

    def propose(self) -> MTPProposal:
        if not self._queued_tokens:
            raise RuntimeError("nothing queued: queue the last target row and the pending token first")
        hidden, tokens = self._take_queue()
        spine, ranked = self.native.mtp_propose(hidden, tokens, self.state, self.depth, self.k)
        return MTPProposal(spine, ranked)
