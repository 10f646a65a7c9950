"""Skinny GEMM in Triton: y[M, N] = x[M, K] @ w[N, K]^T for 1..32 rows, beside `skinny_gemm_reference.py`.

Memory-bound streaming of nn.Linear weights: each program owns BLOCK_N output columns and walks its
share of K (all of it, or one of `splits` equal ranges for narrow outputs, whose fp32 partials the
range that finishes last sums in split order, in the same launch: a count per output block, no
atomics on values), loading [BLOCK_N, BLOCK_K] weight tiles along w's
contiguous rows and multiplying them with tl.dot against the rows of x, padded by masks to one row
tile (16 rows for 1..16, 32 for 17..32: one dot a K step, not two 16-row ones). Accumulation is
fp32; the output is in x's dtype. Epilogues: a residual added as the output stores (the output
and down projections), SwiGLU (`skinny_swiglu`: a [gate | up] projection's program streams its gate
rows and the matching up rows and stores silu(gate) * up: the MLP's gate-up projection), and the
two halves of the producer-side pre-norm (`pending_norm.py`): the next norm's operands stored
beside the output (`skinny_linear_normed`), and a pending norm's 1 / rms applied to the products
of the rows it normalises (`in_norm`).

Batch invariance: a row's arithmetic is one dot per K step, [BLOCK_N, BLOCK_K] x [BLOCK_K, ROWS],
in the same K order (and the same splits, summed in order) for every M, each output column its own
sum of products. So the result of a row does not depend on M if the MMA instruction computes each
output element the same way in every column of a 16- or 32-column tile (padding rows are zeros).
Under the interpreter the tests check it bit for bit with tl.dot summing in a fixed order (numpy's
matmul sums in its BLAS kernel's order, which may follow the column and the CPU). On the GPU NVIDIA
does not document it (tests/kernel_tests/test_gpu_skinny_gemm.py checks it). Not guaranteed: the
same result across configs, or against F.linear for M > 32.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from lumotree.model.fused.pending_norm import PendingNorm, block_stride

MAX_ROWS = 32
ROW_TILE = 16  # tl.dot's smallest dimension; every row tile is this tall
HOPPER_SMS = 132
TILE_BYTES = 16 * 1024  # bytes of weights per loaded tile
MAX_BLOCK_K = 256  # larger: the pipelined x tiles ([BLOCK_K, 16] per row tile, stage) crowd shared memory
WIDE_WAVES = 1.6  # programs per SM a wide output's blocks must reach
SPLIT_PROGRAMS_PER_SM = 2  # programs per SM a split narrow output aims at (all on the SMs at once)
MIN_SPLIT_STEPS = 8  # weight tiles per split, at least
WINNING_SPLIT_STEPS = 32  # weight tiles per split from which the split kernel beat cuBLAS
DTYPES = (torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class SkinnyConfig:
    """Tile sizes and launch options of one skinny-GEMM launch (the same for every M)."""

    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    splits: int = 1  # K ranges per output block (fp32 partials, summed in order by the last range)

    def label(self) -> str:
        return f"n{self.block_n} k{self.block_k} w{self.num_warps} s{self.num_stages} x{self.splits}"

    @staticmethod
    def for_shape(
        n: int, k: int, device: torch.device | str, dtype: torch.dtype = torch.bfloat16
    ) -> SkinnyConfig:
        """128-wide blocks where they make 2 to 8 waves of programs over the SMs, else 64-wide ones
        where those fill WIDE_WAVES waves, with the BLOCK_K that makes a weight tile TILE_BYTES.
        Narrower outputs (the 5120-wide output projections) take 64-wide blocks too and split K
        into the number of ranges that makes about SPLIT_PROGRAMS_PER_SM programs per SM, at least
        MIN_SPLIT_STEPS tiles a range: few enough that every program is on the SMs at once at 32
        rows too, where the x tiles of two row tiles take shared memory (32-wide blocks in 4
        ranges, the earlier rule, made 640 programs, 4 an SM fit at 32 rows: 61.8 against 55.6 us
        at one row for 5120 x 17408; 3 ranges of 64-wide blocks run 55.4 / 55.2 / 56.8 us at 1 / 6
        / 32 rows, the H200 sweep of results/h200/skinny_narrow.md)."""
        sms = _sm_count(torch.device(device))
        item = torch.finfo(dtype).bits // 8
        waves_128 = triton.cdiv(n, 128) / sms
        for block_n in (128, 64):
            if (block_n == 128 and 2 <= waves_128 < 8) or (block_n == 64 and waves_128 * 2 >= WIDE_WAVES):
                block_k = max(16, min(TILE_BYTES // (block_n * item), MAX_BLOCK_K, triton.next_power_of_2(k)))
                return SkinnyConfig(block_n=block_n, block_k=block_k)
        block_n = 64
        block_k = max(16, min(TILE_BYTES // (block_n * item), 128, triton.next_power_of_2(k)))
        wanted = max(1, round(SPLIT_PROGRAMS_PER_SM * sms / triton.cdiv(n, block_n)))
        splits = max(1, min(wanted, k // (block_k * MIN_SPLIT_STEPS)))
        return SkinnyConfig(block_n=block_n, block_k=block_k, splits=splits)


@functools.cache
def beats_cublas(n: int, k: int, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the for_shape kernel was measured faster than cuBLAS at 1-16 rows for a shape like
    this (results/h200/skinny_gemm.md, skinny_narrow.md): every unsplit shape was, and split shapes
    whose splits keep at least WINNING_SPLIT_STEPS weight tiles (5120 x 17408: 45 tiles a split,
    1.10x at one row); 5120 x 6144 (16 tiles a split) ran level with cuBLAS."""
    cfg = SkinnyConfig.for_shape(n, k, device, dtype)
    return cfg.splits == 1 or k // (cfg.block_k * cfg.splits) >= WINNING_SPLIT_STEPS


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return HOPPER_SMS


