"""The paper's draft-tree geometry (DESIGN §3.2, paper §VI), every count configurable.

Default: a 5-depth MTP spine with 2 runner-up sibling leaves per depth (15 MTP candidates), a suffix
principal tail of 6 tokens continuing the spine (max depth 11), and rescue branches of 4 and 2
tokens: 27 drafts + root = 28 active rows, padded to 32.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from lumotree.drafting.selection import argmax_lowest_index, ordered_topk
from lumotree.tree import CONV_WIDTH, DEFAULT_ROWS, MAX_DEPTH, TreeBuilder, TreeDescriptor, TreeError


@dataclass(frozen=True)
class GeometryConfig:
    """Counts of the paper geometry. Inputs longer than a count are cut to it."""

    depth_mtp: int = 5
    siblings_per_depth: int = 2
    tail_len: int = 6
    rescue_lens: tuple[int, ...] = (4, 2)
    rows: int = DEFAULT_ROWS
    max_depth: int = MAX_DEPTH

    def __post_init__(self) -> None:
        if self.depth_mtp < 0 or self.siblings_per_depth < 0 or self.tail_len < 0:
            raise TreeError("geometry counts must be >= 0")
        if self.depth_mtp + self.tail_len > self.max_depth:
            raise TreeError(
                f"spine depth {self.depth_mtp}+{self.tail_len} exceeds max_depth {self.max_depth}"
            )

    @property
    def max_drafts(self) -> int:
        return self.depth_mtp * (1 + self.siblings_per_depth) + self.tail_len + sum(self.rescue_lens)


@dataclass(frozen=True)
class RescueBranch:
    """A suffix-drafter branch: `tokens` hung below the node reached by `attach` (tokens below root)."""

    attach: tuple[int, ...]
    tokens: tuple[int, ...]


def mtp_proposals(logits: Tensor, k: int = 3) -> tuple[list[int], list[list[int]]]:
    """Spine token and ordered top-k per MTP depth. logits [depth, V] float -> ([depth], [depth][k])."""
    return argmax_lowest_index(logits).tolist(), ordered_topk(logits, k).tolist()


def build_paper_tree(
    root_token: int,
    spine: Sequence[int],
    topk: Sequence[Sequence[int]],
    tail: Sequence[int] = (),
    rescues: Sequence[RescueBranch] = (),
    *,
    prefix_len: int,
    config: GeometryConfig = GeometryConfig(),
    conv_width: int = CONV_WIDTH,
) -> TreeDescriptor:
    """Assemble the draft tree from MTP and suffix proposals.

    spine[d-1] is the MTP spine token at depth d and topk[d-1] that depth's ordered top-k; the
    top-k entries that differ from the spine token, in order, become sibling leaves under the
    spine node at depth d-1. The tail continues the spine. Rescue branches attach below existing
    nodes. A proposal repeating a token already under the same parent is merged (counted in
    `merges`); proposals past the row budget or max depth are dropped.
    """
    builder = TreeBuilder(root_token, max_nodes=config.rows, max_depth=config.max_depth)
    grow_mtp_part(builder, spine, topk, tail, config)
    for branch, length in zip(rescues, config.rescue_lens, strict=False):
        at = builder.find(branch.attach)
        if at is None:
            raise TreeError(f"rescue branch attaches below {list(branch.attach)}, which is not in the tree")
        builder.extend(at, branch.tokens[:length])
    return builder.build(prefix_len=prefix_len, rows=config.rows, conv_width=conv_width)


def grow_mtp_part(
    builder: TreeBuilder,
    spine: Sequence[int],
    topk: Sequence[Sequence[int]],
    tail: Sequence[int],
    config: GeometryConfig,
) -> None:
    """Add the MTP spine with the suffix tail after it, then each depth's runner-ups (the top-k
    entries that differ from the spine token, in order) as siblings of that depth's spine node."""
    if len(topk) < min(len(spine), config.depth_mtp):
        raise TreeError(f"need a top-k list per MTP depth: {len(spine)} spine tokens, {len(topk)} lists")
    spine_nodes = [0]
    for t in [*spine[: config.depth_mtp], *tail[: config.tail_len]]:
        node = builder.add(spine_nodes[-1], t)
        if node is None:
            break
        spine_nodes.append(node)
    for d, (spine_tok, ranked) in enumerate(zip(spine[: config.depth_mtp], topk, strict=False)):
        if d >= len(spine_nodes):
            break
        for t in [t for t in ranked if t != spine_tok][: config.siblings_per_depth]:
            builder.add(spine_nodes[d], t)
