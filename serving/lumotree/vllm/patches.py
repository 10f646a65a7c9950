"""The runtime patches into vLLM 0.32 (each function they wrap or replace is pinned in `pins.py`).

- vLLM's CPU GDN core op (`cpu_gdn_attention_core`) is replaced before vLLM registers it, so its
  Qwen3-Next layers call LumoTree's conv + recurrence (chunks and trees, any dtype);
- `CPUAttentionBackendImpl.forward` runs as before, then the tree rows are recomputed (in a step
  of trees only, the tree rows alone);
- on CUDA instead: `QwenGatedDeltaNetAttention._forward_core` is the plugin's core, and
  `FlashAttentionImpl.forward` is followed by the tree rows' recomputation (kernels: `gpu.py`);
- the model runner's `_update_states` and `_prepare_inputs` are followed by the plugin's hooks
  (the step plan, depth positions); with a LumoTree proposer, `_sample` is LumoTree's (first
  tokens, acceptance walks, publication) and `sample_tokens` carries failed requests out;
- in vLLM's align mamba cache mode (prefix caching) its state moves before and after the forward
  are the plugin's (`align.py`);
- the scheduler's `update_from_output` finishes those requests with an error.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from lumotree.vllm.requests import unsupported_parameters
from lumotree.vllm.worker import LumoTreeWorker, get_worker

FAILED_ATTR = "lumotree_failed"  # on ModelRunnerOutput: {request id: message}


def _after(cls: type, name: str, hook: Callable[..., None]) -> None:
    """cls.name runs, then hook(self, *args) runs."""
    original = getattr(cls, name)

    @functools.wraps(original)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        hook(self, *args, **kwargs)
        return result

    setattr(cls, name, wrapped)


def patch_gdn_op(worker: LumoTreeWorker) -> None:
    """Swap vLLM's CPU GDN core function before vLLM registers it as an op (cpu_gdn_attention_core)."""
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention

    from lumotree.vllm.gdn_op import make_gdn_op

    if gdn_attention._CPU_GDN_ATTENTION_OPS_REGISTERED:
        raise RuntimeError(
            "lumotree.vllm activated too late: vLLM already registered cpu_gdn_attention_core "
            "(activate before the model is built: LUMOTREE_VLLM=1 loads the plugin at start-up)"
        )
    replacement = make_gdn_op(worker)
    replacement.__wrapped__ = gdn_attention.cpu_gdn_attention_core  # type: ignore[attr-defined]  # for pins
    gdn_attention.cpu_gdn_attention_core = replacement


def patch_attention(worker: LumoTreeWorker) -> None:
    """vLLM's CPU attention, then the tree rows recomputed; when every scheduled row is a tree row
    (a step of trees only) the plugin's rows alone: vLLM's causal attention of them would be
    overwritten. Its forward only attends (the KV rows are written before it, by
    `do_kv_cache_update`), so skipping it for decoder attention leaves the cache as it was."""
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

    original = CPUAttentionBackendImpl.forward

    @functools.wraps(original)
    def forward(  # type: ignore[no-untyped-def]
        self,
        layer,
        query,
        key,
        value,
        kv_cache,
        attn_metadata,
        output,
        output_scale=None,
        output_block_scale=None,
    ):
        if (
            attn_metadata is not None
            and output_scale is None
            and output_block_scale is None
            and self.attn_type == AttentionType.DECODER
            and worker.recomputes_every_row()
        ):
            worker.attention(layer, query, key, value, kv_cache, output)
            return output
        result = original(
            self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale, output_block_scale
        )
        if attn_metadata is not None:
            worker.attention(layer, query, key, value, kv_cache, output)
        return result

    CPUAttentionBackendImpl.forward = forward


def patch_cuda(worker: LumoTreeWorker) -> None:
    """vLLM's CUDA GDN core and FlashAttention, routed through the worker (kernels: `gpu.py`)."""
    from vllm.forward_context import get_forward_context
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention
    from vllm.v1.attention.backends.flash_attn import FlashAttentionImpl

    original_core = QwenGatedDeltaNetAttention._forward_core

    @functools.wraps(original_core)
    def _forward_core(self, mixed_qkv, b, a, core_attn_out):  # type: ignore[no-untyped-def]
        if get_forward_context().attn_metadata is None or worker.plan is None:
            return original_core(self, mixed_qkv, b, a, core_attn_out)  # profiling and warm-up runs
        worker.gdn(self, mixed_qkv, b, a, core_attn_out)
        return None

    QwenGatedDeltaNetAttention._forward_core = _forward_core

    original_forward = FlashAttentionImpl.forward

    @functools.wraps(original_forward)
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs):  # type: ignore[no-untyped-def]
        result = original_forward(
            self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs
        )
        if attn_metadata is not None:
            worker.attention(layer, query, key, value, kv_cache, output)
        return result

    FlashAttentionImpl.forward = forward


