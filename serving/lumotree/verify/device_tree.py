"""The tree descriptor's tables on the device, in static buffers filled by one copy per cycle.

Every Triton stage of a cycle (tree conv, GDN verification, tree attention, the KV writes, the
device walk, publication) reads its per-cycle metadata from device memory, so CUDA graphs captured
once replay for every later tree of the same row count. `DeviceTree.load_(tree)` packs all tables
of a `TreeDescriptor` into one pinned host buffer and copies it to the device in a single
asynchronous transfer; nothing is allocated per cycle. The int32 views the GDN kernel wants are
converted on the device (`cast_`), inside the captured verify stage.

A `DeviceTree` stands in for the descriptor wherever the `triton` kernel set is called: it has
`tokens`, `position`, `rows` and the tables as device tensors.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lumotree.tree import CONV_WIDTH, TreeDescriptor
from lumotree.verify.attention.decode import tree_visibility_bits
from lumotree.verify.gdn.plan import AncestryTables


class DeviceTree:
    """Static device tables for trees of exactly `rows` rows and depth <= `max_depth`.

    int64 views of one device buffer: tokens, position, depth, slot_map [R]; bits [R] (row r sees
    tree slot j when bit j is set, physical order: `tree_visibility_bits`); conv_gather [R, W];
    child_nodes, child_tokens [R, R] (-1 padded); ancestry [R, R] (1 where column a is the row or
    one of its ancestors); n_active, prefix_len [1]. `gdn` holds the int32 ancestry tables of the GDN kernel.
    """

    def __init__(
        self, rows: int, max_depth: int, device: torch.device | str, conv_width: int = CONV_WIDTH
    ) -> None:
        if rows > 63:
            raise ValueError(f"the visibility bitset holds 63 tree slots, got {rows} rows")
        self.rows, self.max_depth, self.conv_width = rows, max_depth, conv_width
        self.device = torch.device(device)
        r = rows
        self._layout: list[tuple[str, tuple[int, ...]]] = [
            ("tokens", (r,)),
            ("position", (r,)),
            ("depth", (r,)),
            ("slot_map", (r,)),
            ("bits", (r,)),
            ("conv_gather", (r, conv_width)),
            ("child_nodes", (r, r)),
            ("child_tokens", (r, r)),
            ("ancestry", (r, r)),
            ("n_active", (1,)),
            ("prefix_len", (1,)),
        ]
        size = sum(_numel(shape) for _, shape in self._layout)
        pinned = self.device.type == "cuda"
        self._host = torch.zeros(size, dtype=torch.int64, pin_memory=pinned)
        self._device = torch.zeros(size, dtype=torch.int64, device=self.device)
        self._host_views = self._views(self._host)
        for name, view in self._views(self._device).items():
            setattr(self, name, view)
        self.gdn = AncestryTables(
            ancestry=torch.zeros((r, r), dtype=torch.int32, device=self.device),
            n_active=torch.zeros(1, dtype=torch.int32, device=self.device),
            max_depth=max_depth,
        )
        self.host_tree: TreeDescriptor | None = None  # the descriptor last loaded (host side)

    def _views(self, flat: Tensor) -> dict[str, Tensor]:
        views, at = {}, 0
        for name, shape in self._layout:
            n = _numel(shape)
            views[name] = flat[at : at + n].view(shape)
            at += n
        return views

    def load_(self, tree: TreeDescriptor) -> DeviceTree:
        """Pack `tree`'s tables into the pinned staging buffer and copy them to the device (one
        asynchronous copy; the staging buffer is reused, so call once per cycle, after the
        previous cycle's copy completed — the cycle's one synchronisation guarantees that)."""
        if tree.rows != self.rows or tree.max_depth > self.max_depth:
            raise ValueError(
                f"device tables hold {self.rows} rows of depth <= {self.max_depth}; "
                f"the tree has {tree.rows} rows of depth cap {tree.max_depth}"
            )
        h = self._host_views
        h["tokens"].copy_(tree.tokens)
        h["position"].copy_(tree.position)
        h["depth"].copy_(tree.depth)
        h["slot_map"].copy_(tree.slot_map)
        h["bits"].copy_(tree_visibility_bits(tree))
        h["conv_gather"].copy_(tree.conv_gather)
        children = tree.child_nodes.shape[1]
        h["child_nodes"].fill_(-1)
        h["child_tokens"].fill_(-1)
        h["child_nodes"][:, :children].copy_(tree.child_nodes)
        h["child_tokens"][:, :children].copy_(tree.child_tokens)
        h["ancestry"].copy_(tree.ancestry)
        h["n_active"].fill_(tree.n_active)
        h["prefix_len"].fill_(tree.prefix_len)
        self._device.copy_(self._host, non_blocking=True)
        self.host_tree = tree
        return self

    def cast_(self) -> None:
        """Refresh the GDN kernel's int32 tables from the loaded int64 ones (on the device)."""
        self.gdn.ancestry.copy_(self.ancestry)
        self.gdn.n_active.copy_(self.n_active)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
