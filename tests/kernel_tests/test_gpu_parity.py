"""Real-shape parity on a CUDA GPU (fp32 and bf16), compiled kernels, references on the CPU.

Run on the device machine with: TRITON_INTERPRET=0 pytest -m gpu tests/kernel_tests/test_gpu_parity.py
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from lumobench.checks import gdn_checks
from lumobench.checks.paired import paired_check
from lumobench.checks.random_trees import paper_tree, random_tree
from lumotree.drafting import selection as sel_ref
from lumotree.drafting.fused_selection import select_spine_topk
from lumotree.model.fused import elementwise
from lumotree.sampling import walk as walk_ref
from lumotree.sampling.device_walk import DeviceWalk
from lumotree.verify.attention import decode as attn_kernel
from lumotree.verify.attention import reference as attn_ref
from lumotree.verify.conv import fused_conv as conv_kernel
from lumotree.verify.conv import reference as conv_ref
from lumotree.verify.gdn import reference as gdn_ref
from lumotree.verify.gdn.common import empty_operands
from lumotree.verify.gdn.plan import ancestry_tables, scan_tables
from lumotree.verify.gdn.reference import GdnInputs
from lumotree.verify.gdn.replay import replay_accepted_
from lumotree.verify.gdn.scan import gdn_scan_, gdn_verify
from lumotree.verify.gdn.tree_scan import gdn_tree_layers_, gdn_verify_tree
from lumotree.verify.gdn.tree_value_major import (
    gdn_value_major_,
    gdn_value_major_layers_,
    gdn_verify_value_major,
)
from lumotree.verify.graphs import CapturedStage

from .helpers import GPU_ONLY, assert_written, deep_walk_scores, parallel_keys_case, poisoned

pytestmark = GPU_ONLY
CUDA = torch.device("cuda")
QWEN = gdn_checks.GdnDims(H=16, HV=48, K=128, V=128)
DTYPES = [torch.float32, torch.bfloat16]


def _gdn_case(seed: int, shape: str = "paper") -> gdn_checks.GdnCase:
    tree = random_tree(shape, random.Random(seed))
    return gdn_checks.make_case(tree, QWEN, torch.Generator().manual_seed(seed))


def _to(args: tuple[GdnInputs, torch.Tensor], device: torch.device) -> tuple[GdnInputs, torch.Tensor]:
    """A case's (inputs, state) on `device`."""
    inputs, state = args
    return inputs.map(lambda t: t.to(device)), state.to(device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("schedule", ["cut", "recompute"])
def test_gdn_scan_meets_the_paired_rule_at_qwen_shapes(dtype: torch.dtype, schedule: str) -> None:
    case = _gdn_case(1)
    n = case.tree.n_active
    got = gdn_verify(*_to(case.inputs(dtype), CUDA), case.tree, schedule=schedule)
    native = gdn_ref.gdn_verify(*case.inputs(dtype), case.tree)
    truth, _ = gdn_ref.gdn_sequential_reference(*case.truth(dtype), case.tree)
    result = paired_check(got.o[:n].cpu(), native.o[:n], truth[:n], cell_dims=2, storage=dtype)
    assert result.ok, result
    for field in ("k", "v", "g", "beta"):
        torch.testing.assert_close(
            getattr(got.operands, field)[:n].cpu(), getattr(native.operands, field)[:n], rtol=1e-5, atol=1e-5
        )
    if schedule == "cut":
        torch.testing.assert_close(got.cut_states.cpu(), native.cut_states, rtol=1e-4, atol=1e-5)


TREE_VARIANTS = {
    "tree ieee": lambda *x: gdn_verify_tree(*x, precision="ieee", num_warps=8),
    "tree tf32x3": lambda *x: gdn_verify_tree(*x, precision="tf32x3", num_warps=8),
    "tree tf32x3 product": lambda *x: gdn_verify_tree(*x, precision="tf32x3", num_warps=8, solve="product"),
    "tree tf32x3 bv64": lambda *x: gdn_verify_tree(*x, block_v=64, precision="tf32x3", num_warps=8),
    "value-major split (defaults)": lambda *x: gdn_verify_value_major(*x),
    "value-major split p1 s4": lambda *x: gdn_verify_value_major(*x, prepare_warps=1, num_stages=4),
    "value-major split bv128 w8": lambda *x: gdn_verify_value_major(*x, block_v=128, num_warps=8),
    "value-major split bv64 w4 bk64": lambda *x: gdn_verify_value_major(*x, block_v=64, block_k=64),
    "value-major split bv128 w8 r128": lambda *x: gdn_verify_value_major(
        *x, block_v=128, num_warps=8, max_registers=128
    ),
    "value-major ieee bv64 w4": lambda *x: gdn_verify_value_major(*x, block_v=64, precision="ieee"),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", list(TREE_VARIANTS))
def test_gdn_tree_forms_meet_the_paired_rule_at_qwen_shapes(dtype: torch.dtype, variant: str) -> None:
    case = _gdn_case(11)
    n = case.tree.n_active
    got = TREE_VARIANTS[variant](*_to(case.inputs(dtype), CUDA), case.tree)
    native = gdn_ref.gdn_verify(*case.inputs(dtype), case.tree)
    truth, _ = gdn_ref.gdn_sequential_reference(*case.truth(dtype), case.tree)
    result = paired_check(got.o[:n].cpu(), native.o[:n], truth[:n], cell_dims=2, storage=dtype)
    assert result.ok, result
    assert bool((got.o[n:] == 0).all())
    for field in ("q", "k", "v", "g", "beta"):
        torch.testing.assert_close(
            getattr(got.operands, field)[:n].cpu(), getattr(native.operands, field)[:n], rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize(
    "variant", ["tree tf32x3 bv64", *(v for v in TREE_VARIANTS if v.startswith("value-major"))]
)
def test_tree_parallel_solves_meet_the_paired_rule_with_parallel_keys(variant: str) -> None:
    # tf32x3 products on the GPU, and the hardest operands for the solve (see parallel_keys_case).
    tree = random_tree("chain", random.Random(13))
    case = parallel_keys_case(tree, QWEN, torch.Generator().manual_seed(13))
    n = tree.n_active
    got = TREE_VARIANTS[variant](*_to(case.inputs(torch.float32), CUDA), tree)
    native = gdn_ref.gdn_verify(*case.inputs(torch.float32), tree)
    truth, _ = gdn_ref.gdn_sequential_reference(*case.truth(torch.float32), tree)
    result = paired_check(got.o[:n].cpu(), native.o[:n], truth[:n], cell_dims=2, storage=torch.float32)
    assert result.ok, result


@pytest.mark.parametrize("kernel", ["tree", "value-major"])
def test_gdn_one_launch_over_layers_at_qwen_shapes(kernel: str) -> None:
    tree = _gdn_case(12).tree
    layers = [gdn_checks.make_case(tree, QWEN, torch.Generator().manual_seed(20 + i)) for i in range(3)]
    inputs, states = zip(*(c.inputs(torch.bfloat16) for c in layers), strict=True)
    stacked = _to((GdnInputs.stack(inputs), torch.stack(states).contiguous()), CUDA)
    rows = tree.rows
    o = poisoned((3, rows, QWEN.HV, QWEN.V), torch.bfloat16, CUDA)
    one = empty_operands(rows, QWEN.H, QWEN.HV, QWEN.K, QWEN.V, CUDA)
    ops = gdn_ref.GdnOperands(*(torch.empty((3, *t.shape), device=CUDA) for t in vars(one).values()))
    if kernel == "tree":
        gdn_tree_layers_(*stacked, ancestry_tables(tree, CUDA), o, ops, num_warps=8)
    else:
        gdn_value_major_layers_(*stacked, ancestry_tables(tree, CUDA), o, ops)
    assert_written(o)
    for i, case in enumerate(layers):
        native = gdn_ref.gdn_verify(*case.inputs(torch.bfloat16), case.tree).o
        torch.testing.assert_close(o[i].cpu().float(), native.float(), rtol=1.6e-2, atol=1e-3)


def test_gdn_replay_and_store_all_bank_at_qwen_shapes() -> None:
    case = _gdn_case(2)
    tree, n = case.tree, case.tree.n_active
    inputs = _to(case.inputs(torch.float32), CUDA)
    result = gdn_verify(*inputs, tree)
    expected = gdn_ref.gdn_verify(*case.inputs(torch.float32), tree)
    deepest = max(range(n), key=lambda i: int(tree.depth[i]))
    path = tree.path_to(deepest)
    state = case.state.to(CUDA).clone()
    replay_accepted_(state, result.operands, tree.padded_path(path).to(CUDA), len(path))
    reference = case.state.clone()
    gdn_ref.replay_accepted_(reference, expected.operands, tree.padded_path(path), len(path))
    torch.testing.assert_close(state.cpu(), reference, rtol=1e-4, atol=1e-5)
    bank = gdn_verify(*inputs, tree, schedule="store_all").cut_states
    _, states = gdn_ref.gdn_sequential_reference(*case.inputs(torch.float32), tree)
    torch.testing.assert_close(bank[:n].cpu(), states[:n], rtol=1e-4, atol=1e-5)


def _captured_verify(kernel: str, tree, bufs: tuple[GdnInputs, torch.Tensor], o: torch.Tensor, ops) -> tuple:
    """(tables, captured stage) of one verify kernel over static buffers."""
    if kernel == "scan v2 cut":
        tables = scan_tables(tree, CUDA, "cut", paths=8, steps=tree.max_depth + 1)
        bank = torch.empty(tree.rows, QWEN.HV, QWEN.V, QWEN.K, device=CUDA)
        return tables, CapturedStage(lambda: gdn_scan_(*bufs, tables, o, ops, bank))
    tables = ancestry_tables(tree, CUDA)  # the split solve allocates its scratch in the graph's pool
    return tables, CapturedStage(lambda: gdn_value_major_(*bufs, tables, o, ops))


@pytest.mark.parametrize("kernel", ["scan v2 cut", "value-major split"])
def test_captured_verify_replays_for_a_new_tree(kernel: str) -> None:
    # A replay after refilling the inputs and the tables in place must compute the new tree.
    first, second = _gdn_case(3, "paper"), _gdn_case(4, "deep_and_wide")
    rows = first.tree.rows
    bufs = _to(first.inputs(torch.float32), CUDA)  # fresh device copies: the graph's static inputs
    o = poisoned((rows, QWEN.HV, QWEN.V), torch.float32, CUDA)
    ops = empty_operands(rows, QWEN.H, QWEN.HV, QWEN.K, QWEN.V, CUDA)
    tables, stage = _captured_verify(kernel, first.tree, bufs, o, ops)
    new_inputs, new_state = second.inputs(torch.float32)
    for buf, new in zip((*bufs[0].tensors(), bufs[1]), (*new_inputs.tensors(), new_state), strict=True):
        buf.copy_(new)
    tables.fill_(second.tree)
    o.fill_(float("nan"))
    stage.replay()
    torch.cuda.synchronize()
    assert_written(o)
    expected = gdn_ref.gdn_verify(*second.inputs(torch.float32), second.tree).o
    torch.testing.assert_close(o.cpu(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_tree_conv_and_publication_at_qwen_shapes(dtype: torch.dtype) -> None:
    tree = paper_tree(random.Random(5), 1000, prefix_len=100)
    gen = torch.Generator().manual_seed(5)
    channels = 10240
    x = torch.randn(tree.rows, channels, generator=gen).to(dtype)
    state = torch.randn(channels, 3, generator=gen).to(dtype)
    weight, bias = torch.randn(channels, 4, generator=gen), torch.randn(channels, generator=gen)
    y = conv_kernel.tree_conv(x.to(CUDA), state.to(CUDA), weight.to(CUDA), bias.to(CUDA), tree)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(y.cpu(), conv_ref.tree_conv(x, state, weight, bias, tree), **tol)
    path = tree.path_to(tree.n_active - 1)
    got, expected = state.to(CUDA).clone(), state.clone()
    conv_kernel.publish_conv_state_(got, x.to(CUDA), tree.padded_path(path).to(CUDA), len(path))
    conv_ref.publish_conv_state_(expected, x, tree.padded_path(path), len(path))
    assert torch.equal(got.cpu(), expected)


ATTENTION_CONFIGS = {
    "default": None,  # AttentionConfig.for_dtype
    "BN64 22 splits": attn_kernel.AttentionConfig(
        block_m=64, block_n=64, splits=22, num_warps=8, num_stages=2
    ),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", list(ATTENTION_CONFIGS))
def test_tree_attention_at_qwen_shapes(dtype: torch.dtype, config: str) -> None:
    tree = paper_tree(random.Random(6), 1000, prefix_len=4096)
    gen = torch.Generator().manual_seed(6)
    t_max = tree.prefix_len + tree.rows
    k_cache, v_cache = (torch.randn(t_max, 4, 256, generator=gen).to(dtype) for _ in range(2))
    q = torch.randn(tree.rows, 24, 256, generator=gen).to(dtype)
    o, lse = attn_kernel.tree_attention(
        q.to(CUDA), k_cache.to(CUDA), v_cache.to(CUDA), tree, config=ATTENTION_CONFIGS[config]
    )
    o_ref, lse_ref = attn_ref.tree_attention(q, k_cache, v_cache, tree)
    # the output gate applied by the merge has the model's sigmoid_mul bits
    gate = torch.randn(q.shape, generator=gen).to(dtype).to(CUDA)
    gated, gated_lse = attn_kernel.tree_attention(
        q.to(CUDA), k_cache.to(CUDA), v_cache.to(CUDA), tree, config=ATTENTION_CONFIGS[config], gate=gate
    )
    assert torch.equal(gated, elementwise.sigmoid_mul(o, gate)) and torch.equal(gated_lse, lse)
    # bf16: P is rounded to bf16 before P @ V, as flash attention does.
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(o.float().cpu(), o_ref.float(), **tol)
    torch.testing.assert_close(lse.cpu(), lse_ref, rtol=1e-4, atol=1e-3)
    path = tree.path_to(max(range(tree.n_active), key=lambda i: int(tree.depth[i])))
    accepted = tree.padded_path(path)
    got = [k_cache.to(CUDA), v_cache.to(CUDA)]
    moved = attn_kernel.publish_kv_(*got, tree, accepted, len(path))
    assert moved == attn_ref.publish_kv_(k_cache, v_cache, tree, accepted, len(path))
    assert torch.equal(got[0].cpu(), k_cache) and torch.equal(got[1].cpu(), v_cache)
    assert math.isfinite(float(lse.max()))


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_selection_on_the_full_vocabulary(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(7)
    smooth = torch.randn(5, 248320, generator=gen).to(dtype)
    ties = torch.randint(-4, 5, (5, 248320), generator=gen).to(dtype)
    for scores in (smooth, ties):
        spine, topk = select_spine_topk(scores.to(CUDA), 3)
        assert torch.equal(spine.cpu(), sel_ref.argmax_lowest_index(scores))
        assert torch.equal(topk.cpu(), sel_ref.ordered_topk(scores, 3))


def test_device_walks_match_the_reference_on_the_full_vocabulary() -> None:
    tree = paper_tree(random.Random(8), 1000, prefix_len=100)
    vocab = 248320
    logits = deep_walk_scores(tree, vocab, torch.Generator().manual_seed(8), boost=20.0)
    walk = DeviceWalk(tree.rows, vocab, 3, tree.max_depth, child_cap=8, device=CUDA)
    walk.load_tree_(tree)
    walk.greedy_(logits.to(CUDA))
    greedy = walk_ref.greedy_walk(logits, tree)
    assert torch.equal(walk.result.accepted[:1].cpu(), greedy.accepted)
    assert torch.equal(walk.result.emitted[:1].cpu(), greedy.emitted)
    probs = torch.softmax(logits, -1)
    seeds = torch.tensor([11, 12, 13], dtype=torch.int64)
    walk.sample_(probs.to(CUDA), seeds.to(CUDA), torch.tensor([3], device=CUDA))
    sampled = walk_ref.sample_walk(probs, tree, seeds, 3)
    for name in ("accepted", "path_len", "emitted", "final_row"):
        assert torch.equal(getattr(walk.result, name).cpu(), getattr(sampled, name)), name
