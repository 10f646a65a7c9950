"""The LumoTree proposer behind vLLM's `custom_class` speculative method.

vLLM builds it in the model runner (`create_custom_proposer`), calls `load_model(target)` after
loading the target and `propose(...)` after each step's bookkeeping; the drafts it returns are the
next trees' rows in physical order, which vLLM schedules as ordinary spec tokens. The trees
themselves stay in the worker, where the next step's plan finds them.
"""

from __future__ import annotations

from typing import Any

import torch

from lumotree.model import load_checkpoint
from lumotree.vllm.logprobs import RAW_MODES
from lumotree.vllm.settings import SettingsError
from lumotree.vllm.worker import get_worker

_DTYPES = {torch.float32, torch.bfloat16}


def check_config(vllm_config: Any) -> None:
    """SettingsError (one line) for vLLM settings the plugin does not serve."""
    model, cache, parallel = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
    arch = (model.hf_config.architectures or ["?"])[0]
    problems = {
        f"a Qwen3-Next model (this is {arch})": arch == "Qwen3NextForCausalLM",
        f"dtype float32 or bfloat16 (got {model.dtype})": model.dtype in _DTYPES,
        "prefix caching off on CUDA (--no-enable-prefix-caching; the plugin serves vLLM's 'align' "
        "mamba cache mode on the CPU only)": not (cache.enable_prefix_caching and on_cuda()),
        f"kv-cache-dtype auto (got {cache.cache_dtype})": cache.cache_dtype == "auto",
        "tensor parallel size 1": parallel.tensor_parallel_size == 1,
        "pipeline parallel size 1": parallel.pipeline_parallel_size == 1,
        "vLLM's V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0)": not vllm_config.use_v2_model_runner,
        "no CUDA graphs (--enforce-eager: a tree changes every step)": not uses_cuda_graphs(vllm_config),
        f"logprobs mode {' or '.join(RAW_MODES)} (got {model.logprobs_mode})": model.logprobs_mode
        in RAW_MODES,
    }
    missing = [need for need, ok in problems.items() if not ok]
    if missing:
        raise SettingsError(f"lumotree.vllm needs {'; '.join(missing)}")


def on_cuda() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cuda())


def uses_cuda_graphs(vllm_config: Any) -> bool:
    mode = getattr(vllm_config.compilation_config, "cudagraph_mode", None)
    return on_cuda() and mode is not None and mode.name != "NONE"


class LumoTreeProposer:
    """vLLM's custom proposer: LumoTree's drafter (MTP spine + siblings, suffix tail and rescues)."""

    def __init__(self, vllm_config: Any) -> None:
        worker = get_worker()
        if worker is None:  # every process must load the plugin: the scheduler and API server patch too
            raise SettingsError(
                "lumotree.vllm is not active in this vLLM process: run the server with LUMOTREE_VLLM=1 and "
                "the plugin installed in its environment (python -m lumobench.vllm_cpu); a stale "
                "lumobench.egg-info on sys.path (run from the repository root without python -P) hides it"
            )
        check_config(vllm_config)
        self.worker = worker
        self.vllm_config = vllm_config
        self.max_rows = 1 + int(vllm_config.speculative_config.num_speculative_tokens)
        worker.settings.engine_config(self.max_rows)  # SettingsError when the geometry cannot fit

    def load_model(self, target: torch.nn.Module) -> None:
        """Load the checkpoint's MTP head with its embedding and lm_head (the project's model code,
        not the decoder layers: vLLM holds the target) for drafting, on the target's device: in
        float32 for the native forward on the CPU (which packs bfloat16 weights exactly), else in
        vLLM's dtype."""
        model_config = self.vllm_config.model_config
        mtp = None
        if self.worker.settings.drafter != "ar":
            device = next(target.parameters()).device
            native = self.worker.settings.kernels == "cpu-native" and device.type == "cpu"
            dtype = torch.float32 if native else model_config.dtype
            mtp = load_checkpoint(model_config.model, dtype, device, without_layers=True)
        if mtp is not None and mtp.mtp is None:
            raise SettingsError(f"lumotree.vllm: {model_config.model} has no MTP weights to draft with")
        self.worker.enable_trees(mtp, self.max_rows, model_config.max_model_len)

    def propose(self, sampled_token_ids: Any, *args: Any, **kwargs: Any) -> list[list[int]]:
        """Drafts per request of the input batch (physical tree order)."""
        return self.worker.propose()
