"""Gated DeltaNet block (Qwen3.5 names): in_proj_qkv / in_proj_z / in_proj_a / in_proj_b, depthwise causal
conv (kernel 4) + SiLU, gates from A_log and dt_bias, the delta-rule recurrence, gated RMSNorm, out_proj.

Split as project -> conv -> (split_qkv, gates) -> mix -> output so a tree verifier can replace conv and
mix (tree conv, path scan) and keep the rest.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from lumotree.model import gdn_ops
from lumotree.model.config import HybridConfig
from lumotree.model.fused import ops
from lumotree.model.fused.pending_norm import PendingNorm
from lumotree.model.fused.weights import FusedProjection
from lumotree.model.norms import GatedRMSNorm


class GatedDeltaNet(nn.Module):
    """One GDN token mixer. Value head h reads key head h // (HV/H)."""

    FUSED_INPUTS: ClassVar[tuple[str, ...]] = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.num_k_heads = config.linear_num_key_heads
        self.num_v_heads = config.linear_num_value_heads
        self.head_k_dim = config.linear_key_head_dim
        self.head_v_dim = config.linear_value_head_dim
        self.key_dim = config.key_dim
        self.value_dim = config.value_dim
        hidden = config.hidden_size
        self.in_proj_qkv = ops.Linear(hidden, config.conv_dim)
        self.in_proj_z = ops.Linear(hidden, self.value_dim)
        self.in_proj_b = ops.Linear(hidden, self.num_v_heads)
        self.in_proj_a = ops.Linear(hidden, self.num_v_heads)
        # Only conv1d.weight [C, 1, W] is used (functionally); the module keeps the checkpoint name.
        self.conv1d = nn.Conv1d(
            config.conv_dim,
            config.conv_dim,
            config.linear_conv_kernel_dim,
            groups=config.conv_dim,
            bias=False,
        )
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        self.norm = GatedRMSNorm(self.head_v_dim, eps=config.rms_norm_eps)
        self.out_proj = ops.Linear(self.value_dim, hidden)
        self.fused: FusedProjection | None = None  # [qkv | z | b | a], set by fuse_projections_

    def project(
        self, h: torch.Tensor | PendingNorm
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """h: [B, T, hidden] (or its norm left pending) -> (conv inputs [B, T, C], z [B, T, HV, V],
        a [B, T, HV], b [B, T, HV])."""
        bsz, seq, _ = h.shape
        if self.fused is not None and ops.kernels_for(h) and self.fused.current():
            qkv, z, b, a = self.fused(h)  # column slices of one GEMM
        else:
            qkv, z, b, a = self.in_proj_qkv(h), self.in_proj_z(h), self.in_proj_b(h), self.in_proj_a(h)
        return qkv, z.view(bsz, seq, self.num_v_heads, self.head_v_dim), a, b

    def conv(
        self, mixed_qkv: torch.Tensor, conv_state: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal depthwise conv + SiLU along a chain: ([B, T, C], state [B, C, W-1]) -> same + new state."""
        return gdn_ops.causal_conv1d(mixed_qkv, self.conv1d.weight.squeeze(1), conv_state)

    def split_qkv(self, conv_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[B, T, C] -> q, k [B, T, H, K] and v [B, T, HV, V] (raw: not yet normalised)."""
        bsz, seq, _ = conv_out.shape
        q, k, v = conv_out.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        return (
            q.reshape(bsz, seq, self.num_k_heads, self.head_k_dim),
            k.reshape(bsz, seq, self.num_k_heads, self.head_k_dim),
            v.reshape(bsz, seq, self.num_v_heads, self.head_v_dim),
        )

    def gates(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 log decay g = -exp(A_log) * softplus(a + dt_bias) and write strength beta = sigmoid(b)."""
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        return g, b.float().sigmoid()

    def mix(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        state: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The delta-rule recurrence along a chain, from `state` (fp32 [B, HV, V, K], None = zeros).

        q, k: raw [B, T, H, K]; v: [B, T, HV, V]; g, beta: fp32 [B, T, HV].
        Returns (o [B, T, HV, V] in v's dtype, final state fp32 [B, HV, V, K]).
        """
        qn, kn = gdn_ops.prepare_qk(q, k, self.num_v_heads)
        if q.shape[1] == 1:
            o, new_state = gdn_ops.recurrent_gated_delta_rule(qn, kn, v, g, beta, state)
        else:
            o, new_state = gdn_ops.chunk_gated_delta_rule(qn, kn, v, g, beta, state)
        return o.to(v.dtype), new_state

    def output(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """o, z: [B, T, HV, V] -> gated RMSNorm per head -> out_proj -> [B, T, hidden]."""
        return self.out_proj(self.normed_output(o, z))

    def normed_output(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """out_proj's input: o, z [B, T, HV, V] -> gated RMSNorm per head [B, T, HV * V]."""
        bsz, seq = o.shape[:2]
        return self.norm(o, z).reshape(bsz, seq, self.value_dim)

    def forward(
        self, h: torch.Tensor, conv_state: torch.Tensor | None = None, state: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """h: [B, T, hidden] continuing from (conv_state, state) (None = sequence start).

        Returns (out [B, T, hidden], new conv state [B, C, W-1], new recurrent state fp32 [B, HV, V, K]).
        """
        mixed_qkv, z, a, b = self.project(h)
        conv_out, new_conv = self.conv(mixed_qkv, conv_state)
        q, k, v = self.split_qkv(conv_out)
        g, beta = self.gates(a, b)
        o, new_state = self.mix(q, k, v, g, beta, state)
        return self.output(o, z), new_conv, new_state

    def reset_parameters_for_training(self, generator: torch.Generator) -> None:
        """Decay init for training from scratch: A ~ U(1, 16), softplus(dt_bias) ~ logU(1e-3, 1e-1)."""
        with torch.no_grad():
            a = torch.empty(self.num_v_heads).uniform_(1.0, 16.0, generator=generator)
            self.A_log.copy_(a.log())
            log_dt = torch.empty(self.num_v_heads).uniform_(
                math.log(1e-3), math.log(1e-1), generator=generator
            )
            dt = log_dt.exp()
            self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
