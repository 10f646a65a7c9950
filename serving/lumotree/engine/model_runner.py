"""The host runner: the decode cycle with the reference, CPU-fast or native kernels.

    cycle:  descriptor (build_tree of the drafter's topology) -> verify -> walk (logits rows on
            demand) -> publish -> the next MTP proposal (the accepted path's rows)

On a CPU padding rows only cost compute, so trees are built without them (padding is invisible
to every stage by contract, so results are the same). With a `NativeModel` (the cpu-native
kernels) verification, publication, logits rows and the MTP passes run in the model's native C
forward over the same state tensors; prefill stays in the model's PyTorch code.

The MTP drafter's prompt rows are written on a worker thread (`_Background`) while the target
prefills the next chunk and the first token is sampled: the native calls and PyTorch's kernels
release the GIL, so a second core takes them off the time to first token. The worker's passes
touch only the MTP cache and the native forward's scratch; the main thread meanwhile runs the
target's PyTorch prefill and `lt_logits`, which writes only its output. `settle` joins it before
anything reads the MTP cache (the next request's reset) and before the first token is emitted (the
engine: prompt rows are prefill work, kept out of the decode window).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from torch import Tensor

from lumotree.drafting.mtp import MTPDrafter, MTPSource
from lumotree.drafting.native_mtp import NativeMTPDrafter
from lumotree.engine.acceptance import RowSampler, forced_walk, history_counts, support_coins, walk
from lumotree.engine.runner import CycleResult, Follow, Runner
from lumotree.model.model import HybridLM
from lumotree.model.native.coins import philox_coins
from lumotree.model.native.model import NativeModel
from lumotree.model.tree_mode import TreeForward, publish_tree_, verify_tree
from lumotree.sampling.forced import ForcedAcceptance
from lumotree.sampling.logits import SamplingParams
from lumotree.tree import TreeDescriptor, TreeTopology
from lumotree.verify.kernel_sets import TreeKernels


class ModelRunner(Runner):
    """The host cycle. native=(tree rows, MTP rows): verification, publication, logits and MTP passes
    run in the native forward; mtp=(depth, k) of the MTP drafter or None (AR); draft_ids: the MTP
    passes' draft vocabulary (None: the whole vocabulary); draft_dtype: the PyTorch passes'
    projection precision; forced: a forced-acceptance schedule (speed work); background: the prompt's
    MTP rows on a worker thread (`_Background`)."""

    def __init__(
        self,
        model: HybridLM,
        capacity: int,
        max_depth: int,
        kernels: TreeKernels,
        mtp: tuple[int, int] | None,
        native: tuple[int, int] | None = None,
        draft_ids: Tensor | None = None,
        draft_dtype: str = "float32",
        forced: ForcedAcceptance | None = None,
        background: bool = True,
    ) -> None:
        super().__init__(model, capacity, max_depth, None)
        self.kernels, self.forced, self._forced_cycle = kernels, forced, 0
        self.native = NativeModel(model, self.state, *native, draft_ids=draft_ids) if native else None
        self.mtp: MTPSource | None = None
        if mtp is not None:
            depth, k = mtp
            if self.native is not None:
                self.mtp = NativeMTPDrafter(model, depth, k, capacity, self.native)
            else:
                self.mtp = MTPDrafter.for_engine(model, depth, k, capacity, draft_dtype, draft_ids)
        self._background = _Background() if background else None

    def commit_mtp_rows(
        self, hidden: Tensor, next_tokens: Sequence[int], then: Callable[[], None] | None = None
    ) -> None:
        if self.mtp is None or self._background is None:
            super().commit_mtp_rows(hidden, next_tokens, then)
        else:
            self._background.submit(lambda: Runner.commit_mtp_rows(self, hidden, next_tokens, then))

    def settle(self) -> None:
        if self._background is not None:
            self._background.settle()

    @torch.inference_mode()
    def logits(self, hidden: Tensor) -> Tensor:
        if self.native is not None:
            return self.native.logits(hidden)
        return self.model.compute_logits(hidden)

    def sampler(
        self, params: SamplingParams, seed: int, prompt: Sequence[int], generated: Sequence[int]
    ) -> RowSampler:
        prompt_seen = history_counts(prompt, self.model.config.vocab_size) > 0
        coins = support_coins if self.native is None else _native_coins
        return RowSampler(params, prompt_seen, generated, seed, coins)

    @torch.inference_mode()
    def verify(self, tree: TreeDescriptor) -> TreeForward:
        """One target forward over every active tree row (the durable state is only read)."""
        if self.native is not None:
            return TreeForward(tree, self.native.verify(tree), [])
        return verify_tree(self.model, self.state, tree.without_padding(), self.kernels)

    @torch.inference_mode()
    def publish(self, forward: TreeForward, accepted: list[int]) -> None:
        """Publish the accepted path (logical nodes, root first) into the state."""
        if self.native is not None:
            self.native.publish(forward.tree, accepted)  # type: ignore[arg-type]
            return
        path = forward.tree.padded_path(accepted)  # type: ignore[union-attr]
        publish_tree_(self.state, forward, path, len(accepted), self.kernels)

    def cycle(  # type: ignore[override]
        self,
        topology: TreeTopology,
        sampler: RowSampler,
        *,
        chain_next: bool = False,
        follow: Follow | None = None,
    ) -> CycleResult:
        start = time.perf_counter()
        tree = topology.descriptor(prefix_len=self.length, max_depth=self.max_depth)
        built = time.perf_counter()
        forward = self.verify(tree)
        rows = _RowLogits(self, forward)
        verified = time.perf_counter()
        if self.forced is None:
            acc = walk(tree, rows.rows, sampler)
        else:
            acc = forced_walk(
                tree, rows.rows, sampler, self.forced.counts[self._forced_cycle % len(self.forced.counts)]
            )
            self._forced_cycle += 1
        self.publish(forward, acc.accepted)
        published = time.perf_counter()
        proposal = None
        if self.mtp is not None:
            proposal = self.mtp.propose(forward.hidden[acc.accepted], acc.emitted)
        end = time.perf_counter()
        spans = {  # logits rows computed during the walk are target work, not dispatch
            "target": verified - built + rows.seconds,
            "dispatch": published - verified - rows.seconds,
            "drafter": built - start + end - published,
            "cycle": end - start,
        }
        result = CycleResult(acc.accepted, acc.emitted, proposal, spans, rows.rows)
        if follow is not None:  # the host runs cycles one by one: the engine keeps the next tree
            follow(result)
        return result


class _Background:
    """Jobs run one after another on one worker thread (started on first use)."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []

    def submit(self, job: Callable[[], None]) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mtp-commit")
        self._pending.append(self._pool.submit(job))

    def settle(self) -> None:
        """Wait for every submitted job; the first failure is raised after all have ended."""
        pending, self._pending = self._pending, []
        errors = [f.exception() for f in pending]
        for error in errors:
            if error is not None:
                raise error


class _RowLogits:
    """Logits rows of one tree forward, computed when first asked for (the asked rows in one
    matmul: the vocabulary projection is memory-bound at a few rows) and timed: target work."""

    def __init__(self, runner: ModelRunner, forward: TreeForward) -> None:
        self.runner, self.forward = runner, forward
        self.cache: dict[int, Tensor] = {}
        self.seconds = 0.0

    def rows(self, nodes: list[int]) -> Tensor:
        missing = [n for n in nodes if n not in self.cache]
        if missing:
            start = time.perf_counter()
            self.cache.update(zip(missing, self.runner.logits(self.forward.hidden[missing]), strict=True))
            self.seconds += time.perf_counter() - start
        return torch.stack([self.cache[n] for n in nodes])


def _native_coins(seed: int, positions: int | Sequence[int], tokens: Tensor) -> Tensor:
    """`support_coins` in the native forward's code (the same bits, ~15x faster: the sampled
    walk's largest cost on a CPU)."""
    return philox_coins(seed, positions if isinstance(positions, int) else list(positions), tokens)
