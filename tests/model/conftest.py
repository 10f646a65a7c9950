"""Tiny random configs and checkpoints shared by the model tests."""

from __future__ import annotations

import pytest
import torch

from lumotree.model import FULL, LINEAR, HybridConfig, HybridLM


def tiny_config(**changes) -> HybridConfig:
    """4 layers [GDN x3, attention], GQA in both mixers, MTP on; small enough for millisecond forwards."""
    base = HybridConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        layer_types=(LINEAR, LINEAR, LINEAR, FULL),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        tie_word_embeddings=False,
        mtp_num_hidden_layers=1,
    )
    return base.replace(**changes)


def perturbed_model(config: HybridConfig, seed: int = 0) -> HybridLM:
    """Random model whose norm weights are non-trivial too (zero-centred norms start at 0)."""
    model = HybridLM.random(config, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 1 and "A_log" not in name and "dt_bias" not in name:
                param.add_(0.2 * torch.randn(param.shape, generator=gen))
    return model.eval()


@pytest.fixture(name="tiny_config")
def _tiny_config_factory():
    """Factory fixture: tiny_config(**changes) -> HybridConfig."""
    return tiny_config


@pytest.fixture(name="perturbed_model")
def _perturbed_model_factory():
    """Factory fixture: perturbed_model(config, seed=0) -> HybridLM."""
    return perturbed_model


@pytest.fixture
def tiny_model() -> HybridLM:
    return perturbed_model(tiny_config())
