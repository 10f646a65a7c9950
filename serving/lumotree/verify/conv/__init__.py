"""Tree causal conv1d with ancestry gather, and conv-state publication."""

from lumotree.verify.conv.reference import publish_conv_state_, tree_conv

__all__ = ["publish_conv_state_", "tree_conv"]
