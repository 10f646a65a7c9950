"""Tree attention with the ancestry mask and spine-first slots, partial RoPE, and KV-remap publication."""

from lumotree.verify.attention.reference import (
    apply_partial_rope,
    publish_kv_,
    rope_cos_sin,
    tree_attention,
    tree_attention_mask,
    write_tree_kv_,
)

__all__ = [
    "apply_partial_rope",
    "publish_kv_",
    "rope_cos_sin",
    "tree_attention",
    "tree_attention_mask",
    "write_tree_kv_",
]
