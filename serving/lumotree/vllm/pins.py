"""The vLLM version and internals the plugin is written against.

The plugin wraps or replaces vLLM functions (patches.py) and relies on the contracts of others (how
the runner lays out spec tokens, how the scheduler rolls back rejected drafts, how the GDN layer
calls its core op). Each of them is pinned by a digest of its source: on activation a changed
function stops the plugin with an error naming it, instead of computing wrong results.
Regenerate after a deliberate upgrade with `python -m lumotree.vllm.pins` in the vLLM environment.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import sys

PINNED_VERSION = "0.32.0"

#: (module, qualname) -> sha256 (first 16 hex digits) of the function's source in vLLM 0.32.0
PINNED_FUNCTIONS: dict[tuple[str, str], str] = {
    ("vllm.model_executor.layers.mamba.ops.cpu.gdn_attention", "cpu_gdn_attention_core"): "e40161d73584814f",
    (
        "vllm.model_executor.layers.mamba.ops.cpu.gdn_attention",
        "register_cpu_gdn_attention_ops",
    ): "b1c5884c27715adb",
    (
        "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn",
        "QwenGatedDeltaNetAttention.forward_cpu",
    ): "087e254665af31d9",
    (
        "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn",
        "QwenGatedDeltaNetAttention.fix_query_key_value_ordering",
    ): "70572f455c17ce30",
    ("vllm.v1.attention.backends.cpu_attn", "CPUAttentionBackendImpl.forward"): "e746d486d22b88d5",
    ("vllm.v1.attention.backends.cpu_attn", "CPUAttentionBackendImpl.do_kv_cache_update"): "9cccd68715a2b983",
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._update_states"): "326599f31b273b94",
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._prepare_inputs"): "c31a77c123a09a04",
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._calc_spec_decode_metadata"): "6148d63fa0bff183",
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._sample"): "5cb5c1da02cfdc68",
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._bookkeeping_sync"): "13c3e81003a7e168",
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.sample_tokens"): "047e6a4738dead56",
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.propose_draft_token_ids"): "a60269aca9de4e25",
    ("vllm.v1.core.sched.scheduler", "Scheduler.schedule"): "da4f2cf2fc39c39e",
    # align mode (prefix caching): the state moves the plugin replaces, where the runner calls them,
    # and the manager's rule that the running state sits in the block of the last scheduled token
    ("vllm.v1.worker.mamba_utils", "preprocess_mamba"): "2eed1bcbe40ca1ef",
    ("vllm.v1.worker.mamba_utils", "postprocess_mamba_align_gpu"): "ae1bc7ed190ad146",
    ("vllm.v1.worker.mamba_utils", "cleanup_mamba_state_idx"): "1340ccec692310a1",
    ("vllm.v1.core.single_type_kv_cache_manager", "MambaManager.allocate_new_blocks"): "a68fab2ee72268ce",
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.execute_model"): "e058bf791a298e98",
    (
        "vllm.v1.worker.gpu_model_runner",
        "GPUModelRunner._update_states_after_model_execute",
    ): "4675c48e4f112af6",
    ("vllm.v1.core.sched.scheduler", "Scheduler.update_from_output"): "85b29db96051135c",
    ("vllm.v1.core.sched.scheduler", "Scheduler.update_draft_token_ids"): "f05dcf1d78912b36",
    ("vllm.sampling_params", "SamplingParams._validate_spec_decode"): "13f2065aad2612ad",
    ("vllm.v1.spec_decode.custom_class_proposer", "create_custom_proposer"): "b090d3960d9f49fa",
    # what the walk and the logprobs reproduce: vLLM's plain-decoding processing order, its bad-word
    # rule and tokenization, logit bias, raw logprobs and their layout, parsed with the placeholders
    ("vllm.v1.sample.sampler", "Sampler.forward"): "586fe802add4fd74",
    ("vllm.v1.sample.sampler", "Sampler.apply_logits_processors"): "4b31813d0881e38a",
    ("vllm.v1.sample.sampler", "Sampler.gather_logprobs"): "ca39ba3c4e61572e",
    ("vllm.v1.sample.ops.bad_words", "_apply_bad_words_single_batch"): "184787e669f1d46d",
    ("vllm.v1.sample.logits_processor.builtin", "LogitBiasLogitsProcessor.apply"): "963e9e7210559980",
    ("vllm.v1.sample.rejection_sampler", "RejectionSampler.parse_output"): "6090d9b983277064",
    ("vllm.sampling_params", "SamplingParams.update_from_tokenizer"): "7307b445775fee9b",
}


class PinError(RuntimeError):
    """The installed vLLM is not the one the plugin is written against (message: one line)."""


def resolve(target: tuple[str, str]) -> object:
    """(module, "Qual.name") -> the object."""
    module_name, qualname = target
    obj: object = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def digest(target: tuple[str, str]) -> str:
    """sha256 prefix of a pinned function's source as installed."""
    source = inspect.getsource(inspect.unwrap(resolve(target)))  # type: ignore[arg-type]
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def check_version(version: str) -> None:
    if version != PINNED_VERSION:
        raise PinError(f"lumotree.vllm supports vLLM {PINNED_VERSION} only; this is vLLM {version}")


def check_functions(pins: dict[tuple[str, str], str] = PINNED_FUNCTIONS) -> None:
    """PinError naming the first pinned vLLM function whose source is not the pinned one."""
    for target, expected in pins.items():
        try:
            got = digest(target)
        except (ImportError, AttributeError) as exc:
            raise PinError(f"lumotree.vllm: vLLM function {'.'.join(target)} is missing ({exc})") from None
        if got != expected:
            raise PinError(
                f"lumotree.vllm: vLLM function {'.'.join(target)} changed (source digest {got}, pinned "
                f"{expected}); "
                "the plugin would compute wrong results"
            )


def current_digests() -> dict[tuple[str, str], str]:
    return {target: digest(target) for target in PINNED_FUNCTIONS}


if __name__ == "__main__":
    for target, value in current_digests().items():
        sys.stdout.write(f'    ("{target[0]}", "{target[1]}"): "{value}",\n')
