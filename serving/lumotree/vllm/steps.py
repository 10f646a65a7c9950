"""One vLLM step as LumoTree sees it: per scheduled request, either a chunk of known tokens (prompt
prefill, sequence mode) or a tree (the pending root and the drafts vLLM scheduled behind it).

vLLM lays a request's scheduled tokens out flat: token j sits at position prefix_len + j and its KV
at that position's slot. For a tree the plugin sends its drafts in the descriptor's physical order
(spine first), so flat token j is physical row j: KV slots follow `slot_map` as the LumoTree core
expects (prefix_len + slot_map), while the RoPE positions are rewritten to prefix_len + depth.
A prefix of physical order is closed under parents, so when vLLM schedules fewer drafts than were
proposed (budget, context limit) the kept rows still form a tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lumotree.model.native.gdn_core import NativeTree
from lumotree.model.tree_mode import GdnRecord
from lumotree.tree import TreeDescriptor, build_tree, chain_tree


def physical_tokens(tree: TreeDescriptor) -> list[int]:
    """Active tokens in physical (slot) order, root first."""
    n = tree.n_active
    order = torch.argsort(tree.slot_map[:n])
    return [int(t) for t in tree.tokens[:n][order]]


def physical_prefix(tree: TreeDescriptor, rows: int) -> TreeDescriptor:
    """The sub-tree of the first `rows` physical rows (no padding), in logical order."""
    tree = tree.without_padding()
    if rows >= tree.n_active:
        return tree
    keep = [i for i in range(tree.n_active) if int(tree.slot_map[i]) < rows]
    new_index = {old: new for new, old in enumerate(keep)}
    parents = [-1 if i == 0 else new_index[int(tree.parent[i])] for i in keep]
    return build_tree(
        [int(tree.tokens[i]) for i in keep], parents, prefix_len=tree.prefix_len, max_depth=tree.max_depth
    )


def scheduled_tree(
    root: int, drafts: Sequence[int], pending: TreeDescriptor | None, prefix_len: int
) -> TreeDescriptor:
    """The tree vLLM scheduled: the pending proposal cut to the scheduled drafts, or, when vLLM
    scheduled drafts that are not the proposal's (it zero-fills drafts near the context limit), the
    scheduled tokens as a chain. Either way every scheduled token is verified exactly."""
    tokens = [root, *drafts]
    if (
        pending is not None
        and pending.prefix_len == prefix_len
        and physical_tokens(pending)[: len(tokens)] == tokens
    ):
        return physical_prefix(pending, len(tokens))
    return chain_tree(tokens, prefix_len=prefix_len)


@dataclass(eq=False)
class RequestStep:
    """A request's part of one batch.

    index: its row in vLLM's input batch; start, count: its flat tokens [start, start + count),
    token_ids their ids; prefix_len: tokens already in its state; prompt_len: its prompt's length;
    tree (trees only): the descriptor, logical order,
    count rows, and rows[i] the flat token of logical node i (start + slot_map[i]);
    ends_sequence (chunks): the chunk reaches the last known token, so its last row samples;
    logit_start: its first row in the step's logits (vLLM computes 1 + drafts rows per request);
    gdn: the verification records of each GDN layer (trees, PyTorch core), by layer name;
    native: the tree's tables and records of every GDN layer (trees, native core).
    """

    req_id: str
    index: int
    start: int
    count: int
    token_ids: list[int]
    prefix_len: int
    prompt_len: int
    tree: TreeDescriptor | None = None
    rows: Tensor | None = None
    ends_sequence: bool = False
    logit_start: int = 0
    gdn: dict[str, GdnRecord] = field(default_factory=dict)
    native: NativeTree | None = None

    @property
    def is_tree(self) -> bool:
        return self.tree is not None

    @property
    def tokens(self) -> slice:
        return slice(self.start, self.start + self.count)


@dataclass(eq=False)
class StepPlan:
    """Every scheduled request of one step, in input-batch order, and where its state lives.

    block_rows[group][index] is vLLM's block-table row of request `index` in KV cache group
    `group`; block_sizes[group] its block size (tokens per block). In vLLM's align mamba cache
    mode (prefix caching) align_block_size is the mamba block size and state_columns[req_id] the
    block-table column of a request's running state (filled before the forward, `align.py`).
    """

    requests: list[RequestStep]
    block_rows: list[object]
    block_sizes: list[int]
    align_block_size: int | None = None
    state_columns: dict[str, int] = field(default_factory=dict)

    @property
    def trees(self) -> list[RequestStep]:
        return [r for r in self.requests if r.is_tree]

    def state_slot(self, req: RequestStep, group: int) -> int:
        """The mamba-state slot of a request's running state in a GDN layer group (mode "none":
        one slot per request, block-table column 0; mode "align": its state column)."""
        column = 0 if self.align_block_size is None else self.state_columns[req.req_id]
        return int(self.block_rows[group][req.index, column])  # type: ignore[index]

    def block_ids(self, req: RequestStep, group: int) -> list[int]:
        """A request's block table in a KV cache group."""
        return [int(b) for b in self.block_rows[group][req.index]]  # type: ignore[index]

    def kv_blocks(self, req: RequestStep, group: int, tokens: int) -> Tensor:
        """The paged-KV blocks [m] holding a request's first `tokens` positions in a group."""
        size = self.block_sizes[group]
        return torch.as_tensor(self.block_rows[group][req.index][: -(-tokens // size)]).to(torch.long)  # type: ignore[index]

    def kv_slots(self, req: RequestStep, group: int, positions: Tensor) -> Tensor:
        """Paged-KV slots of token positions [n] of a request in an attention layer group."""
        size = self.block_sizes[group]
        table = torch.as_tensor(self.block_rows[group][req.index])  # type: ignore[index]
        return table[positions // size].to(torch.long) * size + positions % size
