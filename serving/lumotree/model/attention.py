"""Gated softmax attention (Qwen3.5 / Qwen3-Next): q with an output gate, q/k RMSNorm, partial RoPE, GQA.

The layer is split project -> mix -> output so a verifier can swap the mix (e.g. tree attention over
the committed prefix plus draft rows) without touching the projections.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from lumotree.model.config import HybridConfig
from lumotree.model.fused import ops
from lumotree.model.fused.pending_norm import PendingNorm
from lumotree.model.fused.weights import FusedProjection
from lumotree.model.norms import RMSNorm


class GatedAttention(nn.Module):
    """q_proj yields [query | gate] per head; output = o_proj(attn * sigmoid(gate))."""

    FUSED_INPUTS: ClassVar[tuple[str, ...]] = ("q_proj", "k_proj", "v_proj")  # see fuse_projections_

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        hidden, heads, kv_heads, dim = config.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim
        self.q_proj = ops.Linear(hidden, heads * dim * 2)
        self.k_proj = ops.Linear(hidden, kv_heads * dim)
        self.v_proj = ops.Linear(hidden, kv_heads * dim)
        self.o_proj = ops.Linear(heads * dim, hidden)
        self.q_norm = RMSNorm(dim, eps=config.rms_norm_eps)
        self.k_norm = RMSNorm(dim, eps=config.rms_norm_eps)
        self.fused: FusedProjection | None = None  # [q_proj | k_proj | v_proj], set by fuse_projections_

    def project(
        self, h: torch.Tensor | PendingNorm, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """h: [B, T, hidden] (or its norm left pending); cos/sin: [B or 1, T, rotary_dim] for each
        row's position.

        Returns q [B, T, Hq, D] (normed, rotated), k [B, T, Hkv, D] (normed, rotated), v [B, T, Hkv, D],
        gate [B, T, Hq, D] (pre-sigmoid; may be a strided view).
        """
        bsz, seq, _ = h.shape
        if self.fused is not None and ops.kernels_for(h) and self.fused.current():
            q_gate, k, v = self.fused(h)
        else:
            q_gate, k, v = self.q_proj(h), self.k_proj(h), self.v_proj(h)
        q, gate = q_gate.view(bsz, seq, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        k = k.view(bsz, seq, self.num_kv_heads, self.head_dim)
        # (both norms take the config's eps)
        q, k = ops.norm_rope_pair(q, self.q_norm.weight, k, self.k_norm.weight, self.q_norm.eps, cos, sin)
        return q, k, v.view(bsz, seq, self.num_kv_heads, self.head_dim), gate

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
        """attn, gate: [B, T, Hq, D] -> [B, T, hidden]."""
        return self.o_proj(gated_rows(attn, gate))

    def project_out(self, gated: torch.Tensor) -> torch.Tensor:
        """The output projection of attention already gated: [B, T, Hq, D] -> [B, T, hidden]."""
        return self.o_proj(output_rows(gated))


def output_rows(gated: torch.Tensor) -> torch.Tensor:
    """o_proj's input: attention gated [B, T, Hq, D] -> [B, T, Hq * D]."""
    return gated.reshape(*gated.shape[:2], -1)


def gated_rows(attn: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """o_proj's input from attention and its output gate, both [B, T, Hq, D] -> [B, T, Hq * D]."""
    return output_rows(ops.sigmoid_mul(attn, gate))


def causal_mask(num_queries: int, num_keys: int, device: torch.device) -> torch.Tensor:
    """bool [T, S]: query i (the (S-T+i)-th key's position) sees keys 0..S-T+i."""
    offset = num_keys - num_queries
    rows = torch.arange(num_queries, device=device)[:, None]
    cols = torch.arange(num_keys, device=device)[None, :]
    return cols <= rows + offset
