"""Read and write HF-format checkpoints (config.json + safetensors) in Qwen3.5 and Qwen3-Next layouts.

Qwen3.5 (`qwen3_5_text`, or `qwen3_5` with `model.language_model.` names) stores the GDN projections
separately (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a); Qwen3-Next fuses them per key-head group:
in_proj_qkvz rows are, for each key head h, [q_h (K) | k_h (K) | v of its r value heads (r*V) |
z of them (r*V)], and in_proj_ba rows are, for each h, [b of its r value heads | a of them]
(r = HV / H). Both read into the same model; both can be written.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from lumotree.model.config import CheckpointFormat, ConfigError, HybridConfig
from lumotree.model.model import HybridLM

_PREFIXES = ("model.language_model.", "language_model.model.")  # qwen3_5 (multimodal) checkpoints
_SKIP = ("model.visual.", "visual.", "model.vision_tower.")


def model_eos_ids(model_dir: Path, config_eos: int | list[int] | None) -> tuple[int, ...]:
    """EOS ids of config.json and generation_config.json together."""
    ids: list[int] = []
    sources: list[object] = [config_eos]
    gen = model_dir / "generation_config.json"
    if gen.is_file():
        sources.append(json.loads(gen.read_text()).get("eos_token_id"))
    for src in sources:
        for i in src if isinstance(src, list) else [src]:
            if isinstance(i, int) and i not in ids:
                ids.append(i)
    return tuple(ids)


def load_checkpoint(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    without_layers: bool = False,
) -> HybridLM:
    """Load a checkpoint folder (config.json + *.safetensors) into a HybridLM of `dtype` on `device`.

    without_layers: skip the decoder layers (not even read): embedding, final norm, lm_head and the
    MTP module only, what MTP drafting beside another engine's target needs.
    Raises ConfigError for unsupported configs and ValueError for missing or unexpected tensors.
    """
    path = Path(path)
    config = HybridConfig.from_file(path)
    if without_layers:
        config = config.replace(num_hidden_layers=0, layer_types=(), mlp_only_layers=())
    tensors = _read_safetensors(path, skip_layers=without_layers)
    tensors = {_canonical_name(k): v for k, v in tensors.items() if not k.startswith(_SKIP)}
    if config.mtp_num_hidden_layers and not any(k.startswith("mtp.") for k in tensors):
        config = config.replace(mtp_num_hidden_layers=0)  # config announces an MTP the file lacks
    if any(".in_proj_qkvz." in k for k in tensors):
        tensors = _unfuse_gdn(tensors, config)
    model = HybridLM(config)
    expected = set(model.state_dict())
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
        expected.discard("lm_head.weight")
    missing = sorted(expected - tensors.keys())
    unexpected = sorted(tensors.keys() - expected)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {path} does not match its config: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    state = model.state_dict()
    wrong = [
        f"{k} {tuple(v.shape)} != {tuple(state[k].shape)}"
        for k, v in tensors.items()
        if v.shape != state[k].shape
    ]
    if wrong:
        raise ValueError(f"checkpoint {path} does not match its config: shapes {wrong[:3]}")
    model.load_state_dict(tensors, strict=False)
    return model.to(device=device, dtype=dtype).eval()


def save_checkpoint(
    model: HybridLM,
    path: str | Path,
    fmt: CheckpointFormat = "qwen3_5_text",
    dtype: torch.dtype = torch.bfloat16,
    dense_mlp_as_moe: bool = False,
) -> Path:
    """Write config.json + model.safetensors of `model` in `fmt`; returns the folder.

    qwen3_next writes lm_head.weight even when tied (vLLM's Qwen3-Next loader has no tying).
    dense_mlp_as_moe (qwen3_next only) writes each dense MLP as an exactly equivalent one-expert MoE
    (top-1 weight 1.0, zero shared expert), for loaders that require a sparse layer.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = model.config
    # clone: a tied lm_head shares storage with the embedding, which safetensors refuses
    tensors = {k: v.detach().to("cpu", dtype).clone() for k, v in model.state_dict().items()}
    if fmt == "qwen3_5_text":
        if config.tie_word_embeddings:
            tensors.pop("lm_head.weight")
        hf_config = config.to_hf_dict(fmt)
    elif fmt == "qwen3_next":
        tensors = _fuse_gdn(tensors, config)
        if dense_mlp_as_moe:
            if config.num_experts:
                raise ConfigError("dense_mlp_as_moe needs a dense model")
            tensors, config = _dense_as_moe(tensors, config)
        hf_config = config.to_hf_dict(fmt)
    else:
        raise ConfigError(f"unknown checkpoint format {fmt!r}")
    hf_config["dtype"] = str(dtype).removeprefix("torch.")
    (path / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


# ---- helpers -----------------------------------------------------------------------------------
def _read_safetensors(path: Path, skip_layers: bool = False) -> dict[str, torch.Tensor]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {path}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open handles are not mappings)
                if not (skip_layers and _canonical_name(key).startswith("model.layers.")):
                    tensors[key] = f.get_tensor(key)
    return tensors


def _canonical_name(name: str) -> str:
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            return "model." + name[len(prefix) :]
    return name


def _prefixes_of(tensors: dict[str, torch.Tensor], suffix: str) -> list[str]:
    return [k[: -len(suffix)] for k in tensors if k.endswith(suffix)]


def _fuse_gdn(tensors: dict[str, torch.Tensor], config: HybridConfig) -> dict[str, torch.Tensor]:
    """Qwen3.5 -> Qwen3-Next GDN projection layout (see the module docstring)."""
    h, r = config.linear_num_key_heads, config.linear_num_value_heads // config.linear_num_key_heads
    dk, dv, hidden = config.linear_key_head_dim, config.linear_value_head_dim, config.hidden_size
    out = dict(tensors)
    for pre in _prefixes_of(tensors, ".in_proj_qkv.weight"):
        qkv = out.pop(pre + ".in_proj_qkv.weight")
        q, k, v = qkv.split([config.key_dim, config.key_dim, config.value_dim])
        z = out.pop(pre + ".in_proj_z.weight")
        groups = [
            q.view(h, dk, hidden),
            k.view(h, dk, hidden),
            v.view(h, r * dv, hidden),
            z.view(h, r * dv, hidden),
        ]
        out[pre + ".in_proj_qkvz.weight"] = torch.cat(groups, dim=1).reshape(-1, hidden)
        b = out.pop(pre + ".in_proj_b.weight").view(h, r, hidden)
        a = out.pop(pre + ".in_proj_a.weight").view(h, r, hidden)
        out[pre + ".in_proj_ba.weight"] = torch.cat([b, a], dim=1).reshape(-1, hidden)
    return out


def _unfuse_gdn(tensors: dict[str, torch.Tensor], config: HybridConfig) -> dict[str, torch.Tensor]:
    """Qwen3-Next -> Qwen3.5 GDN projection layout."""
    h, r = config.linear_num_key_heads, config.linear_num_value_heads // config.linear_num_key_heads
    dk, dv, hidden = config.linear_key_head_dim, config.linear_value_head_dim, config.hidden_size
    out = dict(tensors)
    for pre in _prefixes_of(tensors, ".in_proj_qkvz.weight"):
        qkvz = out.pop(pre + ".in_proj_qkvz.weight").view(h, 2 * dk + 2 * r * dv, hidden)
        q, k, v, z = qkvz.split([dk, dk, r * dv, r * dv], dim=1)
        out[pre + ".in_proj_qkv.weight"] = torch.cat(
            [q.reshape(-1, hidden), k.reshape(-1, hidden), v.reshape(-1, hidden)]
        )
        out[pre + ".in_proj_z.weight"] = z.reshape(-1, hidden)
        ba = out.pop(pre + ".in_proj_ba.weight").view(h, 2 * r, hidden)
        out[pre + ".in_proj_b.weight"] = ba[:, :r].reshape(-1, hidden)
        out[pre + ".in_proj_a.weight"] = ba[:, r:].reshape(-1, hidden)
    return out


_SHARED_SIZE_FOR_WRAPPED_DENSE = 64  # zero-weight shared expert: contributes exactly 0


def _dense_as_moe(
    tensors: dict[str, torch.Tensor], config: HybridConfig
) -> tuple[dict[str, torch.Tensor], HybridConfig]:
    """Dense SwiGLU MLP -> one routed expert (softmax over one expert = 1.0) + zero shared expert."""
    out = dict(tensors)
    hidden, shared = config.hidden_size, _SHARED_SIZE_FOR_WRAPPED_DENSE
    for pre in _prefixes_of(tensors, ".mlp.gate_proj.weight"):
        ref = out[pre + ".mlp.gate_proj.weight"]
        for proj in ("gate_proj", "up_proj", "down_proj"):
            out[f"{pre}.mlp.experts.0.{proj}.weight"] = out.pop(f"{pre}.mlp.{proj}.weight")
        out[pre + ".mlp.gate.weight"] = ref.new_zeros(1, hidden)
        out[pre + ".mlp.shared_expert.gate_proj.weight"] = ref.new_zeros(shared, hidden)
        out[pre + ".mlp.shared_expert.up_proj.weight"] = ref.new_zeros(shared, hidden)
        out[pre + ".mlp.shared_expert.down_proj.weight"] = ref.new_zeros(hidden, shared)
        out[pre + ".mlp.shared_expert_gate.weight"] = ref.new_zeros(1, hidden)
    moe_config = config.replace(
        num_experts=1,
        num_experts_per_tok=1,
        moe_intermediate_size=config.intermediate_size,
        shared_expert_intermediate_size=shared,
        decoder_sparse_step=1,
        mlp_only_layers=(),
        norm_topk_prob=True,
    )
    return out, moe_config