@triton.jit
def _row_tile_dot(
    acc, w, x_ptr, rows, offs_k, stride_xm, M, K, EVEN_K: tl.constexpr, PRECISION: tl.constexpr
):
    """acc[BLOCK_N, 16] += w[BLOCK_N, BLOCK_K] @ x[rows, offs_k]^T, padding rows >= M with zeros."""
    mask = rows[None, :] < M
    if not EVEN_K:
        mask = mask & (offs_k[:, None] < K)
    xt = tl.load(x_ptr + rows[None, :].to(tl.int64) * stride_xm + offs_k[:, None], mask=mask, other=0.0)
    return tl.dot(w, xt, acc, input_precision=PRECISION)


@triton.jit
def _store_tile(ptr, acc, rows, offs_n, M, N, stride_m):
    """ptr[rows, offs_n] = acc (in ptr's dtype), rows >= M and columns >= N left alone."""
    out = ptr + rows[None, :].to(tl.int64) * stride_m + offs_n[:, None]
    tl.store(out, acc.to(ptr.dtype.element_ty), mask=(offs_n[:, None] < N) & (rows[None, :] < M))


@triton.jit
def _store_output(y_ptr, acc, rows, offs_n, M, N, stride_ym, r_ptr, stride_rm, RESIDUAL: tl.constexpr):
    """y[rows, offs_n] = acc, or with RESIDUAL acc rounded to y's dtype plus r[rows, offs_n] (in
    fp32, rounded again: the bits of the product stored and then added to r). Returns the tile as
    stored, in fp32."""
    if RESIDUAL:
        mask = (offs_n[:, None] < N) & (rows[None, :] < M)
        r = tl.load(r_ptr + rows[None, :].to(tl.int64) * stride_rm + offs_n[:, None], mask=mask, other=0.0)
        acc = acc.to(y_ptr.dtype.element_ty).to(tl.float32) + r.to(tl.float32)
    _store_tile(y_ptr, acc, rows, offs_n, M, N, stride_ym)
    return acc.to(y_ptr.dtype.element_ty).to(tl.float32)


@triton.jit
def _store_norm_operands(h, w, ny_ptr, sums_ptr, rows, offs_n, M, N, SUM_STRIDE: tl.constexpr):
    """The next pre-norm's operands of the rows h [BLOCK_N, ROWS] (fp32 of the stored values, in a
    layout that runs along the columns alike for every row tile) for its weight w [BLOCK_N] (fp32):
    ny[rows, offs_n] = h * (1 + w) in ny's dtype, and sums[rows, block] (row stride SUM_STRIDE) =
    the fp32 sum of h squared over the block's columns (`pending_norm.py`)."""
    _store_tile(ny_ptr, h * (1.0 + w[:, None]), rows, offs_n, M, N, N)
    tl.store(sums_ptr + rows * SUM_STRIDE + tl.program_id(0), tl.sum(h * h, axis=0), mask=rows < M)


