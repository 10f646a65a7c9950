"""Tree attention decode and KV-remap publication in Triton, beside `reference.py`.

A row at logical position p (the prefix plus its depth) sees the committed keys and the tree slots
of its ancestors and itself. Its keys below p - MAX_DEPTH (all committed) go through split-K: program
(query block, KV head, split) stages each K/V tile once for all query heads of its group (M = tree
rows x group heads) and runs an online softmax over its split, a fixed range of physical cache rows
(`_partition_start`: SHORT_KEYS rows each for the first ones, then `chunk`), each row masked at its
own bound (K and V tiles of 2-byte caches come by tensor-memory copies from descriptors that end
at the prefix; the tiles below every row's bound take no mask, and the accumulator is rescaled
only when a row's maximum moved). Its last TAIL_KEYS keys, the committed ones above that bound and then its
tree slots (bit j of `bits[r]` says row r sees tree slot j; physical order puts a parent's slot
before its children's), are gathered in logical order and attended in one pass, the last
partition, by one more program per (tree row, KV head) of the split-K's launch (it needs none of
the split-K's results, so it runs beside them). A merge kernel combines the partitions by
log-sum-exp, each in its own lane of a fixed-width load, the tail's last. The prefix length is read
on the device, so one captured graph serves every cycle.

Row invariance: the AR step at position p and any tree row at p (on the spine or off it) split their
keys at the same bound, tile the same committed keys at the same places of the same partitions, and
gather the same tail keys into the same columns of the same tail tile. So they get the same bits,
whatever else the tree holds and wherever its slots lie (the order inside a tile's dot is the dot's
own; on the GPU the query tile's height is fixed per model, `device_ops`; under the interpreter
numpy's matmul sums in its BLAS kernel's order, which differs between CPUs, and the tests fix the
dot's order). With splits that followed the row count, or tree slots tiled in physical order, bf16
trees parted from AR on long sampled answers (results/h200/row-invariance).

`tree_attention` and `publish_kv_` have the reference's signatures; `tree_attention_` and
`publish_kv_device_` take device metadata and caller-owned buffers (the forms graphs capture).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from torch import Tensor

from lumotree.tree import MAX_DEPTH, TreeDescriptor
from lumotree.verify.attention.reference import _check_cache

LOG2E = 1.4426950408889634  # scores run in the log2 domain (exp2); lse is converted back with ln 2
TAIL_KEYS = MAX_DEPTH + 1  # keys a row walks one by one: its position and the MAX_DEPTH before it
MERGE_BLOCK_D = 32  # head-dim columns per merge program on the GPU
MERGE_PARTITIONS = 64  # partitions a merge program reads at once (a 64K context at 1024 rows each)
MERGE_ROWS_INTERPRETED = 16  # grouped rows a merge program under the interpreter (1 on the GPU)
MERGE_WARPS = 1  # a merge program's warps: a [MERGE_PARTITIONS, MERGE_BLOCK_D] tile, many programs
BITSET_SLOTS = 64  # the visibility bitset's width (an int64; 63 tree slots usable)
STAGES = frozenset({"partials", "merge"})  # tree_attention_'s launches
# Cache partitions fixed by the cache's rows, whatever the cache's size, so a short context in a
# large cache (the engine sizes it for max_model_len) still spreads over many programs; the split-K
# programs loop over the partitions that hold committed keys, and the merge reads only those. The
# first SHORT_PARTITIONS hold SHORT_KEYS rows each (a 4K context over 64 programs at 4 KV heads), the
# rest KEYS_PER_SPLIT: measured on the H200 against 256 and 512 throughout (`lumobench bench
# attention --keys`, results/h200/attention.md), fewer partials to write and merge at 32K outweigh
# the fewer programs at 4K; the short ones give 4K its programs back.
KEYS_PER_SPLIT = 1024
SHORT_KEYS = 256
SHORT_PARTITIONS = 16


@triton.jit
def _popcount(x):
    """Set bits of each int64 in x (0 <= x < 2^63), by bit-slice sums."""
    x = x - ((x >> 1) & 0x5555555555555555)
    x = (x & 0x3333333333333333) + ((x >> 2) & 0x3333333333333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0F
    x = x + (x >> 8)
    x = x + (x >> 16)
    x = x + (x >> 32)
    return x & 0x7F


@triton.jit
def _tail_start(bits, prefix, TAIL: tl.constexpr):
    """Logical position from which a row walks its keys one by one: its position (prefix + depth,
    depth = ancestors seen - 1) minus TAIL - 1, so every tree slot it sees lies in its walk."""
    return tl.maximum(prefix + _popcount(bits) - TAIL, 0)


@triton.jit
def _query_rows(
    q_ptr, bits_ptr, block, h, R, stride_qr, stride_qh, G: tl.constexpr, D: tl.constexpr, BM: tl.constexpr
):
    """Query block `block` of KV head h: grouped rows m (tree row m // G, head m % G), which are
    real rows, the head-dim offsets, q [BM, D] (0 past the rows) and each row's visibility bits (1
    past the rows: the root only)."""
    m = block * BM + tl.arange(0, BM)
    row = m // G
    head = h * G + m % G
    valid_m = row < R
    offs_d = tl.arange(0, D)
    q = tl.load(
        q_ptr + row[:, None] * stride_qr + head[:, None] * stride_qh + offs_d[None, :],
        mask=valid_m[:, None],
        other=0.0,
    )
    return m, valid_m, offs_d, q, tl.load(bits_ptr + row, mask=valid_m, other=1)


@triton.jit
def _partition_start(s, chunk, shorts, SHORT: tl.constexpr):
    """First cache row of partition s: `shorts` partitions of SHORT rows, then `chunk` rows each."""
    return tl.where(s < shorts, s * SHORT, shorts * SHORT + (s - shorts) * chunk)


@triton.jit
def _partitions_holding(n, chunk, shorts, SHORT: tl.constexpr):
    """How many partitions (laid out as `_partition_start` says) hold cache rows [0, n)."""
    short_rows = shorts * SHORT
    return tl.where(n <= short_rows, tl.cdiv(n, SHORT), shorts + tl.cdiv(n - short_rows, chunk))


@triton.jit
def _partition_rows(prefix, chunk, BN: tl.constexpr, BY_PREFIX: tl.constexpr):
    """Cache rows a partition: `chunk`, fixed by the cache; with BY_PREFIX, `chunk` is a partition
    count and the committed prefix is spread over that many partitions in whole key tiles."""
    rows = chunk
    if BY_PREFIX:
        rows = tl.maximum(tl.cdiv(tl.cdiv(prefix, chunk), BN), 1) * BN
    return rows


@triton.jit
def _split_k(
    q_ptr,
    k_ptr,
    v_ptr,
    bits_ptr,
    prefix_ptr,
    o_part_ptr,
    lse_part_ptr,
    R,
    qk_scale,
    stride_qr,
    stride_qh,
    stride_kt,
    chunk,
    shorts,
    block,
    h,
    program,
    programs,
    G: tl.constexpr,
    D: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    MPAD: tl.constexpr,
    HKV: tl.constexpr,
    TAIL: tl.constexpr,
    PRECISION: tl.constexpr,
    BY_PREFIX: tl.constexpr,
    SHORT: tl.constexpr,
    DESCRIPTORS: tl.constexpr,
):
    """Query block `block` of KV head h, split-K program `program` of `programs`: partitions
    n - 1 - program, n - 1 - program - programs, ... of the n holding committed keys, each a range
    of cache rows (`_partition_start`), by online softmax over BN-key tiles (K and V tiles by
    tensor-memory descriptors, or without DESCRIPTORS by masked loads: `_kv_tile`)."""
    prefix = tl.load(prefix_ptr).to(tl.int32)
    chunk = _partition_rows(prefix, chunk, BN, BY_PREFIX)
    held = _partitions_holding(prefix, chunk, shorts, SHORT)
    if program < held:  # (a program past the partitions in use has nothing to do)
        m, _, offs_d, q, bits = _query_rows(q_ptr, bits_ptr, block, h, R, stride_qr, stride_qh, G, D, BM)
        bound = _tail_start(bits, prefix, TAIL).to(tl.int32)  # [BM]
        offs_n = tl.arange(0, BN)
        # descriptors over the committed rows [0, prefix) of the caches: a tile past the prefix reads
        # zeros (the tensor-memory unit fills rows past a descriptor's shape), so no load takes a mask
        if DESCRIPTORS:
            committed = tl.maximum(prefix, 1)  # (an empty prefix loads nothing; a descriptor needs a row)
            k_rows = tl.make_tensor_descriptor(k_ptr, [committed, HKV * D], [stride_kt, 1], [BN, D])
            v_rows = tl.make_tensor_descriptor(v_ptr, [committed, HKV * D], [stride_kt, 1], [BN, D])
        else:
            k_rows, v_rows = k_ptr, v_ptr
        for i in range(program, held, programs):
            s = held - 1 - i  # the last (longest) partitions first: the short ones fill in behind them
            lo = _partition_start(s, chunk, shorts, SHORT)
            # committed keys only: the tree's are in the tail
            hi = tl.minimum(_partition_start(s + 1, chunk, shorts, SHORT), prefix)
            m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
            l_i = tl.zeros([BM], dtype=tl.float32)
            acc = tl.zeros([BM, D], dtype=tl.float32)
            # every row's bound is at least prefix + 1 - TAIL (the root's): the tiles below it take no mask
            unmasked_end = lo + tl.maximum(tl.minimum(hi, prefix + 1 - TAIL) - lo, 0) // BN * BN
            for start in range(lo, unmasked_end, BN):
                acc, m_i, l_i = _attend_tile(
                    q, k_rows, v_rows, start, h, bound, prefix, stride_kt, offs_n, offs_d, acc, m_i, l_i,
                    qk_scale, D, PRECISION, DESCRIPTORS, False,
                )  # fmt: skip
            for start in range(unmasked_end, hi, BN):  # at most two tiles a program
                acc, m_i, l_i = _attend_tile(
                    q, k_rows, v_rows, start, h, bound, prefix, stride_kt, offs_n, offs_d, acc, m_i, l_i,
                    qk_scale, D, PRECISION, DESCRIPTORS, True,
                )  # fmt: skip
            base = (s * HKV + h) * MPAD + m
            _store_partial(o_part_ptr, lse_part_ptr, base, offs_d, m_i, l_i, acc, D, m < R * G)


@triton.jit
def _attend_tile(
    q,
    k_rows,
    v_rows,
    start,
    h,
    bound,
    prefix,
    stride_kt,
    offs_n,
    offs_d,
    acc,
    m_i,
    l_i,
    qk_scale,
    D: tl.constexpr,
    PRECISION: tl.constexpr,
    DESCRIPTORS: tl.constexpr,
    MASKED: tl.constexpr,
):
    """One BN-key tile of the online softmax from cache row `start`: (acc, m_i, l_i) updated. Scores
    run in the log2 domain, the scale applied in the exponent by one fused multiply-add; MASKED
    drops each row's keys at or past its bound (a tile all below every bound gives the same bits
    without it)."""
    k = _kv_tile(k_rows, start, h, prefix, stride_kt, offs_n, offs_d, D, DESCRIPTORS)
    scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    if MASKED:
        scores = tl.where((start + offs_n)[None, :] < bound[:, None], scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=1) * qk_scale)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(tl.fma(scores, qk_scale, -m_safe[:, None]))
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = _kv_tile(v_rows, start, h, prefix, stride_kt, offs_n, offs_d, D, DESCRIPTORS)
    # alpha is exactly 1 where a row's maximum held (exp2(0)), and 0 times a zero accumulator where a
    # row has seen no key yet: the block rescales only when some row's maximum moved, the same bits
    if tl.max((m_new != m_i).to(tl.int32), axis=0) != 0:
        acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit
def _kv_tile(rows, start, h, prefix, stride_kt, offs_n, offs_d, D: tl.constexpr, DESCRIPTORS: tl.constexpr):
    """Cache rows start .. start + BN - 1 of KV head h [BN, D], zeros from the prefix on: from a
    descriptor, or (without DESCRIPTORS: `rows` is the cache's pointer) by masked loads."""
    if DESCRIPTORS:
        tile = rows.load([start, h * D])
    else:
        keys = start + offs_n
        tile = tl.load(
            rows + keys.to(tl.int64)[:, None] * stride_kt + h * D + offs_d[None, :],
            mask=(keys < prefix)[:, None],
            other=0.0,
        )
    return tile


@triton.jit
def _store_partial(o_part_ptr, lse_part_ptr, base, offs_d, m_i, l_i, acc, D: tl.constexpr, rows_mask):
    """A partition's normalised output and log2-sum-exp (-inf and 0 where it saw no key), for the
    rows in `rows_mask`."""
    empty = l_i == 0.0
    out = (acc / tl.where(empty, 1.0, l_i)[:, None]).to(o_part_ptr.dtype.element_ty)
    lse2 = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
    tl.store(o_part_ptr + base.to(tl.int64)[:, None] * D + offs_d[None, :], out, mask=rows_mask[:, None])
    tl.store(lse_part_ptr + base, lse2, mask=rows_mask)


@triton.jit
def _tail_rows(bits, prefix, position, TAIL: tl.constexpr, TP: tl.constexpr, RP: tl.constexpr):
    """The cache rows of one tree row's last TAIL logical keys (position - TAIL + 1 .. position), in
    logical order over TP columns, and which are live: a key below the prefix is committed at its own
    row; one at prefix + a is the row's ancestor at depth a (itself at its own depth), whose tree
    slot is the (a + 1)-th set bit of `bits` (physical order puts a parent before its children)."""
    j = tl.arange(0, TP)
    key = position - (TAIL - 1) + j
    live = (j < TAIL) & (key >= 0)
    slot = tl.arange(0, RP)
    seen = ((bits >> slot) & 1).to(tl.int32)  # [RP]
    rank = tl.cumsum(seen, axis=0)  # slots seen up to and including this one
    hit = (seen[None, :] != 0) & (rank[None, :] == (key - prefix + 1)[:, None])  # [TP, RP]
    ancestor = tl.sum(tl.where(hit, slot[None, :], 0), axis=1)
    return tl.where(key < prefix, key, prefix + ancestor), live


@triton.jit
def _tail(
    q_ptr,
    k_ptr,
    v_ptr,
    bits_ptr,
    prefix_ptr,
    o_part_ptr,
    lse_part_ptr,
    qk_scale,
    stride_qr,
    stride_qh,
    stride_kt,
    r,
    h,
    G: tl.constexpr,
    GP: tl.constexpr,
    D: tl.constexpr,
    MPAD: tl.constexpr,
    HKV: tl.constexpr,
    TAIL: tl.constexpr,
    TP: tl.constexpr,
    RP: tl.constexpr,
    SPLIT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Tree row r, KV head h: the row's last TAIL logical keys (the committed ones above its split-K
    bound, then its ancestors' tree slots and its own), gathered in logical order and attended in
    one pass by the G query heads of the group, as partition SPLIT (the last)."""
    g = tl.arange(0, GP)
    offs_d = tl.arange(0, D)
    head = g < G
    q = tl.load(
        q_ptr + r * stride_qr + (h * G + g)[:, None] * stride_qh + offs_d[None, :],
        mask=head[:, None],
        other=0.0,
    )
    bits = tl.load(bits_ptr + r)
    prefix = tl.load(prefix_ptr)
    rows, live = _tail_rows(bits, prefix, prefix + _popcount(bits) - 1, TAIL, TP, RP)
    kv_off = rows.to(tl.int64)[:, None] * stride_kt + h * D + offs_d[None, :]
    k = tl.load(k_ptr + kv_off, mask=live[:, None], other=0.0)
    v = tl.load(v_ptr + kv_off, mask=live[:, None], other=0.0)
    scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [GP, TP], log2 domain
    scores = tl.where(live[None, :], scores, float("-inf"))
    m_i = tl.max(scores, axis=1)  # finite: a row's own position is always live
    p = tl.exp2(scores - m_i[:, None])
    acc = tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    base = (SPLIT * HKV + h) * MPAD + r * G + g
    _store_partial(o_part_ptr, lse_part_ptr, base, offs_d, m_i, tl.sum(p, axis=1), acc, D, head)


@triton.jit
def tree_attention_partial_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    bits_ptr,
    prefix_ptr,
    o_part_ptr,
    lse_part_ptr,
    R,
    qk_scale,
    stride_qr,
    stride_qh,
    stride_kt,
    chunk,
    shorts,
    programs,
    G: tl.constexpr,
    GP: tl.constexpr,
    D: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    MPAD: tl.constexpr,
    HKV: tl.constexpr,
    TAIL: tl.constexpr,
    TP: tl.constexpr,
    RP: tl.constexpr,
    SPLIT: tl.constexpr,
    PRECISION: tl.constexpr,
    BY_PREFIX: tl.constexpr,
    SHORT: tl.constexpr,
    DESCRIPTORS: tl.constexpr,
):
    """Every partial of one launch: the first (MPAD / BM) * HKV * `programs` programs run the split-K
    (`_split_k`: query block fastest, then KV head, then split-K program, so each program's longest
    partitions start first), the last R * HKV the tails (`_tail`: one a tree row and KV head), which
    need nothing of the split-K's and so run beside it, not after it."""
    pid = tl.program_id(0)
    NBLOCKS: tl.constexpr = MPAD // BM
    split_programs = NBLOCKS * HKV * programs
    if pid < split_programs:
        _split_k(
            q_ptr, k_ptr, v_ptr, bits_ptr, prefix_ptr, o_part_ptr, lse_part_ptr, R, qk_scale, stride_qr,
            stride_qh, stride_kt, chunk, shorts, pid % NBLOCKS, (pid // NBLOCKS) % HKV,
            pid // (NBLOCKS * HKV), programs, G, D, BM, BN, MPAD, HKV, TAIL, PRECISION, BY_PREFIX, SHORT,
            DESCRIPTORS,
        )  # fmt: skip
    else:
        t = pid - split_programs
        _tail(
            q_ptr, k_ptr, v_ptr, bits_ptr, prefix_ptr, o_part_ptr, lse_part_ptr, qk_scale, stride_qr,
            stride_qh, stride_kt, t // HKV, t % HKV, G, GP, D, MPAD, HKV, TAIL, TP, RP, SPLIT, PRECISION,
        )  # fmt: skip


@triton.jit
def _merge_lse(lse_part_ptr, first, used, m, h, NB: tl.constexpr, MPAD: tl.constexpr, HKV: tl.constexpr):
    """Partitions first .. first + NB - 1 of those in use (< used) for grouped row m: their rows in
    the partials, which are in use, and their log2-sum-exp [NB] (-inf past `used`)."""
    idx = first + tl.arange(0, NB)
    live = idx < used
    base = (idx * HKV + h) * MPAD + m
    return base, live, tl.load(lse_part_ptr + base, mask=live, other=float("-inf"))


@triton.jit
def _merge_parts(o_part_ptr, base, live, offs_d, D: tl.constexpr):
    """The partials' columns offs_d [NB, BD] at rows `base` (0 where not `live`), in fp32."""
    return tl.load(
        o_part_ptr + base.to(tl.int64)[:, None] * D + offs_d[None, :], mask=live[:, None], other=0.0
    ).to(tl.float32)


@triton.jit
def tree_attention_merge_kernel(
    o_part_ptr,
    lse_part_ptr,
    o_ptr,
    lse_ptr,
    gate_ptr,
    prefix_ptr,
    R,
    chunk,
    shorts,
    stride_or,
    stride_oh,
    stride_gr,
    stride_gh,
    G: tl.constexpr,
    D: tl.constexpr,
    BD: tl.constexpr,
    BM: tl.constexpr,
    NB: tl.constexpr,
    BN: tl.constexpr,
    NSPLIT: tl.constexpr,
    MPAD: tl.constexpr,
    HKV: tl.constexpr,
    BY_PREFIX: tl.constexpr,
    SHORT: tl.constexpr,
    GATED: tl.constexpr,
):
    """Program (BM grouped rows, KV head, head-dim block): per row, the partials' BD columns merged
    by lse. The partitions in use are read NB at a time, partition i always in lane i % NB of read
    i // NB (the first read together with the tail's), summed lane-wise by weight exp2(lse - the
    largest lse), the reads in order, the tail's last. A partition that saw none of a row's keys
    (past its bound) adds exact zeros in its own lane, so a row's bits do not depend on how many
    partitions the prefix fills past its own, nor on BM. GATED: a row stores the output gate's
    product (`_gate` of the output and the gate's columns) instead of the output."""
    h = tl.program_id(1)
    offs_d = tl.program_id(2) * BD + tl.arange(0, BD)
    prefix = tl.load(prefix_ptr)
    chunk = _partition_rows(prefix, chunk, BN, BY_PREFIX)
    used = tl.minimum(_partitions_holding(prefix, chunk, shorts, SHORT), NSPLIT - 1)
    for m in range(tl.program_id(0) * BM, tl.minimum(tl.program_id(0) * BM + BM, R * G)):
        tail_base = ((NSPLIT - 1) * HKV + h) * MPAD + m
        tail_lse = tl.load(lse_part_ptr + tail_base)
        tail = tl.load(o_part_ptr + tail_base.to(tl.int64) * D + offs_d).to(tl.float32)
        base, live, lse0 = _merge_lse(lse_part_ptr, 0, used, m, h, NB, MPAD, HKV)
        part0 = _merge_parts(o_part_ptr, base, live, offs_d, D)
        top = tl.maximum(tl.max(lse0, axis=0), tail_lse)  # finite: the tail holds the row's own key
        for first in range(NB, used, NB):
            _, _, more = _merge_lse(lse_part_ptr, first, used, m, h, NB, MPAD, HKV)
            top = tl.maximum(top, tl.max(more, axis=0))
        weights = tl.exp2(lse0 - top)  # 0 past `used`
        acc = tl.sum(weights[:, None] * part0, axis=0)
        weight_sum = tl.sum(weights, axis=0)
        for first in range(NB, used, NB):
            rows, in_use, more = _merge_lse(lse_part_ptr, first, used, m, h, NB, MPAD, HKV)
            part = _merge_parts(o_part_ptr, rows, in_use, offs_d, D)
            weights = tl.exp2(more - top)
            acc += tl.sum(weights[:, None] * part, axis=0)
            weight_sum += tl.sum(weights, axis=0)
        tail_weight = tl.exp2(tail_lse - top)
        acc += tail_weight * tail
        weight_sum += tail_weight
        row, head = m // G, h * G + m % G
        out = (acc / weight_sum).to(o_ptr.dtype.element_ty)
        if GATED:
            out = _gate(out, tl.load(gate_ptr + row * stride_gr + head * stride_gh + offs_d))
        tl.store(o_ptr + row * stride_or + head * stride_oh + offs_d, out)
        if tl.program_id(2) == 0:  # one head-dim block writes the lse
            tl.store(
                lse_ptr + row * (HKV * G) + head, (top + tl.log2(weight_sum)) * 0.6931471805599453
            )  # ln 2


@triton.jit
def _gate(out, gate):
    """Attention's output gate out * sigmoid(gate) in out's dtype, as the model's `sigmoid_mul` rounds
    it (the sigmoid rounded to that dtype, the product in fp32)."""
    dtype = out.dtype
    return (out.to(tl.float32) * tl.sigmoid(gate.to(tl.float32)).to(dtype).to(tl.float32)).to(dtype)


@triton.jit
def write_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    prefix_ptr,
    stride_kr,
    stride_vr,
    stride_t,
    HD,
    BD: tl.constexpr,
    PREFIX: tl.constexpr,
):
    """Program (row r, column block): k[r] and v[r] ([Hkv * D] each, contiguous, the caches' dtype)
    to cache row slot[r] (+ the prefix length with PREFIX)."""
    r = tl.program_id(0)
    offs = tl.program_id(1) * BD + tl.arange(0, BD)
    mask = offs < HD
    dst = tl.load(slot_ptr + r)
    if PREFIX:
        dst += tl.load(prefix_ptr)
    dst_off = dst.to(tl.int64) * stride_t + offs
    k = tl.load(k_ptr + r.to(tl.int64) * stride_kr + offs, mask=mask)
    v = tl.load(v_ptr + r.to(tl.int64) * stride_vr + offs, mask=mask)
    tl.store(k_cache_ptr + dst_off, k, mask=mask)
    tl.store(v_cache_ptr + dst_off, v, mask=mask)


@triton.jit
def publish_kv_kernel(
    k_ptr,
    v_ptr,
    slot_ptr,
    prefix_ptr,
    accepted_ptr,
    len_ptr,
    stride_t,
    stride_layer,
    HD,
    P: tl.constexpr,
    BD: tl.constexpr,
):
    """Program (column block, layer): the accepted path's K and V rows of layer program_id(1) (at
    stride_layer elements from the first's) moved to the rows after the prefix."""
    layer = tl.program_id(1).to(tl.int64) * stride_layer
    k_ptr += layer
    v_ptr += layer
    offs = tl.program_id(0) * BD + tl.arange(0, BD)
    i = tl.arange(0, P)
    n = tl.load(len_ptr)
    prefix = tl.load(prefix_ptr)
    live = i < n
    node = tl.load(accepted_ptr + i, mask=live, other=0)
    src = prefix + tl.load(slot_ptr + node, mask=live, other=0)
    dst = prefix + i
    move = live & (src != dst)  # a spine prefix is already in place: no traffic
    mask = move[:, None] & (offs[None, :] < HD)
    src_off = src.to(tl.int64)[:, None] * stride_t + offs[None, :]
    dst_off = dst.to(tl.int64)[:, None] * stride_t + offs[None, :]
    # All rows are gathered before any is scattered: a source slot may also be a destination.
    k_rows = tl.load(k_ptr + src_off, mask=mask)
    v_rows = tl.load(v_ptr + src_off, mask=mask)
    tl.debug_barrier()
    tl.store(k_ptr + dst_off, k_rows, mask=mask)
    tl.store(v_ptr + dst_off, v_rows, mask=mask)


@dataclass(frozen=True, kw_only=True)
class AttentionConfig:
    """Tile sizes: BM query rows (tree rows x group heads) per program, BN keys per step, and the
    warps of the split-K's programs (and its tails'; the defaults: the fastest tiles of `lumobench bench
    attention --sweep` at Qwen3.5-27B's shapes on the H200, results/h200/attention.md); the cache
    partitions (`splits`, fixed per cache: they set the bits) and the split-K programs over them,
    `program_waves` waves over the multiprocessors, at most one a partition (free: a partition is
    one program's whole work whichever program runs it; 4 waves give the paper tree's 3 query
    blocks x 4 KV heads a program a partition up to a 32K context's 44, which the GPU's scheduler
    then balances, the longest first)."""

    block_m: int = 64
    block_n: int = 64
    splits: int | None = None  # equal cache partitions; None: `cache_partitions` of the cache
    num_warps: int = 4
    num_stages: int = 3
    program_waves: int = 4
    descriptors: bool = True  # K and V tiles by tensor-memory descriptors (2-byte caches on the GPU)

    @classmethod
    def for_dtype(cls, dtype: torch.dtype) -> AttentionConfig:
        """The defaults for 2-byte caches; 32-key tiles in 2 stages for float32 (BN64's 3 stages of
        4-byte K and V tiles need 336 KiB of shared memory at head dim 256, past the H200's 227;
        on the GPU they load without descriptors: `tree_attention_`)."""
        return cls() if dtype.itemsize <= 2 else cls(block_n=32, num_stages=2)


def tree_visibility_bits(tree: TreeDescriptor) -> Tensor:
    """[R] int64: bit j of row r set when row r sees tree slot j (physical order). Needs R <= 63.

    The tree-slot columns of `tree_attention_mask`, computed without its prefix columns (whose
    width grows with the context: this runs once per cycle)."""
    if tree.rows >= BITSET_SLOTS:
        raise ValueError(f"the bitset holds {BITSET_SLOTS - 1} tree slots, the tree has {tree.rows} rows")
    sees = tree.ancestry & tree.active[None, :]
    sees[~tree.active, 0] = True  # padding rows see the root, as in the reference mask
    physical = torch.zeros_like(sees)
    physical[:, tree.slot_map] = sees
    return (physical.to(torch.int64) << torch.arange(tree.rows, dtype=torch.int64)).sum(-1)


def check_depth(max_depth: int) -> None:
    """ValueError for trees the tail walk cannot hold (a row's tree slots must lie in its walk)."""
    if max_depth >= TAIL_KEYS:
        raise ValueError(f"tree attention takes trees of depth < {TAIL_KEYS}, got depth {max_depth}")


def short_partitions(capacity: int, keys: int = KEYS_PER_SPLIT) -> int:
    """How many of a cache's partitions hold SHORT_KEYS rows, from its first row (none where `keys`,
    the other partitions' rows, is not larger)."""
    return min(SHORT_PARTITIONS, triton.cdiv(capacity, SHORT_KEYS)) if keys > SHORT_KEYS else 0


def cache_partitions(capacity: int, keys: int = KEYS_PER_SPLIT) -> int:
    """Cache partitions that depend on the cache alone, not on the rows verified or the context, so
    that a verified row sums its keys in the same partitions as the autoregressive step at its
    position: `short_partitions` of SHORT_KEYS rows, then `keys` rows each (the engine's setting by
    default; the attention benchmark sweeps it). Pass both counts to `tree_attention_`."""
    short = short_partitions(capacity, keys)
    return short + triton.cdiv(max(capacity - short * SHORT_KEYS, 0), keys)


def fitted_query_tile(config: AttentionConfig, grouped_rows: int) -> AttentionConfig:
    """config with a query tile no taller than `grouped_rows` need (16 up to its own block_m): for
    callers without the row-invariance contract, whose bits may follow the row count."""
    return replace(config, block_m=min(config.block_m, max(16, triton.next_power_of_2(grouped_rows))))


def device_programs(device: torch.device, programs_per_split: int, waves: int = 1) -> int:
    """Split-K programs per (query block, KV head) that fill every multiprocessor `waves` times."""
    if device.type != "cuda":
        return 2
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, waves * sms // programs_per_split)


def partial_dtype(dtype: torch.dtype) -> torch.dtype:
    """The split-K's partial outputs are stored in the activations' dtype when it takes 2 bytes
    (half the scratch the merge reads back: ~37 MB a layer for the paper tree at 32K in fp32; the
    merge sums in fp32 either way), else in fp32."""
    return dtype if dtype.itemsize == 2 else torch.float32


def partial_buffers(
    rows: int,
    hq: int,
    hkv: int,
    dim: int,
    splits: int,
    block_m: int,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor]:
    """Split-K scratch: o_part [(splits + 1) * Hkv * MPAD, D] of `dtype` (`partial_dtype` of the
    queries') and lse_part fp32 (the cache's partitions, then the tail walk's)."""
    mpad = triton.cdiv(rows * (hq // hkv), block_m) * block_m
    n = (splits + 1) * hkv * mpad
    return (
        torch.empty((n, dim), dtype=dtype, device=device),
        torch.empty((n,), dtype=torch.float32, device=device),
    )


def tree_attention_(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    bits: Tensor,
    prefix_len: Tensor,
    o: Tensor,
    lse: Tensor,
    o_part: Tensor,
    lse_part: Tensor,
    splits: int,
    scale: float,
    config: AttentionConfig = AttentionConfig(),
    stages: frozenset[str] = STAGES,
    by_prefix: bool = False,
    short: int = 0,
    gate: Tensor | None = None,
) -> None:
    """Caller-owned form. q [R, Hq, D]; caches [T_max, Hkv, D] (last dim contiguous); bits [R] int64
    and prefix_len [1] int32/int64 on the device; o [R, Hq, D] (q's dtype), lse [R, Hq] fp32;
    o_part/lse_part from `partial_buffers` with the same splits and block_m. Trees of depth
    < TAIL_KEYS. `stages`: which of the launches ("partials": the split-K's and the tails', "merge")
    to issue (both, but in benchmarks that time them apart). by_prefix: spread the committed prefix
    over the `splits` partitions, read on the device (a short context fills every partition),
    instead of fixed cache rows: the bits then follow the prefix, so a row no longer equals the AR
    step at its position (for callers without that contract: the MTP drafter's passes). short: the
    first `short` of the `splits` partitions hold SHORT_KEYS rows each (`short_partitions`), the
    others share the rest.
    gate: the attention output gate [R, Hq, D] (pre-sigmoid, last dim contiguous): o then holds
    o * sigmoid(gate) with the model's `sigmoid_mul` rounding (one launch fewer than applying it)."""
    rows, hq, dim = q.shape
    hkv = k_cache.shape[1]
    group = hq // hkv
    bm = config.block_m
    mpad = triton.cdiv(rows * group, bm) * bm
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    qk_scale = scale * LOG2E
    strides = (q.stride(0), q.stride(1), k_cache.stride(0))
    # fixed partitions of the whole cache: `short` of SHORT_KEYS rows, then chunk rows each, a whole
    # number of key tiles (by_prefix: the kernels size them from the prefix)
    if by_prefix and short:
        raise ValueError("partitions spread over the prefix have no short ones")
    if not 0 <= short <= splits or (short < splits and short * SHORT_KEYS >= k_cache.shape[0]):
        raise ValueError(f"{short} short partitions of {SHORT_KEYS} rows do not fit {splits} in this cache")
    long_rows = triton.cdiv(max(k_cache.shape[0] - short * SHORT_KEYS, 1), max(splits - short, 1))
    chunk = splits if by_prefix else triton.cdiv(long_rows, config.block_n) * config.block_n
    if "partials" in stages:
        _check_cache_layout(k_cache, v_cache)
        # 4-byte tiles never by descriptor on the GPU, whatever the config: Triton 3.6 compiles their
        # exact dots over descriptor tiles to 32-128 registers and tens of KB of spills (masked loads:
        # 255 registers), and BN64's past the shared memory (262 KB; test_sm90_compile.py); the
        # interpreter has neither limit
        descriptors = config.descriptors and (k_cache.element_size() <= 2 or not k_cache.is_cuda)
        if descriptors:
            triton.set_allocator(_descriptor_scratch(q.device))  # a context variable: the launching thread's
        programs = min(splits, device_programs(q.device, (mpad // bm) * hkv, config.program_waves))
        tree_attention_partial_kernel[((mpad // bm) * hkv * programs + rows * hkv,)](
            q, k_cache, v_cache, bits, prefix_len, o_part, lse_part, rows, qk_scale, *strides, chunk, short,
            programs, G=group, GP=max(16, triton.next_power_of_2(group)), D=dim, BM=bm, BN=config.block_n,
            MPAD=mpad, HKV=hkv, TAIL=TAIL_KEYS, TP=max(16, triton.next_power_of_2(TAIL_KEYS)),
            RP=BITSET_SLOTS, SPLIT=splits, PRECISION=precision, BY_PREFIX=by_prefix, SHORT=SHORT_KEYS,
            DESCRIPTORS=descriptors, num_warps=config.num_warps, num_stages=config.num_stages,
        )  # fmt: skip
    if "merge" in stages:
        # a grouped row a program on the GPU (many short programs), fewer programs under the interpreter
        merge_bm, merge_bd = (1 if q.is_cuda else MERGE_ROWS_INTERPRETED), min(dim, MERGE_BLOCK_D)
        if gate is not None and (gate.shape != q.shape or gate.stride(2) != 1):
            raise ValueError(f"the gate must be [R, Hq, D] like q, its last dim contiguous; got {gate.shape}")
        gates = (o, 0, 0) if gate is None else (gate, gate.stride(0), gate.stride(1))
        tree_attention_merge_kernel[(triton.cdiv(rows * group, merge_bm), hkv, dim // merge_bd)](
            o_part, lse_part, o, lse, gates[0], prefix_len, rows, chunk, short, o.stride(0), o.stride(1),
            *gates[1:], G=group, D=dim, BD=merge_bd, BM=merge_bm, NB=MERGE_PARTITIONS, BN=config.block_n,
            NSPLIT=splits + 1, MPAD=mpad, HKV=hkv, BY_PREFIX=by_prefix, SHORT=SHORT_KEYS,
            GATED=gate is not None, num_warps=MERGE_WARPS,
        )  # fmt: skip


@functools.cache
def _descriptor_scratch(device: torch.device) -> Callable[[int, int, int | None], Tensor]:
    """Triton's allocator for the K and V descriptors the split-K programs build on the device:
    global memory on `device` (a graph capture keeps its allocation; the programs write them at
    every launch)."""
    return lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=device)


def _check_cache_layout(k_cache: Tensor, v_cache: Tensor) -> None:
    """ValueError unless K and V are [T_max, Hkv, D] caches of one layout, each row's heads contiguous
    and 16-byte aligned (what a tensor-memory descriptor over [rows, Hkv * D] needs, and the split-K
    assumes either way)."""
    dim = k_cache.shape[2]
    row_bytes = k_cache.stride(0) * k_cache.element_size()
    if (
        k_cache.stride() != v_cache.stride()
        or k_cache.stride()[1:] != (dim, 1)
        or row_bytes % 16
        or k_cache.data_ptr() % 16
        or v_cache.data_ptr() % 16
    ):
        raise ValueError(
            "tree attention reads K and V caches [T_max, Hkv, D] of one layout with each row's heads "
            f"contiguous and 16-byte aligned; got strides {k_cache.stride()} and {v_cache.stride()}"
        )


def tree_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    tree: TreeDescriptor,
    scale: float | None = None,
    config: AttentionConfig | None = None,
    gate: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The reference's signature: q [R, Hq, D] against prefix + tree KV -> o [R, Hq, D] (q's dtype),
    lse [R, Hq] fp32. Head dim must be a power of two (>= 16 on the GPU); depth < TAIL_KEYS.
    config: None for `AttentionConfig.for_dtype` of q's dtype; gate: the output gate the merge
    applies (`tree_attention_`)."""
    _check_cache(k_cache, v_cache, tree)
    check_depth(int(tree.depth.max()))
    rows, hq, dim = q.shape
    hkv = k_cache.shape[1]
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of KV heads ({hkv})")
    if dim & (dim - 1):
        raise ValueError(f"head dim must be a power of two for the Triton kernel, got {dim}")
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    config = config or AttentionConfig.for_dtype(q.dtype)
    device = q.device
    config = fitted_query_tile(config, rows * (hq // hkv))
    splits = config.splits or cache_partitions(k_cache.shape[0])
    short = 0 if config.splits else short_partitions(k_cache.shape[0])
    o = torch.empty_like(q)
    lse = torch.empty((rows, hq), dtype=torch.float32, device=device)
    o_part, lse_part = partial_buffers(
        rows, hq, hkv, dim, splits, config.block_m, device, partial_dtype(q.dtype)
    )
    prefix = torch.tensor([tree.prefix_len], dtype=torch.int32, device=device)
    tree_attention_(
        q.contiguous(),
        k_cache,
        v_cache,
        tree_visibility_bits(tree).to(device),
        prefix,
        o,
        lse,
        o_part,
        lse_part,
        splits,
        scale,
        config,
        short=short,
        gate=gate,
    )
    return o, lse


def write_kv_(
    k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, slots: Tensor, prefix_len: Tensor | None = None
) -> None:
    """Graph-capturable: k, v [R, Hkv, D] (each row's heads contiguous, any row stride) into cache
    rows slots [R] int64 (+ prefix_len [1] when given), both on the device; one launch for K and V
    (the reference: `reference.write_tree_kv_`). Caches [T_max, Hkv, D] with rows contiguous."""
    k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)  # (no copy in the engine: they match)
    rows, hkv, dim = k.shape
    row = hkv * dim
    for t in (k, v):
        if t.shape != k.shape or t.stride(2) != 1 or t.stride(1) != dim:
            raise ValueError(f"k and v must be [R, Hkv, D] with each row contiguous, got {tuple(t.shape)}")
    block = min(1024, triton.next_power_of_2(row))
    write_kv_kernel[(rows, triton.cdiv(row, block))](
        k, v, k_cache, v_cache, slots, slots if prefix_len is None else prefix_len, k.stride(0), v.stride(0),
        k_cache.stride(0), row, BD=block, PREFIX=prefix_len is not None,
    )  # fmt: skip


def publish_kv_device_(
    k_cache: Tensor,
    v_cache: Tensor,
    slot_map: Tensor,
    prefix_len: Tensor,
    accepted: Tensor,
    path_len: Tensor,
) -> None:
    """Graph-capturable KV remap: slot_map [R] int64, prefix_len [1], accepted [D+1] int64,
    path_len [1], all on the device. Caches [T_max, Hkv, D] with rows contiguous, or banks
    [L, T_max, Hkv, D] of L layers' caches (one launch for them all)."""
    k_bank, v_bank = (c if c.dim() == 4 else c[None] for c in (k_cache, v_cache))
    if k_bank.shape != v_bank.shape or k_bank.stride() != v_bank.stride():
        raise ValueError(f"K and V caches differ: {tuple(k_bank.shape)} {k_bank.stride()} and "
                         f"{tuple(v_bank.shape)} {v_bank.stride()}")  # fmt: skip
    row = k_bank.shape[2] * k_bank.shape[3]
    block = 1024
    publish_kv_kernel[(triton.cdiv(row, block), k_bank.shape[0])](
        k_bank,
        v_bank,
        slot_map,
        prefix_len,
        accepted,
        path_len,
        k_bank.stride(1),
        k_bank.stride(0),
        row,
        P=triton.next_power_of_2(accepted.shape[0]),
        BD=block,
    )


def publish_kv_(
    k_cache: Tensor, v_cache: Tensor, tree: TreeDescriptor, accepted: Tensor, path_len: Tensor | int
) -> bool:
    """The reference's signature. Returns False when the path is a spine prefix (nothing moves)."""
    device = k_cache.device
    n = int(path_len)
    moved = not tree.is_spine_prefix([int(x) for x in accepted[:n].tolist()])
    publish_kv_device_(
        k_cache,
        v_cache,
        tree.slot_map.to(device),
        torch.tensor([tree.prefix_len], dtype=torch.int64, device=device),
        accepted.to(device),
        torch.tensor([n], dtype=torch.int64, device=device),
    )
    return moved
