"""The runner interface: the target model, the active request's state bank, the MTP drafter of the
kernel set, and the one decode cycle every kernel set runs (DESIGN §5).

    cycle(topology, sampler) = verify every tree row -> accept (the walk) -> publish the accepted
                               path -> draft the next proposal (MTP passes over the path's rows)

`ModelRunner` (model_runner.py) runs it on the host with the reference, CPU-fast or native kernels;
`DeviceRunner` (device_runner.py) on the GPU as captured graphs with one synchronisation. The engine
holds a `Runner` and never asks which one it has.

One active sequence: the state bank (GDN recurrent + conv state per linear layer, KV cache per
attention layer) is allocated once with room for max_model_len tokens plus the trees in flight,
and reset between requests.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from lumotree.drafting.mtp import MTPProposal, MTPSource
from lumotree.drafting.suffix import SuffixDrafter
from lumotree.model.model import HybridLM
from lumotree.model.state import GDNState, KVCache
from lumotree.sampling.logits import SamplingParams
from lumotree.tree import TreeTopology


class Sampler(Protocol):
    """A request's acceptance settings as a runner applies them (`Runner.sampler`)."""

    def advance(self, emitted: Sequence[int]) -> None: ...


@dataclass(frozen=True)
class CycleResult:
    """One decode cycle. accepted: logical nodes root..last; emitted: the accepted drafts then the
    chosen token (len(accepted) of them); proposal: the MTP proposal for the next tree (None
    without MTP); spans: seconds of each phase ("target", "dispatch", "drafter") and of the whole
    cycle ("cycle"; device time on the device path); logits_of(rows) -> raw logits [n, V] of tree
    rows, on the host (for logprobs); syncs: device->host synchronisations it made; next_tree: the
    next tree when the runner drafted it itself (the device tree drafter), else None."""

    accepted: list[int]
    emitted: list[int]
    proposal: MTPProposal | None
    spans: dict[str, float] = field(default_factory=dict)
    logits_of: Callable[[list[int]], Tensor] | None = None
    syncs: int = 0
    next_tree: TreeTopology | None = None


#: what the engine does as soon as a cycle's results are in: the next tree, or None
Follow = Callable[[CycleResult], TreeTopology | None]


class Runner(ABC):
    """Tensor work for the engine: `capacity` KV rows of state, `mtp` the kernel set's MTP drafter
    (None: AR), `max_depth` the deepest tree."""

    def __init__(self, model: HybridLM, capacity: int, max_depth: int, mtp: MTPSource | None) -> None:
        self.model, self.capacity, self.max_depth, self.mtp = model, capacity, max_depth, mtp
        self.state = model.new_state(capacity)

    @property
    def length(self) -> int:
        """Tokens materialised in the state (the next position)."""
        return self.state.length

    @property
    def mtp_cache(self) -> KVCache | None:
        """The MTP KV cache the prefix cache saves and restores (None: no MTP)."""
        return None if self.mtp is None else self.mtp.cache

    def reset(self, mtp_committed: int = 0) -> None:
        """Empty state for a new request whose first `mtp_committed` MTP rows come from the prefix
        cache (KV rows past `length` are never read, so they stay)."""
        self.settle()
        for layer in self.state.layers:
            if isinstance(layer, GDNState):
                layer.recurrent.zero_()
                layer.conv.zero_()
        self.state.length = 0
        if self.mtp is not None:
            self.mtp.reset(mtp_committed)

    @torch.inference_mode()
    def prefill(self, tokens: list[int]) -> Tensor:
        """Fold prompt tokens into the state (sequence mode). Returns post-norm hidden [n, H]."""
        ids = torch.tensor(tokens, dtype=torch.long).to(self.model.device)
        return self.model.prefill(ids, self.state)

    def load_drafting(self, prompt: Sequence[int], suffix: SuffixDrafter | None) -> None:
        """A new request's drafting context, for a runner that drafts trees itself: the prompt and
        the suffix drafter's earlier outputs (the host runner has nothing to load)."""
        return None

    def commit_mtp_rows(
        self, hidden: Tensor, next_tokens: Sequence[int], then: Callable[[], None] | None = None
    ) -> None:
        """Prompt rows of the MTP drafter: target rows [n, H] with the token after each; `then()`
        runs once they are written (without MTP: at once). A runner may write them in the
        background (`settle` waits for them)."""
        if self.mtp is not None:
            self.mtp.commit(hidden, next_tokens)
        if then is not None:
            then()

    def settle(self) -> None:
        """Wait for the MTP commits still being written (re-raising their error); a runner that
        writes them in place has none."""
        return None

    def start_decode(self, hidden: Tensor, token: int) -> MTPProposal | None:
        """After prefill: the prompt's last target row [1, H] and the first token; returns the
        first tree's MTP proposal (None without MTP)."""
        self.settle()
        return None if self.mtp is None else self.mtp.propose(hidden, [token])

    @abstractmethod
    def logits(self, hidden: Tensor) -> Tensor:
        """hidden [n, H] -> logits [n, V]."""

    @abstractmethod
    def sampler(
        self, params: SamplingParams, seed: int, prompt: Sequence[int], generated: Sequence[int]
    ) -> Sampler:
        """The acceptance of one request: its settings, seed, prompt and output so far (ending
        with the pending root)."""

    @abstractmethod
    def cycle(
        self,
        topology: TreeTopology,
        sampler: Sampler,
        *,
        chain_next: bool = False,
        follow: Follow | None = None,
    ) -> CycleResult:
        """Verify the tree at the committed length, walk it, publish the accepted path and draft
        the next proposal. `follow(result)` is called once the results are in, before returning:
        the next tree it gives back (None: the request ends) may be started at once, and the next
        call must then pass that tree. chain_next: the request may continue after this cycle, so a
        runner that forms the next tree on the device may start it even before the results are in."""