@triton.jit
def _reload_tile(ptr, rows, offs_n, M, N, stride_m):
    """ptr[rows, offs_n] as fp32 [BLOCK_N, ROWS] in a blocked layout, after a barrier: a tile this
    program just stored from an MMA layout (whose lanes split the columns by the row tile's height)
    read back so its column sums run in the same order for 16- and 32-row tiles."""
    tl.debug_barrier()
    mask = (offs_n[:, None] < N) & (rows[None, :] < M)
    return tl.load(ptr + rows[None, :].to(tl.int64) * stride_m + offs_n[:, None], mask=mask, other=0.0).to(
        tl.float32
    )


@triton.jit
def _block_sums_tile(sums_ptr, rows, M, blocks, BLOCKS_PAD: tl.constexpr):
    """sums[rows, :blocks] (row stride BLOCKS_PAD) as a [ROWS, BLOCKS_PAD] fp32 tile, zeros past the
    blocks and the rows. The blocks run along the tile's contiguous axis, which a warp's lanes span
    the same way for 16- and 32-row tiles, so each row's blocks are summed in one order whatever
    the row tile (along the other axis, the lanes' split would follow the tile's height)."""
    b = tl.arange(0, BLOCKS_PAD)
    mask = (rows[:, None] < M) & (b[None, :] < blocks)
    return tl.load(sums_ptr + rows[:, None] * BLOCKS_PAD + b[None, :], mask=mask, other=0.0)


@triton.jit
def _inverse_rms_scale(acc, block_sums, K, eps):
    """acc [BLOCK_N, ROWS] times each row's 1 / rms: rsqrt(the sum of its block sums / K + eps)."""
    return acc * tl.rsqrt(tl.sum(block_sums, axis=1) / K + eps)[None, :]


@triton.jit
def _store_swiglu(y_ptr, acc_gate, acc_up, rows, offs_n, M, N, stride_ym):
    """y[rows, offs_n] = silu(gate) * up of the two products, each first rounded to y's dtype: the
    bits of the [gate | up] product stored and then `elementwise.silu_mul`."""
    dtype = y_ptr.dtype.element_ty
    gate = acc_gate.to(dtype).to(tl.float32)
    up = acc_up.to(dtype).to(tl.float32)
    act = (gate * tl.sigmoid(gate)).to(dtype).to(tl.float32)
    _store_tile(y_ptr, act * up, rows, offs_n, M, N, stride_ym)


@triton.jit
def _sum_splits(part_ptr, rows, offs_n, M, N, SPLITS: tl.constexpr):
    """The fp32 partials [SPLITS, M, N] of these rows and columns summed in split order, as a
    [BLOCK_N, ROWS] tile in a blocked layout."""
    mask = (offs_n[:, None] < N) & (rows[None, :] < M)
    offs = rows[None, :].to(tl.int64) * N + offs_n[:, None]
    plane = M * N  # (the launcher passes M = 1 as a constant: no tensor methods on it)
    acc = tl.load(part_ptr + offs, mask=mask, other=0.0, cache_modifier=".cg")
    for s in tl.static_range(1, SPLITS):
        acc += tl.load(part_ptr + s * plane + offs, mask=mask, other=0.0, cache_modifier=".cg")
    return acc


