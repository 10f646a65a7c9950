"""Fused draft selection in Triton, beside `selection.py`: argmax + ordered top-k in one pass.

Both outputs come from one ranking, values descending with ties by index ascending: its first
entry is the lowest-index argmax (the spine token) and its first k entries are the ordered top-k,
so the pinned tie rules of the reference hold by construction. Stage 1: one program per (row,
vocabulary block) ranks its block's k best; stage 2: one program per row ranks the blocks'
candidates and writes spine [N] and top-k [N, k] straight into caller-owned (graph) buffers.

Stage 1 also scores the exponential race of the sampling walk (`SCORE_RACE`): score = p / -log(u)
with Philox coins u keyed by (seed, output position, token), -1 where p = 0, exactly as
`lumotree.sampling.rng` defines it (node u samples position root_position + depth(u)).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from lumotree.drafting.selection import _check_scores

BLOCK_VOCAB = 2048
# Index 2**31 - 1 marks "no candidate": it ranks after every real index, so ties at -inf keep
# the lowest real index.


@triton.jit
def _rank_k(x, idx, avail, part_val_ptr, part_idx_ptr, K: tl.constexpr):
    """Store the k best (value desc, index asc) of x among `avail` at part_*_ptr[0:K]."""
    for j in tl.static_range(K):
        cand = tl.where(avail, x, float("-inf"))
        best = tl.max(cand, axis=0)
        best_idx = tl.min(tl.where(avail & (cand == best), idx, 2147483647), axis=0)
        tl.store(part_val_ptr + j, best)
        tl.store(part_idx_ptr + j, best_idx)
        avail = avail & (idx != best_idx)


@triton.jit
def topk_partial_kernel(
    scores_ptr,
    stride_row,
    V,
    part_val_ptr,
    part_idx_ptr,
    NB,
    seeds_ptr,
    root_pos_ptr,
    depth_ptr,
    R,
    K: tl.constexpr,
    BLOCK: tl.constexpr,
    SCORE_RACE: tl.constexpr,
):
    row = tl.program_id(0)
    blk = tl.program_id(1)
    idx = blk * BLOCK + tl.arange(0, BLOCK)
    in_vocab = idx < V
    if SCORE_RACE:
        # row = walk * R + node; probabilities are shared by walks, coins are not.
        walk = row // R
        node = row % R
        p = tl.load(scores_ptr + node.to(tl.int64) * stride_row + idx, mask=in_vocab, other=0.0).to(
            tl.float32
        )
        seed = tl.load(seeds_ptr + walk)
        pos = tl.load(root_pos_ptr) + tl.load(depth_ptr + node)
        zero = tl.zeros([BLOCK], dtype=tl.uint32)
        lo = (pos & 0xFFFFFFFF).to(tl.uint32)
        hi = (pos >> 32).to(tl.uint32)
        c0, _, _, _ = tl.philox(seed, idx.to(tl.uint32), zero + lo, zero + hi, zero)
        coin = tl.random.uint_to_uniform_float(c0)
        x = tl.where(p > 0.0, p / -tl.log(coin), -1.0)
    else:
        x = tl.load(scores_ptr + row.to(tl.int64) * stride_row + idx, mask=in_vocab, other=0.0).to(tl.float32)
    out = (row * NB + blk) * K
    _rank_k(x, idx, in_vocab, part_val_ptr + out, part_idx_ptr + out, K)


@triton.jit
def topk_merge_kernel(
    part_val_ptr,
    part_idx_ptr,
    NB,
    spine_ptr,
    topk_ptr,
    ids_ptr,
    K: tl.constexpr,
    KOUT: tl.constexpr,
    CP: tl.constexpr,
    MAP_IDS: tl.constexpr,
):
    row = tl.program_id(0)
    c = tl.arange(0, CP)
    live = c < NB * K
    x = tl.load(part_val_ptr + row * NB * K + c, mask=live, other=float("-inf"))
    idx = tl.load(part_idx_ptr + row * NB * K + c, mask=live, other=2147483647)
    avail = live & (idx != 2147483647)
    for j in tl.static_range(KOUT):
        cand = tl.where(avail, x, float("-inf"))
        best = tl.max(cand, axis=0)
        best_idx = tl.min(tl.where(avail & (cand == best), idx, 2147483647), axis=0)
        token = best_idx.to(tl.int64)
        if MAP_IDS:
            token = tl.load(ids_ptr + best_idx).to(tl.int64)
        tl.store(topk_ptr + row * KOUT + j, token)
        if j == 0:
            tl.store(spine_ptr + row, token)
        avail = avail & (idx != best_idx)


def selection_scratch(rows: int, vocab: int, k: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Stage-1 candidates of `rows` score rows: values fp32 and indices int32 [rows * blocks * k]."""
    n = rows * triton.cdiv(vocab, BLOCK_VOCAB) * k
    return (
        torch.empty(n, dtype=torch.float32, device=device),
        torch.empty(n, dtype=torch.int32, device=device),
    )


