"""Feed-forward blocks: SwiGLU MLP and Qwen3-Next's sparse mixture of experts."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from lumotree.model.fused import ops
from lumotree.model.fused.pending_norm import PendingNorm
from lumotree.model.fused.weights import FusedProjection


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    FUSED_INPUTS: ClassVar[tuple[str, ...]] = ("gate_proj", "up_proj")  # see fuse_projections_

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = ops.Linear(hidden_size, intermediate_size)
        self.up_proj = ops.Linear(hidden_size, intermediate_size)
        self.down_proj = ops.Linear(intermediate_size, hidden_size)
        self.fused: FusedProjection | None = None  # [gate | up], set by fuse_projections_

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x: [..., hidden] -> [..., hidden], plus `residual` [..., hidden] if given (on the fused
        path the down projection adds it as it stores)."""
        return ops.linear(self.activation(x), self.down_proj.weight, residual)

    def activation(self, x: torch.Tensor | PendingNorm) -> torch.Tensor:
        """The down projection's input silu(gate(x)) * up(x) [..., intermediate] (one launch on the
        fused path, which also applies a pending norm of x)."""
        if self.fused is not None and ops.kernels_for(x) and self.fused.current():
            return ops.linear_silu_mul(x, self.fused.weight)
        return F.silu(self.gate_proj(x)) * self.up_proj(x)


class SparseMoE(nn.Module):
    """Top-k routed SwiGLU experts plus a sigmoid-gated shared expert (Qwen3-Next's MoE block).

    Routing: softmax over experts in fp32, top-k, optionally renormalised over the chosen k.
    Checkpoint names: gate.weight, experts.{e}.{gate,up,down}_proj.weight, shared_expert.*,
    shared_expert_gate.weight.
    """

    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        top_k: int,
        expert_size: int,
        shared_size: int,
        norm_topk_prob: bool,
    ) -> None:
        super().__init__()
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.gate = ops.Linear(hidden_size, num_experts)
        self.experts = nn.ModuleList(MLP(hidden_size, expert_size) for _ in range(num_experts))
        self.shared_expert = MLP(hidden_size, shared_size)
        self.shared_expert_gate = ops.Linear(hidden_size, 1)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x: [..., hidden] -> [..., hidden], plus `residual` [..., hidden] if given."""
        flat = x.reshape(-1, x.shape[-1])
        probs = F.softmax(self.gate(flat), dim=-1, dtype=torch.float)
        weights, chosen = probs.topk(self.top_k, dim=-1)  # [N, k]
        if self.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
        weights = weights.to(flat.dtype)
        out = torch.zeros_like(flat)
        for e in chosen.unique().tolist():
            rows, slot = torch.where(chosen == e)
            out.index_add_(0, rows, self.experts[e](flat[rows]) * weights[rows, slot, None])
        out = out + torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
        return out.reshape(x.shape) if residual is None else residual + out.reshape(x.shape)
