"""The shipped model's Qwen3-Next export for vLLM: MTP weights included, reused while current."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open

from lumobench.errors import LumobenchError
from lumobench.vllm_cpu.export import MARKER, SHIPPED_MODEL_DIR, export_qwen3_next


def test_export_carries_the_mtp_module_and_is_reused_until_stale(tmp_path: Path) -> None:
    dest = export_qwen3_next(tmp_path / "next")
    config = json.loads((dest / "config.json").read_text())
    assert config["model_type"] == "qwen3_next" and config["num_nextn_predict_layers"] == 1
    assert config["num_experts"] == 1  # dense MLPs written as one-expert MoE blocks
    with safe_open(str(dest / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
    assert {"mtp.fc.weight", "mtp.norm.weight", "lm_head.weight"} <= keys
    assert (dest / "tokenizer_config.json").read_bytes() == (
        SHIPPED_MODEL_DIR / "tokenizer_config.json"
    ).read_bytes()
    written = (dest / "model.safetensors").stat().st_mtime_ns
    assert export_qwen3_next(dest) == dest
    assert (dest / "model.safetensors").stat().st_mtime_ns == written  # current: reused, not rewritten
    (dest / MARKER).write_text("an older recipe\n")
    (dest / "stray.bin").write_text("left by a partial export")
    export_qwen3_next(dest)
    assert not (dest / "stray.bin").exists() and (dest / MARKER).read_text() != "an older recipe\n"


def test_export_of_a_missing_checkpoint_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LumobenchError, match="no checkpoint to export"):
        export_qwen3_next(tmp_path / "out", model=tmp_path / "nothing-here")
