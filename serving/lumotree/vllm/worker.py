"""LumoTree's state in one vLLM worker process and the hooks vLLM's patched functions call.

Per step (vLLM's order): `update_states` (requests in and out) -> `prepare_inputs` (the step plan:
chunks and trees, depth positions) -> the forward (`gdn` for every GDN layer, `attention` after
vLLM's attention for every attention layer) -> `sample` (first tokens, acceptance walks,
publication) -> `propose` (the next tree per request, through vLLM's custom-class proposer hook).
Without a LumoTree proposer (no speculative config) only `gdn` changes what vLLM computes: every
step is chunks, and vLLM samples.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from lumotree.drafting.drafter import Drafter
from lumotree.drafting.suffix import OutputCache, SuffixDrafter
from lumotree.model.model import HybridLM
from lumotree.model.native.build import NativeBuildError
from lumotree.tree import TreeDescriptor
from lumotree.verify.kernel_sets import CPU_FAST, REFERENCE, TreeKernels
from lumotree.vllm.align import move_running_states, running_column
from lumotree.vllm.gdn_core import GdnCore, TorchGdnCore
from lumotree.vllm.logprobs import TokenLogprobs
from lumotree.vllm.mtp_source import MTPSourceFactory
from lumotree.vllm.native_core import NativeGdnCore, NativeTreeAttention
from lumotree.vllm.paged_kv import check_layout
from lumotree.vllm.publish import LayerIndex
from lumotree.vllm.requests import RequestState, UnsupportedRequest
from lumotree.vllm.sampler import StepSamples, sample_step
from lumotree.vllm.settings import ENV_KERNELS, PluginSettings, SettingsError
from lumotree.vllm.steps import RequestStep, StepPlan, physical_tokens, scheduled_tree
from lumotree.vllm.tree_attention import tree_attention_rows


class LumoTreeWorker:
    """Process-wide plugin state: settings, op set, per-request states and the current step."""

    def __init__(self, settings: PluginSettings) -> None:
        self.settings = settings
        self.kernels: TreeKernels = REFERENCE if settings.kernels == "reference" else CPU_FAST
        self.core: GdnCore | None = None  # chosen once the layers are known (`_index`)
        self._native_attention: NativeTreeAttention | None = None
        self.requests: dict[str, RequestState] = {}
        self.outputs = OutputCache()  # earlier outputs, shared by every request's suffix drafter
        self.plan: StepPlan | None = None
        self.hidden: Tensor | None = None
        self.failed: dict[str, str] = {}
        self.trees = False  # True once a LumoTree proposer is loaded: vLLM schedules our drafts
        self.max_rows = 1
        self.mtp: MTPSourceFactory | None = None
        self._groups: dict[str, int] | None = None
        self._layers: LayerIndex | None = None
        self._conv_dim_first = False
        self._align_block_size: int | None = None  # the mamba block size in vLLM's align mode
        self.runner: object | None = None  # vLLM's model runner (seen in the first hook)

    # ---- the proposer ------------------------------------------------------------------------
    def enable_trees(self, mtp_model: HybridLM | None, max_rows: int, max_model_len: int) -> None:
        """The proposer is in place: trees of at most max_rows rows, drafts from mtp_model's MTP
        (natively when the CPU core is native and the model float32)."""
        self.max_rows, self.trees = max_rows, True
        if mtp_model is not None:
            native = self.settings.kernels == "cpu-native" and mtp_model.device.type == "cpu"
            head_dtype = self.settings.engine_config(max_rows).draft_head_dtype
            self.mtp = MTPSourceFactory(mtp_model, max_model_len + max_rows, native, head_dtype)

    def _new_request(self, runner: object, req_id: str) -> RequestState:
        req = runner.requests[req_id]  # type: ignore[attr-defined]
        config = self.settings.engine_config(self.max_rows)
        geometry = config.geometry()
        suffix = SuffixDrafter(
            config.suffix_min_match, cache_tokens=config.suffix_cache_tokens, cache=self.outputs
        )
        drafter = Drafter(geometry, suffix)
        mtp = None
        if drafter.uses_mtp:
            assert self.mtp is not None
            mtp = self.mtp.new(geometry.depth_mtp, 1 + geometry.siblings_per_depth)
        vocab = runner.input_batch.vocab_size  # type: ignore[attr-defined]
        return RequestState(drafter, mtp, req.sampling_params, vocab, runner.max_model_len)  # type: ignore[attr-defined]

    # ---- vLLM layers -------------------------------------------------------------------------
    def _index(self, runner: object) -> None:
        from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

        mode = runner.cache_config.mamba_cache_mode  # type: ignore[attr-defined]
        on_cuda = runner.device.type == "cuda"  # type: ignore[attr-defined]
        if mode not in ("none", "align") or (mode == "align" and (on_cuda or not self.trees)):
            raise SettingsError(
                f"lumotree.vllm serves vLLM's mamba cache mode 'none', and 'align' (prefix caching) only "
                f"with its proposer on the CPU, not {mode!r}"
            )
        config = runner.kv_cache_config  # type: ignore[attr-defined]
        context = runner.compilation_config.static_forward_context  # type: ignore[attr-defined]
        groups = {name: g for g, group in enumerate(config.kv_cache_groups) for name in group.layer_names}
        gdn, attention = {}, {}
        for name, group in groups.items():
            layer = context[name]
            if hasattr(layer, "conv1d"):
                gdn[name] = (layer, group)
            elif hasattr(layer, "impl"):
                attention[name] = (layer, group)
        impls = {type(layer.impl).__name__ for layer, _ in attention.values()}
        if not impls <= {"CPUAttentionBackendImpl", "FlashAttentionImpl"}:
            raise SettingsError(
                f"lumotree.vllm reads the KV cache of vLLM's CPU and FlashAttention backends, not {impls}"
            )
        self._groups = groups
        self._conv_dim_first = is_conv_state_dim_first()
        self._layers = LayerIndex(gdn, attention, self._conv_dim_first)
        if mode == "align" and gdn:
            self._align_block_size = config.kv_cache_groups[
                next(iter(gdn.values()))[1]
            ].kv_cache_spec.block_size
        if on_cuda:
            from lumotree.vllm.gpu import disable_fused_decode, triton_kernels

            self.kernels = triton_kernels()
            disable_fused_decode([layer for layer, _ in gdn.values()])
        self.core = self._gdn_core({name: layer for name, (layer, _) in gdn.items()}, on_cuda)
        if not on_cuda and self.trees:
            layer = next(iter(attention.values()))[0]
            check_layout(vllm_kv_writer(), layer.isa, layer.kv_cache.dtype)
            if self.settings.kernels == "cpu-native" and layer.isa in NativeTreeAttention.LAYOUTS:
                self._native_attention = NativeTreeAttention(runner.max_model_len + self.max_rows)  # type: ignore[attr-defined]

    def _gdn_core(self, layers: dict[str, torch.nn.Module], on_cuda: bool) -> GdnCore:
        """The native core on the CPU unless the settings name a PyTorch op set; SettingsError if
        the native forward cannot be built here."""
        if on_cuda or self.settings.kernels != "cpu-native" or not layers:
            return TorchGdnCore(self.kernels)
        try:
            return NativeGdnCore(layers, self.max_rows)
        except (NativeBuildError, ValueError) as exc:
            raise SettingsError(
                f"lumotree.vllm: the native GDN core cannot run here ({exc}); set {ENV_KERNELS}=cpu-fast"
            ) from None

    # ---- hooks -------------------------------------------------------------------------------
    def update_states(self, runner: object, scheduler_output: object) -> None:
        """After vLLM updated its persistent batch: forget finished requests."""
        self.runner = runner
        for req_id in scheduler_output.finished_req_ids:  # type: ignore[attr-defined]
            state = self.requests.pop(req_id, None)
            if state is not None:
                state.drafter.finish()
            self.failed.pop(req_id, None)
            if self._native_attention is not None:
                self._native_attention.forget(req_id)
        if self.trees:
            # vLLM's per-request generators are for its own sampler; with them, its bookkeeping
            # rewinds their offsets for split prefills, which CPU generators do not support.
            runner.input_batch.generators.clear()  # type: ignore[attr-defined]

    def prepare_inputs(self, runner: object, scheduler_output: object) -> None:
        """After vLLM prepared the step's inputs: the plan, depth positions for tree rows."""
        if self._groups is None:
            self._index(runner)
        batch = runner.input_batch  # type: ignore[attr-defined]
        scheduled = scheduler_output.num_scheduled_tokens  # type: ignore[attr-defined]
        spec_tokens = scheduler_output.scheduled_spec_decode_tokens  # type: ignore[attr-defined]
        steps, start, logit = [], 0, 0
        for index, req_id in enumerate(batch.req_ids):
            count = int(scheduled[req_id])
            prefix = int(batch.num_computed_tokens_cpu[index])
            drafts = list(spec_tokens.get(req_id, ()))
            req = runner.requests[req_id]  # type: ignore[attr-defined]
            tokens = [int(t) for t in batch.token_ids_cpu[index, prefix : prefix + count]]
            step = RequestStep(req_id, index, start, count, tokens, prefix, req.num_prompt_tokens)
            decode = (
                count - len(drafts) == 1 and prefix + 1 == req.num_tokens and len(req.output_token_ids) > 0
            )
            if self.trees:
                state = self._state(runner, req_id, restart=prefix == 0)
                if decode and state is not None:
                    self._place_tree(runner, step, tokens[0], drafts, state.pending)
                else:
                    step.ends_sequence = prefix + count == req.num_tokens
                    if self._native_attention is not None:  # its positions are (re)written
                        self._native_attention.forget(req_id)
            step.logit_start = logit
            steps.append(step)
            start += count
            logit += len(drafts) + 1
        tables = batch.block_table.block_tables
        self.plan = StepPlan(
            steps,
            [t.block_table.np for t in tables],
            [t.block_size for t in tables],
            align_block_size=self._align_block_size,
            state_columns=runner.mamba_state_idx,  # type: ignore[attr-defined]  # filled by align_states
        )

    def align_states(self, runner: object, scheduler_output: object) -> None:
        """Align mode, before the forward (in place of vLLM's preprocess_mamba): each request's
        running-state column, its committed state moved there from the last step's column."""
        from vllm.v1.worker.mamba_utils import cleanup_mamba_state_idx

        assert self._layers is not None and self._align_block_size is not None
        columns: dict[str, int] = runner.mamba_state_idx  # type: ignore[attr-defined]
        cleanup_mamba_state_idx(scheduler_output, columns)
        batch = runner.input_batch  # type: ignore[attr-defined]
        size = self._align_block_size
        for index, req_id in enumerate(batch.req_ids):
            req = runner.requests[req_id]  # type: ignore[attr-defined]
            computed = req.num_computed_tokens
            last = columns.get(req_id, (computed - 1) // size)  # new or resumed: the cache hit's block
            current = running_column(computed, scheduler_output.num_scheduled_tokens[req_id], size)  # type: ignore[attr-defined]
            columns[req_id] = current
            move_running_states(
                self._layers.gdn.values(), req.block_ids.__getitem__, last, current, self._conv_dim_first
            )
            # vLLM's own drafts would be taken from a per-draft state; publication left it complete
            batch.num_accepted_tokens_cpu[index] = 1

    def _state(self, runner: object, req_id: str, restart: bool) -> RequestState | None:
        """The request's state, (re)started when its sequence starts; None once it failed."""
        if req_id in self.failed:
            return None
        state = self.requests.get(req_id)
        if state is None or restart:
            req = runner.requests[req_id]  # type: ignore[attr-defined]
            try:
                state = self.requests[req_id] = self._new_request(runner, req_id)
            except UnsupportedRequest as exc:
                self.failed[req_id] = f"lumotree: {exc}"
                return None
            state.begin(req.prompt_token_ids)
        return state

    def _place_tree(
        self, runner: object, step: RequestStep, root: int, drafts: list[int], pending: TreeDescriptor | None
    ) -> None:
        tree = scheduled_tree(root, drafts, pending, step.prefix_len)
        if physical_tokens(tree) != step.token_ids:
            raise RuntimeError(f"lumotree: tree tokens {physical_tokens(tree)} != scheduled {step.token_ids}")
        step.tree = tree
        step.rows = step.start + tree.slot_map
        order = torch.argsort(tree.slot_map)
        positions = runner.positions  # type: ignore[attr-defined]
        positions[step.start : step.start + step.count] = tree.position[order].to(positions.dtype)

    def gdn(self, layer: torch.nn.Module, mixed_qkv: Tensor, b: Tensor, a: Tensor, out: Tensor) -> None:
        """vLLM's GDN core op for one layer, all requests of the step."""
        assert self.plan is not None and self._groups is not None and self.core is not None
        group = self._groups[layer.prefix]
        self.core.forward(layer, self.plan, group, self._conv_dim_first, mixed_qkv, b, a, out)

    def attention(
        self,
        layer: torch.nn.Module,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        kv_cache: Tensor,
        output: Tensor,
    ) -> None:
        """After vLLM's attention for one layer: recompute the tree rows."""
        if self.plan is None or not self.plan.trees:
            return
        assert self._groups is not None
        group = self._groups[layer.layer_name]
        if self._native_attention is not None:
            self._native_attention.rows(self.plan, group, layer.layer_name, query, kv_cache, output)
            return
        tree_attention_rows(
            self.plan, group, self.kernels, query, key, value, kv_cache, output, kv_layout(layer)
        )

    def recomputes_every_row(self) -> bool:
        """True when every scheduled row of the step is a tree row (the attention hook overwrites
        each of them), so vLLM's own attention of the step need not run."""
        plan = self.plan
        return plan is not None and bool(plan.requests) and all(r.is_tree for r in plan.requests)

    def sample(self, runner: object, logits: Tensor) -> tuple[StepSamples, TokenLogprobs | None]:
        """The step's tokens in place of vLLM's samplers (publication included), and their
        logprobs when a request of the batch asked for them (vLLM's k: the batch's largest)."""
        assert self.plan is not None and self.hidden is not None and self._layers is not None
        assert self.core is not None
        outputs = [runner.requests[r.req_id].output_token_ids for r in self.plan.requests]  # type: ignore[attr-defined]
        # the walk runs on the host (its Philox coins are numpy's); on a GPU that copies the rows
        logits = logits.cpu()
        samples = sample_step(self.plan, logits, self.hidden, self.requests, outputs, self._layers, self.core)
        self.failed.update(samples.failed)
        k = runner.input_batch.max_num_logprobs  # type: ignore[attr-defined]
        if k is None:
            return samples, None
        return samples, samples.logprobs(logits, k, runner.model_config.logprobs_mode)  # type: ignore[attr-defined]

    def propose(self) -> list[list[int]]:
        """The next step's drafts per request (input-batch order), physical order; trees kept."""
        runner = self.runner
        assert runner is not None
        drafts: list[list[int]] = []
        batch = runner.input_batch  # type: ignore[attr-defined]
        for req_id in batch.req_ids:
            state = self.requests.get(req_id)
            req = runner.requests[req_id]  # type: ignore[attr-defined]
            if state is None or state.stopped or not state.drafting or not req.output_token_ids:
                drafts.append([])  # failed, finished, no drafts asked for, or mid-prompt
                continue
            # every token but the pending root (the last output) is in the state now
            tree = state.propose(req.output_token_ids[-1], req.num_tokens - 1)
            drafts.append(physical_tokens(tree)[1:])
        return drafts

    def end_step(self) -> None:
        self.plan, self.hidden = None, None


def kv_layout(layer: object) -> str:
    """The paged-KV layout of an attention layer: its CPU ISA, or FlashAttention's on CUDA."""
    return getattr(layer, "isa", None) or "flash"


def vllm_kv_writer() -> Callable[..., None]:
    """vLLM's CPU KV-cache writer with the plugin's probe signature (see paged_kv.check_layout)."""
    from vllm import _custom_ops as ops

    def write(
        key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor, slots: Tensor, isa: str
    ) -> None:
        ops.cpu_attn_reshape_and_cache(
            key, value, key_cache, value_cache, slots, isa, k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto"
        )

    return write


_WORKER: LumoTreeWorker | None = None


def get_worker() -> LumoTreeWorker | None:
    """This process's plugin state (None before activation)."""
    return _WORKER


def install_worker(settings: PluginSettings) -> LumoTreeWorker:
    global _WORKER
    if _WORKER is None:
        _WORKER = LumoTreeWorker(settings)
    return _WORKER
