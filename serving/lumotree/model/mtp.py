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

import torch
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

    def _inputs(self, hidden: Tensor, embeds: Tensor) -> Tensor:
        return self.fc(
            torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], dim=-1)
        )

    def forward(self, hidden: Tensor, embeds: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """Whole sequences (training, scoring): hidden, embeds [B, T, hidden], the rows attending
        causally among themselves -> post-norm MTP hidden [B, T, hidden]."""
        return self.norm(self.layers[0](self._inputs(hidden, embeds), cos, sin))

    def step(self, hidden: Tensor, embeds: Tensor, attend: Attend, step_idx: int = 0) -> Tensor:
        """One cached pass over rows hidden, embeds [1, T, hidden] -> post-norm MTP hidden [1, T,
        hidden]. Draft step `step_idx` uses layer step_idx % num_layers (as vLLM does)."""
        layer = self.layers[step_idx % len(self.layers)]
        return self.norm(layer.with_mixer(self._inputs(hidden, embeds), lambda y: attend(layer.self_attn, y)))


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
