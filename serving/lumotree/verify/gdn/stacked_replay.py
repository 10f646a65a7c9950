"""Accepted-path publication of all GDN layers at once, in PyTorch: the CPU-fast kernel set's replay.

The reference step per accepted node applied to the stacked states of every layer, bitwise equal to
`reference.replay_accepted_` layer by layer (one op per step for all layers instead of one per
layer). `replay.py` is the Triton form.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from lumotree.verify.gdn.reference import GdnOperands


def replay_layers_(
    states: Sequence[Tensor], operands: Sequence[GdnOperands], accepted: Tensor, path_len: int
) -> None:
    """Publish accepted[0:path_len] into every layer's state [HV, V, K] in place, all layers per step."""
    path = accepted[:path_len]
    stacked = torch.stack(list(states))  # [L, HV, V, K]
    group = operands[0].group
    k = torch.stack([o.k[path] for o in operands], dim=1).repeat_interleave(group, dim=2)  # [P, L, HV, K]
    v = torch.stack([o.v[path] for o in operands], dim=1)
    decay = torch.exp(torch.stack([o.g[path] for o in operands], dim=1))
    beta = torch.stack([o.beta[path] for o in operands], dim=1)
    for i in range(path_len):
        ki = k[i][:, :, None, :]
        stacked = stacked * decay[i][:, :, None, None]
        u = (v[i] - (stacked * ki).sum(-1)) * beta[i][:, :, None]
        stacked = stacked + u[..., None] * ki
    for dst, src in zip(states, stacked, strict=True):
        dst.copy_(src)
