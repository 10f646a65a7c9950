"""The model's dense elementwise ops in plain PyTorch: the definitions the Triton kernels in
`elementwise.py` are tested against, and the path every non-CUDA tensor takes.

Each keeps the cast points of the Qwen3.5 checkpoints' own modules (fp32 norms cast back to the
activation dtype, gates computed in fp32): on the CPU these are the model's formulas, bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lumotree.model.rope import apply_rotary


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Zero-centred RMSNorm over the last dim: x / rms(x) * (1 + w), in fp32, cast to x's dtype."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (1.0 + weight.float())).type_as(x)


def add_rms_norm(h: Tensor, delta: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """The residual add and the next pre-norm: (h + delta in h's dtype, rms_norm of that sum)."""
    total = h + delta
    return total, rms_norm(total, weight, eps)


def mtp_inputs(
    table: Tensor, tokens: Tensor, hidden: Tensor, w_embed: Tensor, w_hidden: Tensor, eps: float
) -> Tensor:
    """The MTP module's fc input: [rms_norm(embedding of tokens), rms_norm(hidden)] along the last
    dim; table [vocab, D] is the (shared) embedding, tokens [...] int, hidden [..., D]."""
    embeds = F.embedding(tokens, table)
    return torch.cat([rms_norm(embeds, w_embed, eps), rms_norm(hidden, w_hidden, eps)], dim=-1)


def gated_rms_norm(x: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    """GDN output norm per value head: w * (x / rms(x)) * silu(gate), cast points of the checkpoint."""
    dtype = x.dtype
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)
    y = weight * y
    return (y * F.silu(gate.float())).to(dtype)


def silu_mul(gate_up: Tensor) -> Tensor:
    """SwiGLU's activation on a fused [gate | up] projection [..., 2I] -> silu(gate) * up [..., I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def norm_rope(x: Tensor, weight: Tensor, eps: float, cos: Tensor, sin: Tensor) -> Tensor:
    """Attention's per-head q/k norm then partial RoPE: x [B, T, heads, D] -> same shape."""
    return apply_rotary(rms_norm(x, weight, eps), cos, sin)


def sigmoid_mul(x: Tensor, gate: Tensor) -> Tensor:
    """Attention's output gate: x * sigmoid(gate), in x's dtype."""
    return x * torch.sigmoid(gate)