def rank_rows_(
    scores: Tensor,
    spine: Tensor,
    topk: Tensor,
    scratch: tuple[Tensor, Tensor],
    *,
    race: tuple[Tensor, Tensor, Tensor] | None = None,
    rows: int | None = None,
    ids: Tensor | None = None,
) -> None:
    """Caller-owned form. scores [N, V] (row stride free, last dim contiguous) -> spine [N'] int64
    and topk [N', k] int64 (k = topk.shape[1]). race = (seeds [W] int64, root_position [1] int64,
    depth [N] int64) scores the exponential race instead, over N' = W * N rows (row w * N + u uses
    scores[u], seed w and output position root_position + depth[u]). ids [V] int64: write ids[j]
    for the ranked column j (a draft vocabulary's token ids; sorted ascending, they keep the ties'
    order)."""
    n, vocab = scores.shape
    k = topk.shape[1]
    blocks = triton.cdiv(vocab, BLOCK_VOCAB)
    out_rows = n if rows is None else rows
    seeds, root_pos, depth = race if race is not None else (spine, spine, spine)
    topk_partial_kernel[(out_rows, blocks)](
        scores,
        scores.stride(0),
        vocab,
        scratch[0],
        scratch[1],
        blocks,
        seeds,
        root_pos,
        depth,
        n,
        K=k,
        BLOCK=BLOCK_VOCAB,
        SCORE_RACE=race is not None,
        num_warps=4,
    )
    topk_merge_kernel[(out_rows,)](
        scratch[0],
        scratch[1],
        blocks,
        spine,
        topk,
        spine if ids is None else ids,
        K=k,
        KOUT=k,
        CP=triton.next_power_of_2(blocks * k),
        MAP_IDS=ids is not None,
        num_warps=4,
    )


def select_spine_topk(scores: Tensor, k: int = 3) -> tuple[Tensor, Tensor]:
    """Fused selection of one logits tensor per MTP depth: scores [N, V] -> (spine [N], topk [N, k])."""
    _check_scores(scores)
    n, vocab = scores.shape
    if not 1 <= k <= vocab:
        raise ValueError(f"k must be in 1..{vocab}, got {k}")
    spine = torch.empty(n, dtype=torch.int64, device=scores.device)
    topk = torch.empty((n, k), dtype=torch.int64, device=scores.device)
    rank_rows_(scores.contiguous(), spine, topk, selection_scratch(n, vocab, k, scores.device))
    return spine, topk


def argmax_lowest_index(scores: Tensor) -> Tensor:
    """The reference's signature: scores [..., V] -> int64 [...], lowest index of the maximum."""
    flat = scores.reshape(-1, scores.shape[-1])
    return select_spine_topk(flat, 1)[0].reshape(scores.shape[:-1])


def ordered_topk(scores: Tensor, k: int) -> Tensor:
    """The reference's signature: scores [..., V] -> int64 [..., k], values desc, ties index asc."""
    flat = scores.reshape(-1, scores.shape[-1])
    return select_spine_topk(flat, k)[1].reshape(*scores.shape[:-1], k)
