"""The model runner: the target model, the active request's state bank and the tensor-level steps
(prefill chunks, tree verification, lazily computed logits rows, publication).

One active sequence: the state bank (GDN recurrent + conv state per linear layer, KV cache per
attention layer) is allocated once with room for max_model_len tokens plus one tree, and reset
between requests.

Padding rows give a GPU fixed shapes; on a CPU they only cost compute, so the runner verifies the
active rows alone (`TreeDescriptor.without_padding`): padding is invisible to every stage by
contract, so results are the same.

With a `NativeModel` (the cpu-native kernels) verification, publication and logits rows run in the
model's native C forward over the same state tensors; prefill stays in the model's PyTorch code.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lumotree.model.model import HybridLM
from lumotree.model.native.model import NativeModel
from lumotree.model.state import GDNState, ModelState
from lumotree.model.tree_mode import TreeForward, publish_tree_, verify_tree
from lumotree.tree import TreeDescriptor
from lumotree.verify.kernel_sets import TreeKernels


class ModelRunner:
    """Tensor work for the engine; `capacity` = KV rows of the state bank. native=(tree rows, MTP
    rows): verification, publication, logits and MTP passes run in the native forward instead, its
    MTP proposals over `draft_ids` (a draft vocabulary; None: the whole vocabulary)."""

    def __init__(
        self,
        model: HybridLM,
        capacity: int,
        kernels: TreeKernels,
        native: tuple[int, int] | None = None,
        draft_ids: Tensor | None = None,
    ) -> None:
        self.model, self.kernels, self.capacity = model, kernels, capacity
        self.state: ModelState = model.new_state(capacity)
        self.native = NativeModel(model, self.state, *native, draft_ids=draft_ids) if native else None

    @property
    def length(self) -> int:
        """Tokens materialised in the state (the next position)."""
        return self.state.length

    def reset(self) -> None:
        """Empty state for a new request (KV rows past `length` are never read, so they stay)."""
        for layer in self.state.layers:
            if isinstance(layer, GDNState):
                layer.recurrent.zero_()
                layer.conv.zero_()
        self.state.length = 0

    @torch.inference_mode()
    def prefill(self, tokens: list[int]) -> Tensor:
        """Fold prompt tokens into the state (sequence mode). Returns post-norm hidden [n, H]."""
        return self.model.prefill(torch.tensor(tokens, dtype=torch.long), self.state)

    @torch.inference_mode()
    def logits(self, hidden: Tensor) -> Tensor:
        """hidden [n, H] -> logits [n, V]."""
        if self.native is not None:
            return self.native.logits(hidden)
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def verify(self, tree: TreeDescriptor) -> TreeForward:
        """One target forward over every active tree row (the durable state is only read)."""
        if self.native is not None:
            return TreeForward(tree, self.native.verify(tree), [])
        return verify_tree(self.model, self.state, tree.without_padding(), self.kernels)

    @torch.inference_mode()
    def publish(self, forward: TreeForward, accepted: list[int]) -> None:
        """Publish the accepted path (logical nodes, root first) into the state."""
        if self.native is not None:
            self.native.publish(forward.tree, accepted)
            return
        path = forward.tree.padded_path(accepted)
        publish_tree_(self.state, forward, path, len(accepted), self.kernels)
