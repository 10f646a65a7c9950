"""The device runner: the decode cycle on the GPU with the `triton` kernel set, fixed shapes, one
CUDA graph per cycle and one device->host synchronisation per cycle.

One cycle, for trees of `rows` rows (1 for AR, 1 + k for a chain, 32 for the paper tree), all in
one captured graph:

    tables   the descriptor's tables built on the device (`DeviceTree.derive_`): from the host's
             topology in a pinned feed slot (the tree), or from the last cycle's results (AR and
             chain MTP: the root is the last emitted token, the drafts the MTP spine)
    verify   the tree forward (fused projections and dense kernels, tree conv, GDN tree WY per
             layer, tree attention) and fp32 logits of every row
    accept   the request's logits processing and the device walk (`DeviceSampler`; a forced
             schedule replaces the path for speed work)
    publish  replay of all GDN layers in one launch, conv state, KV remap
    draft    the next proposal's MTP passes over the accepted path's rows; the committed length
             and the root's output position advance on the device
    results  accepted nodes, emitted tokens and the proposal packed into a pinned host slot

CUDA events recorded inside the graph time the phases. A graph is captured per (sampler key,
slot), with two slots, so that a cycle can run while the host reads the other's results: when the
next tree is formed on the device, the next cycle is launched before this one's results are read
(`cycle(..., chain_next=True)`), so the device never waits for the host. AR and chain MTP form it
from the last results; the paper tree is drafted on the device too (`DeviceTreeDrafter`: after the
MTP passes, the suffix lookups over the request's tokens and the earlier outputs and the tree's
assembly write the feed the next cycle derives its tables from). With host drafting
(`tree_drafting="host"`) the tree's next cycle starts as soon as the engine has drafted its topology
from this cycle's results (`follow`). The rest of the host's work (events, detokenization in the
server) overlaps with the device. On a CPU (tests, under TRITON_INTERPRET=1) and with `--eager` the
same stages run eagerly in the same order.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial

import torch
from torch import Tensor

from lumotree.drafting.device_mtp import ATTENTION_PARTITIONS, DeviceMTP
from lumotree.drafting.device_tree_drafter import DeviceTreeDrafter, topology_from_feed
from lumotree.drafting.geometry import GeometryConfig
from lumotree.drafting.mtp import MTPProposal
from lumotree.drafting.suffix import SuffixDrafter
from lumotree.engine.runner import CycleResult, Follow, Runner
from lumotree.model.fused.skinny_gemm import skinny_linear
from lumotree.model.fused.weights import fuse_projections_
from lumotree.model.model import HybridLM
from lumotree.model.tree_mode import TreeForward, check_capacity, publish_path_, tree_forward
from lumotree.sampling.device_sampler import DeviceSampler, SamplerKey, sampler_key
from lumotree.sampling.device_walk import DeviceForcing, DeviceWalk
from lumotree.sampling.forced import ForcedAcceptance
from lumotree.sampling.logits import SamplingParams
from lumotree.tree import TreeTopology, chain_topology
from lumotree.verify import device_ops
from lumotree.verify.device_tree import DeviceTree
from lumotree.verify.gdn.plan import DEFAULT_PATHS
from lumotree.verify.kernel_sets import triton_kernels

log = logging.getLogger(__name__)
PHASE_MARKS = ("target", "dispatch", "drafter")  # the spans between consecutive marks
MAX_GRAPH_KEYS = 16  # sampler settings with captured graphs kept (least recently used dropped)


def gdn_paths(chained: bool, tree: tuple[GeometryConfig, SuffixDrafter] | None) -> int:
    """Path programs of the GDN paths scan a layer launches per value tile: one for a chain; for a
    tree the device drafts, the most walks its geometry can need (the spine, one per rescue branch
    and one per MTP depth with runner-up siblings; the paper trees drafted so far share their
    sibling groups among 4, and a program past a tree's walks exits at once); else the default (a
    tree with more walks is verified all the same, a program taking several)."""
    if chained:
        return 1
    if tree is not None:
        geometry = tree[0]
        sibling_walks = geometry.depth_mtp if geometry.siblings_per_depth else 0
        return 1 + len(geometry.rescue_lens) + sibling_walks
    return DEFAULT_PATHS


@dataclass
class _Launch:
    """A cycle on its way: its result slot, the sampler settings it ran with, and the tokens of
    the tree it verifies (None until known: a chained cycle's come with the previous results)."""

    slot: int
    key: SamplerKey
    tokens: tuple[int, ...] | None


class DeviceRunner(Runner):
    """The target model, its state bank, the device MTP drafter and the fixed-shape cycle.

    rows: the verification rows of every tree; max_depth: the deepest tree; mtp: (depth, k) of the
    MTP drafter or None (AR); chained: trees are chains (AR, chain MTP), formed on the device;
    capacity: KV rows of the state bank; graphs: capture the cycle (CUDA only); draft_ids: the MTP
    passes' draft vocabulary (None: the whole vocabulary); forced: a forced-acceptance schedule;
    tree: (geometry, suffix drafter) to draft the paper tree on the device (None: the host sends
    every tree).
    """

    def __init__(
        self,
        model: HybridLM,
        capacity: int,
        rows: int,
        max_depth: int,
        mtp: tuple[int, int] | None,
        chained: bool,
        graphs: bool,
        draft_ids: Tensor | None = None,
        forced: ForcedAcceptance | None = None,
        tree: tuple[GeometryConfig, SuffixDrafter] | None = None,
    ) -> None:
        device = model.device
        self.cuda = device.type == "cuda"
        if self.cuda:
            # cuDNN attention builds a plan per new shape (~19 ms each on the H200): every prefill
            # chunk has a new one. The memory-efficient backend takes masks without that cost.
            torch.backends.cuda.enable_cudnn_sdp(False)
            if fuse_projections_(model):  # one GEMM per block's input projections (model/fused/)
                torch.cuda.empty_cache()  # hand back the separate weights' blocks (19.6 GB at 27B)
        self.kernels = triton_kernels()
        width = max_depth + 1
        device_mtp = None
        if mtp is not None:  # pass 1 writes all `width` queue rows (valid or not) past the committed rows
            mtp_capacity = capacity + width + mtp[0]
            # the drafter's attention spreads its prefix over fixed partitions (no row invariance)
            attention = partial(device_ops.tree_attention, partitions=ATTENTION_PARTITIONS)
            device_mtp = DeviceMTP(model, mtp[0], mtp[1], mtp_capacity, width, attention, draft_ids)
        super().__init__(model, capacity, max_depth, device_mtp)
        self.device_mtp = device_mtp
        self.rows, self.chained = rows, chained
        if chained and rows != 1 + (0 if mtp is None else mtp[0]):
            raise ValueError(f"a chained runner verifies 1 + depth rows, not {rows}")
        self.tree_drafter = None
        if tree is not None:
            if chained or mtp is None:
                raise ValueError("the device tree drafter drafts a tree from MTP proposals, not a chain")
            geometry, suffix = tree
            if geometry.rows != rows:
                raise ValueError(f"the tree geometry has {geometry.rows} rows, the runner {rows}")
            history = capacity + max_depth + 2  # the prompt and the output, with a cycle in flight
            self.tree_drafter = DeviceTreeDrafter(geometry, suffix, mtp[0], mtp[1], history, device)
        self.forms_trees = chained or self.tree_drafter is not None  # the next tree is made on the device
        self.tables = DeviceTree(rows, max_depth, device, paths=gdn_paths(chained, tree))
        vocab = model.config.vocab_size
        self.walk = DeviceWalk(rows, vocab, 1, max_depth, rows, device, tables=self.tables)
        self.forcing = None if forced is None else DeviceForcing(forced, device)
        self.acceptance = DeviceSampler(vocab, self.walk, self.forcing)
        n_out = 2 * width + 1 + (0 if mtp is None else mtp[0] * (1 + mtp[1]))
        n_out += 0 if self.tree_drafter is None else 2 * rows + 2  # the next tree's feed, its merges
        self._out = torch.zeros(n_out, dtype=torch.int64, device=device)
        self._results = [torch.zeros(n_out, dtype=torch.int64, pin_memory=self.cuda) for _ in range(2)]
        self._feeds = [torch.zeros(2 * rows + 1, dtype=torch.int64, pin_memory=self.cuda) for _ in range(2)]
        self._feed_arrays = [feed.numpy() for feed in self._feeds]
        if chained:  # the parents and the node count of a chain never change: written once
            self.tables.fill_feed(self._feed_arrays[0], chain_topology([0] * rows))
            self.tables.feed.copy_(self._feeds[0])
        self._marks: list[list[torch.cuda.Event]] = [
            [torch.cuda.Event(enable_timing=True, external=True) for _ in range(4)] if self.cuda else []
            for _ in range(2)
        ]
        self._host_marks: list[list[float]] = [[], []]
        self._done = [torch.cuda.Event() if self.cuda else None for _ in range(2)]
        self._graphs: dict[tuple[SamplerKey, int], torch.cuda.CUDAGraph] = {}
        self._logits: dict[tuple[SamplerKey, int] | int, Tensor] = {}  # each graph's (or slot's) logits
        self._pool = torch.cuda.graph_pool_handle() if graphs and self.cuda else None
        self._ahead: _Launch | None = None
        self._slot = 0
        self._first_hidden = torch.zeros((1, model.config.hidden_size), dtype=model.dtype, device=device)
        self._first_graph: torch.cuda.CUDAGraph | None = None
        self.graph_bytes = 0
        self.capture_seconds = 0.0
        if self._pool is not None:
            self._warm_up()
            self._baseline = torch.cuda.memory_reserved(device)
            if self.device_mtp is not None:
                self._first_graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self._first_graph, pool=self._pool):
                    self._first_proposal()
            self._capture(sampler_key(self.acceptance.params))

    # ---- state -----------------------------------------------------------------------------
    @property
    def graphs(self) -> tuple[str, ...]:
        """What is captured: ("cycle",) when the cycle runs as graphs, () when eager."""
        return ("cycle",) if self._pool is not None else ()

    def reset(self, mtp_committed: int = 0) -> None:
        self._drop_ahead()
        super().reset(mtp_committed)

    def load_drafting(self, prompt: Sequence[int], suffix: SuffixDrafter | None) -> None:
        if self.tree_drafter is not None and suffix is not None:
            self.tree_drafter.load(prompt, suffix)

    def _drop_ahead(self) -> None:
        """Discard a cycle launched ahead for a request that has ended (its state is discarded too)."""
        if self._ahead is not None:
            self._wait(self._ahead.slot)
            self._ahead = None

    @torch.inference_mode()
    def logits(self, hidden: Tensor) -> Tensor:
        """hidden [n, H] -> fp32 logits [n, V] (on the device).

        A bfloat16 model's vocabulary projection still writes fp32 logits (bf16 operands, fp32
        accumulation and output): bf16-rounded logits move a probability by up to ~6 % when one
        row's hidden state differs in a last bit between trees of other shapes, which flips
        near-tied sampling races between the AR, chain and tree arms (up to 32 rows the projection
        is the skinny GEMM, whose rows do not depend on how many are computed together)."""
        weight = self.model.lm_head.weight
        if hidden.is_cuda and hidden.dtype == torch.bfloat16 and weight.dtype == torch.bfloat16:
            return skinny_linear(hidden, weight, out_dtype=torch.float32)
        return self.model.compute_logits(hidden).float()

    @torch.inference_mode()
    def start_decode(self, hidden: Tensor, token: int) -> MTPProposal | None:
        """Seed the device counters (the committed length, and the 'last cycle' a chained first
        tree reads: the first token emitted by a root-only path), then draft the first proposal
        from the prompt's last row (a captured graph; one synchronisation reads it)."""
        r, mtp = self.walk.result, self.device_mtp
        self.tables.prefix_len.fill_(self.state.length)
        r.emitted[0, 0] = token
        r.path_len.fill_(1)
        if self.tree_drafter is not None:
            self.tree_drafter.push(token)
        if mtp is None or self._first_graph is None:
            return super().start_decode(hidden, token)
        self._first_hidden.copy_(hidden.reshape(self._first_hidden.shape))
        self._first_graph.replay()
        spine, topk = mtp.spine.tolist(), mtp.topk.tolist()
        mtp.advance_host(1)
        return MTPProposal(spine, topk)

    def _first_proposal(self) -> None:
        """The MTP passes after the prompt, as `start_decode` captures them: pass 1 over (the last
        prompt row, the first token), from static buffers."""
        r, mtp = self.walk.result, self.device_mtp
        assert mtp is not None
        mtp.queue_(self._first_hidden, r.emitted[0, :1], r.path_len[:1])
        mtp.propose_()

    def sampler(
        self, params: SamplingParams, seed: int, prompt: Sequence[int], generated: Sequence[int]
    ) -> DeviceSampler:
        self.acceptance.load(params, seed, prompt, generated)
        if self._pool is not None and (self.acceptance.key, 0) not in self._graphs:
            self._capture(self.acceptance.key)
        return self.acceptance

    # ---- the stages --------------------------------------------------------------------------
    def _mark(self, slot: int, index: int) -> None:
        if self.cuda:
            self._marks[slot][index].record()
        else:
            self._host_marks[slot].append(time.perf_counter())

    def _stages(self, slot: int) -> Tensor:
        """Every stage of one cycle in order, reading the feed of `slot` and writing its result
        slot; returns the rows' logits (on CUDA this is what a graph captures)."""
        r, mtp = self.walk.result, self.device_mtp
        self._host_marks[slot] = []
        self._mark(slot, 0)
        if self.chained:
            spine = mtp.spine if mtp is not None else r.emitted[0]
            self.tables.derive_(chained=(r.emitted[0], r.path_len[:1], spine))
        else:  # a drafted tree's feed is written on the device, a host tree's is copied (`_launch`)
            if self.tree_drafter is None:
                self.tables.feed.copy_(self._feeds[slot], non_blocking=True)
            self.tables.derive_()
        # an AR step's root is accepted whatever is sampled: its GDN states advance as it verifies
        forward = tree_forward(self.model, self.state, self.tables, self.kernels, advance_root=self.rows == 1)
        logits = self.logits(forward.hidden)
        self._mark(slot, 1)
        self.acceptance.accept_(logits, self.tables)
        publish_path_(self.state, forward, r.accepted[0], r.path_len[:1], self.kernels)
        self._mark(slot, 2)
        self._draft(forward)
        self._results[slot].copy_(self._out, non_blocking=True)
        self._mark(slot, 3)
        return logits

    def _draft(self, forward: TreeForward) -> None:
        """The next proposal's MTP passes, the committed length, and the packed results."""
        r, mtp = self.walk.result, self.device_mtp
        parts = [r.accepted[0], r.path_len[:1], r.emitted[0]]
        if mtp is not None:
            rows = forward.hidden.index_select(0, r.accepted[0].clamp(min=0))
            mtp.queue_(rows, r.emitted[0].clamp(min=0), r.path_len[:1])
            mtp.propose_()
            parts += [mtp.spine, mtp.topk.reshape(-1)]
        if self.tree_drafter is not None and mtp is not None:  # the next tree, into the feed
            self.tree_drafter.draft_(r.emitted[0], r.path_len[:1], mtp.spine, mtp.topk, self.tables.feed)
            parts += [self.tables.feed, self.tree_drafter.merges]
        self.tables.prefix_len += r.path_len[:1]
        self._out.copy_(torch.cat(parts))

    @torch.inference_mode()
    def run_stages(self) -> None:
        """One cycle's stages eagerly, in a graph's order (profilers count exactly what a graph
        replays); the state advances as after a cycle."""
        self._logits[self._slot] = self._stages(self._slot)

    # ---- graphs ------------------------------------------------------------------------------
    @torch.inference_mode()
    def _warm_up(self) -> None:
        """Run every stage (and the sampled walk's kernels) twice on a representative tree so that
        every kernel is compiled before capture; the state is reset afterwards."""
        warm = chain_topology([0] * min(self.rows, self.max_depth + 1))
        self.tables.fill_feed(self._feed_arrays[0], warm)
        self.tables.fill_feed(self._feed_arrays[1], warm)
        self.tables.feed.copy_(self._feeds[0])
        self.walk.result.path_len.fill_(1)
        self.walk.result.emitted.zero_()
        side = torch.cuda.Stream(self.model.device)
        side.wait_stream(torch.cuda.current_stream(self.model.device))
        seeds = torch.zeros(1, dtype=torch.int64, device=self.model.device)
        with torch.cuda.stream(side):
            for slot in (0, 1):
                logits = self._stages(slot)
                # the sampled walk's kernels too (its first request would pay for them)
                self.walk.sample_(torch.softmax(logits, -1), seeds, seeds)
            if self.device_mtp is not None:
                self._first_proposal()
        torch.cuda.current_stream(self.model.device).wait_stream(side)
        torch.cuda.synchronize(self.model.device)
        self.tables.prefix_len.zero_()
        if self.forcing is not None:
            self.forcing.counter.zero_()
        self.reset()

    @torch.inference_mode()
    def _capture(self, key: SamplerKey) -> None:
        """Capture the cycle for the loaded sampler settings, once per result slot. A new key's
        acceptance kernels are warmed first, with the buffers they write restored afterwards."""
        start = time.perf_counter()
        if self._graphs:
            self._warm_acceptance()
        if len({k for k, _ in self._graphs}) >= MAX_GRAPH_KEYS:
            oldest = next(iter(self._graphs))[0]
            for slot in (0, 1):
                self._graphs.pop((oldest, slot), None)
                self._logits.pop((oldest, slot), None)
        for slot in (0, 1):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                self._logits[(key, slot)] = self._stages(slot)
            self._graphs[(key, slot)] = graph
        torch.cuda.synchronize(self.model.device)
        # what the graphs hold: the reserved memory beyond what the runner held before any capture
        self.graph_bytes = max(0, torch.cuda.memory_reserved(self.model.device) - self._baseline)
        self.capture_seconds += time.perf_counter() - start
        log.info(
            "captured the %d-row cycle (depth <= %d, %s MTP%s) for sampler %s in %.0f ms: pool %.1f MiB",
            self.rows, self.max_depth, "no" if self.device_mtp is None else f"{self.device_mtp.depth}-pass",
            ", forced acceptance" if self.forcing is not None else "", key,
            (time.perf_counter() - start) * 1e3, self.graph_bytes / 2**20,
        )  # fmt: skip

    def _warm_acceptance(self) -> None:
        """Compile the loaded settings' acceptance kernels without changing what a request reads."""
        live = self.acceptance.mutable() + self.walk.result.tensors()
        if self.forcing is not None:
            live.append(self.forcing.counter)
        kept = [t.clone() for t in live]
        logits = torch.zeros((self.rows, self.model.config.vocab_size), device=self.model.device)
        self.acceptance.accept_(logits, self.tables)
        for tensor, saved in zip(live, kept, strict=True):
            tensor.copy_(saved)
        torch.cuda.synchronize(self.model.device)

    # ---- the cycle ---------------------------------------------------------------------------
    def _launch(self, topology: TreeTopology | None) -> _Launch:
        """Start one cycle (asynchronous on CUDA): the host's topology into the next feed slot
        (None: a chained cycle whose tree the device forms), then the graph or the eager stages."""
        slot, self._slot = self._slot, self._slot ^ 1
        if topology is not None and not self.chained:
            self.tables.fill_feed(self._feed_arrays[slot], topology)
            if self.tree_drafter is not None:  # the graph reads the device feed: the host's tree goes there
                self.tables.feed.copy_(self._feeds[slot], non_blocking=True)
        key = self.acceptance.key
        graph = self._graphs.get((key, slot))
        if graph is not None:
            graph.replay()
        else:
            self._logits[slot] = self._stages(slot)
        done = self._done[slot]
        if done is not None:
            done.record()
        return _Launch(slot, key, None if topology is None else topology.tokens)

    def _wait(self, slot: int) -> None:
        done = self._done[slot]
        if done is not None:
            done.synchronize()

    def _collect(self, launch: _Launch) -> CycleResult:
        """Wait for a launched cycle (the one synchronisation) and read its results: accepted
        nodes, emitted tokens, the next proposal and, when drafted on the device, the next tree."""
        self._wait(launch.slot)
        out, width = self._results[launch.slot].tolist(), self.max_depth + 1
        path_len = out[width]
        accepted, emitted = out[:path_len], out[width + 1 : width + 1 + path_len]
        self.state.length += path_len
        proposal, next_tree, at = None, None, 2 * width + 1
        if self.device_mtp is not None:
            self.device_mtp.advance_host(path_len)
            d, k = self.device_mtp.depth, self.device_mtp.k
            flat = out[at + d : at + d + d * k]
            proposal = MTPProposal(out[at : at + d], [flat[i * k : (i + 1) * k] for i in range(d)])
            at += d + d * k
        if self.tree_drafter is not None:
            feed = 2 * self.rows + 1
            next_tree = topology_from_feed(out[at : at + feed], self.rows, out[at + feed])
        return CycleResult(accepted, emitted, proposal, next_tree=next_tree)

    def _result(self, launch: _Launch, collected: CycleResult) -> CycleResult:
        """The cycle's result with its phase times (read once the next cycle is on its way)."""
        slot = launch.slot
        if self.cuda:
            seconds = [a.elapsed_time(b) / 1e3 for a, b in itertools.pairwise(self._marks[slot])]
        else:
            seconds = [b - a for a, b in itertools.pairwise(self._host_marks[slot])]
        spans = dict(zip(PHASE_MARKS, seconds, strict=True)) | {"cycle": sum(seconds)}
        logits = self._logits[(launch.key, slot) if (launch.key, slot) in self._graphs else slot]

        def logits_of(rows: list[int]) -> Tensor:  # the raw logits of tree rows, on the host
            return logits[torch.tensor(rows, device=logits.device)].cpu()

        return replace(collected, spans=spans, logits_of=logits_of, syncs=1)

    @torch.inference_mode()
    def cycle(  # type: ignore[override]
        self,
        topology: TreeTopology,
        sampler: DeviceSampler,
        *,
        chain_next: bool = False,
        follow: Follow | None = None,
    ) -> CycleResult:
        if sampler is not self.acceptance:
            raise ValueError("the device cycle takes the sampler this runner made (`sampler()`)")
        self.tables.check(topology)
        launch, self._ahead = self._ahead, None
        if launch is not None:
            if launch.tokens != topology.tokens or launch.key != sampler.key:
                self._wait(launch.slot)
                raise RuntimeError(
                    f"the cycle started ahead verifies {launch.tokens}, the engine drafted {topology.tokens}"
                )
        else:
            check_capacity(self.state, self.rows)
            launch = self._launch(topology)
        room = self.state.length + self.max_depth + 1 + self.rows <= self.capacity
        # the next tree is formed on the device: start it before this cycle's results are in
        ahead = self._launch(None) if chain_next and self.forms_trees and room else None
        collected = self._collect(launch)
        following = None if follow is None else follow(collected)
        if ahead is not None:  # its tree: the device's drafted tree, or the last token and the spine
            if collected.next_tree is not None:
                ahead.tokens = collected.next_tree.tokens
            else:
                spine = () if collected.proposal is None else collected.proposal.spine
                ahead.tokens = (collected.emitted[-1], *spine)
            self._ahead = ahead
        elif following is not None and self.state.length + self.rows <= self.capacity:
            self._ahead = self._launch(following)  # the host's next tree, before the results are emitted
        return self._result(launch, collected)
