"""The drafting family: one `Drafter`, built from a geometry, turns the MTP proposal the last cycle
drafted and (for the tree) the suffix drafter's continuations into the next cycle's tree topology.

    AR     depth_mtp 0:                         the pending root alone (one decode step)
    chain  siblings 0, no tail, no rescues:     root -> the MTP spine (chain MTP-k)
    tree   the paper geometry (DESIGN §3.2):    MTP spine + ordered siblings, the suffix drafter's
                                                principal tail after the spine, rescue branches

The MTP passes themselves belong to the runner that owns the model (`mtp.MTPDrafter` with the
PyTorch kernels, `native_mtp.NativeMTPDrafter`, `device_mtp.DeviceMTP` inside the device cycle):
every kernel set runs them at the end of its cycle over the accepted path, so a drafter only
assembles. It returns a `TreeTopology`; each runner builds the tables it needs from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from lumotree.drafting.geometry import GeometryConfig
from lumotree.drafting.mtp import MTPProposal
from lumotree.drafting.suffix import SuffixDrafter
from lumotree.tree import TreeBuilder, TreeTopology, chain_topology

DrafterKind = Literal["ar", "mtp", "tree"]


class Drafter:
    """Tree topologies of one geometry; `suffix` (the tree's suffix drafter) learns the request's
    prompt (`begin`) and emitted tokens (`emitted`), and keeps its output when it ends (`finish`)."""

    def __init__(self, geometry: GeometryConfig, suffix: SuffixDrafter | None = None) -> None:
        self.geometry = geometry
        chain = not (geometry.siblings_per_depth or geometry.tail_len or geometry.rescue_lens)
        self.kind: DrafterKind = "ar" if geometry.depth_mtp == 0 else "mtp" if chain else "tree"
        if self.kind == "tree" and suffix is None:
            raise ValueError("the tree geometry needs a suffix drafter")
        self.suffix = suffix if self.kind == "tree" else None

    @property
    def max_depth(self) -> int:
        """Deepest draft this drafter can propose (the length of accepted_per_pos)."""
        return {"ar": 0, "mtp": self.geometry.depth_mtp, "tree": self.geometry.max_depth}[self.kind]

    @property
    def uses_mtp(self) -> bool:
        """Whether its trees need MTP proposals."""
        return self.kind != "ar"

    def begin(self, prompt: Sequence[int]) -> None:
        """A new request."""
        if self.suffix is not None:
            self.suffix.begin(prompt)

    def emitted(self, tokens: Sequence[int]) -> None:
        """Tokens the request emitted (kept ones only)."""
        if self.suffix is not None:
            self.suffix.extend(tokens)

    def finish(self) -> None:
        """The request ended."""
        if self.suffix is not None:
            self.suffix.finish()

    def topology(self, root: int, proposal: MTPProposal | None) -> TreeTopology:
        """The tree below the pending `root` from the last cycle's MTP proposal."""
        if self.kind == "ar":
            return chain_topology([root])
        if proposal is None:
            raise ValueError(f"the {self.kind} drafter needs an MTP proposal")
        if self.kind == "mtp":
            return chain_topology([root, *proposal.spine[: self.geometry.depth_mtp]])
        assert self.suffix is not None
        return paper_topology(self.suffix, self.geometry, root, proposal)


def paper_topology(
    suffix: SuffixDrafter, geo: GeometryConfig, root: int, proposal: MTPProposal
) -> TreeTopology:
    """The paper tree below `root`: the proposal's spine and siblings, the suffix drafter's
    principal tail after the spine, and rescue branches: the best suffix continuations of the root
    that leave the tree so far, each hung below the node where it leaves, the i-th cut to
    geo.rescue_lens[i]. The same nodes and budget as `build_paper_tree` with those branches, in the
    order root, spine and tail, siblings by depth, rescue branches (no breadth-first reordering:
    this runs between two cycles, and every stage reads the topology whatever its order)."""
    tails = suffix.continuations(proposal.spine, geo.tail_len, 1)
    tail = tails[0].continuation if tails else ()
    tree = TreeBuilder(root, max_nodes=geo.rows, max_depth=geo.max_depth)
    spine = [0]
    for token in [*proposal.spine[: geo.depth_mtp], *tail[: geo.tail_len]]:
        node = tree.add(spine[-1], token)
        if node is None:
            break
        spine.append(node)
    for d, (token, ranked) in enumerate(zip(proposal.spine[: geo.depth_mtp], proposal.topk, strict=False)):
        if d >= len(spine):
            break
        for sibling in [t for t in ranked if t != token][: geo.siblings_per_depth]:
            tree.add(spine[d], sibling)
    placed = 0
    if geo.rescue_lens:
        for match in suffix.continuations((), geo.max_depth, 2 * len(geo.rescue_lens)):
            cont, node, at = match.continuation, 0, 0
            while at < len(cont) and (child := tree.children[node].get(cont[at])) is not None:
                node, at = child, at + 1
            branch = cont[at : at + geo.rescue_lens[placed]]
            if not branch:
                continue
            tree.extend(node, branch)
            placed += 1
            if placed == len(geo.rescue_lens):
                break
    return tree.in_order()
