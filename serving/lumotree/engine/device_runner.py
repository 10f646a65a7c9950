"""The model runner of the device path: the decode cycle on the GPU with the `triton` kernel set,
fixed shapes, CUDA graphs and one device->host synchronisation per cycle.

One cycle, for a tree of `rows` rows (1 for AR, 1 + k for a chain, 32 for the paper tree):

    tables.load_(tree)        one host->device copy of every descriptor table (static buffers)
    verify                    [graph] int32 casts, the tree forward (fused projections and dense
                              kernels, tree conv, GDN tree WY per layer, tree attention), logits
                              of every row
    accept                    the request's logits processing and the device walk (eager: a few
                              launches; sampling settings vary per request)
    publish                   [graph] replay of all GDN layers in one launch, conv state, KV remap
    draft                     [graph] the next cycle's MTP passes (queued: the accepted path's rows)
                              and the packing of every result into one int64 buffer
    one copy to the host, one synchronisation: accepted nodes, emitted tokens, next MTP proposal

On CUDA the three stages are captured at start-up (`--eager` turns graphs off); on a CPU (tests,
under TRITON_INTERPRET=1) the same stages run eagerly. Phase spans come from CUDA events.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lumotree.drafting.device_mtp import DeviceMTP
from lumotree.drafting.mtp import MTPProposal
from lumotree.model.fused.weights import fuse_projections_
from lumotree.model.model import HybridLM
from lumotree.model.state import GDNState
from lumotree.model.tree_mode import TreeForward, check_capacity, publish_path_, tree_forward
from lumotree.sampling.device_sampler import DeviceSampler
from lumotree.sampling.device_walk import DeviceWalk
from lumotree.sampling.logits import SamplingParams
from lumotree.tree import TreeDescriptor, chain_tree
from lumotree.verify.device_tree import DeviceTree
from lumotree.verify.kernel_sets import triton_kernels

log = logging.getLogger(__name__)
STAGES = ("verify", "publish", "draft")


@dataclass(frozen=True)
class CycleResult:
    """accepted: logical nodes root..last; emitted: the accepted drafts then the chosen token;
    proposal: the next cycle's MTP drafts (None without an MTP drafter); device_seconds: time of
    each phase on the device (target, dispatch, drafter)."""

    accepted: list[int]
    emitted: list[int]
    proposal: MTPProposal | None
    device_seconds: dict[str, float] = field(default_factory=dict)


class DeviceRunner:
    """The target model, its state bank and the fixed-shape device cycle.

    rows: the verification rows of every tree; max_depth: the deepest tree; mtp: (depth, k) of the
    MTP drafter or None (AR); capacity: KV rows of the state bank; graphs: capture the stages
    (CUDA only); draft_ids: the MTP passes' draft vocabulary (None: the whole vocabulary).
    """

    def __init__(
        self,
        model: HybridLM,
        capacity: int,
        rows: int,
        max_depth: int,
        mtp: tuple[int, int] | None,
        graphs: bool,
        draft_ids: Tensor | None = None,
    ) -> None:
        self.model, self.device = model, model.device
        if self.device.type == "cuda":
            # cuDNN attention builds a plan per new shape (~19 ms each on the H200): every prefill
            # chunk has a new one. The memory-efficient backend takes masks without that cost.
            torch.backends.cuda.enable_cudnn_sdp(False)
            if fuse_projections_(model):  # one GEMM per block's input projections (model/fused/)
                torch.cuda.empty_cache()  # hand back the separate weights' blocks (19.6 GB at 27B)
        self.kernels = triton_kernels()
        self.state, self.capacity = model.new_state(capacity), capacity
        self.rows, self.max_depth = rows, max_depth
        self.tables = DeviceTree(rows, max_depth, self.device)
        vocab = model.config.vocab_size
        self.walk = DeviceWalk(rows, vocab, 1, max_depth, rows, self.device, tables=self.tables)
        width = max_depth + 1
        # pass 1 writes all `width` queue rows (valid or not) past the committed MTP rows
        mtp_capacity = capacity + width + (0 if mtp is None else mtp[0])
        self.mtp = (
            None
            if mtp is None
            else DeviceMTP(model, mtp[0], mtp[1], mtp_capacity, width, self.kernels.tree_attention, draft_ids)
        )
        n_out = 2 * width + 1 + (0 if mtp is None else mtp[0] * (1 + mtp[1]))
        cuda = self.device.type == "cuda"
        self._out = torch.zeros(n_out, dtype=torch.int64, device=self.device)
        self._out_host = torch.zeros(n_out, dtype=torch.int64, pin_memory=cuda)
        self._forward: TreeForward | None = None
        self._logits: Tensor | None = None
        self._graphs: dict[str, torch.cuda.CUDAGraph] = {}
        self.syncs = 0  # device->host synchronisations made by cycles
        self.graph_bytes = 0
        if graphs and cuda:
            self.capture()

    # ---- state -----------------------------------------------------------------------------
    @property
    def length(self) -> int:
        """Tokens materialised in the state (the next position)."""
        return self.state.length

    @property
    def graphs(self) -> tuple[str, ...]:
        """Names of the captured stages (empty: eager)."""
        return tuple(self._graphs)

    def reset(self) -> None:
        """Empty state for a new request."""
        for layer in self.state.layers:
            if isinstance(layer, GDNState):
                layer.recurrent.zero_()
                layer.conv.zero_()
        self.state.length = 0
        if self.mtp is not None:
            self.mtp.reset()

    @torch.inference_mode()
    def prefill(self, tokens: list[int]) -> Tensor:
        """Fold prompt tokens into the state (sequence mode, eager). Returns hidden [n, H]."""
        ids = torch.tensor(tokens, dtype=torch.long).to(self.device)
        return self.model.prefill(ids, self.state)

    @torch.inference_mode()
    def logits(self, hidden: Tensor) -> Tensor:
        """hidden [n, H] -> fp32 logits [n, V] (on the device).

        A bfloat16 model's vocabulary projection still writes fp32 logits (bf16 operands, fp32
        accumulation and output): bf16-rounded logits move a probability by up to ~6 % when one
        row's hidden state differs in a last bit between trees of other shapes, which flips
        near-tied sampling races between the AR, chain and tree arms."""
        weight = self.model.lm_head.weight
        if hidden.is_cuda and hidden.dtype == torch.bfloat16 and weight.dtype == torch.bfloat16:
            return torch.mm(hidden, weight.t(), out_dtype=torch.float32)
        return self.model.compute_logits(hidden).float()

    def sampler(
        self, params: SamplingParams, seed: int, prompt: Sequence[int], generated: Sequence[int]
    ) -> DeviceSampler:
        """The acceptance of one request (its logits processing and this runner's walk)."""
        return DeviceSampler(params, seed, prompt, generated, self.model.config.vocab_size, self.walk)

    def row_logits(self, rows: list[int]) -> Tensor:
        """Raw logits of the last cycle's tree rows, on the host (for logprobs; one extra copy)."""
        assert self._logits is not None, "no cycle has run"
        return self._logits[torch.tensor(rows, device=self.device)].cpu()

    # ---- the stages ------------------------------------------------------------------------
    def _verify(self) -> None:
        self.tables.cast_()
        self._forward = tree_forward(self.model, self.state, self.tables, self.kernels)
        self._logits = self.logits(self._forward.hidden)

    def _publish(self) -> None:
        assert self._forward is not None
        r = self.walk.result
        publish_path_(self.state, self._forward, r.accepted[0], r.path_len[:1], self.kernels)

    def _draft(self) -> None:
        assert self._forward is not None
        r = self.walk.result
        parts = [r.accepted[0], r.path_len[:1], r.emitted[0]]
        if self.mtp is not None:
            rows = self._forward.hidden.index_select(0, r.accepted[0].clamp(min=0))
            self.mtp.queue_(rows, r.emitted[0].clamp(min=0), r.path_len[:1])
            self.mtp.propose_()
            parts += [self.mtp.spine, self.mtp.topk.reshape(-1)]
        self._out.copy_(torch.cat(parts))

    def _stage(self, name: str) -> Callable[[], None]:
        return {"verify": self._verify, "publish": self._publish, "draft": self._draft}[name]

    def run_stage(self, name: str) -> None:
        """Launch one stage ("verify", "publish" or "draft"): its graph, or eagerly (benchmarks
        time them one by one; `cycle` runs them in order)."""
        graph = self._graphs.get(name)
        if graph is not None:
            graph.replay()
        else:
            self._stage(name)()

    @property
    def last_logits(self) -> Tensor:
        """fp32 logits [R, V] of the last verify stage (device)."""
        assert self._logits is not None, "no verify stage has run"
        return self._logits

    def copy_results_async(self) -> None:
        """Start the copy of the packed cycle results to the host (pinned; no wait)."""
        self._out_host.copy_(self._out, non_blocking=True)

    @torch.inference_mode()
    def capture(self) -> None:
        """Warm every stage up on a representative tree (compiling the kernels), then capture each
        in a CUDA graph sharing one memory pool. The state is reset afterwards."""
        warm = chain_tree([0] * min(self.rows, self.max_depth + 1), prefix_len=0, rows=self.rows)
        self.tables.load_(warm)
        before = torch.cuda.memory_reserved(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        seeds = torch.zeros(1, dtype=torch.int64, device=self.device)
        with torch.cuda.stream(side):
            for _ in range(2):
                self._verify()
                assert self._logits is not None
                # compile the sampled walk's kernels too (its first request would pay for it)
                self.walk.sample_(torch.softmax(self._logits, -1), seeds, seeds)
                self.walk.greedy_(self._logits)
                self._publish()
                self._draft()
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)
        pool = torch.cuda.graph_pool_handle()
        for name in STAGES:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._stage(name)()
            self._graphs[name] = graph
        torch.cuda.synchronize(self.device)
        self.graph_bytes = torch.cuda.memory_reserved(self.device) - before
        self.reset()
        log.info(
            "captured CUDA graphs %s for %d-row trees (depth <= %d, %s MTP): %.1f MiB",
            "/".join(STAGES), self.rows, self.max_depth,
            "no" if self.mtp is None else f"{self.mtp.depth}-pass", self.graph_bytes / 2**20,
        )  # fmt: skip

    # ---- the cycle -------------------------------------------------------------------------
    @torch.inference_mode()
    def cycle(self, tree: TreeDescriptor, sampler: DeviceSampler) -> CycleResult:
        """Verify `tree`, walk it with `sampler`, publish the accepted path and draft the next
        proposal; one device->host synchronisation."""
        if tree.prefix_len != self.state.length:
            raise ValueError(f"tree prefix_len {tree.prefix_len} != committed length {self.state.length}")
        check_capacity(self.state, tree.rows)
        timer = _StageTimer(self.device)
        self.tables.load_(tree)
        timer.mark()
        self.run_stage("verify")
        timer.mark()
        sampler.accept_(self.last_logits, self.tables)
        self.run_stage("publish")
        timer.mark()
        self.run_stage("draft")
        timer.mark()
        self.copy_results_async()
        timer.wait()
        self.syncs += 1
        out, width = self._out_host.tolist(), self.max_depth + 1
        path_len = out[width]
        accepted, emitted = out[:path_len], out[width + 1 : width + 1 + path_len]
        self.state.length += path_len
        proposal = None
        if self.mtp is not None:
            self.mtp.advance_host(path_len)
            d, k = self.mtp.depth, self.mtp.k
            spine = out[2 * width + 1 : 2 * width + 1 + d]
            flat = out[2 * width + 1 + d :]
            proposal = MTPProposal(spine, [flat[i * k : (i + 1) * k] for i in range(d)])
        target, dispatch, drafter = timer.seconds()
        return CycleResult(
            accepted, emitted, proposal, {"target": target, "dispatch": dispatch, "drafter": drafter}
        )

    @torch.inference_mode()
    def first_proposal(self, queued: int) -> MTPProposal:
        """Run the MTP passes over the `queued` rows queued after prefill and read the proposal
        (one synchronisation, before the first cycle)."""
        assert self.mtp is not None
        self.mtp.propose_()
        self.mtp.advance_host(queued)
        return MTPProposal(self.mtp.spine.tolist(), self.mtp.topk.tolist())


class _StageTimer:
    """Device time between marks: CUDA events on CUDA (read after the one synchronisation),
    host time elsewhere (the CPU runs every stage synchronously)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[torch.cuda.Event | float] = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def wait(self) -> None:
        """The cycle's synchronisation: wait for everything issued so far."""
        if self.cuda:
            done = torch.cuda.Event()
            done.record()
            done.synchronize()

    def seconds(self) -> tuple[float, ...]:
        """Seconds between consecutive marks."""
        pairs = zip(self.marks, self.marks[1:], strict=False)
        if self.cuda:
            return tuple(a.elapsed_time(b) / 1000 for a, b in pairs)  # type: ignore[union-attr]
        return tuple(b - a for a, b in pairs)  # type: ignore[operator]
