"""The tree descriptor: one object, built once per cycle, that every LumoTree stage reads (DESIGN §3.1).

A tree has `rows` logical rows. Row 0 is the root (the pending token of the last cycle); rows
[0, n_active) are nodes in topological order (a parent precedes its children); rows [n_active, rows)
are padding, invisible to attention, selection and publication. Logical order is what selection,
sampling and the acceptance walk use. Physical order (`slot_map`) puts the spine (root, then its
first child, that child's first child, ...) first and contiguous, then the other active nodes, then
padding; KV write slots and ancestry-mask key columns use it. Positions are `prefix_len + depth`,
never the flattened row index.

The GDN scan schedule (`PathPlan`) decomposes the tree into the spine path, run from the pre-tree
state, and branch paths, each run from the state after one spine node (a cut state). Leaf children
of a path node are evaluated from the path's state tile and need neither a path nor a cut state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from functools import cache, cached_property

import numpy as np
import torch
from torch import Tensor

MAX_DEPTH = 11
DEFAULT_ROWS = 32
CONV_WIDTH = 4
PAD_TOKEN = 0


class TreeError(ValueError):
    """A tree topology that no LumoTree stage may consume."""


@dataclass(frozen=True, eq=False)
class PathPlan:
    """GDN scan schedule. All tensors int64 (owner: bool), on the descriptor's device.

    nodes:     [P, L] logical nodes of each path in order, -1 padded; path 0 is the spine.
    start_cut: [P] index into `cut_nodes` of the state a path starts from; -1 = the pre-tree state.
    cut_nodes: [C] spine nodes whose post-update state is exported for branch paths.
    owner:     [P, L] True where this path is the first to cover the node (it writes the output and
               the recorded operands); branch paths sharing a prefix recompute it identically.
    leaf_node, leaf_path, leaf_step: [M] leaf children evaluated from path `leaf_path`'s tile right
               after its step `leaf_step` (no state of their own is kept).
    """

    nodes: Tensor
    start_cut: Tensor
    cut_nodes: Tensor
    owner: Tensor
    leaf_node: Tensor
    leaf_path: Tensor
    leaf_step: Tensor


@dataclass(frozen=True)
class TreeTopology:
    """A draft tree as a drafter proposes it: tokens, parents and depths in topological order
    (root first, a parent before its children, the principal child first), before any table is
    built. A runner turns it into what it needs: the host kernel sets a `TreeDescriptor`
    (`descriptor`), the device path static device tables (`verify/device_tree.py`)."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    depths: tuple[int, ...]
    merges: int = 0

    @property
    def n_active(self) -> int:
        return len(self.tokens)

    def descriptor(
        self,
        *,
        prefix_len: int,
        rows: int | None = None,
        max_depth: int = MAX_DEPTH,
        conv_width: int = CONV_WIDTH,
    ) -> TreeDescriptor:
        """The descriptor of this topology (its depths are trusted: builders make valid tries)."""
        return build_tree(
            self.tokens,
            self.parents,
            prefix_len=prefix_len,
            rows=rows,
            max_depth=max_depth,
            conv_width=conv_width,
            merges=self.merges,
            trusted_depth=self.depths,
        )


def chain_topology(tokens: Sequence[int]) -> TreeTopology:
    """root -> tokens[1] -> tokens[2] ... (chain MTP; AR when len(tokens) == 1)."""
    n = len(tokens)
    return TreeTopology(tuple(int(t) for t in tokens), (-1, *range(n - 1)), tuple(range(n)))


