"""Multi-token-prediction module (checkpoint prefix `mtp.`): fc over [norm(embed), norm(hidden)], one
full-attention decoder layer, a final norm; logits come from the main model's (shared) lm_head.

Row t of the MTP stream takes the main model's post-norm hidden row h_t and the embedding of token
x_{t+1}, sits at position t, and predicts x_{t+2}. Chained drafting feeds its output hidden row back in.
"""

from __future__ import annotations

import torch
from torch import nn

from lumotree.model.config import FULL, HybridConfig
from lumotree.model.layers import DecoderLayer
from lumotree.model.norms import RMSNorm
from lumotree.model.state import KVCache


class MTP(nn.Module):
    """Checkpoint names: fc, pre_fc_norm_embedding, pre_fc_norm_hidden, layers.{i}, norm."""

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding = RMSNorm(hidden, eps=config.rms_norm_eps)
        self.pre_fc_norm_hidden = RMSNorm(hidden, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(
            DecoderLayer(config, FULL, moe=config.is_moe_layer(i))
            for i in range(config.mtp_num_hidden_layers)
        )
        self.norm = RMSNorm(hidden, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden: torch.Tensor,
        embeds: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache | None = None,
        start: int = 0,
        step_idx: int = 0,
    ) -> torch.Tensor:
        """hidden, embeds: [B, T, hidden] -> post-norm MTP hidden [B, T, hidden].

        Draft step `step_idx` uses layer step_idx % num_layers (as vLLM does). cache None: the rows
        attend causally among themselves; else B == 1 and the layer's KV rows [start, start+T) are
        written and [0, start+T) attended.
        """
        x = torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], dim=-1)
        layer = self.layers[step_idx % len(self.layers)]
        return self.norm(layer(self.fc(x), cos, sin, cache, start))
