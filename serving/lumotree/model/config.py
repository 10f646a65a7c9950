"""Model configuration: one dataclass read from (and written to) HF Qwen3.5 / Qwen3-Next config.json."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

LINEAR = "linear_attention"
FULL = "full_attention"
CheckpointFormat = Literal["qwen3_5_text", "qwen3_next"]


class ConfigError(ValueError):
    """A config.json this model cannot represent (the message says which field and why)."""


@dataclass(frozen=True)
class HybridConfig:
    """Shapes of the hybrid GDN + gated-attention decoder (HF Qwen3.5 text / Qwen3-Next field names).

    `layer_types[i]` is "linear_attention" (Gated DeltaNet) or "full_attention" (gated softmax
    attention). `num_experts > 0` turns the MLP of layers selected by `decoder_sparse_step` /
    `mlp_only_layers` into Qwen3-Next's sparse MoE block. `mtp_num_hidden_layers` is the number of
    decoder layers of the multi-token-prediction module (0: the checkpoint has none).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int = 4
    rope_theta: float = 10_000.0
    partial_rotary_factor: float = 0.25
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32_768
    tie_word_embeddings: bool = False
    mtp_num_hidden_layers: int = 1
    num_experts: int = 0
    num_experts_per_tok: int = 1
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    norm_topk_prob: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        self.validate()

    # ---- derived sizes -------------------------------------------------------------------------
    @property
    def key_dim(self) -> int:
        """Width of all GDN query (or key) heads together."""
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        """Width of all GDN value heads together."""
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the GDN depthwise convolution: [q | k | v]."""
        return 2 * self.key_dim + self.value_dim

    @property
    def rotary_dim(self) -> int:
        """Leading head dims that RoPE rotates (the rest pass through)."""
        return int(self.head_dim * self.partial_rotary_factor)

    def is_moe_layer(self, layer_idx: int) -> bool:
        """Qwen3-Next's rule for which layers carry the sparse MoE MLP."""
        return (
            self.num_experts > 0
            and layer_idx not in self.mlp_only_layers
            and (layer_idx + 1) % self.decoder_sparse_step == 0
        )

    def validate(self) -> None:
        """Raise ConfigError on shapes the model cannot build."""
        if len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError(
                f"{len(self.layer_types)} layer_types for num_hidden_layers = {self.num_hidden_layers}"
            )
        unknown = sorted(set(self.layer_types) - {LINEAR, FULL})
        if unknown:
            raise ConfigError(f"unknown layer_types {unknown}; expected {LINEAR!r} or {FULL!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ConfigError("linear_num_value_heads must be a multiple of linear_num_key_heads")
        if self.rotary_dim % 2:
            raise ConfigError(f"rotary dim head_dim*partial_rotary_factor = {self.rotary_dim} must be even")
        if self.num_experts and (
            self.moe_intermediate_size <= 0 or self.num_experts_per_tok > self.num_experts
        ):
            raise ConfigError(
                "MoE config needs moe_intermediate_size > 0 and num_experts_per_tok <= num_experts"
            )

    # ---- HF config.json ------------------------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any]) -> HybridConfig:
        """Read a `qwen3_5_text`, `qwen3_5` (nested `text_config`) or `qwen3_next` config dict."""
        model_type = raw.get("model_type")
        if model_type == "qwen3_5":
            if not isinstance(raw.get("text_config"), dict):
                raise ConfigError("qwen3_5 config has no text_config")
            text = dict(raw["text_config"])
            text.setdefault("tie_word_embeddings", raw.get("tie_word_embeddings", False))
            return cls.from_hf_dict({**text, "model_type": "qwen3_5_text"})
        if model_type not in ("qwen3_5_text", "qwen3_next"):
            raise ConfigError(
                f"model_type {model_type!r} is not supported (expected qwen3_5_text, qwen3_5 or qwen3_next)"
            )
        if raw.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"hidden_act {raw['hidden_act']!r} is not supported (only silu)")
        if raw.get("attention_bias", False):
            raise ConfigError("attention_bias=true is not supported (Qwen3.5 / Qwen3-Next have none)")
        rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ConfigError(f"rope_type {rope_type!r} is not supported (only default)")
        n_layers = int(raw["num_hidden_layers"])
        layer_types = raw.get("layer_types") or [
            LINEAR if (i + 1) % int(raw.get("full_attention_interval", 4)) else FULL for i in range(n_layers)
        ]
        hidden = int(raw["hidden_size"])
        n_heads = int(raw["num_attention_heads"])
        mtp_layers = raw.get("mtp_num_hidden_layers", raw.get("num_nextn_predict_layers", 1))
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=n_layers,
            layer_types=tuple(layer_types),
            num_attention_heads=n_heads,
            num_key_value_heads=int(raw["num_key_value_heads"]),
            head_dim=int(raw.get("head_dim") or hidden // n_heads),
            linear_num_key_heads=int(raw["linear_num_key_heads"]),
            linear_num_value_heads=int(raw["linear_num_value_heads"]),
            linear_key_head_dim=int(raw["linear_key_head_dim"]),
            linear_value_head_dim=int(raw["linear_value_head_dim"]),
            linear_conv_kernel_dim=int(raw.get("linear_conv_kernel_dim", 4)),
            rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", 10_000.0))),
            partial_rotary_factor=float(
                rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 0.25))
            ),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 32_768)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            mtp_num_hidden_layers=int(mtp_layers or 0),
            num_experts=int(raw.get("num_experts", 0)) if model_type == "qwen3_next" else 0,
            num_experts_per_tok=int(raw.get("num_experts_per_tok", 1)),
            moe_intermediate_size=int(raw.get("moe_intermediate_size", 0)),
            shared_expert_intermediate_size=int(raw.get("shared_expert_intermediate_size", 0)),
            decoder_sparse_step=int(raw.get("decoder_sparse_step", 1)),
            mlp_only_layers=tuple(raw.get("mlp_only_layers") or ()),
            norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_id=raw.get("eos_token_id"),
            pad_token_id=raw.get("pad_token_id"),
            extra={k: v for k, v in raw.items() if k not in known},
        )

    @classmethod
    def from_file(cls, path: str | Path) -> HybridConfig:
        """Read config.json (a file, or a checkpoint folder holding one)."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"no config.json at {path}") from exc
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path} is not valid JSON: {exc}") from exc
        return cls.from_hf_dict(raw)

    def to_hf_dict(self, fmt: CheckpointFormat = "qwen3_5_text") -> dict[str, Any]:
        """The config.json dict of a `qwen3_5_text` or `qwen3_next` checkpoint of this model."""
        out: dict[str, Any] = {
            "architectures": ["Qwen3_5ForCausalLM" if fmt == "qwen3_5_text" else "Qwen3NextForCausalLM"],
            "model_type": fmt,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "layer_types": list(self.layer_types),
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "linear_num_key_heads": self.linear_num_key_heads,
            "linear_num_value_heads": self.linear_num_value_heads,
            "linear_key_head_dim": self.linear_key_head_dim,
            "linear_value_head_dim": self.linear_value_head_dim,
            "linear_conv_kernel_dim": self.linear_conv_kernel_dim,
            "hidden_act": "silu",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor,
            },
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "use_cache": True,
        }
        if fmt == "qwen3_5_text":
            out["mtp_num_hidden_layers"] = self.mtp_num_hidden_layers
            if self.num_experts:
                raise ConfigError("a MoE model cannot be written as qwen3_5_text (use qwen3_next)")
        else:
            out.update(
                num_nextn_predict_layers=self.mtp_num_hidden_layers,
                num_experts=self.num_experts,
                num_experts_per_tok=self.num_experts_per_tok,
                moe_intermediate_size=self.moe_intermediate_size,
                shared_expert_intermediate_size=self.shared_expert_intermediate_size,
                decoder_sparse_step=self.decoder_sparse_step,
                mlp_only_layers=list(self.mlp_only_layers),
                norm_topk_prob=self.norm_topk_prob,
            )
        return out

    def replace(self, **changes: Any) -> HybridConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)
