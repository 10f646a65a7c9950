"""A real serving engine on CPU for integration tests: vLLM's CPU build in a cached virtual environment
(`env.py`) serving a tiny random-weight Qwen3-Next-format checkpoint (`tiny_model.py`).

`python -m lumobench.vllm_cpu` builds both under `.cache/` (the locations the `vllm-cpu-tiny` arm uses).
"""

from lumobench.arms import REPO_ROOT

VENV_DIR = REPO_ROOT / ".cache" / "vllm-cpu"
TINY_MODEL_DIR = REPO_ROOT / ".cache" / "vllm-cpu-tiny"
