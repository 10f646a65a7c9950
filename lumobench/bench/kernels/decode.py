"""Tree attention, draft selection, the device walk and the captured commit, against their floors
and the stock PyTorch paths measured in the same run."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from lumobench.bench.kernels.gdn import GdnShape
from lumobench.bench.timing import Timer
from lumobench.checks.random_trees import paper_tree
from lumotree.drafting.fused_selection import rank_rows_, selection_scratch
from lumotree.sampling.device_walk import DeviceWalk
from lumotree.verify.attention.decode import (
    AttentionConfig,
    partial_buffers,
    partial_dtype,
    publish_kv_device_,
    tree_attention_,
    tree_visibility_bits,
)
from lumotree.verify.attention.reference import tree_attention_mask
from lumotree.verify.conv.fused_conv import publish_conv_state_
from lumotree.verify.gdn.reference import GdnOperands
from lumotree.verify.gdn.replay import replay_layers_
from lumotree.verify.graphs import CapturedStage


@dataclass(frozen=True)
class AttentionShape:
    """Qwen3.5-27B attention: 24 query / 4 KV heads of 256."""

    q_heads: int = 24
    kv_heads: int = 4
    dim: int = 256


def attention_rows(
    contexts: list[int],
    shape: AttentionShape,
    dtype: torch.dtype,
    device: torch.device,
    timer: Timer,
    bandwidth: float,
    configs: list[tuple[AttentionConfig, int]],
) -> list[dict]:
    """Per context: each (config, splits) of the Triton kernel, then dense masked SDPA."""
    rows = []
    for ctx in contexts:
        tree = paper_tree(random.Random(ctx), vocab=1000, prefix_len=ctx)
        R = tree.rows
        t_max = ctx + R
        gen = torch.Generator(device=device).manual_seed(ctx)
        k_cache = torch.randn(t_max, shape.kv_heads, shape.dim, generator=gen, device=device).to(dtype)
        v_cache = torch.randn(t_max, shape.kv_heads, shape.dim, generator=gen, device=device).to(dtype)
        q = torch.randn(R, shape.q_heads, shape.dim, generator=gen, device=device).to(dtype)
        kv_bytes = 2 * k_cache.numel() * k_cache.element_size()
        floor_ms = kv_bytes / bandwidth * 1e3
        bits = tree_visibility_bits(tree).to(device)
        prefix = torch.tensor([ctx], dtype=torch.int32, device=device)
        o = torch.empty_like(q)
        lse = torch.empty(R, shape.q_heads, dtype=torch.float32, device=device)
        scale = 1.0 / math.sqrt(shape.dim)
        base = {"context": ctx, "kv_bytes": kv_bytes, "floor_ms": floor_ms}
        for config, splits in configs:
            c = config
            name = f"lumotree BM{c.block_m} BN{c.block_n} w{c.num_warps} s{c.num_stages} splits{splits}"
            try:
                o_part, lse_part = partial_buffers(
                    R, shape.q_heads, shape.kv_heads, shape.dim, splits, config.block_m, device,
                    partial_dtype(dtype),
                )  # fmt: skip

                run = partial(
                    tree_attention_,
                    q,
                    k_cache,
                    v_cache,
                    bits,
                    prefix,
                    o,
                    lse,
                    o_part,
                    lse_part,
                    splits,
                    scale,
                    config,
                )
                rows.append({**base, "method": name, **_timed(run, timer)})
            except Exception as exc:  # one failing variant must not kill the table
                rows.append({**base, "method": name, "error": repr(exc)[:300]})
        mask = tree_attention_mask(tree).to(device)
        k_view, v_view = k_cache.transpose(0, 1)[None], v_cache.transpose(0, 1)[None]

        def sdpa(q=q, k_view=k_view, v_view=v_view, mask=mask) -> None:
            F.scaled_dot_product_attention(
                q.transpose(0, 1)[None], k_view, v_view, attn_mask=mask[None, None], enable_gqa=True
            )

        try:
            rows.append({**base, "method": "torch SDPA, dense boolean mask", **_timed(sdpa, timer)})
        except Exception as exc:
            rows.append({**base, "method": "torch SDPA, dense boolean mask", "error": repr(exc)[:300]})
        del k_cache, v_cache
    return rows


def _timed(fn, timer: Timer) -> dict:
    """Eager and graph-replay medians of one zero-argument call."""
    eager = timer(fn)
    out = {"eager": eager.as_dict()}
    if timer.cuda:
        out["graph"] = timer(CapturedStage(fn).replay).as_dict()
    return out


def selection_rows(
    vocab: int, depths: int, device: torch.device, timer: Timer, bandwidth: float
) -> list[dict]:
    """Fused spine + ordered top-3 vs torch argmax + topk, one logits row per MTP depth."""
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        gen = torch.Generator(device=device).manual_seed(1)
        logits = torch.randn(depths, vocab, generator=gen, device=device).to(dtype)
        spine = torch.empty(depths, dtype=torch.int64, device=device)
        topk = torch.empty(depths, 3, dtype=torch.int64, device=device)
        scratch = selection_scratch(depths, vocab, 3, device)
        base = {
            "dtype": str(dtype).replace("torch.", ""),
            "rows": depths,
            "vocab": vocab,
            "floor_ms": logits.numel() * logits.element_size() / bandwidth * 1e3,
        }

        def fused(logits=logits, spine=spine, topk=topk, scratch=scratch) -> None:
            rank_rows_(logits, spine, topk, scratch)

        rows.append({**base, "method": "lumotree fused selection", **_timed(fused, timer)})

        def stock(logits=logits) -> None:
            torch.argmax(logits, dim=-1)
            torch.topk(logits, 3, dim=-1)

        rows.append({**base, "method": "torch argmax + topk", **_timed(stock, timer)})
    return rows


def walk_rows(vocab: int, device: torch.device, timer: Timer, bandwidth: float) -> list[dict]:
    """Device greedy and sampling walks over the paper tree's 32 rows of full-vocabulary scores."""
    tree = paper_tree(random.Random(2), vocab=1000, prefix_len=4096)
    gen = torch.Generator(device=device).manual_seed(2)
    logits = torch.randn(tree.rows, vocab, generator=gen, device=device)
    probs = torch.softmax(logits, -1)
    walk = DeviceWalk(tree.rows, vocab, 1, tree.max_depth, child_cap=8, device=device)
    walk.load_tree_(tree)
    seeds = torch.tensor([1234], dtype=torch.int64, device=device)
    root_position = torch.tensor([7], dtype=torch.int64, device=device)
    floor = logits.numel() * 4 / bandwidth * 1e3
    base = {"rows": tree.rows, "vocab": vocab, "floor_ms": floor}
    return [
        {**base, "method": "device greedy walk", **_timed(lambda: walk.greedy_(logits), timer)},
        {
            **base,
            "method": "device sampling walk (Philox race)",
            **_timed(lambda: walk.sample_(probs, seeds, root_position), timer),
        },
    ]


