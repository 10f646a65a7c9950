"""Build the vLLM CPU environment, the tiny checkpoint (`vllm-cpu-tiny`) and the shipped model's
Qwen3-Next export (`vllm-cpu-ar`, `vllm-cpu-mtp1/3/5`)."""

from __future__ import annotations

import sys

import lumobench.vllm_cpu.plugin as lumotree_plugin
from lumobench.errors import LumobenchError
from lumobench.vllm_cpu import SHIPPED_EXPORT_DIR, TINY_MODEL_DIR, VENV_DIR
from lumobench.vllm_cpu.env import build_vllm_cpu_env
from lumobench.vllm_cpu.export import export_qwen3_next
from lumobench.vllm_cpu.tiny_model import demo_training_texts, write_tiny_checkpoint


def main() -> int:
    """Also installs this checkout's LumoTree vLLM plugin into the environment (`vllm-cpu-lumotree*`)."""
    try:
        python = build_vllm_cpu_env(VENV_DIR)
        lumotree_plugin.install_plugin(VENV_DIR)
        model = write_tiny_checkpoint(TINY_MODEL_DIR, demo_training_texts())
        shipped = export_qwen3_next(SHIPPED_EXPORT_DIR)
    except LumobenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"vLLM CPU python: {python}\ntiny checkpoint: {model}\nlumo-tiny-coder for vLLM: {shipped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