@triton.jit
def skinny_gemm_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    part_ptr,
    count_ptr,
    r_ptr,
    in_sums_ptr,
    nw_ptr,
    ny_ptr,
    out_sums_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_ym,
    stride_rm,
    k_per_split,
    in_blocks,
    eps,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    PRECISION: tl.constexpr,
    SPLITS: tl.constexpr,
    RESIDUAL: tl.constexpr,
    SWIGLU: tl.constexpr = False,
    ROW_NORM: tl.constexpr = False,
    IN_BLOCKS_PAD: tl.constexpr = 1,
    NORM_OUT: tl.constexpr = False,
    OUT_BLOCKS_PAD: tl.constexpr = 1,
):
    """y [M, N] of one output block (program_id(0)) and one K range (program_id(1)), the rows in one
    ROWS-tall tile (16 or 32), plus r [M, N] with RESIDUAL (_store_output). With SPLITS > 1 each K
    range stores its fp32 partial sums [M, N] at part_ptr + split * M * N and counts itself in
    count_ptr[block]; the range that counts last sums all partials in split order into y and resets
    the count to 0 (one launch, no atomics on the values, the same sums every time). With SWIGLU
    (one K range) w is a [gate | up] projection [2N, K]: a program also streams the up rows N + its
    columns and stores silu(gate) * up (_store_swiglu).

    The pending pre-norm (`pending_norm.py`): with ROW_NORM, x is h * (1 + w) of a norm left
    pending and in_sums [M, in_blocks] (rows IN_BLOCKS_PAD apart) its rows' block sums of h
    squared; the products are scaled by each row's 1 / rms before anything else (its sums loaded
    before the K loop, read after it). With NORM_OUT, the stored output h (residual added) is also
    the input of a pre-norm of weight nw [N]: ny [M, N] = h * (1 + nw) and out_sums [M, blocks]
    (rows OUT_BLOCKS_PAD apart) = its block sums are stored too."""
    block = tl.program_id(0)
    offs_n = block * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = tl.program_id(1) * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    rows = tl.arange(0, ROWS)
    mask_n = offs_n < N
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * K
    up_rows = w_rows + N.to(tl.int64) * K if SWIGLU else w_rows
    acc = tl.zeros([BLOCK_N, ROWS], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N, ROWS], dtype=tl.float32)
    if ROW_NORM:  # (loaded before the loop, read after it: the loads' latency hides behind it)
        in_sums = _block_sums_tile(in_sums_ptr, rows, M, in_blocks, IN_BLOCKS_PAD)
    if NORM_OUT:  # (loaded before the loop: in the epilogue it would follow the output's stores)
        norm_w = tl.load(nw_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_w = mask_n[:, None] if EVEN_K else mask_n[:, None] & (offs_k[None, :] < K)
        w = tl.load(w_rows + offs_k[None, :], mask=mask_w, other=0.0)
        acc = _row_tile_dot(acc, w, x_ptr, rows, offs_k, stride_xm, M, K, EVEN_K, PRECISION)
        if SWIGLU:
            w_up = tl.load(up_rows + offs_k[None, :], mask=mask_w, other=0.0)
            acc_up = _row_tile_dot(acc_up, w_up, x_ptr, rows, offs_k, stride_xm, M, K, EVEN_K, PRECISION)
    if SWIGLU:
        if ROW_NORM:
            acc = _inverse_rms_scale(acc, in_sums, K, eps)
            acc_up = _inverse_rms_scale(acc_up, in_sums, K, eps)
        _store_swiglu(y_ptr, acc, acc_up, rows, offs_n, M, N, stride_ym)
    elif SPLITS == 1:
        if ROW_NORM:
            acc = _inverse_rms_scale(acc, in_sums, K, eps)
        _store_output(y_ptr, acc, rows, offs_n, M, N, stride_ym, r_ptr, stride_rm, RESIDUAL)
        if NORM_OUT:
            h = _reload_tile(y_ptr, rows, offs_n, M, N, stride_ym)
            _store_norm_operands(h, norm_w, ny_ptr, out_sums_ptr, rows, offs_n, M, N, OUT_BLOCKS_PAD)
    else:
        part = part_ptr + tl.program_id(1).to(tl.int64) * M * N
        _store_tile(part, acc, rows, offs_n, M, N, N)
        # release: this range's partials are visible before its count; acquire: the last range
        # sees every other range's partials
        done = tl.atomic_add(count_ptr + block, 1, sem="acq_rel")
        if done == SPLITS - 1:
            acc = _sum_splits(part_ptr, rows, offs_n, M, N, SPLITS)
            if ROW_NORM:
                acc = _inverse_rms_scale(acc, in_sums, K, eps)
            h = _store_output(y_ptr, acc, rows, offs_n, M, N, stride_ym, r_ptr, stride_rm, RESIDUAL)
            if NORM_OUT:  # (the summed partials' layout runs along the columns alike for any tile)
                _store_norm_operands(h, norm_w, ny_ptr, out_sums_ptr, rows, offs_n, M, N, OUT_BLOCKS_PAD)
            tl.store(count_ptr + block, 0)


_COUNTS: dict[tuple[torch.device, int], Tensor] = {}


def split_counts(device: torch.device, blocks: int) -> Tensor:
    """The zeroed int32 counts of a split launch's output blocks, one buffer per device kept for
    the process (every launch leaves it zeroed again). Launches on one device run on one stream in
    this engine; two concurrent split launches on different streams would share it."""
    key = (device, blocks)
    if key not in _COUNTS:
        _COUNTS[key] = torch.zeros(blocks, dtype=torch.int32, device=device)
    return _COUNTS[key]


def check_skinny_operands(
    x: Tensor, w: Tensor, out: Tensor | None, out_dtype: torch.dtype | None = None
) -> None:
    """ValueError unless x [M, K] and w [N, K] match in dtype (bf16 / fp32) and device, w is
    contiguous, x's rows are contiguous, the output dtype is x's or float32 and `out` (if given) is
    a contiguous [M, N] of that dtype."""
    if x.dim() != 2 or w.dim() != 2:
        raise ValueError(f"x and w must be 2-D, got x {tuple(x.shape)} and w {tuple(w.shape)}")
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"x has K={x.shape[1]} but w [N, K] has K={w.shape[1]}")
    if x.dtype not in DTYPES or w.dtype != x.dtype:
        raise ValueError(f"x and w must both be bfloat16 or float32, got {x.dtype} and {w.dtype}")
    if x.device != w.device:
        raise ValueError(f"x is on {x.device} but w is on {w.device}")
    if not w.is_contiguous():
        raise ValueError("w must be contiguous (row-major [N, K])")
    if x.shape[1] > 1 and x.stride(1) != 1:
        raise ValueError(f"x's rows must be contiguous (stride(1) == 1), got strides {x.stride()}")
    want = out_dtype or x.dtype
    if want not in (x.dtype, torch.float32):
        raise ValueError(f"the output dtype must be {x.dtype} or torch.float32, got {want}")
    if out is not None:
        if out.shape != (x.shape[0], w.shape[0]) or out.dtype != want or out.device != x.device:
            raise ValueError(
                f"out must be [{x.shape[0]}, {w.shape[0]}] {want} on {x.device}, "
                f"got {tuple(out.shape)} {out.dtype} on {out.device}"
            )
        if not out.is_contiguous():
            raise ValueError("out must be contiguous")


