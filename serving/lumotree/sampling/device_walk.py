"""The acceptance walk on the device (Triton), beside `walk.py`, with fixed-shape outputs.

Every row's choice is computed in parallel first (greedy: lowest-index argmax of the row's logits;
sampling: the exponential race with Philox coins keyed by (seed, output position, token), one race per
(walk, row)), then one program per walk descends the tree: at node u take u's choice x; if a child
of u carries x, descend, else stop. Nothing goes to the host: accepted [W, D+1], path_len [W],
emitted [W, D+1] and final_row [W] are written into caller-owned buffers, ready for publication.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from lumotree.drafting.fused_selection import rank_rows_, selection_scratch
from lumotree.sampling.forced import ForcedAcceptance
from lumotree.sampling.walk import WalkResult
from lumotree.tree import TreeDescriptor
from lumotree.verify.device_tree import DeviceTree


@triton.jit
def tree_walk_kernel(
    choice_ptr,
    child_nodes_ptr,
    child_tokens_ptr,
    accepted_ptr,
    path_len_ptr,
    emitted_ptr,
    final_ptr,
    R,
    CMAX,
    CHOICE_WALK_STRIDE,
    WIDTH: tl.constexpr,
    CP: tl.constexpr,
):
    w = tl.program_id(0)
    c = tl.arange(0, CP)
    node = tl.zeros([], dtype=tl.int64)
    length = tl.full([], 1, dtype=tl.int64)
    running = node == 0
    tl.store(accepted_ptr + w * WIDTH, node)
    for d in tl.static_range(WIDTH):
        x = tl.load(choice_ptr + w * CHOICE_WALK_STRIDE + node)
        tl.store(emitted_ptr + w * WIDTH + d, tl.where(running, x, -1))
        nodes = tl.load(child_nodes_ptr + node * CMAX + c, mask=c < CMAX, other=-1)
        tokens = tl.load(child_tokens_ptr + node * CMAX + c, mask=c < CMAX, other=-1)
        match = (tokens == x) & (nodes >= 0)
        first = tl.min(tl.where(match, c, CP), axis=0)
        hit = running & (first < CP)
        child = tl.sum(tl.where(c == first, nodes, 0), axis=0)
        if d + 1 < WIDTH:
            tl.store(accepted_ptr + w * WIDTH + d + 1, tl.where(hit, child, -1))
        length += hit.to(tl.int64)
        node = tl.where(hit, child, node)
        running = hit
    tl.store(path_len_ptr + w, length)
    tl.store(final_ptr + w, node)


class DeviceWalk:
    """Fixed-shape walk buffers for trees of `rows` rows over a `vocab`-token vocabulary.

    Call `load_tree_` once per cycle (copies the child tables into the static buffers), then
    `greedy_` or `sample_`; results sit in `result` (same fields as `WalkResult`). Given `tables`
    (a `DeviceTree` with the same rows), the walk reads its child tables and depths instead and
    `load_tree_` is not needed: `DeviceTree.load_` already put them on the device.
    """

    def __init__(
        self,
        rows: int,
        vocab: int,
        walks: int,
        max_depth: int,
        child_cap: int,
        device: torch.device,
        tables: DeviceTree | None = None,
    ):
        width = max_depth + 1
        i64 = dict(dtype=torch.int64, device=device)
        self.rows, self.walks, self.width, self.child_cap = rows, walks, width, child_cap
        if tables is None:
            self.child_nodes = torch.full((rows, child_cap), -1, **i64)
            self.child_tokens = torch.full((rows, child_cap), -1, **i64)
            self.depth = torch.zeros(rows, **i64)
        else:
            if tables.rows != rows or tables.child_nodes.shape[1] != child_cap:
                raise ValueError(f"tables hold {tables.rows} rows; the walk was asked for {rows}")
            self.child_nodes, self.child_tokens, self.depth = (
                tables.child_nodes,
                tables.child_tokens,
                tables.depth,
            )
        self.choice = torch.empty(walks * rows, **i64)
        self._topk = torch.empty((walks * rows, 1), **i64)
        self._scratch = selection_scratch(walks * rows, vocab, 1, device)
        self.result = WalkResult(
            accepted=torch.empty((walks, width), **i64),
            path_len=torch.empty(walks, **i64),
            emitted=torch.empty((walks, width), **i64),
            final_row=torch.empty(walks, **i64),
        )

    def load_tree_(self, tree: TreeDescriptor) -> None:
        """Copy the tree's child tables (padded to the buffers' capacity)."""
        if tree.rows != self.rows or tree.max_depth + 1 != self.width:
            raise ValueError(
                f"tree has {tree.rows} rows / depth {tree.max_depth}; buffers were made for "
                f"{self.rows} / {self.width - 1}"
            )
        cmax = tree.child_nodes.shape[1]
        if cmax > self.child_cap:
            raise ValueError(f"a node has {cmax} children; the buffers hold {self.child_cap}")
        self.child_nodes.fill_(-1)
        self.child_tokens.fill_(-1)
        self.child_nodes[:, :cmax].copy_(tree.child_nodes)
        self.child_tokens[:, :cmax].copy_(tree.child_tokens)
        self.depth.copy_(tree.depth)

    def _walk(self, choice_walk_stride: int) -> None:
        r = self.result
        tree_walk_kernel[(self.walks,)](
            self.choice,
            self.child_nodes,
            self.child_tokens,
            r.accepted,
            r.path_len,
            r.emitted,
            r.final_row,
            self.rows,
            self.child_cap,
            choice_walk_stride,
            WIDTH=self.width,
            CP=triton.next_power_of_2(self.child_cap),
            num_warps=1,
        )

    def greedy_(self, logits: Tensor) -> None:
        """Greedy walk (every walk identical) over penalised logits [R, V]."""
        rank_rows_(logits, self.choice[: self.rows], self._topk[: self.rows], self._scratch)
        self._walk(0)

    def sample_(self, probs: Tensor, seeds: Tensor, root_position: Tensor) -> None:
        """Target-only sampling walks: probs [R, V] fp32, seeds [W] int64, root_position [1] int64
        (device): the output index the root row samples."""
        rank_rows_(
            probs,
            self.choice,
            self._topk,
            self._scratch,
            race=(seeds, root_position, self.depth),
            rows=self.walks * self.rows,
        )
        self._walk(self.rows)


@triton.jit
def force_path_kernel(
    schedule_ptr,
    n_schedule,
    counter_ptr,
    spine_nodes_ptr,
    tokens_ptr,
    choice_ptr,
    accepted_ptr,
    path_len_ptr,
    emitted_ptr,
    final_ptr,
    WIDTH: tl.constexpr,
    WP: tl.constexpr,
):
    d = tl.arange(0, WP)
    cycle = tl.load(counter_ptr)
    want = tl.load(schedule_ptr + cycle % n_schedule)
    nodes = tl.load(spine_nodes_ptr + d, mask=d < WIDTH, other=-1)
    have = tl.sum((nodes >= 0).to(tl.int64), axis=0) - 1
    count = tl.minimum(want, have)
    last = tl.sum(tl.where(d == count, nodes, 0), axis=0)
    following = tl.load(spine_nodes_ptr + d + 1, mask=(d + 1 < WIDTH) & (d < count), other=0)
    drafted = tl.load(tokens_ptr + following, mask=d < count, other=-1)
    chosen = tl.load(choice_ptr + last)
    tl.store(accepted_ptr + d, tl.where(d <= count, nodes, -1), mask=d < WIDTH)
    tl.store(emitted_ptr + d, tl.where(d < count, drafted, tl.where(d == count, chosen, -1)), mask=d < WIDTH)
    tl.store(path_len_ptr, count + 1)
    tl.store(final_ptr, last)
    tl.store(counter_ptr, cycle + 1)


class DeviceForcing:
    """A forced-acceptance schedule (`forced.py`) on the device and a cycle counter: `force_`
    rewrites the walk's one path (its host reference: `forced.forced_path`)."""

    def __init__(self, forced: ForcedAcceptance, device: torch.device) -> None:
        self.forced = forced
        self.schedule = torch.tensor(forced.counts, dtype=torch.int64, device=device)
        self.counter = torch.zeros(1, dtype=torch.int64, device=device)

    def force_(
        self, spine_nodes: Tensor, tokens: Tensor, choice: Tensor, accepted: Tensor, path_len: Tensor,
        emitted: Tensor, final_row: Tensor,
    ) -> None:  # fmt: skip
        """spine_nodes [D+1] (-1 past the spine), tokens [R], choice [R] (the walk's choices) ->
        accepted [D+1], path_len [1], emitted [D+1], final_row [1] (graph-capturable)."""
        width = accepted.shape[-1]
        force_path_kernel[(1,)](
            self.schedule, self.schedule.numel(), self.counter, spine_nodes, tokens, choice, accepted,
            path_len, emitted, final_row, WIDTH=width, WP=triton.next_power_of_2(width), num_warps=1,
        )  # fmt: skip


def _clone(result: WalkResult) -> WalkResult:
    return WalkResult(
        *(t.clone() for t in (result.accepted, result.path_len, result.emitted, result.final_row))
    )


def greedy_walk(logits: Tensor, tree: TreeDescriptor) -> WalkResult:
    """The reference's signature: greedy walk over penalised logits [R, V]; one walk."""
    walk = DeviceWalk(
        tree.rows, logits.shape[-1], 1, tree.max_depth, tree.child_nodes.shape[1], logits.device
    )
    walk.load_tree_(tree)
    walk.greedy_(logits.contiguous())
    return _clone(walk.result)


def sample_walk(probs: Tensor, tree: TreeDescriptor, seeds: Tensor, position: int) -> WalkResult:
    """The reference's signature (coins are always the Philox coins): probs [R, V] fp32, seeds [W]."""
    device = probs.device
    walks = int(seeds.shape[0])
    walk = DeviceWalk(tree.rows, probs.shape[-1], walks, tree.max_depth, tree.child_nodes.shape[1], device)
    walk.load_tree_(tree)
    walk.sample_(
        probs.contiguous(), seeds.to(device), torch.tensor([position], dtype=torch.int64, device=device)
    )
    return _clone(walk.result)
