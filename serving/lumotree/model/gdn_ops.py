"""Gated DeltaNet sequence operators in plain PyTorch: depthwise causal conv, recurrent and chunked forms.

Conventions (shared with lumotree's core and engine):
- recurrent state is fp32 and V-first: `[B, HV, V, K]` (S maps a key to a value: read = S @ q);
- conv state holds the last W-1 pre-conv inputs, oldest first: `[B, C, W-1]`;
- operands passed to the recurrences are already prepared by `prepare_qk` (fp32, q/k L2-normalised
  with eps 1e-6 inside the sqrt, q scaled by dk^-1/2, key heads repeated to the value heads so value
  head h reads key head h // (HV/H)), and `g` (log decay, <= 0) and `beta` are fp32 `[B, T, HV]`.

One step of the recurrence, per value head (decay first, predict with the decayed state, rank-1
write, read): S <- exp(g) S;  u = beta (v - S k);  S <- S + u k^T;  o = S q.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv1d(
    x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv + SiLU over time.

    x: [B, T, C] pre-conv inputs; weight: [C, W] (tap W-1 multiplies the newest input);
    conv_state: [B, C, W-1] inputs before x (None = zeros, i.e. sequence start).
    Returns (y [B, T, C] in x's dtype, new conv state [B, C, W-1] = last W-1 inputs of state ++ x).
    """
    bsz, _, channels = x.shape
    width = weight.shape[-1]
    if conv_state is None:
        conv_state = x.new_zeros(bsz, channels, width - 1)
    window = torch.cat([conv_state.to(x.dtype), x.transpose(1, 2)], dim=-1)  # [B, C, W-1+T]
    y = F.conv1d(window.to(weight.dtype), weight.unsqueeze(1), groups=channels)  # [B, C, T]
    y = F.silu(y).to(x.dtype).transpose(1, 2)
    return y, window[:, :, -(width - 1) :].clone()


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim (eps inside the sqrt, as fla and HF do)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def prepare_qk(q: torch.Tensor, k: torch.Tensor, num_v_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 recurrence operands from raw post-conv q, k `[B, T, H, K]` -> `[B, T, HV, K]` each."""
    q = l2norm(q.float())
    k = l2norm(k.float())
    repeats = num_v_heads // q.shape[2]
    if repeats > 1:
        q = q.repeat_interleave(repeats, dim=2)
        k = k.repeat_interleave(repeats, dim=2)
    return q * q.shape[-1] ** -0.5, k


def recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token recurrence (the definition; used for decode and as the test reference).

    q, k: [B, T, HV, K] prepared; v: [B, T, HV, V]; g, beta: [B, T, HV] fp32; state: [B, HV, V, K] fp32.
    Returns (o [B, T, HV, V] fp32, final state [B, HV, V, K] fp32). `state` is not modified.
    """
    bsz, seq, heads, dk = k.shape
    dv = v.shape[-1]
    s = q.new_zeros(bsz, heads, dv, dk) if state is None else state.float().clone()
    v = v.float()
    out = q.new_empty(bsz, seq, heads, dv)
    for t in range(seq):
        s = s * g[:, t].exp()[..., None, None]
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhvk,bhk->bhv", s, k[:, t]))
        s = s + u[..., :, None] * k[:, t, :, None, :]
        out[:, t] = torch.einsum("bhvk,bhk->bhv", s, q[:, t])
    return out, s


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same recurrence, chunk-parallel (WY form): one triangular solve per chunk, a scan over chunks.

    Same arguments and results as `recurrent_gated_delta_rule`; differentiable (training uses it).
    Within a chunk with cumulative log decay c, the writes U solve (I + A) U = beta*V - beta*exp(c)*K S0^T
    with A[i, j] = beta_i exp(c_i - c_j) k_i.k_j for j < i.
    """
    # fp32 throughout, also under a caller's bf16 autocast: the solve and the state scan need it.
    with torch.autocast(q.device.type, enabled=False):
        return _chunk_fp32(q, k, v, g, beta, state, chunk_size)


def _chunk_fp32(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    bsz, seq, heads, dk = k.shape
    dv = v.shape[-1]
    pad = (-seq) % chunk_size
    # [B, HV, N, C, *]: heads first, then chunks.
    q, k, v = (F.pad(x.float().transpose(1, 2), (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x.float().transpose(1, 2), (0, pad)) for x in (g, beta))
    n = (seq + pad) // chunk_size
    q, k, v = (x.reshape(bsz, heads, n, chunk_size, -1) for x in (q, k, v))
    g, beta = (x.reshape(bsz, heads, n, chunk_size) for x in (g, beta))

    c = g.cumsum(-1)  # [B, HV, N, C]
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()
    # exp(c_i - c_j) on and below the diagonal (<= 1, so no overflow), 0 above.
    decay = (c[..., :, None] - c[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    k_beta = k * beta[..., None]
    a = ((k_beta @ k.transpose(-1, -2)) * decay).tril(-1)
    eye = torch.eye(chunk_size, dtype=q.dtype, device=q.device)
    system = eye + a
    w_v = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False, unitriangular=True)
    w_k = torch.linalg.solve_triangular(system, k_beta * c.exp()[..., None], upper=False, unitriangular=True)
    qk = (q @ k.transpose(-1, -2)) * decay  # [B, HV, N, C, C], includes the diagonal
    q_decayed = q * c.exp()[..., None]
    k_to_end = k * (c[..., -1:] - c).exp()[..., None]  # decay from each row to the chunk end
    chunk_decay = c[..., -1].exp()  # [B, HV, N]

    s = q.new_zeros(bsz, heads, dv, dk) if state is None else state.float()
    outs = []
    for i in range(n):
        u = w_v[:, :, i] - w_k[:, :, i] @ s.transpose(-1, -2)  # [B, HV, C, V]
        outs.append(q_decayed[:, :, i] @ s.transpose(-1, -2) + qk[:, :, i] @ u)
        s = s * chunk_decay[:, :, i, None, None] + u.transpose(-1, -2) @ k_to_end[:, :, i]
    out = torch.stack(outs, dim=2).reshape(bsz, heads, n * chunk_size, dv)[:, :, :seq]
    return out.transpose(1, 2), s
