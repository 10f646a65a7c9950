"""The engine's drafters: AR (the root alone), chain MTP-k, and the LumoTree tree (MTP spine and
siblings + suffix tail and rescue branches, assembled by the core's `build_paper_tree`).

All three answer `propose(root, prefix_len) -> TreeDescriptor`, so AR, chain and tree arms run the
same verification, walk and publication code. Drafters learn what happened through `rows()` (true
target hidden rows with the tokens that follow them: the MTP head's inputs) and `emitted()` (tokens
of the request, for the suffix index).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from lumotree.drafting.draft_vocab import subset_head
from lumotree.drafting.geometry import GeometryConfig, RescueBranch, build_paper_tree
from lumotree.drafting.mtp import MTPDrafter, MTPProposal
from lumotree.drafting.native_mtp import NativeMTPDrafter
from lumotree.drafting.selection_fast import ordered_topk_fast
from lumotree.drafting.suffix import OutputCache, SuffixDrafter
from lumotree.engine.config import EngineConfig
from lumotree.model.model import HybridLM
from lumotree.model.mtp import mtp_chain_step
from lumotree.model.native.model import NativeModel
from lumotree.model.state import KVCache
from lumotree.tree import TreeBuilder, TreeDescriptor, chain_tree, root_tree

if TYPE_CHECKING:  # the device path needs Triton, which CPU-only installs may lack
    from lumotree.engine.device_runner import DeviceRunner


class ARDrafter:
    """No drafts: every cycle verifies the pending root alone (one decode step)."""

    kind = "ar"

    def __init__(self, geometry: GeometryConfig) -> None:
        self.geometry = geometry

    @property
    def max_depth(self) -> int:
        """Deepest draft this drafter can propose (the length of accepted_per_pos)."""
        return 0

    @property
    def mtp_cache(self) -> KVCache | None:
        """The MTP KV cache the prefix cache saves and restores (None: no MTP)."""
        return None

    def begin(self, prompt: Sequence[int], cached: int) -> None:
        """A new request whose first `cached` prompt tokens come from the prefix cache."""

    def rows(self, hidden: Tensor, next_tokens: Sequence[int], commit: bool) -> None:
        """True target rows: hidden [n, H] of materialised tokens and the token after each.
        commit=True processes them now (prefill), else with the next proposal."""

    def emitted(self, tokens: Sequence[int]) -> None:
        """Tokens the request emitted (kept ones only)."""

    def propose(self, root: int, prefix_len: int) -> TreeDescriptor:
        return root_tree(root, prefix_len=prefix_len)

    def receive(self, proposal: MTPProposal | None) -> None:
        """The MTP proposal a device cycle drafted for the next cycle (device path only)."""

    def finish(self) -> None:
        """The request ended."""


class ChainDrafter(ARDrafter):
    """Chain MTP-k: the MTP spine of depth k, no siblings, no suffix."""

    kind = "mtp"

    def __init__(
        self,
        geometry: GeometryConfig,
        model: HybridLM,
        capacity: int,
        draft_head: Callable[[Tensor], Tensor] | None = None,
        native: NativeModel | None = None,
    ) -> None:
        super().__init__(geometry)
        depth, k = geometry.depth_mtp, 1 + geometry.siblings_per_depth
        self.mtp = (
            NativeMTPDrafter(model, depth, k, capacity, native)
            if native is not None
            else MTPDrafter(
                model,
                depth,
                k,
                capacity,
                select_topk=ordered_topk_fast,
                step=partial(mtp_chain_step, model, lm_head=draft_head),
            )
        )

    @property
    def max_depth(self) -> int:
        return self.geometry.depth_mtp

    @property
    def mtp_cache(self) -> KVCache | None:
        cache = self.mtp.state.layers[0]
        assert isinstance(cache, KVCache)
        return cache

    def begin(self, prompt: Sequence[int], cached: int) -> None:
        # MTP row t needs token t+1: a cached prefix of B tokens holds MTP rows 0..B-2
        self.mtp.reset(max(cached - 1, 0))

    def rows(self, hidden: Tensor, next_tokens: Sequence[int], commit: bool) -> None:
        if commit:
            self.mtp.commit(hidden, next_tokens)
        else:
            self.mtp.queue(hidden, next_tokens)

    def propose(self, root: int, prefix_len: int) -> TreeDescriptor:
        return chain_tree([root, *self.mtp.propose().spine], prefix_len=prefix_len)


class TreeDrafter(ChainDrafter):
    """The paper geometry: MTP spine + ordered siblings, suffix principal tail, rescue branches."""

    kind = "tree"

    def __init__(
        self,
        geometry: GeometryConfig,
        model: HybridLM,
        capacity: int,
        suffix: SuffixDrafter,
        draft_head: Callable[[Tensor], Tensor] | None = None,
        native: NativeModel | None = None,
    ) -> None:
        super().__init__(geometry, model, capacity, draft_head, native)
        self.suffix = suffix

    @property
    def max_depth(self) -> int:
        return self.geometry.max_depth

    def begin(self, prompt: Sequence[int], cached: int) -> None:
        super().begin(prompt, cached)
        self.suffix.begin(prompt)

    def emitted(self, tokens: Sequence[int]) -> None:
        self.suffix.extend(tokens)

    def finish(self) -> None:
        self.suffix.finish()

    def propose(self, root: int, prefix_len: int) -> TreeDescriptor:
        return paper_tree(self.suffix, self.geometry, root, prefix_len, self.mtp.propose())


def paper_tree(
    suffix: SuffixDrafter, geo: GeometryConfig, root: int, prefix_len: int, proposal: MTPProposal
) -> TreeDescriptor:
    """The paper tree below `root`: the MTP proposal's spine and siblings, the suffix drafter's
    principal tail after the spine, and its rescue branches."""
    tails = suffix.continuations(proposal.spine, geo.tail_len, 1)
    tail = tails[0].continuation if tails else ()
    rescues = rescue_branches(suffix, geo, proposal.spine, proposal.topk, tail)
    return build_paper_tree(
        root, proposal.spine, proposal.topk, tail, rescues, prefix_len=prefix_len, config=geo
    )


def rescue_branches(
    suffix: SuffixDrafter,
    geo: GeometryConfig,
    spine: Sequence[int],
    topk: Sequence[Sequence[int]],
    tail: Sequence[int],
) -> list[RescueBranch]:
    """Rescue branches: the best suffix continuations of the root that leave the tree (spine, tail
    and siblings), each hung below the node where it leaves, the i-th cut to geo.rescue_lens[i]."""
    if not geo.rescue_lens:
        return []
    # Mirror build_paper_tree's spine, tail and siblings (same order and budget) to find where
    # each continuation leaves the tree.
    mirror = TreeBuilder(0, max_nodes=geo.rows, max_depth=geo.max_depth)
    node: int | None = 0
    for token in [*spine[: geo.depth_mtp], *tail[: geo.tail_len]]:
        node = mirror.add(node, token) if node is not None else None
    for d, (token, ranked) in enumerate(zip(spine[: geo.depth_mtp], topk, strict=False)):
        at_depth = mirror.find(spine[:d])
        if at_depth is not None:
            for t in [t for t in ranked if t != token][: geo.siblings_per_depth]:
                mirror.add(at_depth, t)
    out: list[RescueBranch] = []
    for match in suffix.continuations((), geo.max_depth, 2 * len(geo.rescue_lens)):
        cont = match.continuation
        at = 0
        while at < len(cont) and mirror.find(cont[: at + 1]) is not None:
            at += 1
        branch = cont[at : at + geo.rescue_lens[len(out)]]
        if not branch:
            continue
        out.append(RescueBranch(tuple(cont[:at]), tuple(branch)))
        anchor = mirror.find(cont[:at])
        assert anchor is not None  # every prefix up to `at` was found above
        mirror.extend(anchor, branch)
        if len(out) == len(geo.rescue_lens):
            break
    return out


def draft_head(model: HybridLM, dtype: str, draft_ids: Tensor | None) -> Callable[[Tensor], Tensor] | None:
    """The vocabulary projection of MTP drafting passes (None: the model's own): a bfloat16 copy of
    its weight, and/or its draft-vocabulary rows with -inf logits elsewhere (`subset_head`).

    Each MTP pass streams the whole projection (8 MB in fp32 for lumo-tiny-coder); on a CPU that is
    memory-bound, and half the bytes make the pass faster. Drafts only propose: verification uses
    the fp32 target, so outputs keep their distribution (a near-tie may pick another draft).
    """
    weight = model.lm_head.weight.detach()
    half = torch.bfloat16 if dtype == "bfloat16" else None
    if draft_ids is not None:
        return subset_head(weight, draft_ids, half)
    if half is None:
        return None
    copy = weight.to(half)
    return lambda h: F.linear(h.to(half), copy).float()


class DeviceChainDrafter(ARDrafter):
    """Chain MTP-k on the device path: the MTP passes run inside the device cycle (`DeviceRunner`),
    whose synchronisation brings the next proposal back (`receive`); only the first proposal of a
    request is fetched on its own, right after prefill."""

    kind = "mtp"

    def __init__(self, geometry: GeometryConfig, runner: DeviceRunner) -> None:
        super().__init__(geometry)
        if runner.mtp is None:
            raise ValueError("the device runner was built without an MTP drafter")
        self.runner, self.mtp = runner, runner.mtp
        self.proposal: MTPProposal | None = None
        self._queued = 0

    @property
    def max_depth(self) -> int:
        return self.geometry.depth_mtp

    @property
    def mtp_cache(self) -> KVCache | None:
        return self.mtp.cache

    def begin(self, prompt: Sequence[int], cached: int) -> None:
        self.mtp.reset(max(cached - 1, 0))  # MTP row t needs token t+1 (see ChainDrafter)
        self.proposal = None

    def rows(self, hidden: Tensor, next_tokens: Sequence[int], commit: bool) -> None:
        tokens = torch.tensor(list(next_tokens), dtype=torch.long).to(hidden.device)
        if commit:
            if len(next_tokens):
                self.mtp.commit_(hidden, tokens)
            return
        count = torch.tensor([len(next_tokens)], dtype=torch.long).to(hidden.device)
        self.mtp.queue_(hidden, tokens, count)
        self._queued, self.proposal = len(next_tokens), None

    def receive(self, proposal: MTPProposal | None) -> None:
        self.proposal = proposal

    def next_proposal(self) -> MTPProposal:
        if self.proposal is None:
            self.proposal = self.runner.first_proposal(self._queued)
        return self.proposal

    def propose(self, root: int, prefix_len: int) -> TreeDescriptor:
        spine = self.next_proposal().spine
        return chain_tree([root, *spine], prefix_len=prefix_len, rows=self.geometry.rows)


class DeviceTreeDrafter(DeviceChainDrafter):
    """The paper tree on the device path: device MTP proposals, host suffix drafter, padded rows."""

    kind = "tree"

    def __init__(self, geometry: GeometryConfig, runner: DeviceRunner, suffix: SuffixDrafter) -> None:
        super().__init__(geometry, runner)
        self.suffix = suffix

    @property
    def max_depth(self) -> int:
        return self.geometry.max_depth

    def begin(self, prompt: Sequence[int], cached: int) -> None:
        super().begin(prompt, cached)
        self.suffix.begin(prompt)

    def emitted(self, tokens: Sequence[int]) -> None:
        self.suffix.extend(tokens)

    def finish(self) -> None:
        self.suffix.finish()

    def propose(self, root: int, prefix_len: int) -> TreeDescriptor:
        return paper_tree(self.suffix, self.geometry, root, prefix_len, self.next_proposal())


def make_drafter(
    config: EngineConfig,
    model: HybridLM,
    capacity: int,
    runner: DeviceRunner | None = None,
    native: NativeModel | None = None,
    outputs: OutputCache | None = None,
    draft_ids: Tensor | None = None,
) -> ARDrafter:
    """The drafter of config.drafter, with the geometry of config.geometry(); on the device path
    (`runner` given) the MTP passes are the runner's, with `native` (the cpu-native kernels) the
    native forward's; a tree drafter's suffix lookups use `outputs` as their cache of earlier
    outputs (default: its own); draft_ids: the PyTorch MTP passes' draft vocabulary (the device
    runner and the native forward hold their own)."""
    geometry = config.geometry()
    suffix = SuffixDrafter(
        min_match=config.suffix_min_match, cache_tokens=config.suffix_cache_tokens, cache=outputs
    )
    if config.drafter == "ar":
        return ARDrafter(geometry)
    if runner is not None:
        if config.drafter == "mtp":
            return DeviceChainDrafter(geometry, runner)
        return DeviceTreeDrafter(geometry, runner, suffix)
    head = draft_head(model, config.draft_head_dtype, draft_ids) if native is None else None
    if config.drafter == "mtp":
        return ChainDrafter(geometry, model, capacity, head, native)
    return TreeDrafter(geometry, model, capacity, suffix, head, native)