@dataclass(frozen=True, eq=False)
class TreeDescriptor:
    """Everything a verification cycle needs about the draft tree. Shapes use R = rows.

    tokens [R] int64 (padding: PAD_TOKEN); parent [R] int64 (root and padding: -1);
    depth [R] int64 (padding: 0); position [R] = prefix_len + depth; active [R] bool;
    slot_map [R] int64 logical -> physical slot, a permutation of range(R), spine first;
    ancestry [R, R] bool, ancestry[i, j] = j is i or an ancestor of i (padding: itself only);
    ancestor_at_depth [R, max_depth + 1] int64, the ancestor of i at each depth (-1 below i);
    child_nodes / child_tokens [R, Cmax] int64, each row's children and their tokens (-1 padded);
    spine [S] int64 logical nodes of the spine path; paths (planned on first use): the GDN scan schedule;
    conv_gather [R, W] int64 window of each row into cat(conv_state.T, x): entries < W-1 are
    committed conv-state columns, entry W-1+r is tree row r (padding rows reuse the root's window).
    merges: duplicate proposals merged by the builder.
    """

    tokens: Tensor
    parent: Tensor
    depth: Tensor
    position: Tensor
    active: Tensor
    slot_map: Tensor
    ancestry: Tensor
    ancestor_at_depth: Tensor
    child_nodes: Tensor
    child_tokens: Tensor
    spine: Tensor
    conv_gather: Tensor
    n_active: int
    prefix_len: int
    max_depth: int
    merges: int = 0

    @property
    def rows(self) -> int:
        return int(self.tokens.shape[0])

    @cached_property
    def paths(self) -> PathPlan:
        """The GDN path-scan schedule, planned on first use (the device path never needs it)."""
        children = [[c for c in row if c >= 0] for row in self.child_nodes.tolist()]
        return _plan_paths(children, self.spine.tolist(), self.n_active)

    def path_to(self, node: int) -> list[int]:
        """Logical nodes root..node."""
        d = int(self.depth[node])
        return [int(x) for x in self.ancestor_at_depth[node, : d + 1]]

    def padded_path(self, nodes: Sequence[int]) -> Tensor:
        """A path as the walk emits it: int64 [max_depth + 1], -1 padded."""
        out = torch.full((self.max_depth + 1,), -1, dtype=torch.long)
        out[: len(nodes)] = torch.as_tensor(list(nodes), dtype=torch.long)
        return out

    def without_padding(self) -> TreeDescriptor:
        """The same tree without its padding rows (active rows come first in logical and physical
        order): every per-row field cut to the n_active rows (ancestry in both dims); spine and
        paths only name active rows already."""
        n = self.n_active
        if n == self.rows:
            return self
        rows = {
            f.name: value[:n]
            for f in fields(self)
            if isinstance(value := getattr(self, f.name), Tensor) and f.name != "spine"
        }
        return replace(self, **rows | {"ancestry": self.ancestry[:n, :n]})

    def topology(self) -> TreeTopology:
        """The active nodes' tokens, parents and depths (what a drafter proposed)."""
        n = self.n_active
        return TreeTopology(
            tuple(self.tokens[:n].tolist()),
            tuple(self.parent[:n].tolist()),
            tuple(self.depth[:n].tolist()),
            self.merges,
        )

    def is_spine_prefix(self, nodes: Sequence[int]) -> bool:
        """True when `nodes` is root, spine[1], ..., i.e. its KV already sits contiguously."""
        return len(nodes) <= len(self.spine) and [int(x) for x in self.spine[: len(nodes)]] == list(nodes)


