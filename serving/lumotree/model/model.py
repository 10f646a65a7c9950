"""The hybrid decoder (Qwen3.5 / Qwen3-Next compatible) with its MTP head, and its forward modes.

Modes, all sharing the layers' project -> mix -> output code:
- `forward(input_ids)`: whole sequences from an empty state (training, scoring), batch allowed;
- `prefill(tokens, state)`: T tokens of one request continuing from `state` (advanced in place);
- `decode(token, state)`: one token (the recurrent GDN form);
- `mtp_forward` (whole sequence) and `mtp_hidden` / `mtp_step` (one cached pass of one request,
  `MTP.step`) for the MTP head.
Parameter names equal the checkpoint tensor names (`model.*`, `lm_head.weight`, `mtp.*`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from lumotree.model.config import HybridConfig
from lumotree.model.fused import ops
from lumotree.model.layers import DecoderLayer
from lumotree.model.mtp import MTP, chain_attention
from lumotree.model.norms import RMSNorm
from lumotree.model.rope import RotaryEmbedding
from lumotree.model.state import GDNState, KVCache, ModelState

_OUTPUT_PROJECTIONS = ("o_proj", "out_proj", "down_proj")


def parameter_init(name: str, param: torch.Tensor, config: HybridConfig, std: float) -> tuple[str, float]:
    """How a random model draws a parameter: ("uniform", bound), ("normal", std), or ("module", 0)
    for the 1-D parameters whose owning module sets them (norms, GDN decays)."""
    leaf = name.rsplit(".", 2)
    if leaf[-2] == "conv1d":  # PyTorch's default depthwise-conv scale: U(+-1/sqrt(width))
        return "uniform", param.shape[-1] ** -0.5
    if param.ndim >= 2:
        out_std = std / math.sqrt(2 * config.num_hidden_layers)
        return "normal", out_std if leaf[-2] in _OUTPUT_PROJECTIONS else std
    return "module", 0.0


class HybridBackbone(nn.Module):
    """Embedding, decoder layers, final norm (checkpoint prefix `model.`)."""

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, config.layer_types[i], moe=config.is_moe_layer(i))
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class HybridLM(nn.Module):
    """Causal LM: backbone + lm_head (tied to the embedding when the config says so) + optional MTP."""

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.config = config
        self.model = HybridBackbone(config)
        self.lm_head = ops.Linear(config.hidden_size, config.vocab_size)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.mtp = MTP(config) if config.mtp_num_hidden_layers > 0 else None
        self.rotary = RotaryEmbedding(config.rotary_dim, config.rope_theta)

    # ---- construction --------------------------------------------------------------------------
    @classmethod
    def random(cls, config: HybridConfig, seed: int = 0, std: float = 0.02) -> HybridLM:
        """A seeded random-weight model (deterministic across runs and machines, fp32, CPU).

        Linear/embedding weights ~ N(0, std), residual output projections scaled by 1/sqrt(2 * layers),
        zero-centred norms 0, gated norms 1, GDN decays spread over timescales (A_log, dt_bias).
        """
        gen = torch.Generator().manual_seed(seed)
        model = cls(config)
        with torch.no_grad():
            for name, param in model.named_parameters():
                kind, scale = parameter_init(name, param, config, std)
                if kind == "uniform":
                    param.copy_((torch.rand(param.shape, generator=gen) * 2 - 1) * scale)
                elif kind == "normal":
                    param.copy_(torch.randn(param.shape, generator=gen) * scale)
            for module in model.modules():
                if hasattr(module, "reset_parameters_for_training"):
                    module.reset_parameters_for_training(gen)
        return model

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    def num_parameters(self) -> int:
        """Distinct parameters (a tied lm_head counts once)."""
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())

    # ---- state ---------------------------------------------------------------------------------
    def new_state(self, max_tokens: int) -> ModelState:
        """Empty request state on the model's device: GDN states zero, KV caches [max_tokens, Hkv, D].

        The GDN recurrent states are views of one stacked fp32 bank [L_gdn, HV, V, K]
        (`ModelState.gdn_bank`), the conv states views of one [L_gdn, C, W-1], and the K and V
        caches views of one [L_attn, max_tokens, Hkv, D] each, so publication can update every
        layer in one launch each.
        """
        cfg, dev, dtype = self.config, self.device, self.dtype
        n_gdn = sum(layer.is_linear for layer in self.model.layers)
        head_shape = (cfg.linear_num_value_heads, cfg.linear_value_head_dim, cfg.linear_key_head_dim)
        bank = torch.zeros((n_gdn, *head_shape), dtype=torch.float32, device=dev)
        convs = torch.zeros(n_gdn, cfg.conv_dim, cfg.linear_conv_kernel_dim - 1, dtype=dtype, device=dev)
        n_attn = len(self.model.layers) - n_gdn
        kv_shape = (n_attn, max_tokens, cfg.num_key_value_heads, cfg.head_dim)
        keys, values = (torch.zeros(kv_shape, dtype=dtype, device=dev) for _ in range(2))
        layers: list[GDNState | KVCache] = []
        for layer in self.model.layers:
            if layer.is_linear:
                index = sum(isinstance(s, GDNState) for s in layers)
                layers.append(GDNState(bank[index], convs[index]))
            else:
                index = sum(isinstance(s, KVCache) for s in layers)
                layers.append(KVCache(keys[index], values[index]))
        return ModelState(layers, 0, gdn_bank=bank)

    def new_mtp_state(self, max_tokens: int) -> ModelState:
        """Empty KV caches of the MTP layers (one per MTP layer); `length` = MTP rows committed."""
        if self.mtp is None:
            raise ValueError("this model has no MTP module")
        return ModelState([self._new_kv(max_tokens) for _ in self.mtp.layers], 0)

    def _new_kv(self, max_tokens: int) -> KVCache:
        shape = (max_tokens, self.config.num_key_value_heads, self.config.head_dim)
        return KVCache(
            torch.zeros(shape, dtype=self.dtype, device=self.device),
            torch.zeros(shape, dtype=self.dtype, device=self.device),
        )

    # ---- main model ----------------------------------------------------------------------------
    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """int tokens [...] -> embeddings [..., hidden]."""
        return self.model.embed_tokens(tokens)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Post-norm hidden [..., hidden] -> logits [..., vocab] in the model's dtype."""
        return self.lm_head(hidden)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids: int [B, T] from position 0, empty state -> post-norm hidden [B, T, hidden]."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        cos, sin = self.rotary(positions)
        h = self.embed(input_ids)
        for layer in self.model.layers:
            h = layer(h, cos, sin)
        return self.model.norm(h)

    def prefill(self, tokens: torch.Tensor, state: ModelState) -> torch.Tensor:
        """Fold tokens [T] (one request) into `state` at positions state.length.. (in place).

        Returns post-norm hidden rows [T, hidden]; state.length advances by T.
        """
        tokens = tokens.reshape(-1)
        start, seq = state.length, tokens.shape[0]
        if start + seq > state.capacity:
            raise ValueError(f"context limit: {start + seq} tokens exceed the KV capacity {state.capacity}")
        positions = torch.arange(start, start + seq, device=tokens.device)[None]
        cos, sin = self.rotary(positions)
        h = self.embed(tokens[None])
        for layer, layer_state in zip(self.model.layers, state.layers, strict=True):
            h = layer(h, cos, sin, layer_state, start)
        state.length = start + seq
        return self.model.norm(h)[0]

    def decode(self, token: int | torch.Tensor, state: ModelState) -> torch.Tensor:
        """One token (int or 1-element tensor) -> post-norm hidden row [1, hidden]; state advances by 1."""
        tok = torch.as_tensor(token, device=self.device).reshape(1)
        return self.prefill(tok, state)

    # ---- MTP head ------------------------------------------------------------------------------
    def mtp_forward(self, hidden: torch.Tensor, next_tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Whole-sequence MTP: hidden [B, T, hidden] (rows at positions start..), next_tokens [B, T]
        (row t's token x_{t+1}) -> MTP post-norm hidden [B, T, hidden]; logits predict x_{t+2}."""
        mtp = self._require_mtp()
        positions = torch.arange(start, start + hidden.shape[1], device=hidden.device)[None]
        cos, sin = self.rotary(positions)
        return mtp(hidden, next_tokens, self.model.embed_tokens.weight, cos, sin)

    def mtp_hidden(
        self, hidden: torch.Tensor, tokens: torch.Tensor, mtp_state: ModelState, step_idx: int = 0
    ) -> torch.Tensor:
        """One cached MTP pass for one request: hidden rows [T, hidden] and their next tokens [T] at
        positions mtp_state.length.. -> MTP post-norm hidden rows [T, hidden].

        Writes the MTP KV rows and advances mtp_state.length by T; a drafter rolls speculative rows
        back by resetting `length` (rows beyond it are overwritten later).
        """
        mtp = self._require_mtp()
        start, seq = mtp_state.length, hidden.shape[0]
        cos, sin = self.rotary(torch.arange(start, start + seq, device=hidden.device)[None])
        cache = mtp_state.layers[step_idx % len(mtp_state.layers)]
        assert isinstance(cache, KVCache)
        attend = chain_attention(cache, start, cos, sin)
        table = self.model.embed_tokens.weight
        out = mtp.step(hidden[None], tokens.reshape(1, -1), table, attend, step_idx)[0]
        mtp_state.length = start + seq
        return out

    def mtp_step(
        self, hidden: torch.Tensor, tokens: torch.Tensor, mtp_state: ModelState, step_idx: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`mtp_hidden` with the logits of every row: (logits [T, vocab], new hidden [T, hidden])."""
        out = self.mtp_hidden(hidden, tokens, mtp_state, step_idx)
        return self.compute_logits(out), out

    def _require_mtp(self) -> MTP:
        if self.mtp is None:
            raise ValueError("this model has no MTP module (mtp_num_hidden_layers = 0)")
        return self.mtp
