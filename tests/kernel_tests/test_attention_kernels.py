"""Triton tree attention (split-K + ancestry bitset + LSE merge) and KV remap vs the reference."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
import torch
from torch import Tensor

from lumobench.checks.random_trees import SHAPES, random_tree
from lumotree.model.fused import elementwise
from lumotree.tree import TreeDescriptor, chain_tree
from lumotree.verify.attention import decode
from lumotree.verify.attention import reference as ref
from lumotree.verify.attention.decode import (
    AttentionConfig,
    partial_buffers,
    publish_kv_,
    tree_attention_,
    tree_visibility_bits,
    write_kv_,
)
from lumotree.verify.device_ops import publish_kv_layers, stacked_view
from lumotree.verify.device_tree import DeviceTree
from tests.model.conftest import perturbed_model, tiny_config

from .helpers import assert_written, poisoned

HQ, HKV, DIM = 4, 2, 16
CONFIG = AttentionConfig(block_m=16, block_n=16, num_warps=1)


def _run_with_partials(
    tree: TreeDescriptor,
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    splits: int,
    by_prefix: bool = False,
    short: int = 0,
    gate: Tensor | None = None,
    config: AttentionConfig = CONFIG,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """o [R, HQ, D] and lse [R, HQ], and the partials o_part [splits + 1, HKV, MPAD, D] and
    lse_part [splits + 1, HKV, MPAD] (the cache's splits, then the tail walk's; row m of a head's
    partials is query row m // G, head m % G)."""
    rows = tree.rows
    o = poisoned((rows, HQ, DIM), q.dtype)
    lse = poisoned((rows, HQ), torch.float32)
    o_part, lse_part = (
        poisoned(tuple(t.shape), t.dtype)
        for t in partial_buffers(rows, HQ, HKV, DIM, splits, CONFIG.block_m, torch.device("cpu"))
    )
    prefix = torch.tensor([tree.prefix_len], dtype=torch.int32)
    tree_attention_(
        q,
        k_cache,
        v_cache,
        tree_visibility_bits(tree),
        prefix,
        o,
        lse,
        o_part,
        lse_part,
        splits,
        1.0 / math.sqrt(DIM),
        config,
        by_prefix=by_prefix,
        short=short,
        gate=gate,
    )
    return o, lse, o_part.view(splits + 1, HKV, -1, DIM), lse_part.view(splits + 1, HKV, -1)


def _run(
    tree: TreeDescriptor, q: Tensor, k_cache: Tensor, v_cache: Tensor, splits: int, short: int = 0
) -> tuple[Tensor, Tensor]:
    return _run_with_partials(tree, q, k_cache, v_cache, splits, short=short)[:2]


@pytest.fixture
def short_keys(monkeypatch: pytest.MonkeyPatch) -> int:
    """Short partitions of 16 rows (the engine's are 256): 2 of them, then 2 of the cache's rest."""
    monkeypatch.setattr(decode, "SHORT_KEYS", 16)
    return 16


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("prefix_len", "splits"), [(37, 3), (5, 4), (0, 1)])
def test_tree_attention_matches_reference(shape: str, prefix_len: int, splits: int) -> None:
    # prefix 5 with 4 splits leaves splits empty; prefix 0 leaves only the tree split.
    seed = SHAPES.index(shape) * 10 + splits
    tree = random_tree(shape, random.Random(seed), prefix_len=prefix_len)
    gen = torch.Generator().manual_seed(seed)
    t_max = prefix_len + tree.rows + 3
    k_cache, v_cache = (torch.randn(t_max, HKV, DIM, generator=gen) for _ in range(2))
    q = torch.randn(tree.rows, HQ, DIM, generator=gen)
    o, lse = _run(tree, q, k_cache, v_cache, splits)
    assert_written(o)
    assert_written(lse)
    o_ref, lse_ref = ref.tree_attention(q, k_cache, v_cache, tree)
    torch.testing.assert_close(o, o_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, lse_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("rows", "partitions"), [(16, 64), (1, 2), (4, 1)])