def validate_topology(tokens: Sequence[int], parents: Sequence[int], max_depth: int = MAX_DEPTH) -> list[int]:
    """Check a tree given as parallel token/parent lists; return each node's depth.

    Rejects: empty trees, a root that is not node 0, out-of-range or self parents, cycles, parents
    listed after their children, duplicate tokens among siblings, negative tokens, depth > max_depth.
    """
    n = len(tokens)
    if n == 0:
        raise TreeError("a tree needs at least the root node")
    if len(parents) != n:
        raise TreeError(f"tokens has {n} entries but parents has {len(parents)}")
    if parents[0] != -1:
        raise TreeError(f"node 0 must be the root (parent -1), got parent {parents[0]}")
    for i, p in enumerate(parents):
        if i > 0 and not 0 <= p < n:
            raise TreeError(f"node {i} has out-of-range parent {p} (valid: 0..{n - 1})")
        if i > 0 and p == i:
            raise TreeError(f"node {i} is its own parent")
        if tokens[i] < 0:
            raise TreeError(f"node {i} has negative token {tokens[i]}")
    for i in range(1, n):
        seen, j = {i}, parents[i]
        while j != -1:
            if j in seen:
                raise TreeError(f"cycle through node {i} (parent chain revisits node {j})")
            seen.add(j)
            j = parents[j]
    for i in range(1, n):
        if parents[i] > i:
            raise TreeError(f"node {i} is listed before its parent {parents[i]}; order parents first")
    depth = [0] * n
    sibling_tokens: dict[int, set[int]] = {}
    for i in range(1, n):
        p = parents[i]
        depth[i] = depth[p] + 1
        if depth[i] > max_depth:
            raise TreeError(f"node {i} has depth {depth[i]} > max_depth {max_depth}")
        taken = sibling_tokens.setdefault(p, set())
        if tokens[i] in taken:
            raise TreeError(f"node {i} repeats token {tokens[i]} under parent {p}; merge duplicate siblings")
        taken.add(tokens[i])
    return depth


def build_tree(
    tokens: Sequence[int],
    parents: Sequence[int],
    *,
    prefix_len: int,
    rows: int | None = None,
    max_depth: int = MAX_DEPTH,
    conv_width: int = CONV_WIDTH,
    merges: int = 0,
    trusted_depth: Sequence[int] | None = None,
) -> TreeDescriptor:
    """Descriptor of an arbitrary validated tree, padded to `rows` (default: no padding).

    The spine is root -> lowest-index child -> ... ; builders list the principal child first.
    trusted_depth: each node's depth, from a builder whose trie cannot produce an invalid
    topology (`TreeBuilder`): validation is skipped (it is most of a small tree's build time).
    """
    tokens, parents = [int(t) for t in tokens], [int(p) for p in parents]
    trusted = trusted_depth is not None
    depth = list(trusted_depth) if trusted else validate_topology(tokens, parents, max_depth)
    n = len(tokens)
    rows = n if rows is None else rows
    if rows < n:
        raise TreeError(f"{n} active nodes do not fit in {rows} rows")
    if prefix_len < 0:
        raise TreeError(f"prefix_len must be >= 0, got {prefix_len}")

    children: list[list[int]] = [[] for _ in range(rows)]
    for i in range(1, n):
        children[parents[i]].append(i)
    spine = [0]
    while children[spine[-1]]:
        spine.append(children[spine[-1]][0])

    # Built with numpy and wrapped once (torch.from_numpy): this runs every cycle, and small
    # per-field torch constructions or per-element tensor writes cost microseconds each.
    tok = np.full(rows, PAD_TOKEN, dtype=np.int64)
    tok[:n] = tokens
    par = np.full(rows, -1, dtype=np.int64)
    par[:n] = parents
    dep = np.zeros(rows, dtype=np.int64)
    dep[:n] = depth

    on_spine = set(spine)
    physical_order = spine + [i for i in range(n) if i not in on_spine] + list(range(n, rows))
    slot_map = np.empty(rows, dtype=np.int64)
    slot_map[physical_order] = np.arange(rows)

    # every active node's ancestors, found by walking all nodes up one level at a time
    anc_at = np.full((rows, max_depth + 1), -1, dtype=np.int64)
    ancestry = np.eye(rows, dtype=bool)
    nodes = np.arange(n)
    up = nodes.copy()
    while up.size:
        anc_at[nodes, dep[up]] = up
        ancestry[nodes, up] = True
        keep = par[up] >= 0
        nodes, up = nodes[keep], par[up[keep]]
    cmax = max(1, max(len(c) for c in children))
    child_nodes = np.full((rows, cmax), -1, dtype=np.int64)
    for i in range(n):
        child_nodes[i, : len(children[i])] = children[i]
    child_tokens = np.where(child_nodes >= 0, tok[child_nodes.clip(min=0)], -1)

    return TreeDescriptor(
        tokens=torch.from_numpy(tok),
        parent=torch.from_numpy(par),
        depth=torch.from_numpy(dep),
        position=torch.from_numpy(prefix_len + dep),
        active=torch.arange(rows) < n,
        slot_map=torch.from_numpy(slot_map),
        ancestry=torch.from_numpy(ancestry),
        ancestor_at_depth=torch.from_numpy(anc_at),
        child_nodes=torch.from_numpy(child_nodes),
        child_tokens=torch.from_numpy(child_tokens),
        spine=torch.tensor(spine, dtype=torch.long),
        conv_gather=torch.from_numpy(_conv_gather(anc_at, dep, n, conv_width)),
        n_active=n,
        prefix_len=prefix_len,
        max_depth=max_depth,
        merges=merges,
    )


