"""The tree descriptor's tables on the device, in static buffers, built on the device.

Every Triton stage of a cycle (tree conv, GDN verification, tree attention, the KV writes, the
device walk, publication) reads its per-cycle metadata from device memory, so CUDA graphs captured
once replay for every later tree of the same row count. The host sends a tree as its topology only
(`TreeTopology`: tokens, parents, the node count) through a small pinned "feed" buffer, and one
Triton program (`derive_tables_kernel`) builds every table `build_tree` builds on the host: depth,
position, the spine-first slot map, ancestry, the visibility bits of tree attention, the conv
gather windows, the child tables of the walk, the spine's nodes. In chained mode the same program
takes the tokens of a chain tree from the last cycle's results on the device instead (the root is
the last emitted token, the drafts are the MTP spine), so an AR or chain-MTP cycle needs nothing
from the host at all.

The PyTorch reference is `lumotree.tree.build_tree` with `tree_visibility_bits`; the interpreter
tests compare every table with it on every tree shape.

A `DeviceTree` stands in for the descriptor wherever the `triton` kernel set is called: it has
`tokens`, `position`, `rows` and the tables as device tensors; `prefix_len` is the committed
length, a device counter the cycle advances by the accepted path's length.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl
from torch import Tensor

from lumotree.tree import CONV_WIDTH, PAD_TOKEN, TreeDescriptor, TreeTopology
from lumotree.verify.attention.decode import check_depth
from lumotree.verify.gdn.plan import DEFAULT_PATHS, empty_ancestry_tables


@triton.jit
def derive_tables_kernel(
    feed_ptr,  # [2R + 1] int64: tokens, parents, node count
    emitted_ptr,  # chained mode: the last cycle's emitted tokens [D + 1] and path length [1]
    path_len_ptr,
    spine_ptr,  # chained mode: the MTP spine drafts [>= n - 1]
    tokens_ptr,
    position_ptr,
    depth_ptr,
    slot_ptr,
    bits_ptr,
    conv_ptr,
    child_nodes_ptr,
    child_tokens_ptr,
    ancestry_ptr,
    ancestry32_ptr,
    n_active_ptr,
    n_active32_ptr,
    path_end_ptr,
    path_start_ptr,
    leaf_parent_ptr,
    leaf_walk_ptr,
    spine_nodes_ptr,
    prefix_ptr,
    R: tl.constexpr,
    RP: tl.constexpr,
    W: tl.constexpr,
    MAXD: tl.constexpr,
    CHAINED: tl.constexpr,
    PAD: tl.constexpr,
):
    i = tl.arange(0, RP)
    in_tree = i < R
    n = tl.load(feed_ptr + 2 * R)
    active = i < n
    par = tl.load(feed_ptr + R + i, mask=active & (i > 0), other=-1)
    if CHAINED:
        root = tl.load(emitted_ptr + tl.load(path_len_ptr) - 1)
        drafts = tl.load(spine_ptr + i - 1, mask=active & (i > 0), other=PAD)
        tok = tl.where(i == 0, root, drafts)
    else:
        tok = tl.load(feed_ptr + i, mask=active, other=PAD)
    tok = tl.where(active, tok, PAD)

    # ancestry[a, b]: b is a or one of a's ancestors (padding rows: themselves only)
    a2 = i[:, None]
    b2 = i[None, :]
    anc = a2 == b2
    up = par
    for _ in tl.static_range(MAXD):
        anc = anc | ((b2 == up[:, None]) & (up[:, None] >= 0))
        up = tl.load(feed_ptr + R + up, mask=up > 0, other=-1)
    depth = tl.sum(anc.to(tl.int64), axis=1) - 1

    # the spine: the root, its first (lowest-index) child, that child's first child, ...
    node = tl.zeros([], dtype=tl.int64)
    running = node == 0
    on_spine = i == 0
    tl.store(spine_nodes_ptr, node)
    for d in tl.static_range(1, MAXD + 1):
        child = tl.min(tl.where((par == node) & active, i, RP), axis=0).to(tl.int64)
        running = running & (child < RP)
        node = tl.where(running, child, node)
        on_spine = on_spine | (running & (i == child))
        tl.store(spine_nodes_ptr + d, tl.where(running, node, -1))
    spine_len = tl.sum(on_spine.to(tl.int64), axis=0)
    off_spine = (active & ~on_spine).to(tl.int64)
    slot = tl.where(
        on_spine, depth, tl.where(active, spine_len + tl.cumsum(off_spine, axis=0) - off_spine, i)
    )

    one = tl.full([RP, RP], 1, dtype=tl.int64)
    seen = tl.sum(tl.where(anc, one << slot[None, :], 0), axis=1)
    bits = tl.where(active, seen, 1)  # a padding row sees the root's slot, 0

    tl.store(tokens_ptr + i, tok, mask=in_tree)
    tl.store(depth_ptr + i, depth, mask=in_tree)
    tl.store(position_ptr + i, tl.load(prefix_ptr) + depth, mask=in_tree)
    tl.store(slot_ptr + i, slot, mask=in_tree)
    tl.store(bits_ptr + i, bits, mask=in_tree)
    square = (a2 < R) & (b2 < R)
    tl.store(ancestry_ptr + a2 * R + b2, anc.to(tl.int64), mask=square)
    tl.store(ancestry32_ptr + a2 * R + b2, anc.to(tl.int32), mask=square)
    tl.store(n_active_ptr, n)
    tl.store(n_active32_ptr, n.to(tl.int32))

    # conv windows: tap t holds relative depth d - (W-1) + t; above the root, committed conv-state
    # columns (< W-1), else tree row W-1 + that ancestor; padding rows reuse the root's window
    for t in tl.static_range(W):
        rel = depth - (W - 1) + t
        ancestor = tl.sum(tl.where(anc & (depth[None, :] == rel[:, None]), b2.to(tl.int64), 0), axis=1)
        window = tl.where(rel < 0, W - 1 + rel, W - 1 + ancestor)
        tl.store(conv_ptr + i * W + t, tl.where(active, window, t), mask=in_tree)

    # the first-child decomposition (`first_child_paths`): ends are leaves that are the root or a
    # first child, in ascending order; a path's start is its end's deepest ancestor-or-self that is
    # the root or a later child; a later child that is a leaf hangs off its parent, and each
    # parent's group of them goes, deepest parent first, to the shortest walk through the parent
    # that stays within the longest walk, else to a new walk to the parent (start R)
    elder = (b2 < a2) & (par[None, :] == par[:, None]) & active[None, :]
    rank = tl.sum(elder.to(tl.int64), axis=1)
    later = active & (i > 0) & (rank > 0)
    leaf = active & (tl.sum(((par[None, :] == a2) & active[None, :]).to(tl.int32), axis=1) == 0)
    hanging = tl.where(leaf & later, par, -1)
    end = leaf & ~later
    start = tl.max(tl.where(anc & ((b2 == 0) | later[None, :]), b2, 0), axis=1)
    n_walks = tl.sum(end.to(tl.int32), axis=0)
    at = tl.cumsum(end.to(tl.int32), axis=0) - end.to(tl.int32)
    # walk j (a2's index) of the paths: its end, start and steps
    is_walk = end[None, :] & (at[None, :] == a2)
    walk_end = tl.where(i < n_walks, tl.sum(tl.where(is_walk, b2, 0), axis=1), -1).to(tl.int32)
    walk_start = tl.where(i < n_walks, tl.sum(tl.where(is_walk, start[None, :], 0), axis=1), -1).to(tl.int32)
    walk_steps = tl.sum(tl.where(is_walk, depth[None, :] + 1, 0), axis=1).to(tl.int32)
    longest = tl.max(walk_steps, axis=0)
    group = tl.sum((hanging[None, :] == a2).to(tl.int32), axis=1)  # leaves hanging off each node
    remaining = group > 0
    leaf_walk = tl.full([RP], -1, dtype=tl.int32)
    tl.debug_barrier()  # (reads the ancestry stored above, once: the loop keeps it in registers)
    # passes[j, b]: walk j passes node b (b is its end or one of the end's ancestors)
    walk_row = (i < n_walks)[:, None] & (b2 < R)
    passes = tl.load(ancestry32_ptr + walk_end[:, None] * R + b2, mask=walk_row, other=0) != 0
    for _ in range(tl.sum(remaining.to(tl.int32), axis=0)):
        key = tl.max(tl.where(remaining, depth * RP + (RP - 1 - i), -1), axis=0)
        parent = RP - 1 - key % RP
        count = tl.sum(tl.where(i == parent, group, 0), axis=0)
        through = tl.sum(tl.where((b2 == parent) & passes, 1, 0), axis=1) > 0
        fits = through & (walk_steps + count <= longest)
        choice = tl.min(tl.where(fits, walk_steps * RP + i, RP * RP), axis=0)
        shared = choice < RP * RP
        walk = tl.where(shared, choice % RP, n_walks).to(tl.int32)
        added = (i == walk) & ~shared
        ancestors = tl.sum(tl.where(a2 == parent, anc.to(tl.int32), 0), axis=0) > 0  # of the parent
        passes = passes | (added[:, None] & ancestors[None, :])
        walk_end = tl.where(added, parent, walk_end).to(tl.int32)
        walk_start = tl.where(added, R, walk_start).to(tl.int32)
        steps = tl.where(shared, 0, key // RP + 1) + count
        walk_steps = tl.where(i == walk, walk_steps + steps, walk_steps).to(tl.int32)
        longest = tl.maximum(longest, tl.max(walk_steps, axis=0))
        n_walks += tl.where(shared, 0, 1)
        leaf_walk = tl.where(i == parent, walk, leaf_walk)
        remaining = remaining & (i != parent)
    tl.store(path_end_ptr + i, walk_end, mask=in_tree)
    tl.store(path_start_ptr + i, walk_start, mask=in_tree)
    tl.store(leaf_parent_ptr + i, hanging.to(tl.int32), mask=in_tree)
    tl.store(leaf_walk_ptr + i, leaf_walk, mask=in_tree)

    # child tables: every entry -1, then each node at its rank among its parent's children
    tl.store(child_nodes_ptr + a2 * R + b2, tl.full([RP, RP], -1, dtype=tl.int64), mask=square)
    tl.store(child_tokens_ptr + a2 * R + b2, tl.full([RP, RP], -1, dtype=tl.int64), mask=square)
    tl.debug_barrier()
    child = active & (i > 0)
    tl.store(child_nodes_ptr + par * R + rank, i.to(tl.int64), mask=child)
    tl.store(child_tokens_ptr + par * R + rank, tok, mask=child)


class DeviceTree:
    """Static device tables for trees of exactly `rows` rows and depth <= `max_depth`.

    int64: tokens, position, depth, slot_map [R]; bits [R] (row r sees tree slot j when bit j is
    set, physical order: `tree_visibility_bits`); conv_gather [R, W]; child_nodes, child_tokens
    [R, R] (-1 padded); ancestry [R, R] (1 where column a is the row or one of its ancestors);
    n_active [1]; spine_nodes [max_depth + 1] (the spine's logical nodes by depth, -1 past its
    end); prefix_len [1], the committed length. `gdn` holds the int32 tables of the GDN kernels
    (`AncestryTables`: the ancestry, the active count and the first-child decomposition, launched as
    `paths` path programs a value tile). `feed` [2R + 1] is what `derive_` reads: tokens, parents, node count.
    """

    def __init__(
        self,
        rows: int,
        max_depth: int,
        device: torch.device | str,
        conv_width: int = CONV_WIDTH,
        paths: int = DEFAULT_PATHS,
    ) -> None:
        if rows > 63:
            raise ValueError(f"the visibility bitset holds 63 tree slots, got {rows} rows")
        check_depth(max_depth)
        self.rows, self.max_depth, self.conv_width = rows, max_depth, conv_width
        self.device = torch.device(device)
        r, i64 = rows, dict(dtype=torch.int64, device=self.device)
        self.tokens = torch.zeros(r, **i64)
        self.position = torch.zeros(r, **i64)
        self.depth = torch.zeros(r, **i64)
        self.slot_map = torch.zeros(r, **i64)
        self.bits = torch.zeros(r, **i64)
        self.conv_gather = torch.zeros((r, conv_width), **i64)
        self.child_nodes = torch.full((r, r), -1, **i64)
        self.child_tokens = torch.full((r, r), -1, **i64)
        self.ancestry = torch.zeros((r, r), **i64)
        self.n_active = torch.zeros(1, **i64)
        self.spine_nodes = torch.full((max_depth + 1,), -1, **i64)
        self.prefix_len = torch.zeros(1, **i64)
        self.feed = torch.zeros(2 * r + 1, **i64)
        self.gdn = empty_ancestry_tables(r, max_depth, self.device, paths)

    def check(self, topology: TreeTopology) -> None:
        """ValueError when `topology` does not fit these tables."""
        n = topology.n_active
        if not 1 <= n <= self.rows or max(topology.depths) > self.max_depth:
            raise ValueError(
                f"device tables hold {self.rows} rows of depth <= {self.max_depth}; the tree has {n} "
                f"nodes of depth {max(topology.depths)}"
            )

    def fill_feed(self, feed: np.ndarray, topology: TreeTopology) -> None:
        """Write `topology` into a host feed array [2R + 1] (a numpy view of a pinned buffer)."""
        self.check(topology)
        n, r = topology.n_active, self.rows
        feed[:n] = topology.tokens
        feed[r : r + n] = topology.parents
        feed[2 * r] = n

    def derive_(
        self, chained: tuple[Tensor, Tensor, Tensor] | None = None, pad_token: int = PAD_TOKEN
    ) -> None:
        """Build every table from `feed` (one launch, graph-capturable). chained = (emitted [D+1],
        path_len [1], spine [k]) on the device: the tokens come from there (root = emitted[path_len
        - 1], then the spine) and only the feed's parents and node count are read."""
        emitted, path_len, spine = chained if chained is not None else (self.feed, self.feed, self.feed)
        derive_tables_kernel[(1,)](
            self.feed,
            emitted,
            path_len,
            spine,
            self.tokens,
            self.position,
            self.depth,
            self.slot_map,
            self.bits,
            self.conv_gather,
            self.child_nodes,
            self.child_tokens,
            self.ancestry,
            self.gdn.ancestry,
            self.n_active,
            self.gdn.n_active,
            self.gdn.path_end,
            self.gdn.path_start,
            self.gdn.leaf_parent,
            self.gdn.leaf_walk,
            self.spine_nodes,
            self.prefix_len,
            R=self.rows,
            RP=max(16, triton.next_power_of_2(self.rows)),
            W=self.conv_width,
            MAXD=self.max_depth,
            CHAINED=chained is not None,
            PAD=pad_token,
            num_warps=4,
        )

    def load_(self, tree: TreeDescriptor) -> DeviceTree:
        """Every table of a host descriptor (eager; tests, benchmarks and the vLLM plugin): its
        topology through the feed, its prefix length into `prefix_len`, then `derive_`."""
        if tree.rows != self.rows:
            raise ValueError(f"device tables hold {self.rows} rows; the tree has {tree.rows}")
        n = tree.n_active
        depths = tree.depth[:n].tolist()
        topology = TreeTopology(
            tuple(tree.tokens[:n].tolist()), tuple(tree.parent[:n].tolist()), tuple(depths)
        )
        feed = np.zeros(2 * self.rows + 1, dtype=np.int64)
        self.fill_feed(feed, topology)
        self.feed.copy_(torch.from_numpy(feed))
        self.prefix_len.fill_(tree.prefix_len)
        self.derive_()
        return self
