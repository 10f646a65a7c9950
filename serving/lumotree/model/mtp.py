"""Multi-token-prediction module (checkpoint prefix `mtp.`): fc over [norm(embed), norm(hidden)], one
full-attention decoder layer, a final norm; logits come from the main model's (shared) lm_head.

Row t of the MTP stream takes the main model's post-norm hidden row h_t and the embedding of token
x_{t+1}, sits at position t, and predicts x_{t+2}. Chained drafting feeds its output hidden row back in.

`mtp_chain_step` is `HybridLM.mtp_step` for a drafter: grouped-query attention without repeating KV
heads over the whole context, and logits for the last row only (the next draft); it computes the
same values (tested).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lumotree.model.attention import GatedAttention, causal_mask
from lumotree.model.config import FULL, HybridConfig
from lumotree.model.fused import ops
from lumotree.model.layers import DecoderLayer
from lumotree.model.norms import RMSNorm
from lumotree.model.state import KVCache, ModelState

if TYPE_CHECKING:  # model.py builds MTP, so it cannot be imported here at run time
    from lumotree.model.model import HybridLM


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


def _attention_chain(
    attn: GatedAttention, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache, start: int
) -> Tensor:
    """x [1, T, H] at positions start.. : write KV rows, attend causally over rows [0, start+T)."""
    q, k, v, gate = attn.project(x, cos, sin)
    seq = x.shape[1]
    end = start + seq
    cache.key[start:end] = k[0]
    cache.value[start:end] = v[0]
    mask = None if seq == 1 else causal_mask(seq, end, x.device)
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2),
        cache.key[None, :end].transpose(1, 2),
        cache.value[None, :end].transpose(1, 2),
        attn_mask=mask,
        enable_gqa=True,
    )
    return attn.output(o.transpose(1, 2), gate)


@torch.inference_mode()
def mtp_chain_step(
    model: HybridLM,
    hidden: Tensor,
    tokens: Tensor,
    mtp_state: ModelState,
    step_idx: int = 0,
    lm_head: Callable[[Tensor], Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """HybridLM.mtp_step for drafting: hidden rows [T, H] and their next tokens [T] at positions
    mtp_state.length.. -> (logits [V] of the last row, MTP hidden rows [T, H]). Writes the MTP KV
    rows and advances mtp_state.length by T. lm_head: the vocabulary projection to use (default
    the model's)."""
    mtp = model.mtp
    if mtp is None:
        raise ValueError("this model has no MTP module")
    start, seq = mtp_state.length, hidden.shape[0]
    cos, sin = model.rotary(torch.arange(start, start + seq, device=hidden.device)[None])
    layer = mtp.layers[step_idx % len(mtp.layers)]
    cache = mtp_state.layers[step_idx % len(mtp_state.layers)]
    assert isinstance(cache, KVCache)
    x = torch.cat(
        [mtp.pre_fc_norm_embedding(model.embed(tokens[None])), mtp.pre_fc_norm_hidden(hidden[None])], -1
    )
    h = layer.with_mixer(mtp.fc(x), lambda y: _attention_chain(layer.self_attn, y, cos, sin, cache, start))
    out = mtp.norm(h)[0]
    mtp_state.length = start + seq
    return (lm_head or model.compute_logits)(out[-1]), out
