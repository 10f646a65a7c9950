"""Device tables that drive the Triton GDN kernels, built from a `TreeDescriptor`.

`ScanTables` drive the path scan (`scan.py`). The descriptor's `PathPlan` says which nodes each path
visits; the kernel needs the same facts as flat int32 tables it can index without host help. Three
schedules share one kernel:

- "cut" (the LumoTree design): launch 1 runs path 0 (the spine) from the durable state and exports
  the cut states; launch 2 runs the branch paths from them.
- "recompute": one launch; every branch path re-runs its spine prefix from the durable state
  (without writing outputs for it) instead of reading a cut state.
- "store_all" (the per-node "native paths" baseline): the "cut" schedule, but every node writes
  its full post-update state into a bank indexed by node, and branch paths reload their parent's.

Tables have a fixed capacity (`paths`, `steps`) so a CUDA graph captured for one tree replays for
any other tree that fits: `fill_` rewrites them in place. Unused paths have zero steps.

`AncestryTables` drive the tree-parallel forms (`tree_scan.py`, `tree_value_major.py`) and the
scans with the one-row step's bits (`row_scan.py`, `paths_scan.py`): the ancestry matrix, the active
row count and the tree's first-child decomposition, refillable the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lumotree.tree import TreeDescriptor

SCHEDULES = ("cut", "recompute", "store_all")


@dataclass(frozen=True, eq=False)
class ScanTables:
    """int32 device tables (P = path capacity, L = step capacity, R = rows).

    nodes [P, L] logical node per step (-1 past the end); steps [P] path lengths;
    start [P] slot of the state a path starts from in the cut bank (-1 = the durable state);
    owner [P, L] 1 where the path writes that node's output and records;
    cut_slot [R] slot in the cut bank where a node's post-update state is exported (-1 = none);
    leaf_lo, leaf_hi [P, L] range into `leaves` of the leaf children evaluated after that step;
    leaves [R] leaf nodes grouped by (path, step); n_active [1].
    cut_rows is the number of cut-bank slots the schedule needs (host int, fixed per capacity).
    """

    nodes: Tensor
    steps: Tensor
    start: Tensor
    owner: Tensor
    cut_slot: Tensor
    leaf_lo: Tensor
    leaf_hi: Tensor
    leaves: Tensor
    n_active: Tensor
    schedule: str

    @property
    def paths(self) -> int:
        return int(self.nodes.shape[0])

    @property
    def max_steps(self) -> int:
        return int(self.nodes.shape[1])

    @property
    def rows(self) -> int:
        return int(self.cut_slot.shape[0])

    @property
    def cut_rows(self) -> int:
        """Cut-bank slots: one per row for store_all (indexed by node), else at most one per row."""
        return self.rows

    def fill_(self, tree: TreeDescriptor) -> ScanTables:
        """Rewrite the tables in place for `tree` (same rows, fits the capacity); returns self."""
        host = _host_tables(tree, self.schedule, self.paths, self.max_steps)
        for name, value in host.items():
            getattr(self, name).copy_(value)
        return self


def _host_tables(tree: TreeDescriptor, schedule: str, paths: int, steps: int) -> dict[str, Tensor]:
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown scan schedule {schedule!r}; choose from {', '.join(SCHEDULES)}")
    plan, rows = tree.paths, tree.rows
    spine = plan.nodes[0][plan.nodes[0] >= 0].tolist()
    cut_nodes = plan.cut_nodes.tolist()
    path_nodes: list[list[int]] = []
    path_owner: list[list[int]] = []
    path_start: list[int] = []
    shift: list[int] = []  # steps prepended to a path (recompute schedule)
    for p in range(plan.nodes.shape[0]):
        keep = plan.nodes[p] >= 0
        nodes, owner = plan.nodes[p][keep].tolist(), plan.owner[p][keep].int().tolist()
        start = int(plan.start_cut[p])
        prefix: list[int] = []
        if start >= 0 and schedule == "recompute":
            cut_node = cut_nodes[start]
            prefix = spine[: spine.index(cut_node) + 1]
            start = -1
        elif start >= 0 and schedule == "store_all":
            start = cut_nodes[start]  # the bank is indexed by node
        path_nodes.append(prefix + nodes)
        path_owner.append([0] * len(prefix) + owner)
        path_start.append(start)
        shift.append(len(prefix))
    if len(path_nodes) > paths or max(len(n) for n in path_nodes) > steps:
        raise ValueError(
            f"tree needs {len(path_nodes)} paths of up to {max(len(n) for n in path_nodes)} steps; "
            f"the tables hold {paths} x {steps}"
        )
    nodes_t = torch.full((paths, steps), -1, dtype=torch.int32)
    owner_t = torch.zeros((paths, steps), dtype=torch.int32)
    steps_t = torch.zeros(paths, dtype=torch.int32)
    start_t = torch.full((paths,), -1, dtype=torch.int32)
    for p, (nodes, owner) in enumerate(zip(path_nodes, path_owner, strict=True)):
        nodes_t[p, : len(nodes)] = torch.tensor(nodes, dtype=torch.int32)
        owner_t[p, : len(owner)] = torch.tensor(owner, dtype=torch.int32)
        steps_t[p] = len(nodes)
        start_t[p] = path_start[p]

    cut_slot = torch.full((rows,), -1, dtype=torch.int32)
    if schedule == "cut":
        cut_slot[plan.cut_nodes] = torch.arange(len(cut_nodes), dtype=torch.int32)
    elif schedule == "store_all":
        cut_slot[: tree.n_active] = torch.arange(tree.n_active, dtype=torch.int32)

    groups: dict[tuple[int, int], list[int]] = {}
    for leaf, p, step in zip(
        plan.leaf_node.tolist(), plan.leaf_path.tolist(), plan.leaf_step.tolist(), strict=True
    ):
        groups.setdefault((p, step + shift[p]), []).append(leaf)
    leaf_lo = torch.zeros((paths, steps), dtype=torch.int32)
    leaf_hi = torch.zeros((paths, steps), dtype=torch.int32)
    leaves = torch.full((rows,), -1, dtype=torch.int32)
    cursor = 0
    for (p, step), group in sorted(groups.items()):
        leaf_lo[p, step] = cursor
        leaves[cursor : cursor + len(group)] = torch.tensor(group, dtype=torch.int32)
        cursor += len(group)
        leaf_hi[p, step] = cursor
    return {
        "nodes": nodes_t,
        "steps": steps_t,
        "start": start_t,
        "owner": owner_t,
        "cut_slot": cut_slot,
        "leaf_lo": leaf_lo,
        "leaf_hi": leaf_hi,
        "leaves": leaves,
        "n_active": torch.tensor([tree.n_active], dtype=torch.int32),
    }


def scan_tables(
    tree: TreeDescriptor,
    device: torch.device | str,
    schedule: str = "cut",
    paths: int | None = None,
    steps: int | None = None,
) -> ScanTables:
    """Tables for `tree` on `device`. paths/steps: capacity (default: exactly what this tree needs;
    give max_depth + 1 steps and a path budget to reuse the tables, e.g. in a CUDA graph)."""
    paths = int(tree.paths.nodes.shape[0]) if paths is None else paths
    steps = tree.max_depth + 1 if steps is None else steps
    host = _host_tables(tree, schedule, paths, steps)
    return ScanTables(**{k: v.to(device) for k, v in host.items()}, schedule=schedule)


#: path programs per value tile by default: the paper geometry's walks (the spine, one per rescue
#: branch, one per MTP depth with runner-up siblings: `drafting/geometry.py`)
DEFAULT_PATHS = 8


@dataclass(frozen=True, eq=False)
class AncestryTables:
    """ancestry [R, R] int32 (1 where column a is row n or one of its ancestors); n_active [1] int32;
    max_depth: the deepest tree these tables may hold (fixes the number of solve rounds).

    The first-child decomposition that drives the paths scan (`paths_scan.py`), int32 [R]: every
    non-leaf node continues into its first (lowest-index) child, so the tree falls into paths, each
    ending at a leaf that is the root or a first child; leaf_parent: for a leaf that is not a first
    child, its parent, else -1. Such leaves are not path ends: each parent's group of them is
    evaluated by one walk that passes the parent (`first_child_paths` says which: leaf_walk, the
    walk's index at the parent, -1 at other nodes), right after it steps the parent; walks are
    added for the groups no path can take without growing past the longest walk, each to a parent,
    owning none of its nodes (the paper tree's runner-up siblings: evaluated in the spine's program
    they put 22 steps in series, one walk a parent took 49 steps a value tile in 8 walks, shared
    they take 38 in 4). path_end: the paths' ends ascending, then the added walks' parents in the
    order they were added, -1 after; path_start: per path, its first own node (the deepest
    ancestor-or-self of its end that is the root or not a first child; the nodes above it belong
    to other paths), R for an added walk, -1 after. paths: how many path programs a launch runs per
    value tile (a tree with more walks is still verified, a program taking several in turn)."""

    ancestry: Tensor
    n_active: Tensor
    path_end: Tensor
    path_start: Tensor
    leaf_parent: Tensor
    leaf_walk: Tensor
    max_depth: int
    paths: int

    def fill_(self, tree: TreeDescriptor) -> AncestryTables:
        """Rewrite in place for `tree` (same rows, depth <= max_depth), e.g. before a graph replay."""
        if tree.rows != self.ancestry.shape[0] or int(tree.depth.max()) > self.max_depth:
            raise ValueError(
                f"tables hold {self.ancestry.shape[0]} rows of depth <= {self.max_depth}; "
                f"tree has {tree.rows} rows of depth {int(tree.depth.max())}"
            )
        self.ancestry.copy_(tree.ancestry.to(torch.int32))
        self.n_active.fill_(tree.n_active)
        for name, values in first_child_paths(tree.parent.tolist(), tree.n_active).items():
            getattr(self, name).copy_(torch.tensor(values, dtype=torch.int32))
        return self


def first_child_paths(parents: list[int], n_active: int) -> dict[str, list[int]]:
    """The decomposition of `AncestryTables` (path_end, path_start, leaf_parent, leaf_walk, each of
    len(parents) entries) of the tree whose first n_active entries of `parents` are active (the
    root's parent -1, a parent before its children); the host reference of `DeviceTree.derive_`.

    The leaf groups (a parent's leaves that are not first children) are placed deepest parent
    first (then lowest index): on the shortest walk passing the parent that stays within the
    longest walk's steps (then the lowest walk index), else on a new walk to the parent."""
    rows = len(parents)
    children: list[list[int]] = [[] for _ in range(n_active)]
    for c in range(1, n_active):
        children[parents[c]].append(c)
    first = [c == 0 or min(children[parents[c]]) == c for c in range(n_active)]
    leaf = [not kids for kids in children]
    depth = [0] * n_active
    for c in range(1, n_active):
        depth[c] = depth[parents[c]] + 1
    ends = [c for c in range(n_active) if leaf[c] and first[c]]
    starts = []
    for end in ends:
        node = end
        while node != 0 and first[node]:
            node = parents[node]
        starts.append(node)

    def ancestry(node: int) -> set[int]:
        nodes = {node}
        while node != 0:
            node = parents[node]
            nodes.add(node)
        return nodes

    leaf_parent = [parents[c] if leaf[c] and not first[c] else -1 for c in range(n_active)]
    passes = [ancestry(end) for end in ends]
    steps = [depth[end] + 1 for end in ends]
    longest = max(steps)
    leaf_walk = [-1] * rows
    for parent in sorted({p for p in leaf_parent if p >= 0}, key=lambda p: (-depth[p], p)):
        count = leaf_parent.count(parent)
        fits = [w for w in range(len(ends)) if parent in passes[w] and steps[w] + count <= longest]
        if fits:
            walk = min(fits, key=lambda w: (steps[w], w))
            steps[walk] += count
        else:
            walk = len(ends)
            ends, starts = [*ends, parent], [*starts, rows]
            passes.append(ancestry(parent))
            steps.append(depth[parent] + 1 + count)
            longest = max(longest, steps[walk])
        leaf_walk[parent] = walk
    pad = [-1] * (rows - len(ends))
    return {
        "path_end": ends + pad,
        "path_start": starts + pad,
        "leaf_parent": leaf_parent + [-1] * (rows - n_active),
        "leaf_walk": leaf_walk,
    }


def count_paths(tree: TreeDescriptor) -> int:
    """How many walks `tree`'s first-child decomposition has (the path programs it needs)."""
    return sum(end >= 0 for end in first_child_paths(tree.parent.tolist(), tree.n_active)["path_end"])


def empty_ancestry_tables(
    rows: int,
    max_depth: int,
    device: torch.device | str,
    paths: int = DEFAULT_PATHS,
) -> AncestryTables:
    """Zeroed tables for trees of `rows` rows and depth <= max_depth, to fill."""
    if paths < 1:
        raise ValueError(f"a launch needs at least one path program, got paths={paths}")

    def table(*shape: int) -> Tensor:
        return torch.zeros(shape, dtype=torch.int32, device=device)

    return AncestryTables(
        ancestry=table(rows, rows),
        n_active=table(1),
        path_end=table(rows),
        path_start=table(rows),
        leaf_parent=table(rows),
        leaf_walk=table(rows),
        max_depth=max_depth,
        paths=paths,
    )


def ancestry_tables(
    tree: TreeDescriptor,
    device: torch.device | str,
    max_depth: int | None = None,
    paths: int = DEFAULT_PATHS,
) -> AncestryTables:
    """Tables for `tree` on `device`; max_depth defaults to the descriptor's depth cap."""
    depth = tree.max_depth if max_depth is None else max_depth
    return empty_ancestry_tables(tree.rows, depth, device, paths).fill_(tree)
