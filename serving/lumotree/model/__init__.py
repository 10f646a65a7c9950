"""Qwen3.5 / Qwen3-Next compatible hybrid decoder (GDN + gated attention + MTP head), plain PyTorch.

from lumotree.model import load_checkpoint, default_model_path
model = load_checkpoint(default_model_path())
state = model.new_state(max_tokens=4096)
hidden = model.prefill(prompt_ids, state)          # [T, hidden]
logits = model.compute_logits(hidden[-1:])         # [1, vocab]
hidden = model.decode(next_token, state)           # [1, hidden]
"""

from lumotree.model.checkpoint import load_checkpoint, save_checkpoint
from lumotree.model.config import FULL, LINEAR, ConfigError, HybridConfig
from lumotree.model.model import HybridLM
from lumotree.model.paths import DEFAULT_MODEL_NAME, default_model_path
from lumotree.model.state import GDNState, KVCache, ModelState

__all__ = [
    "DEFAULT_MODEL_NAME",
    "FULL",
    "LINEAR",
    "ConfigError",
    "GDNState",
    "HybridConfig",
    "HybridLM",
    "KVCache",
    "ModelState",
    "default_model_path",
    "load_checkpoint",
    "save_checkpoint",
]