def check_residual(residual: Tensor | None, m: int, n: int, dtype: torch.dtype, device: torch.device) -> None:
    """ValueError unless residual (if given) is [m, n] of the output dtype on x's device with
    contiguous rows."""
    if residual is None:
        return
    if residual.shape != (m, n) or residual.dtype != dtype or residual.device != device:
        raise ValueError(
            f"residual must be [{m}, {n}] {dtype} on {device}, "
            f"got {tuple(residual.shape)} {residual.dtype} on {residual.device}"
        )
    if n > 1 and residual.stride(1) != 1:
        raise ValueError(f"residual's rows must be contiguous, got strides {residual.stride()}")


def dot_precision(x: Tensor) -> str:
    """bf16 operands: one tensor-core product ("tf32" names the default); fp32: three TF32 products
    on the GPU ("tf32x3", fp32-level error at tensor-core speed; the exact fp32 FMA path ran the tiny
    model's 32-row tree GEMMs at 1.28 ms a cycle on the H200), exact fp32 under the interpreter."""
    if x.dtype != torch.float32:
        return "tf32"
    return "tf32x3" if x.is_cuda else "ieee"


def row_tile(m: int) -> int:
    """The height of the one row tile of an m-row launch: 16 for 1..16 rows, 32 for 17..32."""
    return ROW_TILE * triton.cdiv(m, ROW_TILE)


def _wide_linear(x: Tensor, w: Tensor) -> Tensor:
    """x @ w^T in fp32 from bf16 operands: cuBLAS's fp32-output GEMM (CUDA), or fp32 copies."""
    return torch.mm(x, w.t(), out_dtype=torch.float32) if x.is_cuda else F.linear(x.float(), w.float())


