"""Multi-token-prediction module (checkpoint prefix `mtp.`): fc over [norm(embed), norm(hidden)], one
full-attention decoder layer, a final norm; logits come from the main model's (shared) lm_head.

Row t of the MTP stream takes the main model's post-norm hidden row h_t and the embedding of token
x_{t+1}, sits at position t, and predicts x_{t+2}. Chained drafting feeds its output hidden row back in.

There is one cached MTP pass, `MTP.step`: every caller (the model's `mtp_step`, the PyTorch drafter,
the device drafter's captured passes) runs it and passes only how its rows attend (`Attend`):
`chain_attention` writes the rows' KV into a cache and attends causally over it with SDPA; the
device drafter writes at device-held positions and attends with the tree-attention kernel.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from lumotree.model.attention import GatedAttention, causal_mask
from lumotree.model.config import FULL, HybridConfig
from lumotree.model.fused import ops
from lumotree.model.layers import DecoderLayer
from lumotree.model.norms import RMSNorm
from lumotree.model.state import KVCache

#: (the MTP layer's attention module, its normed input rows [1, T, H]) -> the mixed rows [1, T, H]
Attend = Callable[[GatedAttention, Tensor], Tensor]


class MTP(nn.Module):
    """Checkpoint names: fc, pre_fc_norm_embedding, pre_fc_norm_hidden, layers.{i}, norm."""

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.fc = ops.Linear(2 * hidden, hidden)
        self.pre_fc_norm_embedding = RMSNorm(hidden, eps=config.rms_norm_eps)
        self.pre_fc_norm_hidden = RMSNorm(hidden, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(
            DecoderLayer(config, FULL, moe=config.is_moe_layer(i))
            for i in range(config.mtp_num_hidden_layers)
        )
        self.norm = RMSNorm(hidden, eps=config.rms_norm_eps)

    def _inputs(self, hidden: Tensor, tokens: Tensor, table: Tensor) -> Tensor:
        """fc([norm(embedding of tokens), norm(hidden)]): the gather, both norms and the
        concatenation are one op (`ops.mtp_inputs`)."""
        e, h = self.pre_fc_norm_embedding, self.pre_fc_norm_hidden
        assert e.eps == h.eps
        return self.fc(ops.mtp_inputs(table, tokens, hidden, e.weight, h.weight, e.eps))

    def forward(self, hidden: Tensor, tokens: Tensor, table: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """Whole sequences (training, scoring): hidden [B, T, hidden] and their next tokens [B, T]
        (embedded by `table`, the model's embedding weight), the rows attending causally among
        themselves -> post-norm MTP hidden [B, T, hidden]."""
        return self.norm(self.layers[0](self._inputs(hidden, tokens, table), cos, sin))

    def step(
        self, hidden: Tensor, tokens: Tensor, table: Tensor, attend: Attend, step_idx: int = 0
    ) -> Tensor:
        """One cached pass over rows hidden [1, T, hidden] with their next tokens [1, T] (embedded by
        `table`) -> post-norm MTP hidden [1, T, hidden]. Draft step `step_idx` uses layer
        step_idx % num_layers (as vLLM does)."""
        layer = self.layers[step_idx % len(self.layers)]
        mixed = layer.with_mixer(self._inputs(hidden, tokens, table), lambda y: attend(layer.self_attn, y))
        return self.norm(mixed)


def chain_attention(cache: KVCache, start: int, cos: Tensor, sin: Tensor) -> Attend:
    """Rows at positions start.. (cos/sin for them): write their KV rows into `cache` and attend
    causally over rows [0, start + T), grouped-query heads without repeating the KV heads."""

    def attend(attn: GatedAttention, y: Tensor) -> Tensor:
        q, k, v, gate = attn.project(y, cos, sin)
        end = start + y.shape[1]
        cache.key[start:end] = k[0]
        cache.value[start:end] = v[0]
        mask = None if y.shape[1] == 1 else causal_mask(y.shape[1], end, y.device)
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            cache.key[None, :end].transpose(1, 2),
            cache.value[None, :end].transpose(1, 2),
            attn_mask=mask,
            enable_gqa=True,
        )
        return attn.output(o.transpose(1, 2), gate)

    return attend
