"""Tree conv and tree attention checks against per-node contiguous (step-by-step) computations:
float64 exact to 1e-12, fp32/bf16 under the paired rule, publication exact, planted faults caught."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor

from lumobench.checks.gdn_checks import FLOAT64_TOL, frontiers
from lumobench.checks.paired import paired_check
from lumobench.checks.random_trees import SHAPES, random_tree
from lumobench.checks.result import CheckResult
from lumotree.tree import TreeDescriptor, chain_tree
from lumotree.verify.attention.reference import publish_kv_, tree_attention, write_tree_kv_
from lumotree.verify.conv.reference import publish_conv_state_, tree_conv

DTYPES = (torch.float32, torch.bfloat16)


def conv_stepwise(
    x: Tensor, conv_state: Tensor, weight: Tensor, bias: Tensor, tree: TreeDescriptor
) -> Tensor:
    """Each node's output from F.conv1d over its contiguous history (state, then its path's inputs)."""
    out = torch.zeros_like(x)
    for node in range(tree.n_active):
        seq = torch.cat([conv_state, x[tree.path_to(node)].T], dim=1)[None]  # [1, C, W-1+depth+1]
        out[node] = F.silu(F.conv1d(seq, weight[:, None, :], bias, groups=x.shape[1]))[0, :, -1]
    return out


def check_tree_conv(trees: Sequence[TreeDescriptor], channels: int = 48, seed: int = 0) -> CheckResult:
    """Tree conv vs stepwise conv (f64 exact; fp32/bf16 paired); conv-state publication exact for every
    frontier; the omitted-gather faults (verify and publish) are caught."""
    gen = torch.Generator().manual_seed(seed)
    result = CheckResult("Tree conv + conv publish")
    worst = 0.0
    for tree in trees:
        x = torch.randn(tree.rows, channels, generator=gen, dtype=torch.float64)
        state = torch.randn(channels, 3, generator=gen, dtype=torch.float64)
        weight = 0.5 * torch.randn(channels, 4, generator=gen, dtype=torch.float64)
        bias = 0.1 * torch.randn(channels, generator=gen, dtype=torch.float64)
        n = tree.n_active
        ref = conv_stepwise(x, state, weight, bias, tree)
        err = float((tree_conv(x, state, weight, bias, tree)[:n] - ref[:n]).abs().max())
        worst = max(worst, err)
        ok = err <= FLOAT64_TOL
        for dtype in DTYPES:
            args = [t.to(dtype) for t in (x, state, weight, bias)]
            truth = conv_stepwise(*(a.double() for a in args), tree)
            native = conv_stepwise(*args, tree)
            ok &= paired_check(tree_conv(*args, tree)[:n], native[:n], truth[:n], 1, dtype).ok
        for path in frontiers(tree):
            length = int((path >= 0).sum())
            published = state.clone()
            publish_conv_state_(published, x, path, length)
            ok &= torch.equal(published, torch.cat([state, x[path[:length]].T], dim=1)[:, -3:])
        result.case(ok)
        # Omitted gather: windows taken from the flattened rows, as if the tree were a chain.
        flat = chain_tree([0] * tree.rows, prefix_len=tree.prefix_len, max_depth=tree.rows)
        if any(tree.path_to(i) != list(range(int(tree.depth[i]) + 1)) for i in range(n)):
            result.fault(not torch.allclose(tree_conv(x, state, weight, bias, flat)[:n], ref[:n], atol=1e-9))
            deep = max(
                range(n),
                key=lambda i: (tree.path_to(i) != list(range(int(tree.depth[i]) + 1)), int(tree.depth[i])),
            )
            path = frontiers(tree)[deep]
            length = int((path >= 0).sum())
            published = state.clone()
            publish_conv_state_(published, x, torch.arange(length), length)
            result.fault(not torch.equal(published, torch.cat([state, x[path[:length]].T], dim=1)[:, -3:]))
    result.detail = f"f64 max |diff| {worst:.1e}; faults: omitted gather in verify, in publication"
    return result


def attention_stepwise(
    q: Tensor, k: Tensor, v: Tensor, k_prefix: Tensor, v_prefix: Tensor, tree: TreeDescriptor
) -> Tensor:
    """Each node's output from SDPA over its contiguous sequence (prefix, then its path's keys)."""
    hq, hkv = q.shape[1], k.shape[1]
    out = torch.zeros_like(q)
    for node in range(tree.n_active):
        path = tree.path_to(node)
        keys = torch.cat([k_prefix, k[path]]).repeat_interleave(hq // hkv, dim=1).transpose(0, 1)
        vals = torch.cat([v_prefix, v[path]]).repeat_interleave(hq // hkv, dim=1).transpose(0, 1)
        out[node] = F.scaled_dot_product_attention(q[node][:, None], keys, vals)[:, 0]
    return out


def check_tree_attention(
    trees: Sequence[TreeDescriptor], heads: tuple[int, int] = (4, 2), dim: int = 32, seed: int = 0
) -> CheckResult:
    """Tree attention vs stepwise SDPA (f64 exact; fp32/bf16 paired); KV publication equals the
    contiguous path for every frontier, moves nothing for spine prefixes; a wrong remap is caught."""
    gen = torch.Generator().manual_seed(seed)
    hq, hkv = heads
    result = CheckResult("Tree attention + KV publish")
    worst = 0.0
    for tree in trees:
        p, rows, n = tree.prefix_len, tree.rows, tree.n_active
        q = torch.randn(rows, hq, dim, generator=gen, dtype=torch.float64)
        k = torch.randn(rows, hkv, dim, generator=gen, dtype=torch.float64)
        v = torch.randn(rows, hkv, dim, generator=gen, dtype=torch.float64)
        kp = torch.randn(p, hkv, dim, generator=gen, dtype=torch.float64)
        vp = torch.randn(p, hkv, dim, generator=gen, dtype=torch.float64)
        kv = (k, v, kp, vp)

        ref = attention_stepwise(q, k, v, kp, vp, tree)
        err = float(
            (tree_attention(q, *_filled_cache(torch.float64, tree, *kv), tree)[0][:n] - ref[:n]).abs().max()
        )
        worst = max(worst, err)
        ok = err <= FLOAT64_TOL
        for dtype in DTYPES:
            args = [t.to(dtype) for t in (q, k, v, kp, vp)]
            truth = attention_stepwise(*(a.double() for a in args), tree)
            native = attention_stepwise(*args, tree)
            ok &= paired_check(
                tree_attention(args[0], *_filled_cache(dtype, tree, *kv), tree)[0][:n],
                native[:n],
                truth[:n],
                2,
                dtype,
            ).ok
        wrong_remap_caught = []
        for path in frontiers(tree):
            length = int((path >= 0).sum())
            nodes = path[:length]
            kc, vc = _filled_cache(torch.float64, tree, *kv)
            before = kc.clone()
            moved = publish_kv_(kc, vc, tree, path, length)
            ok &= torch.equal(kc[p : p + length], k[nodes]) and torch.equal(vc[p : p + length], v[nodes])
            ok &= torch.equal(kc[:p], before[:p]) and moved != tree.is_spine_prefix(nodes.tolist())
            if not moved:
                ok &= torch.equal(kc, before)
            if tree.slot_map[nodes].tolist() != nodes.tolist():
                kc, vc = _filled_cache(torch.float64, tree, *kv)
                publish_kv_(kc, vc, _logical_slots(tree), path, length)
                wrong_remap_caught.append(not torch.equal(kc[p : p + length], k[nodes]))
        result.case(ok)
        if wrong_remap_caught:
            result.fault(all(wrong_remap_caught))
    result.detail = f"f64 max |diff| {worst:.1e}; fault: KV remap by logical index"
    return result


def _filled_cache(
    dtype: torch.dtype, tree: TreeDescriptor, k: Tensor, v: Tensor, kp: Tensor, vp: Tensor
) -> tuple[Tensor, Tensor]:
    """KV caches [prefix + R, Hkv, D] holding the prefix rows, then the tree rows at their slots."""
    p = tree.prefix_len
    kc = torch.zeros(p + tree.rows, *k.shape[1:], dtype=dtype)
    vc = torch.zeros_like(kc)
    kc[:p], vc[:p] = kp.to(dtype), vp.to(dtype)
    write_tree_kv_(kc, vc, k.to(dtype), v.to(dtype), tree)
    return kc, vc


def _logical_slots(tree: TreeDescriptor) -> TreeDescriptor:
    return replace(tree, slot_map=torch.arange(tree.rows))


def attention_trees(count: int, seed: int) -> list[TreeDescriptor]:
    """Random trees with prefixes from empty to a few hundred tokens."""
    rng = random.Random(seed)
    return [
        random_tree(SHAPES[i % len(SHAPES)], rng, prefix_len=rng.choice([0, 1, 17, 300]))
        for i in range(count)
    ]
