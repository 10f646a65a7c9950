"""The op families the model's tree-verification mode calls, as one swappable set.

`REFERENCE` is the LumoTree core's PyTorch references (lumotree.verify.*.reference), one call per
layer. `CPU_FAST` (lumotree.model.tree_kernels_cpu) holds CPU-fast variants of the hot ones; tests
prove each equal to its reference. Every kernel has the signature of the reference it stands for,
except `replay`, which publishes all GDN layers of a model in one call (so a variant may batch them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch import Tensor

from lumotree.tree import TreeDescriptor
from lumotree.verify.attention.reference import publish_kv_, tree_attention, write_tree_kv_
from lumotree.verify.conv.reference import publish_conv_state_, tree_conv
from lumotree.verify.gdn.reference import GdnOperands, GdnVerifyResult, gdn_verify, replay_accepted_

GdnVerify = Callable[
    [Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, TreeDescriptor], GdnVerifyResult
]
Replay = Callable[[Sequence[Tensor], Sequence[GdnOperands], Tensor, int], None]


@dataclass(frozen=True)
class TreeKernels:
    """One implementation per op family (see the module docstring for the signatures)."""

    name: str
    tree_conv: Callable[[Tensor, Tensor, Tensor, Tensor | None, TreeDescriptor], Tensor]
    gdn_verify: GdnVerify
    write_tree_kv: Callable[[Tensor, Tensor, Tensor, Tensor, TreeDescriptor], None]
    tree_attention: Callable[[Tensor, Tensor, Tensor, TreeDescriptor], tuple[Tensor, Tensor]]
    replay: Replay
    publish_conv: Callable[[Tensor, Tensor, Tensor, int], None]
    publish_kv: Callable[[Tensor, Tensor, TreeDescriptor, Tensor, int], bool]


def replay_each_layer_(
    states: Sequence[Tensor], operands: Sequence[GdnOperands], accepted: Tensor, path_len: int
) -> None:
    """Publish every GDN layer with the core's `replay_accepted_`, one layer at a time."""
    for state, ops in zip(states, operands, strict=True):
        replay_accepted_(state, ops, accepted, path_len)


REFERENCE = TreeKernels(
    name="reference",
    tree_conv=tree_conv,
    gdn_verify=gdn_verify,
    write_tree_kv=write_tree_kv_,
    tree_attention=tree_attention,
    replay=replay_each_layer_,
    publish_conv=publish_conv_state_,
    publish_kv=publish_kv_,
)