@dataclass(frozen=True)
class _Epilogue:
    """What a launch does besides the product: a residual added, a pending norm applied to its
    input rows (`in_norm`), the next pre-norm's operands stored (`norm_weight`, into `ny`, `sums`)."""

    residual: Tensor | None = None
    in_norm: PendingNorm | None = None
    norm_weight: Tensor | None = None
    ny: Tensor | None = None
    sums: Tensor | None = None


def _launch(
    x: Tensor, w: Tensor, y: Tensor, n: int, cfg: SkinnyConfig, epilogue: _Epilogue, swiglu: bool = False
) -> None:
    """One skinny_gemm_kernel launch of y [M, n] = x @ w^T (n: the gate half for SwiGLU)."""
    (m, k), e = x.shape, epilogue
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.splits), cfg.block_k) * cfg.block_k
    split = cfg.splits > 1
    blocks = triton.cdiv(n, cfg.block_n)
    part = torch.empty(cfg.splits, m, n, dtype=torch.float32, device=x.device) if split else y
    counts = split_counts(x.device, blocks) if split else y
    in_blocks = 1 if e.in_norm is None else e.in_norm.block_sums.shape[1]
    skinny_gemm_kernel[(blocks, cfg.splits)](
        x, w, y, part, counts, y if e.residual is None else e.residual,
        y if e.in_norm is None else e.in_norm.block_sums, y if e.norm_weight is None else e.norm_weight,
        y if e.ny is None else e.ny, y if e.sums is None else e.sums,
        m, n, k, x.stride(0), y.stride(0), 0 if e.residual is None else e.residual.stride(0), k_per_split,
        in_blocks, 0.0 if e.in_norm is None else e.in_norm.eps, ROWS=row_tile(m), BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, EVEN_K=k % cfg.block_k == 0, PRECISION=dot_precision(x), SPLITS=cfg.splits,
        RESIDUAL=e.residual is not None, SWIGLU=swiglu, ROW_NORM=e.in_norm is not None,
        IN_BLOCKS_PAD=block_stride(in_blocks), NORM_OUT=e.norm_weight is not None,
        OUT_BLOCKS_PAD=block_stride(blocks),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


def check_pending_norm(norm: PendingNorm | None, x: Tensor) -> None:
    """ValueError unless `norm` (if given) can be x's pending norm (x: its scaled rows [M, K]): its
    block sums are fp32 [M, blocks] on x's device, rows `block_stride(blocks)` apart."""
    if norm is None:
        return
    if norm.scaled.shape[-1] != x.shape[1] or norm.scaled.numel() != x.numel():
        raise ValueError(f"x {tuple(x.shape)} is not the pending norm's rows {tuple(norm.scaled.shape)}")
    sums = norm.block_sums
    if sums.dim() != 2 or sums.shape[0] != x.shape[0] or sums.dtype != torch.float32:
        raise ValueError(
            f"block sums must be fp32 [{x.shape[0]}, blocks], got {tuple(sums.shape)} {sums.dtype}"
        )
    stride = (block_stride(sums.shape[1]), 1)
    if sums.device != x.device or (sums.shape[0] > 1 and sums.stride() != stride):
        raise ValueError(f"block sums must be on x's device with strides {stride}")


def skinny_linear(
    x: Tensor,
    w: Tensor,
    out: Tensor | None = None,
    config: SkinnyConfig | None = None,
    out_dtype: torch.dtype | None = None,
    residual: Tensor | None = None,
    in_norm: PendingNorm | None = None,
) -> Tensor:
    """x[M, K] @ w[N, K]^T into `out` (or a new tensor of `out_dtype`: x's dtype, or float32 for
    the fp32 accumulators unrounded), plus `residual` [M, N] of the output dtype if given (the
    product rounded to the output dtype, then added: the bits of `skinny_linear(x, w) + residual`);
    the Triton kernel for 1..32 rows, F.linear (cuBLAS) above that or for no rows. in_norm: x is
    the `scaled` of this pending norm, whose 1 / rms scales each row's products (the fallback
    reads its materialised rows)."""
    check_skinny_operands(x, w, out, out_dtype)
    check_pending_norm(in_norm, x)
    (m, k), n = x.shape, w.shape[0]
    dtype = out.dtype if out is not None else out_dtype or x.dtype
    check_residual(residual, m, n, dtype, x.device)
    if m == 0 or m > MAX_ROWS:
        x = x if in_norm is None else in_norm.materialize()
        y = F.linear(x, w) if dtype == x.dtype else _wide_linear(x, w)
        y = y if residual is None else y + residual
        return y if out is None else out.copy_(y)
    y = torch.empty(m, n, dtype=dtype, device=x.device) if out is None else out
    cfg = config or SkinnyConfig.for_shape(n, k, x.device, x.dtype)
    _launch(x, w, y, n, cfg, _Epilogue(residual=residual, in_norm=in_norm))
    return y


def skinny_linear_normed(
    x: Tensor,
    w: Tensor,
    residual: Tensor,
    norm_weight: Tensor,
    eps: float,
    config: SkinnyConfig | None = None,
    in_norm: PendingNorm | None = None,
) -> tuple[Tensor, PendingNorm]:
    """h = residual + x @ w^T as `skinny_linear` (1..32 rows), and the zero-centred RMSNorm of h of
    weight `norm_weight` [N] left pending for the GEMMs that read it (`pending_norm.py`), in one
    launch: (h [M, N], its PendingNorm)."""
    check_skinny_operands(x, w, None)
    check_pending_norm(in_norm, x)
    (m, k), n = x.shape, w.shape[0]
    check_residual(residual, m, n, x.dtype, x.device)
    if not 0 < m <= MAX_ROWS:
        raise ValueError(f"a launch that leaves its norm pending takes 1..{MAX_ROWS} rows, got {m}")
    if norm_weight.shape != (n,) or norm_weight.device != x.device:
        raise ValueError(f"the norm weight must be [{n}] on {x.device}, got {tuple(norm_weight.shape)}")
    cfg = config or SkinnyConfig.for_shape(n, k, x.device, x.dtype)
    h, ny = (torch.empty(m, n, dtype=x.dtype, device=x.device) for _ in range(2))
    blocks = triton.cdiv(n, cfg.block_n)
    sums = torch.empty(m, block_stride(blocks), dtype=torch.float32, device=x.device)[:, :blocks]
    epilogue = _Epilogue(residual=residual, in_norm=in_norm, norm_weight=norm_weight, ny=ny, sums=sums)
    _launch(x, w, h, n, cfg, epilogue)
    return h, PendingNorm(ny, sums, eps)


def skinny_swiglu(
    x: Tensor,
    w: Tensor,
    config: SkinnyConfig | None = None,
    out: Tensor | None = None,
    in_norm: PendingNorm | None = None,
) -> Tensor:
    """silu(x @ gate^T) * (x @ up^T) [M, I] for a [gate | up] projection w [2I, K], one launch for
    1..32 rows (each program streams BLOCK_N / 2 gate rows and the matching up rows, so the launch
    reads the bytes of `for_shape(2I, K)`'s blocks); the bits of `skinny_linear` of the gate and up
    halves then `elementwise.silu_mul`, if the MMA computes each column alike in both tile heights.
    Shapes whose config splits K (narrow projections) are refused: use the product then silu_mul.
    out: a contiguous [M, I] of x's dtype to write (else a new tensor). in_norm: as skinny_linear."""
    if w.dim() != 2 or w.shape[0] % 2:
        raise ValueError(f"w must be a [gate | up] projection [2I, K], got {tuple(w.shape)}")
    check_skinny_operands(x, w, None)
    check_pending_norm(in_norm, x)
    if out is not None and (
        out.shape != (x.shape[0], w.shape[0] // 2) or out.dtype != x.dtype or not out.is_contiguous()
    ):
        raise ValueError(f"out must be a contiguous [{x.shape[0]}, {w.shape[0] // 2}] {x.dtype}")
    (m, k), n = x.shape, w.shape[0] // 2
    if not 0 < m <= MAX_ROWS:
        raise ValueError(f"the SwiGLU epilogue takes 1..{MAX_ROWS} rows, got {m}")
    cfg = config or SkinnyConfig.for_shape(2 * n, k, x.device, x.dtype)
    if cfg.splits != 1:
        raise ValueError(f"the SwiGLU epilogue needs one K range, the config has {cfg.splits}")
    y = torch.empty(m, n, dtype=x.dtype, device=x.device) if out is None else out
    half = replace(cfg, block_n=max(16, cfg.block_n // 2))
    _launch(x, w, y, n, half, _Epilogue(in_norm=in_norm), swiglu=True)
    return y
