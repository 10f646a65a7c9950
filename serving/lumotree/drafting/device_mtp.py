"""The MTP drafter on the device: the same protocol as `mtp.MTPDrafter`, with every per-cycle value
(committed length, queued rows, proposals) in static device buffers so `propose_` can be captured
in a CUDA graph.

Pass 1 runs the queued true rows (the accepted path's target hidden rows and the tokens after each:
up to `queue_rows` of them, `queue_len` valid) at positions committed.., commits them, and ranks
the last valid row's logits; passes 2..depth each run one speculative row (the previous pass's
MTP hidden row and its spine draft) right after the committed rows, which later cycles overwrite.
Attention uses the tree-attention kernel: the queued rows form a chain over the committed MTP
prefix, a speculative row sees the prefix and itself. Selection is the fused argmax + ordered
top-k kernel, so the spine is the lowest-index argmax and the top-k follows the pinned tie rules.

With a draft vocabulary (`draft_ids`, sorted token ids: `draft_vocab.py`) each pass ranks only those
rows of the vocabulary projection, a gathered copy of them, and the ranking kernel writes their
token ids: the proposal the whole-vocabulary ranking would give with every other logit at -inf.

A cycle's passes launch few kernels besides the layer's own: every pass's cos/sin come from one
gather of a table built once (the values `model.rotary` gives at each position), each pass's fc
input (the embedding gather, both pre-fc norms and their concatenation) from one kernel
(`ops.mtp_inputs`), and the ranking writes token ids itself. The drafter's attention
(`attention`) need not give an AR step's bits (drafts are checked, not trusted): the device runner
spreads the MTP prefix over ATTENTION_PARTITIONS partitions, so a short context still fills the GPU.

Every pass is the model's one MTP pass (`MTP.step`) with the device attention. Prompt rows are
committed eagerly (`commit`, variable length) through `HybridLM.mtp_hidden`; the host mirrors the
committed length (`length`) for that and for the prefix cache. `propose` (eager, one
synchronisation) gives the first proposal of a request, right after its prefill; later proposals
are drafted inside the device cycle (`queue_`, `propose_`) and come back with its results.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lumotree.drafting.fused_selection import rank_rows_, selection_scratch
from lumotree.drafting.mtp import MTPProposal, check_mtp_model
from lumotree.model.attention import GatedAttention
from lumotree.model.fused import ops
from lumotree.model.model import HybridLM
from lumotree.model.state import KVCache
from lumotree.verify.attention.decode import check_depth, write_kv_

# (q [T, Hq, D], k_cache, v_cache, tables with .bits [T] and .prefix_len [1], gate=the output gate
# [T, Hq, D] pre-sigmoid) -> (o * sigmoid(gate), lse): `device_ops.tree_attention`
TreeAttention = Callable[..., tuple[Tensor, Tensor]]
# Partitions of the MTP prefix in the device drafter's attention: at 4K context, 128 keys each over
# 32 x 4 KV heads programs (fixed 1024-key partitions left 16 programs reading 1 MB each).
ATTENTION_PARTITIONS = 32


@dataclass(frozen=True, eq=False)
class AttentionTables:
    """What the tree-attention kernel reads for MTP rows: visibility bits [T] int64 (row i sees
    tree slots whose bits are set) and the committed prefix length [1] int64, on the device."""

    bits: Tensor
    prefix_len: Tensor


class DeviceMTP:
    """`depth` MTP passes with `k` ordered candidates per depth, over static device buffers.

    spine [depth] and topk [depth, k] int64 hold the last proposal; committed [1] int64 the MTP
    rows whose inputs are true; queue_hidden [Q, H], queue_tokens [Q], queue_len [1] the true rows
    pass 1 commits. draft_ids: the draft vocabulary (None: the whole vocabulary).
    """

    def __init__(
        self,
        model: HybridLM,
        depth: int,
        k: int,
        capacity: int,
        queue_rows: int,
        attention: TreeAttention,
        draft_ids: Tensor | None = None,
    ) -> None:
        check_mtp_model(model, depth, k)
        check_depth(queue_rows - 1)  # pass 1's rows are a chain
        self.model, self.depth, self.k, self.attention = model, depth, k, attention
        dev, hidden = model.device, model.config.hidden_size
        i64 = dict(dtype=torch.int64, device=dev)
        self.state = model.new_mtp_state(capacity)
        self.length = 0  # host mirror of `committed`
        self.committed = torch.zeros(1, **i64)
        self.queue_hidden = torch.zeros((queue_rows, hidden), dtype=model.dtype, device=dev)
        self.queue_tokens = torch.zeros(queue_rows, **i64)
        self.queue_len = torch.ones(1, **i64)
        self.spine = torch.zeros(depth, **i64)
        self.topk = torch.zeros((depth, k), **i64)
        self._rows = torch.arange(queue_rows, **i64)
        self._chain_bits = (torch.ones(queue_rows, **i64) << (self._rows + 1)) - 1  # row i sees 0..i
        self._own_bit = torch.ones(1, **i64)
        self._next = torch.zeros(1, **i64)
        self._steps = torch.arange(depth - 1, **i64)  # the speculative passes' offsets from _next
        # a cycle's positions: pass 1's queued rows, then the speculative passes'
        self._positions = torch.zeros(queue_rows + depth - 1, **i64)
        cos, sin = model.rotary(torch.arange(capacity, **i64)[None])  # [1, capacity, rotary_dim] fp32
        self._rotations = torch.stack([cos[0], sin[0]], dim=1)  # [capacity, 2, rotary_dim]: one gather
        self.draft_ids = None if draft_ids is None else draft_ids.to(dev)
        self._head: Tensor | None = None  # the draft vocabulary's rows of the vocabulary projection
        ranked = model.config.vocab_size
        if self.draft_ids is not None:
            ranked = self.draft_ids.numel()
            if ranked < k:
                raise ValueError(f"a draft vocabulary of {ranked} ids cannot rank {k} candidates")
            self._head = model.lm_head.weight.detach().index_select(0, self.draft_ids).contiguous()
        self._scratch = selection_scratch(1, ranked, k, dev)

    @property
    def cache(self) -> KVCache:
        """The MTP layer's KV cache (saved and restored by the prefix cache)."""
        cache = self.state.layers[0]
        assert isinstance(cache, KVCache)
        return cache

    def reset(self, committed: int = 0) -> None:
        """A new request whose first `committed` MTP rows are already cached (prefix hit)."""
        self.length = committed
        self.committed.fill_(committed)

    @torch.inference_mode()
    def commit(self, hidden: Tensor, next_tokens: Sequence[int]) -> None:
        """Write true rows now (prefill; variable length, eager): hidden [n, H] and their next tokens."""
        if not len(next_tokens):
            return
        tokens = torch.tensor([int(t) for t in next_tokens], dtype=torch.long).to(self.model.device)
        self.state.length = self.length
        self.model.mtp_hidden(hidden, tokens, self.state)
        self.length = self.state.length
        self.committed.fill_(self.length)

    @torch.inference_mode()
    def propose(self, hidden: Tensor, next_tokens: Sequence[int]) -> MTPProposal:
        """The proposal after true rows hidden [n, H] (eager; reads it back: one synchronisation)."""
        n = len(next_tokens)
        tokens = torch.tensor([int(t) for t in next_tokens], dtype=torch.long).to(self.model.device)
        self.queue_(hidden, tokens, torch.tensor([n], dtype=torch.long).to(self.model.device))
        self.propose_()
        self.advance_host(n)
        return MTPProposal(self.spine.tolist(), self.topk.tolist())

    def queue_(self, hidden: Tensor, tokens: Tensor, count: Tensor) -> None:
        """Queue true rows for pass 1: hidden [Q', H] and tokens [Q'] (Q' <= Q), count [1] valid
        (device); rows past `count` are ignored. Graph-capturable."""
        rows = hidden.shape[0]
        self.queue_hidden[:rows].copy_(hidden)
        self.queue_tokens[:rows].copy_(tokens)
        self.queue_len.copy_(count)

    def advance_host(self, committed_rows: int) -> None:
        """Mirror on the host the rows the last `propose_` committed (known after the cycle's sync)."""
        self.length += committed_rows

    @torch.inference_mode()
    def propose_(self) -> None:
        """depth MTP passes into `spine` / `topk`; commits the queued rows. Graph-capturable."""
        queued, steps = self._positions[: self._rows.numel()], self._positions[self._rows.numel() :]
        torch.add(self.committed, self._rows, out=queued)
        torch.add(self.committed, self.queue_len, out=self._next)
        torch.add(self._next, self._steps, out=steps)
        rotations = self._rotations.index_select(0, self._positions)  # every pass's cos/sin at once
        out = self._pass(self.queue_hidden, self.queue_tokens, queued, self._chain_bits, rotations)
        last = out.index_select(0, self.queue_len - 1)  # [1, H]
        self._rank(last, 0)
        for d in range(1, self.depth):
            row = self._rows.numel() + d - 1
            step = slice(d - 1, d)
            last = self._pass(last, self.spine[step], steps[step], self._own_bit, rotations[row : row + 1])
            self._rank(last, d)
        self.committed.copy_(self._next)

    def _rank(self, hidden: Tensor, d: int) -> None:
        # [1, V], or [1, N] with a draft vocabulary: its rows of the projection only
        logits = self.model.compute_logits(hidden) if self._head is None else ops.linear(hidden, self._head)
        rank_rows_(logits, self.spine[d : d + 1], self.topk[d : d + 1], self._scratch, ids=self.draft_ids)

    def _pass(
        self,
        hidden: Tensor,
        tokens: Tensor,
        positions: Tensor,
        bits: Tensor,
        rotations: Tensor,
    ) -> Tensor:
        """MTP rows hidden [T, H] with their next tokens [T] at consecutive positions [T] (device;
        rotations [T, 2, rotary_dim]: their cos and sin): write their KV, attend to
        [0, positions[0]) and the chain ancestors set in bits -> [T, H]."""
        model, mtp = self.model, self.model.mtp
        assert mtp is not None
        rows = hidden.shape[0]
        positions = positions[:rows]
        cos, sin = rotations[None, :rows, 0], rotations[None, :rows, 1]
        cache = self.cache
        tables = AttentionTables(bits[:rows], positions[:1])

        def attend(attn: GatedAttention, y: Tensor) -> Tensor:
            q, k, v, gate = attn.project(y, cos, sin)
            write_kv_(cache.key, cache.value, k[0], v[0], positions)
            o, _ = self.attention(q[0], cache.key, cache.value, tables, gate=gate[0])  # gated as it stores
            return attn.project_out(o[None])

        return mtp.step(hidden[None], tokens[None], model.model.embed_tokens.weight, attend)[0]
