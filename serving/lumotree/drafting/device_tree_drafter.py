"""The paper tree drafted on the device, inside the cycle, so the tree's next cycle can start before
the host reads this one's results (as AR and chain MTP do): the host leaves the critical path.

After a cycle's MTP passes, four launches do on the device what `drafter.paper_topology` does with
the host's `SuffixDrafter`, with the same result for the same tokens:

    append    the cycle's emitted tokens join the request's token history
    scan      every block of the history and of the cache of earlier outputs finds the occurrences
              of the two lookups' keys (the last `min_match` tokens of history + MTP spine for the
              principal tail, of the history alone for the rescue branches) and keeps its latest
              `per_key` (grid: blocks x lookups)
    pick      per lookup, the latest `per_key` occurrences of each source, each extended backwards to
              its match length (up to `max_match`), ranked (longer match, this request before the
              cache, later first) and cut to the distinct continuations the tree takes
    assemble  the trie in insertion order: root, the MTP spine and the tail, the runner-up siblings
              per depth, the rescue branches below the node where each leaves the tree; written as
              the next cycle's feed (tokens, parents, node count) for `DeviceTree.derive_`

The reference beside it is the host drafter (`drafter.paper_topology` over `suffix.SuffixDrafter`);
the interpreter tests compare the two on random histories, caches and proposals.

The history holds the request's prompt and output (`load`, then `push` for the first token; the
cycles append the rest); the cache is `OutputCache.concatenated()`: earlier outputs, oldest first,
each after a separator, copied when it changed. Both are static buffers, so the launches are
captured with the cycle.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import triton
import triton.language as tl
from torch import Tensor

from lumotree.drafting.geometry import GeometryConfig
from lumotree.drafting.suffix import SEPARATOR, SuffixDrafter
from lumotree.tree import PAD_TOKEN, TreeTopology

SEP = tl.constexpr(SEPARATOR)  # (a kernel reads globals only as constexprs)


@triton.jit
def _context_token(hist_ptr, hist_len, extra_ptr, n_extra, back):
    """context[-1 - back] with context = history + extra (-1 before its start)."""
    in_extra = back < n_extra
    extra = tl.load(extra_ptr + tl.maximum(n_extra - 1 - back, 0), mask=in_extra, other=-1)
    at = hist_len - 1 - (back - n_extra)
    past = tl.load(hist_ptr + tl.maximum(at, 0), mask=(~in_extra) & (at >= 0), other=-1)
    return tl.where(in_extra, extra, past)


@triton.jit
def _source_token(hist_ptr, cache_ptr, from_hist, at, mask, other):
    """Tokens at `at` of the history (from_hist) or of the cache."""
    safe = tl.maximum(at, 0)
    h = tl.load(hist_ptr + safe, mask=mask & from_hist, other=other)
    c = tl.load(cache_ptr + safe, mask=mask & (~from_hist), other=other)
    return tl.where(from_hist, h, c)


@triton.jit
def append_history_kernel(
    hist_ptr, hist_len_ptr, emitted_ptr, path_len_ptr, CAP: tl.constexpr, WP: tl.constexpr
):
    i = tl.arange(0, WP)
    n = tl.load(path_len_ptr)
    at = tl.load(hist_len_ptr)
    tokens = tl.load(emitted_ptr + i, mask=i < n, other=0)
    tl.store(hist_ptr + at + i, tokens, mask=(i < n) & (at + i < CAP))
    tl.debug_barrier()
    tl.store(hist_len_ptr, tl.minimum(at + n, CAP))


@triton.jit
def suffix_scan_kernel(
    hist_ptr,
    hist_len_ptr,
    cache_ptr,
    cache_len_ptr,
    spine_ptr,
    counts_ptr,  # [2 lookups, 2 sources, NBP] int32: occurrences per block
    ends_ptr,  # [2, 2, NBP, PK] int32: a block's latest PK occurrences (key end index), latest first
    DEPTH: tl.constexpr,
    K: tl.constexpr,
    PK: tl.constexpr,
    BLOCK: tl.constexpr,
    NBH: tl.constexpr,
    NBP: tl.constexpr,
):
    block, lookup = tl.program_id(0), tl.program_id(1)
    hist_len = tl.load(hist_len_ptr)
    n_extra = tl.where(lookup == 0, DEPTH, 0)
    lane = tl.arange(0, BLOCK)
    from_hist = (lane * 0 + block) < NBH  # (a vector: the interpreter mixes no scalar into vector logic)
    blk = tl.where(block < NBH, block, block - NBH)
    src_len = tl.where(block < NBH, hist_len, tl.load(cache_len_ptr))
    end = blk * BLOCK + lane
    hit = tl.where(hist_len + n_extra >= K, (end >= K - 1) & (end < src_len), False)
    for t in tl.static_range(K):
        want = _context_token(hist_ptr, hist_len, spine_ptr, n_extra, t)
        hit = hit & (_source_token(hist_ptr, cache_ptr, from_hist, end - t, hit, -2) == want)
    count = tl.sum(hit.to(tl.int32), axis=0)
    rank = count - tl.cumsum(hit.to(tl.int32), axis=0)  # 0: the block's latest occurrence
    row = (lookup * 2 + tl.where(block < NBH, 0, 1)) * NBP + blk
    tl.store(counts_ptr + row, count)
    tl.store(ends_ptr + row * PK + rank, end.to(tl.int32), mask=hit & (rank < PK))


@triton.jit
def suffix_pick_kernel(
    hist_ptr,
    hist_len_ptr,
    cache_ptr,
    cache_len_ptr,
    spine_ptr,
    counts_ptr,
    ends_ptr,
    picked_ptr,  # [2 lookups, NCP, LENP] int64: the chosen continuations, best first
    picked_len_ptr,  # [2, NCP] int64: their lengths (0: none)
    DEPTH: tl.constexpr,
    K: tl.constexpr,
    MAXM: tl.constexpr,
    MAXMP: tl.constexpr,
    PER_KEY: tl.constexpr,
    PK: tl.constexpr,
    NBP: tl.constexpr,
    TAIL: tl.constexpr,
    MAXD: tl.constexpr,
    CANDIDATES: tl.constexpr,
    LENP: tl.constexpr,
    NCP: tl.constexpr,
):
    lookup = tl.program_id(0)
    hist_len = tl.load(hist_len_ptr)
    cache_len = tl.load(cache_len_ptr)
    n_extra = tl.where(lookup == 0, DEPTH, 0)
    length = tl.where(lookup == 0, TAIL, MAXD)
    limit = tl.where(lookup == 0, 1, CANDIDATES)  # the tail: the best; rescues: CANDIDATES
    reach = tl.minimum(MAXM, hist_len + n_extra)

    # the latest PER_KEY occurrences of each source: candidate c = (source c // PK, rank c % PK)
    c = tl.arange(0, 2 * PK)
    from_hist = c < PK
    j = c % PK
    b = tl.arange(0, NBP)
    counts_h = tl.load(counts_ptr + (lookup * 2) * NBP + b)
    counts_c = tl.load(counts_ptr + (lookup * 2 + 1) * NBP + b)
    later_h = tl.sum(counts_h, axis=0) - tl.cumsum(counts_h, axis=0)  # occurrences in later blocks
    later_c = tl.sum(counts_c, axis=0) - tl.cumsum(counts_c, axis=0)
    counts = tl.where(from_hist[:, None], counts_h[None, :], counts_c[None, :])
    later = tl.where(from_hist[:, None], later_h[None, :], later_c[None, :])
    inside = (later <= j[:, None]) & (j[:, None] < later + counts)
    has = (tl.sum(inside.to(tl.int32), axis=1) > 0) & (j < PER_KEY)
    blk = tl.sum(tl.where(inside, b[None, :], 0), axis=1)
    base = tl.sum(tl.where(inside, later, 0), axis=1)
    source = tl.where(from_hist, 0, 1)
    end = tl.load(ends_ptr + ((lookup * 2 + source) * NBP + blk) * PK + (j - base), mask=has, other=0)
    start = end.to(tl.int64) + 1
    src_len = tl.where(from_hist, hist_len, cache_len)
    first = _source_token(hist_ptr, cache_ptr, from_hist, start, has & (start < src_len), SEP)
    valid = has & (start < src_len) & (first != SEP)

    # Every token the ranking reads is loaded up front as two tiles (the code is latency-bound: one
    # round of loads instead of a chain of them): the context behind each occurrence, and the
    # continuation after it.
    # match length: how far each occurrence extends backwards while it equals the context
    t = tl.arange(0, MAXMP)
    want = _context_token(hist_ptr, hist_len, spine_ptr, n_extra, t)
    at = start[:, None] - 1 - t[None, :]
    behind_ok = valid[:, None] & (at >= 0) & (t[None, :] < MAXM)
    behind = _source_token(hist_ptr, cache_ptr, from_hist[:, None], at, behind_ok, -3)
    checked = (t[None, :] >= K) & (t[None, :] < reach)
    stop = tl.min(tl.where(checked & (behind != want[None, :]), t[None, :], reach), axis=1)
    matched = tl.where(valid, tl.maximum(stop, K), K).to(tl.int32)

    # continuation lengths (to the source's end, a separator, or `length`)
    u = tl.arange(0, LENP)
    ahead_at = start[:, None] + u[None, :]
    ok = valid[:, None] & (u[None, :] < length) & (ahead_at < src_len[:, None])
    ahead = _source_token(hist_ptr, cache_ptr, from_hist[:, None], ahead_at, ok, SEP)
    ends = tl.min(tl.where(ahead == SEP, u[None, :], LENP), axis=1)
    cont_len = tl.where(valid, ends, 0).to(tl.int32)
    real = valid & (cont_len > 0)
    order = tl.where(real, (MAXM - matched) * (2 * PK) + c, 1 << 30)  # longer, hist first, later first

    # distinct continuations: a candidate repeating a better one's continuation is skipped
    inside_cont = real[:, None] & (u[None, :] < cont_len[:, None])
    ahead = tl.where(inside_cont, ahead, SEP)
    same = cont_len[:, None] == cont_len[None, :]
    for step in tl.static_range(LENP):
        token = tl.sum(tl.where(u[None, :] == step, ahead, 0), axis=1)
        same = same & (token[:, None] == token[None, :])
    better = order[None, :] < order[:, None]  # [a, b]: b ranks before a
    repeat = tl.sum((same & better & real[None, :]).to(tl.int32), axis=1) > 0
    kept = real & ~repeat
    rank = tl.sum((kept[None, :] & better).to(tl.int32), axis=1)
    chosen = kept & (rank < limit)

    # the chosen ones into their rank's slot (their ranks differ); the other slots' lengths are 0
    tl.store(picked_len_ptr + lookup * NCP + tl.arange(0, NCP), tl.zeros([NCP], dtype=tl.int64))
    tl.debug_barrier()
    slot = lookup * NCP + tl.where(chosen, rank, 0)
    tl.store(picked_len_ptr + slot, cont_len.to(tl.int64), mask=chosen)
    keep = chosen[:, None] & inside_cont
    tl.store(picked_ptr + slot[:, None] * LENP + u[None, :], ahead, mask=keep)


@triton.jit
def _child(tok, par, idx, n, parent, token, RP: tl.constexpr):
    """The child of `parent` carrying `token` (RP when there is none)."""
    hit = (par == parent) & (tok == token) & (idx < n) & (idx > 0)
    return tl.min(tl.where(hit, idx, RP), axis=0)


@triton.jit
def paper_tree_kernel(
    hist_ptr,
    hist_len_ptr,
    spine_ptr,
    topk_ptr,
    picked_ptr,
    picked_len_ptr,
    rescue_lens_ptr,
    feed_ptr,  # [2R + 1] int64: tokens, parents, node count
    merges_ptr,  # [1] int64
    DEPTH: tl.constexpr,
    KTOP: tl.constexpr,
    SIBS: tl.constexpr,
    TAIL: tl.constexpr,
    N_RESCUE: tl.constexpr,
    R: tl.constexpr,
    RP: tl.constexpr,
    MAXD: tl.constexpr,
    LENP: tl.constexpr,
    NCP: tl.constexpr,
    PAD: tl.constexpr,
):
    idx = tl.arange(0, RP)
    hist_len = tl.load(hist_len_ptr)
    root = tl.load(hist_ptr + tl.maximum(hist_len - 1, 0))
    tok = tl.where(idx == 0, root, PAD).to(tl.int64)
    par = tl.full([RP], -1, dtype=tl.int64)
    n = tl.full([], 1, dtype=tl.int64)
    merges = tl.zeros([], dtype=tl.int64)

    # the spine: the MTP drafts, then the principal tail; it ends at the first token that does not fit
    # (once a token does not fit, none after it does: the budget and the depth only grow)
    tail_len = tl.load(picked_len_ptr)
    last = tl.zeros([], dtype=tl.int64)
    for t in tl.static_range(DEPTH + TAIL):
        if t < DEPTH:
            token = tl.load(spine_ptr + t)
            fits = (n < R) & (last + 1 <= MAXD)  # the spine's node `last` has depth `last`
        else:
            token = tl.load(picked_ptr + (t - DEPTH))
            fits = ((t - DEPTH) < tail_len) & (n < R) & (last + 1 <= MAXD)
        new = tl.where(fits, idx == n, False)
        tok = tl.where(new, token, tok)
        par = tl.where(new, last, par)
        last = tl.where(fits, n, last)
        n += fits.to(tl.int64)
    spine_nodes = n  # nodes 0..n-1, node d at depth d

    # runner-ups: per MTP depth d, the first SIBS ranked tokens other than the spine's, below node d
    for d in tl.static_range(DEPTH):
        on_spine = d < spine_nodes
        spine_token = tl.load(spine_ptr + d)
        taken = tl.zeros([], dtype=tl.int64)
        for q in tl.static_range(KTOP):
            token = tl.load(topk_ptr + d * KTOP + q)
            take = on_spine & (token != spine_token) & (taken < SIBS)
            taken += take.to(tl.int64)
            there = _child(tok, par, idx, n, d, token, RP) < RP
            merges += (take & there).to(tl.int64)
            fits = take & ~there & (n < R) & (d + 1 <= MAXD)
            new = tl.where(fits, idx == n, False)
            tok = tl.where(new, token, tok)
            par = tl.where(new, d, par)
            n += fits.to(tl.int64)

    # rescue branches: each continuation after the root walks the tree as far as it agrees with it,
    # and the rest (cut to its length) hangs below the node where it leaves; empty ones are skipped
    # (the rows are read once; the steps pick their tokens in registers, not through dependent loads)
    lanes = tl.arange(0, LENP)
    wanted = tl.load(rescue_lens_ptr + lanes, mask=lanes < N_RESCUE, other=0)
    placed = tl.zeros([], dtype=tl.int64)
    for cand in tl.static_range(2 * N_RESCUE):
        row = tl.load(picked_ptr + (NCP + cand) * LENP + lanes)
        cont_len = tl.load(picked_len_ptr + NCP + cand)
        active = placed < N_RESCUE
        node = tl.zeros([], dtype=tl.int64)
        at = tl.zeros([], dtype=tl.int64)  # also the depth of `node`
        walking = active
        for u in tl.static_range(MAXD):
            token = tl.sum(tl.where(lanes == u, row, 0), axis=0)
            child = _child(tok, par, idx, n, node, token, RP)
            found = walking & (u < cont_len) & (child < RP)
            node = tl.where(found, child, node)
            at += found.to(tl.int64)
            walking = found
        want = tl.sum(tl.where(lanes == placed, wanted, 0), axis=0)
        branch = tl.maximum(tl.minimum(cont_len - at, want), 0)
        place = active & (branch > 0)
        ok = place
        depth = at
        for u in tl.static_range(MAXD):
            token = tl.sum(tl.where(lanes == at + u, row, 0), axis=0)
            step = ok & (u < branch)
            child = _child(tok, par, idx, n, node, token, RP)
            there = step & (child < RP)
            fits = step & ~there & (n < R) & (depth + 1 <= MAXD)
            merges += there.to(tl.int64)
            new = tl.where(fits, idx == n, False)
            tok = tl.where(new, token, tok)
            par = tl.where(new, node, par)
            node = tl.where(there, child, tl.where(fits, n, node))
            depth += (there | fits).to(tl.int64)
            n += fits.to(tl.int64)
            ok = ok & (~step | there | fits)  # a branch cut by the budget ends there
        placed += place.to(tl.int64)

    in_tree = idx < R
    tl.store(feed_ptr + idx, tok, mask=in_tree)
    tl.store(feed_ptr + R + idx, par, mask=in_tree)
    tl.store(feed_ptr + 2 * R, n)
    tl.store(merges_ptr, merges)


class DeviceTreeDrafter:
    """The paper tree of `geometry` drafted on the device from the MTP proposal and the suffix
    lookups `suffix` would make (its key length, match length, per-key occurrences and cache
    budget). history: tokens the request may reach (prompt + output); depth, k: the MTP drafter's
    passes and ranked candidates per pass; block: tokens a scan program reads."""

    def __init__(
        self,
        geometry: GeometryConfig,
        suffix: SuffixDrafter,
        depth: int,
        k: int,
        history: int,
        device: torch.device | str,
        block: int = 4096,
    ) -> None:
        if depth != geometry.depth_mtp:
            raise ValueError(f"the tree's spine has {geometry.depth_mtp} MTP drafts, the drafter {depth}")
        self.geometry, self.depth, self.k = geometry, depth, k
        self.key_len, self.max_match, self.per_key = suffix.min_match, suffix.max_match, suffix.per_key
        self.device = torch.device(device)
        cache_capacity = 2 * suffix.outputs.budget + 1  # each output (>= 1 token) after a separator
        self.block = min(block, triton.next_power_of_2(max(history, cache_capacity)))
        self.hist_blocks = triton.cdiv(history, self.block)
        self.cache_blocks = triton.cdiv(cache_capacity, self.block)
        i64 = dict(dtype=torch.int64, device=self.device)
        self.hist = torch.zeros(self.hist_blocks * self.block, **i64)
        self.hist_len = torch.zeros(1, **i64)
        self.cache = torch.full((self.cache_blocks * self.block,), SEPARATOR, **i64)
        self.cache_len = torch.zeros(1, **i64)
        self.length = 0  # host mirror of hist_len, valid between `load` and the first cycle
        self._cache_version = -1
        self.nbp = triton.next_power_of_2(max(self.hist_blocks, self.cache_blocks))
        self.pk = triton.next_power_of_2(self.per_key)
        self.counts = torch.zeros((2, 2, self.nbp), dtype=torch.int32, device=self.device)
        self.ends = torch.zeros((2, 2, self.nbp, self.pk), dtype=torch.int32, device=self.device)
        n_rescue = len(geometry.rescue_lens)
        self.lenp = triton.next_power_of_2(max(geometry.max_depth, geometry.tail_len, 1))
        self.ncp = triton.next_power_of_2(max(2 * n_rescue, 1))
        if n_rescue > self.lenp:
            raise ValueError(f"{n_rescue} rescue branches: at most {self.lenp} at this depth")
        self.picked = torch.zeros((2, self.ncp, self.lenp), **i64)
        self.picked_len = torch.zeros((2, self.ncp), **i64)
        self.rescue_lens = torch.tensor([*geometry.rescue_lens, 0], **i64)
        self.merges = torch.zeros(1, **i64)

    def load(self, prompt: Sequence[int], suffix: SuffixDrafter) -> None:
        """A new request: its prompt as the history, and the suffix drafter's earlier outputs
        (copied when they changed since the last request)."""
        if len(prompt) > self.hist.numel():
            raise ValueError(f"the history holds {self.hist.numel()} tokens, the prompt has {len(prompt)}")
        if prompt:
            self.hist[: len(prompt)].copy_(torch.as_tensor(np.asarray(prompt, dtype=np.int64)))
        self.hist_len.fill_(len(prompt))
        self.length = len(prompt)
        if suffix.outputs.version != self._cache_version:
            flat = suffix.outputs.concatenated()
            self.cache[: flat.size].copy_(torch.from_numpy(flat))
            self.cache_len.fill_(flat.size)
            self._cache_version = suffix.outputs.version

    def push(self, token: int) -> None:
        """Append one token the host knows (the first output token, before the first cycle)."""
        if self.length < self.hist.numel():
            self.hist[self.length] = token
            self.length += 1
            self.hist_len.fill_(self.length)

    def draft_(self, emitted: Tensor, path_len: Tensor, spine: Tensor, topk: Tensor, feed: Tensor) -> None:
        """Append the cycle's emitted tokens (emitted [D + 1], path_len [1]) and write the next
        tree below the last of them into `feed` [2R + 1] from the proposal (spine [depth], topk
        [depth, k]); graph-capturable."""
        geo, rows = self.geometry, (feed.numel() - 1) // 2
        n_rescue = len(geo.rescue_lens)
        append_history_kernel[(1,)](
            self.hist, self.hist_len, emitted, path_len, CAP=self.hist.numel(),
            WP=triton.next_power_of_2(emitted.numel()), num_warps=1,
        )  # fmt: skip
        scan = (self.hist_blocks + self.cache_blocks, 2)
        suffix_scan_kernel[scan](
            self.hist, self.hist_len, self.cache, self.cache_len, spine, self.counts, self.ends,
            DEPTH=self.depth, K=self.key_len, PK=self.pk, BLOCK=self.block, NBH=self.hist_blocks,
            NBP=self.nbp, num_warps=4,
        )  # fmt: skip
        suffix_pick_kernel[(2,)](
            self.hist, self.hist_len, self.cache, self.cache_len, spine, self.counts, self.ends,
            self.picked, self.picked_len, DEPTH=self.depth, K=self.key_len, MAXM=self.max_match,
            MAXMP=triton.next_power_of_2(self.max_match), PER_KEY=self.per_key, PK=self.pk, NBP=self.nbp,
            TAIL=geo.tail_len, MAXD=geo.max_depth, CANDIDATES=2 * n_rescue, LENP=self.lenp, NCP=self.ncp,
            num_warps=4,
        )  # fmt: skip
        paper_tree_kernel[(1,)](
            self.hist, self.hist_len, spine, topk, self.picked, self.picked_len, self.rescue_lens,
            feed, self.merges, DEPTH=self.depth, KTOP=self.k, SIBS=geo.siblings_per_depth,
            TAIL=geo.tail_len, N_RESCUE=n_rescue, R=rows, RP=max(16, triton.next_power_of_2(rows)),
            MAXD=geo.max_depth, LENP=self.lenp, NCP=self.ncp, PAD=PAD_TOKEN, num_warps=1,
        )  # fmt: skip


def topology_from_feed(values: Sequence[int], rows: int, merges: int) -> TreeTopology:
    """The tree a feed [2R + 1] holds (tokens, parents, node count), as a `TreeTopology`."""
    n = values[2 * rows]
    tokens, parents = tuple(values[:n]), tuple(values[rows : rows + n])
    depths = [0] * n
    for node in range(1, n):
        depths[node] = depths[parents[node]] + 1
    return TreeTopology(tokens, parents, tuple(depths), merges)
