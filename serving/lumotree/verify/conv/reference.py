"""Tree causal conv1d (depthwise, kernel W = 4, SiLU) and conv-state publication: the PyTorch reference.

Each row's window is gathered along its ancestry (`tree.conv_gather`); taps above the root come from
the committed conv state [C, W-1] (the last W-1 pre-conv inputs, oldest first). Pinned arithmetic,
which a kernel must keep: inputs, weights and bias are cast to the compute dtype (float64 for
float64 inputs, else float32); acc = bias (or 0); acc += w[:, t] * x[t] for t = 0..W-1 in order
(t = W-1 is the row's own input); y = silu(acc) cast back to the input dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lumotree.tree import TreeDescriptor
from lumotree.verify.gdn.reference import compute_dtype


def check_conv_shapes(x: Tensor, conv_state: Tensor, weight: Tensor, tree: TreeDescriptor) -> None:
    """Raise ValueError unless x [R, C], conv_state [C, W-1], weight [C, W] and the tree's windows agree."""
    rows, channels = x.shape
    width = weight.shape[1]
    if conv_state.shape != (channels, width - 1) or weight.shape[0] != channels:
        raise ValueError(
            f"expected x [R, C], conv_state [C, W-1], weight [C, W]; got {tuple(x.shape)}, "
            f"{tuple(conv_state.shape)}, {tuple(weight.shape)}"
        )
    if tree.conv_gather.shape != (rows, width):
        raise ValueError(
            f"tree gathers {tuple(tree.conv_gather.shape)} windows for {rows} rows of width {width}"
        )


def tree_conv(
    x: Tensor, conv_state: Tensor, weight: Tensor, bias: Tensor | None, tree: TreeDescriptor
) -> Tensor:
    """x [R, C] pre-conv inputs, conv_state [C, W-1] (same dtype), weight [C, W], bias [C] -> y [R, C]."""
    check_conv_shapes(x, conv_state, weight, tree)
    rows, channels = x.shape
    width = weight.shape[1]
    cd = compute_dtype(x.dtype)
    windows = torch.cat([conv_state.T.to(x.dtype), x])[tree.conv_gather]  # [R, W, C]
    acc = (
        torch.zeros((rows, channels), dtype=cd, device=x.device)
        if bias is None
        else bias.to(cd).expand(rows, channels)
    )
    w = weight.to(cd)
    for t in range(width):
        acc = acc + w[:, t] * windows[:, t].to(cd)
    return F.silu(acc).to(x.dtype)


def publish_conv_state_(conv_state: Tensor, x: Tensor, accepted: Tensor, path_len: Tensor | int) -> None:
    """Publish: conv_state [C, W-1] <- the last W-1 pre-conv inputs along accepted[0:path_len], in place.

    x [R, C] the tree's pre-conv inputs; accepted [D+1] int64 logical nodes (root first), -1 padded.
    """
    keep = conv_state.shape[1]
    path = accepted[: int(path_len)]
    history = torch.cat([conv_state.T, x[path].to(conv_state.dtype)])
    conv_state.copy_(history[-keep:].T)
