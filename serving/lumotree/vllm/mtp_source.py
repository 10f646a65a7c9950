"""Each request's MTP drafter, from the checkpoint's MTP head (loaded without its decoder layers):
on the native forward (`NativeMTPDrafter`: a proposal's passes and selection in one C call; one
packed copy of the head shared by every request, each with its own MTP cache), the CPU default, or
in PyTorch (`MTPDrafter`, the project engine's). Drafts only decide what is verified, never what
is emitted, so either source leaves outputs unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from lumotree.drafting.mtp import MTPDrafter
from lumotree.drafting.native_mtp import NativeMTPDrafter
from lumotree.model.model import HybridLM
from lumotree.model.native.model import NativeModel, unsupported_reason
from lumotree.model.state import ModelState

_SHARED = (".mlp.shared_expert.", ".mlp.shared_expert_gate.")
COMMIT_ROWS = 256  # MTP rows of one native pass: a prefill chunk is committed in blocks of this many


def dense_equivalent(model: HybridLM) -> HybridLM:
    """`model` with its one-expert MoE blocks whose shared expert is zero (dense MLPs exported for
    vLLM's Qwen3-Next, `save_checkpoint(dense_mlp_as_moe=True)`: top-1 of one expert weighs 1.0) as
    the dense MLPs they equal, which the native forward runs; `model` itself when it has others."""
    cfg = model.config
    state = model.state_dict()
    if cfg.num_experts != 1 or any(t.any() for k, t in state.items() if any(s in k for s in _SHARED)):
        return model
    dense = HybridLM(cfg.replace(num_experts=0, intermediate_size=cfg.moe_intermediate_size))
    tensors = {
        k.replace(".mlp.experts.0.", ".mlp."): t
        for k, t in state.items()
        if not any(s in k for s in _SHARED) and not k.endswith(".mlp.gate.weight")
    }
    dense.load_state_dict(tensors)
    return dense.to(device=model.device, dtype=model.dtype).eval()


class MTPSourceFactory:
    """MTP drafters over `model` with caches of `capacity` rows; native when asked and the native
    forward serves the model (float32, bfloat16-exact weights, dense MLPs or their exact one-expert
    wrapping), else PyTorch with the vocabulary projection in `head_dtype`."""

    def __init__(self, model: HybridLM, capacity: int, native: bool, head_dtype: str) -> None:
        self.native: NativeModel | None = None
        if native:
            model = dense_equivalent(model)
        self.model, self.capacity, self.head_dtype = model, capacity, head_dtype
        if native and unsupported_reason(model) is None:
            state = ModelState([], 0)  # no decoder layers: the MTP passes bring their own caches
            self.native = NativeModel(model, state, 1, COMMIT_ROWS, capacity=capacity)

    def new(self, depth: int, k: int) -> MTPDrafter:
        """A request's drafter: `depth` passes, ordered top-k per depth."""
        if self.native is not None:
            return NativeMTPDrafter(self.model, depth, k, self.capacity, self.native)
        return MTPDrafter.for_engine(self.model, depth, k, self.capacity, self.head_dtype, None)


def commit(mtp: MTPDrafter, hidden: Tensor, next_tokens: Sequence[int]) -> None:
    """Commit true rows (hidden [n, H], in the drafter's dtype) in passes of at most COMMIT_ROWS rows."""
    for i in range(0, len(next_tokens), COMMIT_ROWS):
        mtp.commit(hidden[i : i + COMMIT_ROWS], next_tokens[i : i + COMMIT_ROWS])