def commit_rows(
    gdn: GdnShape,
    attn: AttentionShape,
    conv_channels: int,
    layers_attn: int,
    context: int,
    device: torch.device,
    timer: Timer,
    bandwidth: float,
) -> list[dict]:
    """The captured commit: GDN replay (all layers, one launch) + conv-state publication per GDN
    layer + KV remap per attention layer, for the deepest accepted path off the spine."""
    tree = paper_tree(random.Random(3), vocab=1000, prefix_len=context)
    L, R, HV, H, K, V, C = gdn.layers, tree.rows, gdn.v_heads, gdn.heads, gdn.dk, gdn.dv, conv_channels
    gen = torch.Generator(device=device).manual_seed(3)

    def randn(*dims: int) -> torch.Tensor:
        return torch.randn(*dims, generator=gen, device=device)

    states = randn(L, HV, V, K)
    rec = GdnOperands(
        q=randn(L, R, H, K),
        k=F.normalize(randn(L, R, H, K), dim=-1),
        v=randn(L, R, HV, V),
        g=-torch.rand(L, R, HV, generator=gen, device=device),
        beta=torch.rand(L, R, HV, generator=gen, device=device),
    )
    conv_states = randn(L, C, 3).bfloat16()
    conv_x = randn(L, R, C).bfloat16()
    kv = [randn(context + R, attn.kv_heads, attn.dim).bfloat16() for _ in range(2 * layers_attn)]
    off_spine = max(
        (n for n in range(tree.n_active) if not tree.is_spine_prefix(tree.path_to(n))),
        key=lambda n: int(tree.depth[n]),
    )
    path = tree.path_to(off_spine)
    accepted = tree.padded_path(path).to(device)
    path_len = torch.tensor([len(path)], device=device)
    slot_map = tree.slot_map.to(device)
    prefix = torch.tensor([context], dtype=torch.int64, device=device)

    def commit() -> None:
        replay_layers_(states, rec, accepted, path_len, one_launch=True)
        for layer in range(L):
            publish_conv_state_(conv_states[layer], conv_x[layer], accepted, path_len)
        for layer in range(layers_attn):
            publish_kv_device_(kv[2 * layer], kv[2 * layer + 1], slot_map, prefix, accepted, path_len)

    kv_row = attn.kv_heads * attn.dim * 2
    floor_bytes = (
        2 * states.numel() * 4 + 2 * len(path) * kv_row * 2 * layers_attn + 2 * conv_states.numel() * 2
    )
    name = f"commit graph ({L} GDN + {layers_attn} attention layers, path of {len(path)} off the spine)"
    return [{"method": name, "floor_ms": floor_bytes / bandwidth * 1e3, **_timed(commit, timer)}]
