"""Our model computes the same logits as transformers' Qwen3.5 / Qwen3-Next on the same checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen3_5ForCausalLM, Qwen3NextConfig, Qwen3NextForCausalLM

from lumotree.model import ConfigError, HybridLM, load_checkpoint, save_checkpoint

TOL = dict(atol=2e-5, rtol=1e-4)


def _logits(model: HybridLM, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.compute_logits(model(ids))


@pytest.mark.parametrize("tied", [False, True])
def test_logits_match_transformers_qwen3_5(tmp_path, tied: bool, tiny_config, perturbed_model) -> None:
    model = perturbed_model(tiny_config(tie_word_embeddings=tied), seed=3)
    save_checkpoint(model, tmp_path, dtype=torch.float32)
    ref = Qwen3_5ForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids = torch.randint(0, 128, (2, 150), generator=torch.Generator().manual_seed(0))  # > one 64-token chunk
    with torch.no_grad():
        expected = ref(ids).logits
    torch.testing.assert_close(_logits(model, ids), expected, **TOL)


@pytest.mark.parametrize("as_moe", [False, True])
def test_qwen3_next_export_matches_transformers_and_round_trips(tmp_path, tiny_model, as_moe: bool) -> None:
    save_checkpoint(tiny_model, tmp_path, fmt="qwen3_next", dtype=torch.float32, dense_mlp_as_moe=as_moe)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["model_type"] == "qwen3_next" and (raw["num_experts"] == 1) == as_moe
    ref = Qwen3NextForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids = torch.randint(0, 128, (1, 90), generator=torch.Generator().manual_seed(1))
    ours = _logits(tiny_model, ids)
    with torch.no_grad():
        torch.testing.assert_close(ref(ids).logits, ours, **TOL)
    reloaded = load_checkpoint(tmp_path)
    torch.testing.assert_close(_logits(reloaded, ids), ours, **TOL)


def test_sparse_moe_checkpoint_from_transformers_loads_with_equal_logits(tmp_path) -> None:
    cfg = Qwen3NextConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        mlp_only_layers=[1],
    )
    torch.manual_seed(0)
    ref = Qwen3NextForCausalLM(cfg).eval()
    with torch.no_grad():  # transformers zero-inits the router: give it real routing decisions
        for name, p in ref.named_parameters():
            if name.endswith("mlp.gate.weight") or "norm" in name:
                p.normal_(0, 0.5)
    ref.save_pretrained(tmp_path)
    ours = load_checkpoint(tmp_path)
    assert ours.config.num_experts == 4 and not ours.config.is_moe_layer(1)
    ids = torch.randint(0, 128, (1, 70), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(_logits(ours, ids), ref(ids).logits, **TOL)


def test_nested_qwen3_5_checkpoint_with_language_model_names_loads(tmp_path, tiny_model) -> None:
    save_checkpoint(tiny_model, tmp_path, dtype=torch.float32)
    from safetensors.torch import load_file, save_file

    tensors = load_file(tmp_path / "model.safetensors")
    renamed = {
        k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k: v
        for k, v in tensors.items()
    }
    renamed["model.visual.blocks.0.attn.qkv.weight"] = torch.zeros(3, 3)  # vision tower: ignored
    save_file(renamed, tmp_path / "model.safetensors")
    text = json.loads((tmp_path / "config.json").read_text())
    nested = {
        "model_type": "qwen3_5",
        "text_config": {**text, "model_type": "qwen3_5_text"},
        "vision_config": {},
    }
    (tmp_path / "config.json").write_text(json.dumps(nested))
    ids = torch.randint(0, 128, (1, 40))
    torch.testing.assert_close(_logits(load_checkpoint(tmp_path), ids), _logits(tiny_model, ids))


def test_unsupported_configs_and_mismatched_tensors_fail_clearly(tmp_path, tiny_model, tiny_config) -> None:
    save_checkpoint(tiny_model, tmp_path, dtype=torch.float32)
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, "model_type": "llama"}))
    with pytest.raises(ConfigError, match="model_type 'llama'"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**raw, "hidden_size": 32, "intermediate_size": 48}))
    with pytest.raises(ValueError, match="does not match its config"):
        load_checkpoint(tmp_path)
    with pytest.raises(ConfigError, match="layer_types"):
        tiny_config(num_hidden_layers=3)
