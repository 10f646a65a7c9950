"""One decoder layer: pre-norm token mixer (GDN or gated attention) and pre-norm MLP, both residual."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from lumotree.model.attention import GatedAttention
from lumotree.model.config import LINEAR, HybridConfig
from lumotree.model.fused import ops
from lumotree.model.fused.pending_norm import PendingNorm
from lumotree.model.gdn import GatedDeltaNet
from lumotree.model.mlp import MLP, SparseMoE
from lumotree.model.norms import RMSNorm
from lumotree.model.state import GDNState, KVCache


class DecoderLayer(nn.Module):
    """Checkpoint names: input_layernorm, linear_attn | self_attn, post_attention_layernorm, mlp."""

    def __init__(self, config: HybridConfig, layer_type: str, moe: bool) -> None:
        super().__init__()
        self.layer_type = layer_type
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        if layer_type == LINEAR:
            self.linear_attn = GatedDeltaNet(config)
        else:
            self.self_attn = GatedAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp: nn.Module
        if moe:
            self.mlp = SparseMoE(
                config.hidden_size,
                config.num_experts,
                config.num_experts_per_tok,
                config.moe_intermediate_size,
                config.shared_expert_intermediate_size,
                config.norm_topk_prob,
            )
        else:
            self.mlp = MLP(config.hidden_size, config.intermediate_size)

    @property
    def is_linear(self) -> bool:
        return self.layer_type == LINEAR

    def forward(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        state: GDNState | KVCache | None = None,
        start: int = 0,
    ) -> torch.Tensor:
        """h: [B, T, hidden] at positions start..start+T-1 (cos/sin for those positions).

        state None: whole sequence from an empty state (training). Otherwise B == 1 and the layer's
        state (no batch dim) is read and advanced in place: GDN recurrent/conv state, or KV rows
        [start, start+T) written and rows [0, start+T) attended.
        """
        x = self.input_layernorm(h)
        if self.is_linear:
            if state is None:
                mixed, _, _ = self.linear_attn(x)
            else:
                assert isinstance(state, GDNState)
                mixed, conv, rec = self.linear_attn(x, state.conv[None], state.recurrent[None])
                state.conv.copy_(conv[0])
                state.recurrent.copy_(rec[0])
        else:
            q, k, v, gate = self.self_attn.project(x, cos, sin)
            if state is None:
                attn = self.self_attn.mix(q, k, v)
            else:
                assert isinstance(state, KVCache)
                end = start + h.shape[1]
                state.key[start:end] = k[0]
                state.value[start:end] = v[0]
                attn = self.self_attn.mix(q, state.key[None, :end], state.value[None, :end])
            mixed = self.self_attn.output(attn, gate)
        return self._residual_mlp(h, mixed)

    def with_mixer(self, h: torch.Tensor, mixer: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """`forward`'s structure with the token mixer swapped (MTP drafting): pre-norm mixer,
        pre-norm MLP, both residual."""
        return self._residual_mlp(h, mixer(self.input_layernorm(h)))

    def _residual_mlp(self, h: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
        """h + mixed, then the pre-norm MLP on that sum, residual (the add and the norm fused; the
        MLP's down projection adds the residual as it stores)."""
        norm = self.post_attention_layernorm
        h, x = ops.add_rms_norm(h, mixed, norm.weight, norm.eps)
        return self.mlp(x, residual=h)

    @property
    def output_projection(self) -> nn.Linear:
        """The token mixer's output projection (GDN's out_proj, attention's o_proj)."""
        return self.linear_attn.out_proj if self.is_linear else self.self_attn.o_proj

    def chained(
        self,
        h: torch.Tensor,
        x: torch.Tensor | PendingNorm,
        mixer: Callable[[torch.Tensor | PendingNorm], torch.Tensor],
        next_norm: RMSNorm | None,
    ) -> tuple[torch.Tensor, torch.Tensor | PendingNorm | None]:
        """One layer of a forward whose layers hand on their pre-norms (tree verification): x is
        h's input norm (a tensor, or left pending by the previous layer's last GEMM) and `mixer`
        returns its output projection's input. The output projection adds the residual, the MLP's
        down projection too, and each leaves the next norm pending where the fused path can
        (`ops.linear_add_norm`). Returns (the layer's output h, next_norm of h, a tensor or pending;
        None when next_norm is None: the last layer)."""
        post = self.post_attention_layernorm
        out = self.output_projection.weight
        if not isinstance(self.mlp, MLP):  # (the routed experts read a plain tensor)
            h = self._residual_mlp(h, ops.linear(mixer(x), out))
            return h, None if next_norm is None else ops.rms_norm(h, next_norm.weight, next_norm.eps)
        h, x = ops.linear_add_norm(mixer(x), out, h, post.weight, post.eps)
        act = self.mlp.activation(x)
        if next_norm is None:
            return ops.linear(act, self.mlp.down_proj.weight, h), None
        return ops.linear_add_norm(act, self.mlp.down_proj.weight, h, next_norm.weight, next_norm.eps)
