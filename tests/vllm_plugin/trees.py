"""Small trees for the plugin's tests, written as their root-to-leaf token paths."""

from __future__ import annotations

from collections.abc import Sequence

from lumotree.tree import TreeBuilder, TreeDescriptor


def tree_from_paths(root_token: int, paths: Sequence[Sequence[int]], *, prefix_len: int) -> TreeDescriptor:
    """The tree whose paths below the root are `paths` (shared prefixes merge), unpadded."""
    builder = TreeBuilder(root_token, max_nodes=1 + sum(len(p) for p in paths))
    for path in paths:
        builder.extend(0, path)
    return builder.build(prefix_len=prefix_len, rows=None)
