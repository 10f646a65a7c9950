"""Gated softmax attention (Qwen3.5 / Qwen3-Next): q with an output gate, q/k RMSNorm, partial RoPE, GQA.

The layer is split project -> mix -> output so a verifier can swap the mix (e.g. tree attention over
the committed prefix plus draft rows) without touching the projections.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lumotree.model.config import HybridConfig
from lumotree.model.norms import RMSNorm
from lumotree.model.rope import apply_rotary


class GatedAttention(nn.Module):
    """q_proj yields [query | gate] per head; output = o_proj(attn * sigmoid(gate))."""

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        hidden, heads, kv_heads, dim = config.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim
        self.q_proj = nn.Linear(hidden, heads * dim * 2, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * dim, bias=False)
        self.o_proj = nn.Linear(heads * dim, hidden, bias=False)
        self.q_norm = RMSNorm(dim, eps=config.rms_norm_eps)
        self.k_norm = RMSNorm(dim, eps=config.rms_norm_eps)

    def project(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """h: [B, T, hidden]; cos/sin: [B or 1, T, rotary_dim] for each row's position.

        Returns q [B, T, Hq, D] (normed, rotated), k [B, T, Hkv, D] (normed, rotated), v [B, T, Hkv, D],
        gate [B, T, Hq*D] (pre-sigmoid).
        """
        bsz, seq, _ = h.shape
        q_gate = self.q_proj(h).view(bsz, seq, self.num_heads, 2 * self.head_dim)
        q, gate = q_gate.chunk(2, dim=-1)
        q = apply_rotary(self.q_norm(q), cos, sin)
        k = apply_rotary(
            self.k_norm(self.k_proj(h).view(bsz, seq, self.num_kv_heads, self.head_dim)), cos, sin
        )
        v = self.v_proj(h).view(bsz, seq, self.num_kv_heads, self.head_dim)
        return q, k, v, gate.reshape(bsz, seq, -1)

    def mix(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Softmax attention of q [B, T, Hq, D] over k, v [B, S, Hkv, D] -> [B, T, Hq, D].

        mask: bool [T, S] (True = visible); None = causal with the T queries being the last T keys.
        """
        groups = self.num_heads // self.num_kv_heads
        # Repeat KV heads explicitly: every SDPA backend accepts it (enable_gqa is not everywhere).
        k = k.repeat_interleave(groups, dim=2) if groups > 1 else k
        v = v.repeat_interleave(groups, dim=2) if groups > 1 else v
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        if mask is None and q.shape[2] == k.shape[2]:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            if mask is None:
                mask = causal_mask(q.shape[2], k.shape[2], q.device)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out.transpose(1, 2)

    def output(self, attn: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """attn: [B, T, Hq, D], gate: [B, T, Hq*D] -> [B, T, hidden]."""
        bsz, seq = attn.shape[:2]
        return self.o_proj(attn.reshape(bsz, seq, -1) * torch.sigmoid(gate))


def causal_mask(num_queries: int, num_keys: int, device: torch.device) -> torch.Tensor:
    """bool [T, S]: query i (the (S-T+i)-th key's position) sees keys 0..S-T+i."""
    offset = num_keys - num_queries
    rows = torch.arange(num_queries, device=device)[:, None]
    cols = torch.arange(num_keys, device=device)[None, :]
    return cols <= rows + offset