def test_the_merge_split_over_head_dim_blocks_writes_every_column(
    monkeypatch: pytest.MonkeyPatch, rows: int, partitions: int
) -> None:
    # 8-column merge blocks: two per head (the H200 runs eight 32-column blocks of a 256-dim head),
    # with the GPU's one grouped row a program or another count, and the partitions read 64 at once
    # (one load here), or 2 or 1 at a time (the 3 partitions and the tail's over several loads).
    monkeypatch.setattr(decode, "MERGE_BLOCK_D", 8)
    monkeypatch.setattr(decode, "MERGE_ROWS_INTERPRETED", rows)
    monkeypatch.setattr(decode, "MERGE_PARTITIONS", partitions)
    tree = random_tree("paper", random.Random(5), prefix_len=41)
    gen = torch.Generator().manual_seed(5)
    k_cache, v_cache = (torch.randn(tree.prefix_len + tree.rows, HKV, DIM, generator=gen) for _ in range(2))
    q = torch.randn(tree.rows, HQ, DIM, generator=gen)
    o, lse = _run(tree, q, k_cache, v_cache, splits=3)
    assert_written(o)
    assert_written(lse)
    o_ref, lse_ref = ref.tree_attention(q, k_cache, v_cache, tree)
    torch.testing.assert_close(o, o_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, lse_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("prefix_len", [0, 3, 37, 70])
def test_partitions_spread_over_the_prefix_match_the_reference(prefix_len: int) -> None:
    # by_prefix: the prefix over at most 4 partitions of whole 16-key tiles whatever the cache's
    # size (0 and 3 keys: one tile; 37 keys: 3 partitions of 16; 70: 3 of 32), the rest unwritten.
    seed = 100 + prefix_len
    tree = random_tree("paper", random.Random(seed), prefix_len=prefix_len)
    gen = torch.Generator().manual_seed(seed)
    k_cache, v_cache = (torch.randn(prefix_len + tree.rows + 200, HKV, DIM, generator=gen) for _ in range(2))
    q = torch.randn(tree.rows, HQ, DIM, generator=gen)
    o, lse, _, lse_part = _run_with_partials(tree, q, k_cache, v_cache, splits=4, by_prefix=True)
    assert_written(o)
    assert_written(lse)
    o_ref, lse_ref = ref.tree_attention(q, k_cache, v_cache, tree)
    torch.testing.assert_close(o, o_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, lse_ref, rtol=1e-5, atol=1e-5)
    chunk = max(1, math.ceil(math.ceil(prefix_len / 4) / CONFIG.block_n)) * CONFIG.block_n
    written = math.ceil(prefix_len / chunk)  # the partitions holding committed keys
    real = tree.rows * (HQ // HKV)
    assert_written(lse_part[:written, :, :real])
    assert torch.isnan(lse_part[written:4]).all(), "a partition past the prefix was written"


@pytest.mark.parametrize("prefix_len", [0, 9, 30, 33, 55])
def test_short_partitions_then_long_ones_match_the_reference(short_keys: int, prefix_len: int) -> None:
    # 2 partitions of 16 rows, then 2 sharing the rest of the cache (rows 32.. in 16-row tiles): the
    # prefix ends inside the short ones, at their end, or in the long ones.
    tree = random_tree("paper", random.Random(prefix_len), prefix_len=prefix_len)
    gen = torch.Generator().manual_seed(prefix_len)
    k_cache, v_cache = (torch.randn(prefix_len + tree.rows + 30, HKV, DIM, generator=gen) for _ in range(2))
    q = torch.randn(tree.rows, HQ, DIM, generator=gen)
    o, lse = _run(tree, q, k_cache, v_cache, 4, short=2)
    assert_written(o)
    assert_written(lse)
    o_ref, lse_ref = ref.tree_attention(q, k_cache, v_cache, tree)
    torch.testing.assert_close(o, o_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, lse_ref, rtol=1e-5, atol=1e-5)


def test_the_engine_partitions_a_cache_short_ones_first() -> None:
    assert decode.short_partitions(40_000) == decode.SHORT_PARTITIONS == 16
    assert decode.cache_partitions(40_000) == 16 + -(
        -(40_000 - 16 * decode.SHORT_KEYS) // decode.KEYS_PER_SPLIT
    )
    assert decode.short_partitions(1000) == decode.cache_partitions(1000) == -(-1000 // decode.SHORT_KEYS)
    assert decode.short_partitions(40_000, keys=256) == 0  # a benchmark's uniform 256-row setting
    assert decode.cache_partitions(40_000, keys=256) == -(-40_000 // 256)


@pytest.mark.usefixtures("dot_in_k_order")
@pytest.mark.parametrize("prefix_len", [14, 29, 40])
def test_rows_equal_the_one_row_steps_with_short_partitions_bitwise(short_keys: int, prefix_len: int) -> None:
    # The chain's rows and the AR steps at their positions split their keys alike: positions 14-19
    # lie in the short partitions, 29-34 cross their end at 32, 40-45 lie in the first long one.
    gen = torch.Generator().manual_seed(prefix_len)
    chain = chain_tree(list(range(6)), prefix_len=prefix_len)
    k_cache, v_cache = (torch.randn(prefix_len + 40, HKV, DIM, generator=gen) for _ in range(2))
    q = torch.randn(chain.rows, HQ, DIM, generator=gen)
    o_chain, lse_chain = _run(chain, q, k_cache, v_cache, 4, short=2)
    for depth in range(chain.rows):
        step = chain_tree([depth], prefix_len=prefix_len + depth)
        o, lse = _run(step, q[depth : depth + 1], k_cache, v_cache, 4, short=2)
        assert torch.equal(o[0], o_chain[depth]) and torch.equal(lse[0], lse_chain[depth]), depth


def test_short_partitions_that_do_not_fit_the_cache_are_refused(short_keys: int) -> None:
    tree = chain_tree([0], prefix_len=3)
    k_cache = torch.randn(20, HKV, DIM)
    with pytest.raises(ValueError, match="short partitions"):
        _run(tree, torch.randn(1, HQ, DIM), k_cache, k_cache, 3, short=2)  # 2 x 16 rows past 20


# prefix 43: the chain (49 keys) and its first steps (44-48 keys) would get different split sizes
# from a split rule that followed the prefix instead of the cache
@pytest.mark.usefixtures("dot_in_k_order")
@pytest.mark.parametrize("prefix_len", [5, 29, 43])
@pytest.mark.parametrize(("merge_rows", "merge_partitions"), [(16, 64), (1, 2)])
def test_a_chain_row_equals_the_one_row_step_at_its_position_bitwise(
    monkeypatch: pytest.MonkeyPatch, prefix_len: int, merge_rows: int, merge_partitions: int
) -> None:
    # AR at position p and a chain verified from an earlier prefix see the same keys in the same
    # splits (fixed cache rows, not relative to the prefix): each split's partials and the merged
    # outputs agree bit for bit, with the merge reading all partitions at once or 2 at a time (the
    # step's extra partitions past the chain's prefix add zeros). dot_in_k_order: the interpreter's
    # numpy matmul would sum in its BLAS kernel's order, which depends on the CPU and on the query's
    # row in the tile.
    monkeypatch.setattr(decode, "MERGE_ROWS_INTERPRETED", merge_rows)
    monkeypatch.setattr(decode, "MERGE_PARTITIONS", merge_partitions)
    gen = torch.Generator().manual_seed(prefix_len)
    chain = chain_tree(list(range(6)), prefix_len=prefix_len)
    k_cache, v_cache = (torch.randn(prefix_len + 8, HKV, DIM, generator=gen) for _ in range(2))
    q = torch.randn(chain.rows, HQ, DIM, generator=gen)
    o_chain, lse_chain, o_part_chain, lse_part_chain = _run_with_partials(chain, q, k_cache, v_cache, 3)
    group = HQ // HKV
    chunk = math.ceil(math.ceil(k_cache.shape[0] / 3) / CONFIG.block_n) * CONFIG.block_n  # rows a split
    used = math.ceil(
        prefix_len / chunk
    )  # the chain's partitions that hold committed keys (the others unwritten)
    for depth in range(chain.rows):
        step = chain_tree([depth], prefix_len=prefix_len + depth)
        o, lse, o_part, lse_part = _run_with_partials(step, q[depth : depth + 1], k_cache, v_cache, 3)
        assert torch.equal(o[0], o_chain[depth]) and torch.equal(lse[0], lse_chain[depth]), depth
        heads = slice(depth * group, (depth + 1) * group)  # the chain row's partial rows
        for s in [*range(used), 3]:  # the shared partitions and the tail's
            assert torch.equal(lse_part[s, :, :group], lse_part_chain[s, :, heads]), (depth, s)
            assert torch.equal(o_part[s, :, :group], o_part_chain[s, :, heads]), (depth, s)
        # the step's further partitions hold only keys past its split-K bound: it saw none there
        assert torch.all(lse_part[used : -(-(prefix_len + depth) // chunk), :, :group] == float("-inf")), (
            depth
        )


@pytest.mark.usefixtures("dot_in_k_order")
@pytest.mark.parametrize(("shape", "prefix_len"), [("paper", 40), ("deep_and_wide", 7), ("random_order", 29)])
@pytest.mark.parametrize(("merge_rows", "merge_partitions"), [(16, 64), (1, 2)])
def test_every_tree_row_equals_the_one_row_step_along_its_path_bitwise(
    monkeypatch: pytest.MonkeyPatch, shape: str, prefix_len: int, merge_rows: int, merge_partitions: int
) -> None:
    # On the spine or off it: the AR arm would have committed the row's ancestors at contiguous
    # positions and verify the row alone at prefix + depth; the tree holds them at physical slots
    # elsewhere (spine first) and verifies every row at once. The row's bits must not tell.
    monkeypatch.setattr(decode, "MERGE_ROWS_INTERPRETED", merge_rows)
    monkeypatch.setattr(decode, "MERGE_PARTITIONS", merge_partitions)
    tree = random_tree(shape, random.Random(prefix_len), prefix_len=prefix_len)
    gen = torch.Generator().manual_seed(prefix_len)
    k_cache, v_cache = (torch.randn(prefix_len + tree.rows + 2, HKV, DIM, generator=gen) for _ in range(2))
    q = torch.randn(tree.rows, HQ, DIM, generator=gen)
    o_tree, lse_tree = _run(tree, q, k_cache, v_cache, 3)
    off_spine = 0
    for node in range(tree.n_active):
        path = tree.path_to(node)
        off_spine += node not in tree.spine.tolist()
        k_ar, v_ar = k_cache.clone(), v_cache.clone()
        for depth, ancestor in enumerate(path):
            slot = prefix_len + int(tree.slot_map[ancestor])
            k_ar[prefix_len + depth], v_ar[prefix_len + depth] = k_cache[slot], v_cache[slot]
        step = chain_tree([0], prefix_len=prefix_len + len(path) - 1)
        o, lse = _run(step, q[node : node + 1], k_ar, v_ar, 3)
        assert torch.equal(o[0], o_tree[node]) and torch.equal(lse[0], lse_tree[node]), node
    assert off_spine > 0, "the case must hold rows off the spine"


def test_tree_rows_ignore_keys_outside_their_ancestry() -> None:
    # Poison every tree slot a row must not see: the outputs must not move.
    tree = random_tree("paper", random.Random(3), prefix_len=20)
    gen = torch.Generator().manual_seed(3)
    k_cache, v_cache = (torch.randn(tree.prefix_len + tree.rows, HKV, DIM, generator=gen) for _ in range(2))
    q = torch.randn(tree.rows, HQ, DIM, generator=gen)
    row = int(tree.spine[-1])
    o, _ = _run(tree, q, k_cache, v_cache, splits=2)
    hidden = ~ref.tree_attention_mask(tree)[row, tree.prefix_len :]
    k2, v2 = k_cache.clone(), v_cache.clone()
    k2[tree.prefix_len :][hidden] = 1e4
    v2[tree.prefix_len :][hidden] = 1e4
    o2, _ = _run(tree, q, k2, v2, splits=2)
    assert torch.equal(o[row], o2[row])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_gated_merge_has_the_bits_of_the_models_output_gate(dtype: torch.dtype) -> None:
    # the merge stores o * sigmoid(gate) as the model's sigmoid_mul kernel rounds it, from a gate that
    # is a strided view (the q projection's second half, as the model passes it); 2-byte outputs in
    # float16 (the interpreter's bf16 dots are not the GPU's: the GPU tests run bf16 at Qwen shapes)
    tree = random_tree("paper", random.Random(23), prefix_len=29)
    gen = torch.Generator().manual_seed(23)
    k_cache, v_cache = (
        torch.randn(tree.prefix_len + tree.rows, HKV, DIM, generator=gen).to(dtype) for _ in range(2)
    )
    q_gate = torch.randn(tree.rows, HQ, 2 * DIM, generator=gen).to(dtype)
    q, gate = q_gate[..., :DIM].contiguous(), q_gate[..., DIM:]
    o, lse, _, _ = _run_with_partials(tree, q, k_cache, v_cache, splits=3)
    gated, gated_lse, _, _ = _run_with_partials(tree, q, k_cache, v_cache, splits=3, gate=gate)
    assert_written(gated)
    assert torch.equal(gated, elementwise.sigmoid_mul(o, gate))
    assert torch.equal(gated_lse, lse)
    with pytest.raises(ValueError, match="the gate must be"):
        _run_with_partials(tree, q, k_cache, v_cache, splits=3, gate=gate[:, :1])


@pytest.mark.parametrize("descriptors", [True, False])
@pytest.mark.parametrize("by_prefix", [False, True])
def test_cache_rows_past_the_tree_are_never_read(by_prefix: bool, descriptors: bool) -> None:
    # NaN in every row past the prefix and the tree's slots (a cache's unwritten rows): the key tile
    # holding the prefix's end spans them, and the split-K must read zeros there (its descriptors
    # end at the prefix), or NaN times a zero weight poisons the row.
    tree = chain_tree([0, 1, 2], prefix_len=37)
    gen = torch.Generator().manual_seed(17)
    k_cache, v_cache = (torch.randn(tree.prefix_len + 40, HKV, DIM, generator=gen) for _ in range(2))
    q = torch.randn(tree.rows, HQ, DIM, generator=gen)
    expected, expected_lse = ref.tree_attention(q, k_cache, v_cache, tree)
    for cache in (k_cache, v_cache):
        cache[tree.prefix_len + tree.rows :] = float("nan")
    config = replace(CONFIG, descriptors=descriptors)
    o, lse, _, _ = _run_with_partials(tree, q, k_cache, v_cache, splits=3, by_prefix=by_prefix, config=config)
    torch.testing.assert_close(o, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, expected_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", ["paper", "chain", "random_order"])
def test_descriptor_and_masked_loads_give_the_same_bits(shape: str) -> None:
    # the fp32 default loads K and V tiles by masked loads, 2-byte caches by descriptors: one kernel
    tree = random_tree(shape, random.Random(31), prefix_len=45)
    gen = torch.Generator().manual_seed(31)
    k_cache, v_cache = (
        torch.randn(tree.prefix_len + tree.rows + 5, HKV, DIM, generator=gen) for _ in range(2)
    )
    q = torch.randn(tree.rows, HQ, DIM, generator=gen)
    loaded = [
        _run_with_partials(tree, q, k_cache, v_cache, splits=3, config=replace(CONFIG, descriptors=d))
        for d in (True, False)
    ]
    assert all(torch.equal(a, b) for a, b in zip(loaded[0][:2], loaded[1][:2], strict=True))


def test_caches_whose_heads_are_not_contiguous_are_refused() -> None:
    tree = chain_tree([0, 1], prefix_len=5)
    k_cache, v_cache = (torch.randn(DIM, tree.prefix_len + 2, HKV).permute(1, 2, 0) for _ in range(2))
    q = torch.randn(tree.rows, HQ, DIM)
    with pytest.raises(ValueError, match="heads contiguous"):
        _run(tree, q, k_cache, v_cache, splits=1)


def test_a_new_state_holds_its_kv_caches_in_two_banks() -> None:
    config = tiny_config(vocab_size=64)
    config = config.replace(num_hidden_layers=8, layer_types=config.layer_types * 2)  # 2 attention layers
    state = perturbed_model(config, seed=1).new_state(16)
    caches = [layer for layer in state.layers if hasattr(layer, "key")]
    for tensors in ([c.key for c in caches], [c.value for c in caches]):
        bank = stacked_view(tensors)
        assert bank is not None and bank.shape == (2, 16, *caches[0].key.shape[1:])
    assert stacked_view([c.key for c in state.clone().layers if hasattr(c, "key")]) is None


def test_kv_publication_of_a_bank_moves_every_layer_as_one_layer_alone() -> None:
    # 3 layers' caches as views of one K and one V bank (`HybridLM.new_state`): one launch over the
    # banks equals the reference layer by layer for every node's path; caches that are not a bank's
    # views take the per-layer launches and get the same.
    tree = random_tree("paper", random.Random(13), prefix_len=7)
    tables = DeviceTree(tree.rows, tree.max_depth, "cpu").load_(tree)
    gen = torch.Generator().manual_seed(13)
    banks = [torch.randn(3, tree.prefix_len + tree.rows + 2, HKV, DIM, generator=gen) for _ in range(2)]
    for node in range(tree.n_active):
        path = tree.path_to(node)
        accepted = tree.padded_path(path)
        expected = [b.clone() for b in banks]
        for layer in range(3):
            ref.publish_kv_(expected[0][layer], expected[1][layer], tree, accepted, len(path))
        banked = [b.clone() for b in banks]
        publish_kv_layers(list(banked[0]), list(banked[1]), tables, accepted, len(path))
        assert all(torch.equal(b, e) for b, e in zip(banked, expected, strict=True)), f"node {node}"
        separate = [[layer.clone() for layer in b] for b in banks]
        publish_kv_layers(separate[0], separate[1], tables, accepted, len(path))
        for got, want in zip(separate, expected, strict=True):
            assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), f"node {node}"


@pytest.mark.parametrize("shape", ["paper", "deep_and_wide", "random_order"])
def test_kv_publication_matches_reference(shape: str) -> None:
    tree = random_tree(shape, random.Random(11), prefix_len=9)
    gen = torch.Generator().manual_seed(11)
    caches = [torch.randn(tree.prefix_len + tree.rows + 2, HKV, DIM, generator=gen) for _ in range(2)]
    for node in range(tree.n_active):
        path = tree.path_to(node)
        accepted = tree.padded_path(path)
        got = [c.clone() for c in caches]
        expected = [c.clone() for c in caches]
        moved = publish_kv_(*got, tree, accepted, len(path))
        assert moved == ref.publish_kv_(*expected, tree, accepted, len(path))
        assert all(torch.equal(g, e) for g, e in zip(got, expected, strict=True)), f"node {node}"


@pytest.mark.parametrize("shape", ["paper", "random_order"])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_the_one_launch_kv_write_matches_the_reference(shape: str, cache_dtype: torch.dtype) -> None:
    # v a column slice of a wider projection (the fused q/k/v output), caches poisoned: the tree's
    # rows land at prefix + slot in the cache's dtype, every other row keeps its poison.
    tree = random_tree(shape, random.Random(12), prefix_len=7)
    gen = torch.Generator().manual_seed(12)
    k = torch.randn(tree.rows, HKV, DIM, generator=gen)
    v = torch.randn(tree.rows, 3 * HKV * DIM, generator=gen)[:, HKV * DIM : 2 * HKV * DIM].view(
        tree.rows, HKV, DIM
    )
    shape_ = (tree.prefix_len + tree.rows + 3, HKV, DIM)
    got = [poisoned(shape_, cache_dtype) for _ in range(2)]
    expected = [c.clone() for c in got]
    prefix = torch.tensor([tree.prefix_len])
    write_kv_(*got, k, v, tree.slot_map, prefix)
    ref.write_tree_kv_(*expected, k, v, tree)
    assert all(torch.equal(g.nan_to_num(7.0), e.nan_to_num(7.0)) for g, e in zip(got, expected, strict=True))
    assert_written(got[0][tree.prefix_len : tree.prefix_len + tree.rows])
    # without a prefix: the slots are the rows (the MTP drafter's positions)
    rows = torch.tensor([3, 0, 5])
    got = [poisoned(shape_, cache_dtype) for _ in range(2)]
    write_kv_(*got, k[:3], v[:3], rows)
    assert torch.equal(got[0][rows], k[:3].to(cache_dtype)) and torch.equal(
        got[1][rows], v[:3].to(cache_dtype)
    )
    assert torch.isnan(got[0][[1, 2, 4]]).all()


def test_the_kv_write_refuses_rows_whose_heads_are_not_contiguous() -> None:
    k = torch.randn(2, HKV, 2 * DIM)[:, :, :DIM]
    with pytest.raises(ValueError, match="each row contiguous"):
        write_kv_(torch.empty(4, HKV, DIM), torch.empty(4, HKV, DIM), k, k, torch.tensor([0, 1]))


@pytest.mark.parametrize(("rows", "partitions", "tile"), [(1, 3, 16), (6, 3, 16), (12, 3, 32), (6, None, 64)])
def test_the_drafters_device_attention_fits_its_query_tile_and_matches_the_reference(
    rows: int, partitions: int | None, tile: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`device_ops.tree_attention(partitions=N)` (the MTP drafter's passes): the prefix spread over
    N partitions and a query tile as tall as the grouped rows need (2, 12 and 24 of them here); the
    cache's partitions (the verification, row-invariant) keep the engine's 64 rows whatever the
    rows. Both against the reference."""
    from lumotree.verify import device_ops
    from lumotree.verify.device_tree import DeviceTree

    tiles: list[int] = []
    launch = device_ops.tree_attention_
    monkeypatch.setattr(
        device_ops, "tree_attention_", lambda *a, **kw: tiles.append(a[11].block_m) or launch(*a, **kw)
    )
    gen = torch.Generator().manual_seed(rows)
    tree = chain_tree(list(range(rows)), prefix_len=45)
    q = torch.randn(rows, HQ, DIM, generator=gen)
    k_cache, v_cache = (torch.randn(80, HKV, DIM, generator=gen) for _ in range(2))
    tables = DeviceTree(rows, 11, torch.device("cpu")).load_(tree)
    o, lse = device_ops.tree_attention(q, k_cache, v_cache, tables, partitions=partitions)
    o_ref, lse_ref = ref.tree_attention(q, k_cache, v_cache, tree)
    torch.testing.assert_close(o, o_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(lse, lse_ref, rtol=1e-4, atol=1e-4)
    assert tiles == [tile]
