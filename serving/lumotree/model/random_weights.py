"""Random-weight models of real shapes, for speed work without downloads.

`random_model(preset_config("qwen3.5-27b"), device="cuda", dtype=torch.bfloat16)` builds the
model on the meta device, materialises it with `to_empty` on the target device and initialises
every parameter in place from a device generator: 27B parameters never pass through host memory
and the build takes seconds. The values follow `HybridLM.random`'s recipe (N(0, std) matrices,
residual output projections scaled by 1/sqrt(2 * layers), U(+-1/sqrt(width)) conv taps, norms at
their checkpoint identity, spread GDN decays) but come from the device's generator, so they differ
from `HybridLM.random` on the CPU; a seed gives the same model on the same kind of device.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from lumotree.model.config import HybridConfig
from lumotree.model.gdn import GatedDeltaNet
from lumotree.model.model import HybridLM, parameter_init
from lumotree.model.norms import GatedRMSNorm, RMSNorm
from lumotree.model.rope import RotaryEmbedding

PRESETS_DIR = Path(__file__).parent / "presets"


def preset_names() -> list[str]:
    """Names accepted by `preset_config` (the JSON files under model/presets/)."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.json"))


def preset_config(name: str) -> HybridConfig:
    """The HF-style config of a shipped shape preset, e.g. "qwen3.5-27b"."""
    path = PRESETS_DIR / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"unknown random-weights preset {name!r}; known: {', '.join(preset_names())}")
    return HybridConfig.from_hf_dict(json.loads(path.read_text()))


@torch.no_grad()
def random_model(
    config: HybridConfig,
    device: torch.device | str,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    std: float = 0.02,
) -> HybridLM:
    """A seeded random-weight model built directly on `device` in `dtype` (eval mode)."""
    device = torch.device(device)
    with torch.device("meta"):
        model = HybridLM(config)
    model = model.to(dtype=dtype).to_empty(device=device)
    if config.tie_word_embeddings:  # to_empty gives the tied head a storage of its own
        model.lm_head.weight = model.model.embed_tokens.weight
    model.rotary = RotaryEmbedding(config.rotary_dim, config.rope_theta).to(device)  # buffer was empty
    gen = torch.Generator(device=device).manual_seed(seed)
    host_gen = torch.Generator().manual_seed(seed)  # the small GDN decay vectors
    for name, param in model.named_parameters():
        kind, scale = parameter_init(name, param, config, std)
        if kind == "uniform":
            param.uniform_(-scale, scale, generator=gen)
        elif kind == "normal":
            param.normal_(0.0, scale, generator=gen)
    for module in model.modules():
        if isinstance(module, RMSNorm):
            module.weight.zero_()
        elif isinstance(module, GatedRMSNorm):
            module.weight.fill_(1.0)
        elif isinstance(module, GatedDeltaNet):
            module.reset_parameters_for_training(host_gen)
    return model.eval()
