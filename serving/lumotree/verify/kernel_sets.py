"""The op families the model's tree-verification mode calls, as swappable sets: each set is a list
of imports from the op folders.

`REFERENCE` is the LumoTree core's PyTorch references (lumotree.verify.*.reference), one call per
layer. `CPU_FAST` swaps in the CPU-fast variants of the hot ones, each beside its reference in its
op folder: the tree WY form of GDN verification (`gdn/tree_wy.py`), the stacked all-layer replay
(`gdn/stacked_replay.py`) and grouped-query tree attention (`attention/gqa.py`); tests prove each
equal to its reference. Conv and the conv/KV publication are cheap already and use the references.
Every kernel has the signature of the reference it stands for, except `replay`, which publishes all
GDN layers of a model in one call (so a variant may batch them), and the optional prepared GDN path
(`conv_operands` and `gdn_scan`: the Triton set's).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch import Tensor

from lumotree.tree import TreeDescriptor
from lumotree.verify.attention.gqa import tree_attention_gqa
from lumotree.verify.attention.reference import publish_kv_, tree_attention, write_tree_kv_
from lumotree.verify.conv.reference import publish_conv_state_, tree_conv
from lumotree.verify.gdn.reference import (
    GdnInputs,
    GdnOperands,
    GdnVerifyResult,
    gdn_verify,
    replay_accepted_,
)
from lumotree.verify.gdn.stacked_replay import replay_layers_
from lumotree.verify.gdn.tree_wy import gdn_verify_wy

GdnVerify = Callable[[GdnInputs, Tensor, TreeDescriptor], GdnVerifyResult]
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
    # every GDN layer's conv publication at once (states, their inputs, accepted, path length); None:
    # publish_conv per layer
    publish_conv_layers: Callable[[Sequence[Tensor], Sequence[Tensor], Tensor, int], None] | None = None
    # every attention layer's KV publication at once (K caches, V caches, tree, accepted, path
    # length); None: publish_kv per layer
    publish_kv_layers: (
        Callable[[Sequence[Tensor], Sequence[Tensor], TreeDescriptor, Tensor, int], None] | None
    ) = None
    # both or neither (`prepares_gdn`): the forward keeps every GDN layer's records in stacked banks
    # (publication reads them without stacking); a layer's conv copies its inputs and prepares the
    # scan's operands into its slices in one launch (x, conv state, weight, tree, gates, conv input
    # record, records), and the scan reads them (records, state, tree, output dtype) -> o
    conv_operands: Callable[..., None] | None = None
    gdn_scan: Callable[..., Tensor] | None = None
    # tree attention with the output gate applied as it stores (q, K and V caches, tree, the gate
    # [R, Hq, D] pre-sigmoid -> o * sigmoid(gate) with the model's sigmoid_mul bits); None:
    # tree_attention, then the model's gate
    gated_tree_attention: Callable[[Tensor, Tensor, Tensor, TreeDescriptor, Tensor], Tensor] | None = None

    @property
    def prepares_gdn(self) -> bool:
        """Whether the forward takes the prepared GDN path (the conv prepares, the scan reads)."""
        return self.conv_operands is not None and self.gdn_scan is not None


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

CPU_FAST = TreeKernels(
    name="cpu-fast",
    tree_conv=tree_conv,
    gdn_verify=gdn_verify_wy,
    write_tree_kv=write_tree_kv_,
    tree_attention=tree_attention_gqa,
    replay=replay_layers_,
    publish_conv=publish_conv_state_,
    publish_kv=publish_kv_,
)


def triton_kernels() -> TreeKernels:
    """The Triton set (`lumotree.verify.device_ops`): the tree argument is a `DeviceTree` and the
    accepted path lives on the device. Imported on demand: CPU-only installs may lack Triton."""
    from lumotree.verify import device_ops

    return TreeKernels(
        name="triton",
        tree_conv=device_ops.tree_conv,
        gdn_verify=device_ops.gdn_verify,
        write_tree_kv=device_ops.write_tree_kv,
        tree_attention=device_ops.tree_attention,
        replay=device_ops.replay,
        publish_conv=device_ops.publish_conv,
        publish_kv=device_ops.publish_kv,
        publish_conv_layers=device_ops.publish_conv_layers,
        publish_kv_layers=device_ops.publish_kv_layers,
        conv_operands=device_ops.conv_operands,
        gdn_scan=device_ops.gdn_scan,
        gated_tree_attention=device_ops.gated_tree_attention,
    )