def chain_tree(
    tokens: Sequence[int], *, prefix_len: int, rows: int | None = None, **kw: int
) -> TreeDescriptor:
    """A chain root -> tokens[1] -> tokens[2] ... (chain MTP, and AR when len(tokens) == 1)."""
    return build_tree(tokens, [-1, *range(len(tokens) - 1)], prefix_len=prefix_len, rows=rows, **kw)


def root_tree(token: int, *, prefix_len: int, max_depth: int = MAX_DEPTH) -> TreeDescriptor:
    """chain_tree([token], prefix_len=prefix_len): the root-only tree of an autoregressive step,
    made from a cached template (only the token and the position differ between cycles)."""
    template = _root_template(max_depth)
    return replace(
        template,
        tokens=torch.tensor([int(token)]),
        position=torch.tensor([prefix_len]),
        prefix_len=prefix_len,
    )


@cache
def _root_template(max_depth: int) -> TreeDescriptor:
    return chain_tree([PAD_TOKEN], prefix_len=0, max_depth=max_depth)


class TreeBuilder:
    """Grows a token trie, merging a proposal that repeats a sibling's token (and counting it).

    Logical order is breadth-first with children in insertion order, so the child a drafter adds
    first under each spine node becomes the spine.
    """

    def __init__(self, root_token: int, max_nodes: int = DEFAULT_ROWS, max_depth: int = MAX_DEPTH) -> None:
        self.tokens = [int(root_token)]
        self.parents = [-1]
        self.depths = [0]
        self.children: list[dict[int, int]] = [{}]
        self.max_nodes, self.max_depth = max_nodes, max_depth
        self.merges = 0
        self.dropped = 0

    def add(self, parent: int, token: int) -> int | None:
        """Child of `parent` carrying `token`: the existing one (a merge) or a new node.

        Returns None, counting a drop, when the node budget or the depth limit is reached.
        """
        token = int(token)
        if token in self.children[parent]:
            self.merges += 1
            return self.children[parent][token]
        if len(self.tokens) >= self.max_nodes or self.depths[parent] + 1 > self.max_depth:
            self.dropped += 1
            return None
        node = len(self.tokens)
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.children.append({})
        self.children[parent][token] = node
        return node

    def extend(self, parent: int, tokens: Sequence[int]) -> int | None:
        """Add a chain of tokens under `parent`; return its last node (None if cut by the budget)."""
        node: int | None = parent
        for i, t in enumerate(tokens):
            node = self.add(node, t)
            if node is None:
                self.dropped += len(tokens) - i - 1
                return None
        return node

    def find(self, token_path: Sequence[int]) -> int | None:
        """Node reached from the root by `token_path` (tokens below the root), or None."""
        node = 0
        for t in token_path:
            nxt = self.children[node].get(int(t))
            if nxt is None:
                return None
            node = nxt
        return node

    def in_order(self) -> TreeTopology:
        """The trie in insertion order (a parent before its children, the first child added under
        each node first): no reordering, for a tree built between two cycles."""
        return TreeTopology(tuple(self.tokens), tuple(self.parents), tuple(self.depths), self.merges)

    def topology(self) -> TreeTopology:
        """The trie in breadth-first order (children in insertion order)."""
        order = [0]
        for node in order:
            order.extend(self.children[node].values())
        new_index = {old: new for new, old in enumerate(order)}
        return TreeTopology(
            tuple(self.tokens[o] for o in order),
            tuple(-1 if o == 0 else new_index[self.parents[o]] for o in order),
            tuple(self.depths[o] for o in order),
            self.merges,
        )

    def build(
        self, *, prefix_len: int, rows: int | None = DEFAULT_ROWS, conv_width: int = CONV_WIDTH
    ) -> TreeDescriptor:
        """Descriptor in breadth-first order."""
        return self.topology().descriptor(
            prefix_len=prefix_len, rows=rows, max_depth=self.max_depth, conv_width=conv_width
        )