def patch_runner(worker: LumoTreeWorker) -> None:
    from vllm.v1.outputs import LogprobsTensors, SamplerOutput
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    _after(GPUModelRunner, "_update_states", lambda self, out, *a, **k: worker.update_states(self, out))
    _after(GPUModelRunner, "_prepare_inputs", lambda self, out, *a, **k: worker.prepare_inputs(self, out))

    original_sample = GPUModelRunner._sample

    @functools.wraps(original_sample)
    def _sample(self, logits, spec_decode_metadata):  # type: ignore[no-untyped-def]
        if not worker.trees:
            return original_sample(self, logits, spec_decode_metadata)
        samples, logprobs = worker.sample(self, logits)
        tensors = (
            None if logprobs is None else LogprobsTensors(logprobs.ids, logprobs.logprobs, logprobs.ranks)
        )
        return SamplerOutput(sampled_token_ids=samples.as_tensor(), logprobs_tensors=tensors)

    GPUModelRunner._sample = _sample

    original_sample_tokens = GPUModelRunner.sample_tokens

    @functools.wraps(original_sample_tokens)
    def sample_tokens(self, grammar_output):  # type: ignore[no-untyped-def]
        state = self.execute_model_state
        if state is not None:
            worker.hidden = state.hidden_states
            if grammar_output is not None and worker.trees:
                raise RuntimeError("lumotree.vllm does not support structured outputs")
        try:
            output = original_sample_tokens(self, grammar_output)
        finally:
            worker.end_step()
        failed = {r: worker.failed[r] for r in getattr(output, "req_ids", ()) if r in worker.failed}
        if failed:
            setattr(output, FAILED_ATTR, failed)
        return output

    GPUModelRunner.sample_tokens = sample_tokens


def patch_align(worker: LumoTreeWorker) -> None:
    """vLLM's align-mode state moves (prefix caching on hybrid models), the plugin's: before the
    forward each request's state is moved to its running column (`worker.align_states`); after it
    vLLM's per-draft-state copy is skipped, publication having saved the block-boundary states."""
    from vllm.v1.worker import mamba_utils

    original_pre = mamba_utils.preprocess_mamba

    @functools.wraps(original_pre)
    def preprocess_mamba(
        scheduler_output,
        kv_cache_config,
        cache_config,
        mamba_state_idx,
        input_batch,
        requests,
        *args,
        **kwargs,
    ):  # type: ignore[no-untyped-def]
        runner = worker.runner
        assert runner is not None and runner.mamba_state_idx is mamba_state_idx  # type: ignore[attr-defined]
        worker.align_states(runner, scheduler_output)

    original_post = mamba_utils.postprocess_mamba_align_gpu

    @functools.wraps(original_post)
    def postprocess_mamba_align_gpu(*, num_reqs, num_accepted_tokens_cpu_tensor, **kwargs):  # type: ignore[no-untyped-def]
        num_accepted_tokens_cpu_tensor[:num_reqs] = 1

    mamba_utils.preprocess_mamba = preprocess_mamba
    mamba_utils.postprocess_mamba_align_gpu = postprocess_mamba_align_gpu


def patch_scheduler() -> None:
    """Requests the worker failed finish with an error (vLLM answers HTTP 500; the log names why)."""
    from vllm.logger import init_logger
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.request import RequestStatus

    log = init_logger("vllm.lumotree")
    original = Scheduler.update_from_output

    @functools.wraps(original)
    def update_from_output(self, scheduler_output, model_runner_output):  # type: ignore[no-untyped-def]
        outputs = original(self, scheduler_output, model_runner_output)
        failed: dict[str, str] = getattr(model_runner_output, FAILED_ATTR, None) or {}
        if not failed:
            return outputs
        for request in self.finish_requests(set(failed), RequestStatus.FINISHED_ERROR):
            log.error("request %s failed: %s", request.request_id, failed[request.request_id])
            client = outputs.setdefault(request.client_index, EngineCoreOutputs(outputs=[]))
            client.outputs.append(
                EngineCoreOutput(
                    request_id=request.request_id,
                    new_token_ids=[],
                    finish_reason=request.get_finished_reason(),
                    events=request.take_events(),
                    trace_headers=request.trace_headers,
                )
            )
        return outputs

    Scheduler.update_from_output = update_from_output


def is_lumotree_proposer(speculative_config: Any) -> bool:
    """True when vLLM's speculative config names the LumoTree proposer."""
    model = getattr(speculative_config, "model", None) or ""
    return getattr(speculative_config, "method", None) == "custom_class" and model.startswith("lumotree.vllm")


def patch_sampling_validation() -> None:
    """vLLM refuses min_p and logit_bias with any speculation (its rejection sampler cannot apply
    them); the LumoTree walk applies both exactly, so with its proposer only what the plugin does
    not do is refused, at admission (HTTP 400 naming the parameters)."""
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams

    original = SamplingParams._validate_spec_decode

    @functools.wraps(original)
    def _validate_spec_decode(self, speculative_config):  # type: ignore[no-untyped-def]
        if speculative_config is None or not is_lumotree_proposer(speculative_config):
            return original(self, speculative_config)
        asked = unsupported_parameters(self)
        if asked:
            raise VLLMValidationError(
                f"lumotree.vllm: the LumoTree sampler does not support {', '.join(asked)}"
            )
        return None

    SamplingParams._validate_spec_decode = _validate_spec_decode


def install(worker: LumoTreeWorker) -> None:
    """Every patch, once per process."""
    if get_worker() is not worker:
        raise RuntimeError("install the worker before patching")
    from vllm.platforms import current_platform

    if current_platform.is_cuda():
        patch_cuda(worker)
    else:
        patch_gdn_op(worker)
        patch_attention(worker)
    patch_runner(worker)
    patch_align(worker)
    patch_scheduler()
    patch_sampling_validation()
