"""Drafting: selection semantics and the paper's tree geometry."""

from lumotree.drafting.geometry import GeometryConfig, RescueBranch, build_paper_tree, mtp_proposals
from lumotree.drafting.selection import argmax_lowest_index, ordered_topk

__all__ = [
    "GeometryConfig",
    "RescueBranch",
    "argmax_lowest_index",
    "build_paper_tree",
    "mtp_proposals",
    "ordered_topk",
]