def _plan_paths(children: list[list[int]], spine: list[int], n: int) -> PathPlan:
    is_leaf = [not children[i] for i in range(n)]
    paths: list[list[int]] = [spine]
    start_cut_node: list[int] = [-1]

    def frontier_chains(node: int, prefix: list[int]) -> list[list[int]]:
        # One path per node whose children are all leaves; shared prefixes are recomputed.
        inner = [c for c in children[node] if not is_leaf[c]]
        if not inner:
            return [[*prefix, node]]
        return [chain for c in inner for chain in frontier_chains(c, [*prefix, node])]

    for s in spine:
        for c in children[s]:
            if c in spine or is_leaf[c]:
                continue
            for chain in frontier_chains(c, []):
                paths.append(chain)
                start_cut_node.append(s)
    cut_nodes = [s for s in spine if s in start_cut_node]

    covered: set[int] = set()
    owner: list[list[bool]] = []
    leaf_node, leaf_path, leaf_step = [], [], []
    for p, path in enumerate(paths):
        flags = []
        for step, node in enumerate(path):
            flags.append(node not in covered)
            covered.add(node)
            for c in children[node]:
                if is_leaf[c] and c not in covered and c not in spine:
                    covered.add(c)
                    leaf_node.append(c)
                    leaf_path.append(p)
                    leaf_step.append(step)
        owner.append(flags)

    length = max(len(p) for p in paths)
    nodes_t = torch.tensor([path + [-1] * (length - len(path)) for path in paths], dtype=torch.long)
    owner_t = torch.tensor([flags + [False] * (length - len(flags)) for flags in owner], dtype=torch.bool)
    return PathPlan(
        nodes=nodes_t,
        start_cut=torch.tensor(
            [-1 if s == -1 else cut_nodes.index(s) for s in start_cut_node], dtype=torch.long
        ),
        cut_nodes=torch.tensor(cut_nodes, dtype=torch.long),
        owner=owner_t,
        leaf_node=torch.tensor(leaf_node, dtype=torch.long),
        leaf_path=torch.tensor(leaf_path, dtype=torch.long),
        leaf_step=torch.tensor(leaf_step, dtype=torch.long),
    )


def _conv_gather(anc_at: np.ndarray, depth: np.ndarray, n: int, width: int) -> np.ndarray:
    """[R, W] window of each row: tap t holds the token at relative depth d - (W-1) + t; taps above
    the root index the committed conv state (< W-1), the others tree row W-1 + ancestor. Padding
    rows (>= n) reuse the root's window."""
    rows = anc_at.shape[0]
    src = np.where(np.arange(rows) < n, np.arange(rows), 0)
    d = depth[src]
    rel = d[:, None] - (width - 1) + np.arange(width)[None, :]
    ancestor = np.take_along_axis(anc_at[src], rel.clip(min=0), axis=1)
    return np.where(rel < 0, width - 1 + rel, width - 1 + ancestor)
