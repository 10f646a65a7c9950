"""The shipped model's Qwen3-Next export for vLLM: MTP weights included, reused while current, rewritten
when stale (the real export runs once; a stand-in exporter checks the rewrite and the failure)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open

from lumobench.errors import LumobenchError
from lumobench.vllm_cpu.export import MARKER, SHIPPED_MODEL_DIR, export_qwen3_next, export_recipe, is_exported


def test_export_carries_the_mtp_module_and_is_reused_while_current(tmp_path: Path) -> None:
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


def _stand_in_exporter(tmp_path: Path, exit_code: int) -> str:
    """A stand-in for `python -m lumotree.training export` (the real one takes ~7 s): writes config.json
    into --out, or fails with a message."""
    script = tmp_path / "fake-python"
    script.write_text(
        "#!/bin/sh\n"
        'while [ "$1" != "--out" ]; do shift; done\n'
        f'[ {exit_code} -eq 0 ] || {{ echo "export: something broke"; exit {exit_code}; }}\n'
        'mkdir -p "$2" && echo "{}" > "$2/config.json"\n'
    )
    script.chmod(0o755)
    return str(script)


def test_a_stale_or_partial_export_is_rewritten_and_a_failing_one_is_one_clear_error(tmp_path: Path) -> None:
    dest = tmp_path / "next"
    dest.mkdir()
    (dest / MARKER).write_text("an older recipe\n")
    (dest / "stray.bin").write_text("left by a partial export")
    assert not is_exported(dest)
    export_qwen3_next(dest, python=_stand_in_exporter(tmp_path, 0))
    assert not (dest / "stray.bin").exists() and (dest / "config.json").is_file()
    assert is_exported(dest) and (dest / MARKER).read_text() == export_recipe(SHIPPED_MODEL_DIR) + "\n"
    (dest / MARKER).unlink()
    with pytest.raises(LumobenchError, match=r"failed \(exit 3\):\nexport: something broke"):
        export_qwen3_next(dest, python=_stand_in_exporter(tmp_path, 3))
    assert not is_exported(dest)


def test_export_of_a_missing_checkpoint_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LumobenchError, match="no checkpoint to export"):
        export_qwen3_next(tmp_path / "out", model=tmp_path / "nothing-here")
