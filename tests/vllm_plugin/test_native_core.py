"""The native entry points of the plugin's hot path (forward.c's lt_gdn_chain, lt_gdn_tree,
lt_gdn_publish, lt_paged_tree_attention) against the PyTorch references beside them, on fresh random
weights, states and rows: a chain against the model's chain ops, a tree's rows against the reference
tree conv + GDN verification, a published path against the reference replay and conv publication,
tree attention over vLLM's paged cache against the reference tree attention. Outputs start
poisoned (NaN), so a row the core should write and does not, or one it should leave and writes,
shows; float32 within float32 rounding (other summation order), bfloat16 rows within bfloat16
rounding.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from lumotree.model import gdn_ops
from lumotree.model.native.gdn_core import GdnShape, GdnWeights, NativeGdn, token_rows
from lumotree.tree import TreeDescriptor
from lumotree.verify.conv.reference import publish_conv_state_, tree_conv
from lumotree.verify.gdn.reference import GdnInputs, gdn_verify, replay_accepted_
from lumotree.verify.kernel_sets import REFERENCE
from lumotree.vllm.native_core import NativeTreeAttention
from lumotree.vllm.paged_kv import gather_kv
from lumotree.vllm.steps import RequestStep

from .fake_vllm import attention_layer, plan
from .trees import tree_from_paths

SHAPES = [GdnShape(64 * 2 * 2 + 4 * 64, 4, 2, 4, 64, 64), GdnShape(32 * 2 * 3 + 3 * 48, 4, 3, 3, 32, 48)]
TOL = {torch.float32: {"rtol": 1e-4, "atol": 2e-5}, torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2}}


def _weights(shape: GdnShape, gen: torch.Generator) -> GdnWeights:
    return GdnWeights(
        conv=torch.randn(shape.conv_dim, shape.conv_width, generator=gen) * 0.5,
        A_log=torch.rand(shape.value_heads, generator=gen) * 2 - 1,
        dt_bias=torch.randn(shape.value_heads, generator=gen),
    )


def _rows(
    shape: GdnShape, n: int, dtype: torch.dtype, gen: torch.Generator
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Random flat rows x [n, C], a, b [n, HV] and a NaN-poisoned output [n, HV, V]."""
    x = torch.randn(n, shape.conv_dim, generator=gen).to(dtype)
    a = torch.randn(n, shape.value_heads, generator=gen).to(dtype)
    b = torch.randn(n, shape.value_heads, generator=gen).to(dtype)
    return x, a, b, torch.full((n, shape.value_heads, shape.value_dim), float("nan"), dtype=dtype)


def _states(shape: GdnShape, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """A committed conv state [C, W-1] and recurrent state [HV, V, K] (float32)."""
    conv = torch.randn(shape.conv_dim, shape.conv_width - 1, generator=gen)
    return conv, torch.randn(shape.value_heads, shape.value_dim, shape.key_dim, generator=gen) * 0.1


def _split(shape: GdnShape, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    n, kd = y.shape[0], shape.key_heads * shape.key_dim
    q, k, v = y.split([kd, kd, shape.value_heads * shape.value_dim], dim=-1)
    return (
        q.reshape(n, shape.key_heads, shape.key_dim),
        k.reshape(n, shape.key_heads, shape.key_dim),
        v.reshape(n, shape.value_heads, shape.value_dim),
    )


def _reference_tree(
    shape: GdnShape,
    w: GdnWeights,
    x: Tensor,
    a: Tensor,
    b: Tensor,
    conv: Tensor,
    state: Tensor,
    tree: TreeDescriptor,
):
    """The PyTorch reference of a tree's rows (logical order): outputs [R, HV, V] and operands."""
    y = tree_conv(x, conv.to(x.dtype), w.conv, None, tree)
    q, k, v = _split(shape, y)
    return gdn_verify(GdnInputs(q, k, v, a, b, w.A_log, w.dt_bias), state, tree)


def _random_tree(rnd: random.Random, prefix_len: int) -> TreeDescriptor:
    paths = [[rnd.randrange(1, 6) for _ in range(rnd.randrange(1, 7))] for _ in range(rnd.randrange(1, 6))]
    return tree_from_paths(0, paths, prefix_len=prefix_len)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n", [1, 5, 40])
def test_a_chain_is_the_models_chain_forward_and_advances_the_state(shape: GdnShape, n: int) -> None:
    gen = torch.Generator().manual_seed(n)
    w = _weights(shape, gen)
    core = NativeGdn(shape, [w], max_rows=16)  # 40 tokens: three blocks
    conv, state = _states(shape, gen)
    x, a, b, out = _rows(shape, n + 3, torch.float32, gen)
    rows = slice(2, 2 + n)  # rows 0, 1 and the last belong to other requests
    conv_run, state_run = conv.clone(), state.clone()
    core.chain(0, token_rows(x, a, b, out), 2, n, conv_run, state_run)

    y, want_conv = gdn_ops.causal_conv1d(x[None, rows], w.conv, conv[None])
    q, k, v = _split(shape, y[0])
    qn, kn = gdn_ops.prepare_qk(q[None], k[None], shape.value_heads)
    g = -w.A_log.exp() * F.softplus(a[rows] + w.dt_bias)
    o, want_state = gdn_ops.recurrent_gated_delta_rule(
        qn, kn, v[None], g[None], b[rows].sigmoid()[None], state[None]
    )
    torch.testing.assert_close(out[rows], o[0], **TOL[torch.float32])
    torch.testing.assert_close(state_run, want_state[0], **TOL[torch.float32])
    assert torch.equal(conv_run, want_conv[0])
    assert out[:2].isnan().all() and out[2 + n :].isnan().all()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", range(4))
def test_tree_rows_are_the_reference_verification_and_leave_the_state(
    shape: GdnShape, dtype: torch.dtype, seed: int
) -> None:
    gen, rnd = torch.Generator().manual_seed(seed), random.Random(seed)
    w = _weights(shape, gen)
    core = NativeGdn(shape, [w], max_rows=32)
    tree = _random_tree(rnd, prefix_len=9)
    n, start = tree.n_active, 3
    conv, state = _states(shape, gen)
    conv = conv.to(dtype).float()  # a committed conv state holds earlier rows' inputs, in the rows' dtype
    x, a, b, out = _rows(shape, start + n + 2, dtype, gen)
    flat = start + tree.slot_map  # vLLM's flat rows of the logical nodes
    conv_run, state_run = conv.clone(), state.clone()
    core.tree(0, core.new_tree(tree), token_rows(x, a, b, out), start, conv_run, state_run)

    want = _reference_tree(shape, w, x[flat], a[flat], b[flat], conv, state, tree)
    torch.testing.assert_close(out[flat].float(), want.o.float(), **TOL[dtype])
    assert torch.equal(conv_run, conv) and torch.equal(state_run, state)
    assert out[:start].isnan().all() and out[start + n :].isnan().all()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", range(4))
def test_publication_is_the_reference_replay_of_the_accepted_path_in_every_layer(
    shape: GdnShape, seed: int
) -> None:
    gen, rnd = torch.Generator().manual_seed(100 + seed), random.Random(seed)
    layers = [_weights(shape, gen) for _ in range(3)]
    core = NativeGdn(shape, layers, max_rows=32)
    tree = _random_tree(rnd, prefix_len=4)
    native_tree = core.new_tree(tree)
    x, a, b, out = _rows(shape, tree.n_active, torch.float32, gen)
    flat = tree.slot_map
    committed = [_states(shape, gen) for _ in layers]
    convs, states = [c.clone() for c, _ in committed], [s.clone() for _, s in committed]
    for i in range(len(layers)):
        core.tree(i, native_tree, token_rows(x, a, b, out), 0, convs[i], states[i])
    leaf = rnd.randrange(tree.n_active)
    path = tree.path_to(leaf)
    cut = rnd.randrange(1, len(path) + 1)
    core.publish(native_tree, states, convs, path[:cut])  # in two segments, as align mode may
    core.publish(native_tree, states, convs, path[cut:])

    accepted = tree.padded_path(path)
    for i, w in enumerate(layers):
        conv, state = committed[i][0].clone(), committed[i][1].clone()
        want = _reference_tree(shape, w, x[flat], a[flat], b[flat], conv, state, tree)
        replay_accepted_(state, want.operands, accepted, len(path))
        publish_conv_state_(conv, x[flat], accepted, len(path))
        torch.testing.assert_close(states[i], state, **TOL[torch.float32])
        assert torch.equal(convs[i], conv)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", range(3))
def test_tree_attention_over_the_paged_cache_is_the_reference_tree_attention(
    dtype: torch.dtype, seed: int
) -> None:
    """The plugin's native tree rows (vLLM's flat rows, block table, "vec" cache with the step's
    rows written at prefix + slot) against the reference tree attention of the same rows."""
    gen, rnd = torch.Generator().manual_seed(seed), random.Random(seed)
    heads, kv_heads, dim, block_size = 4, 2, 64, 16
    prefix = rnd.randrange(0, 40)
    tree = _random_tree(rnd, prefix_len=prefix)
    n, start = tree.n_active, 2
    req = RequestStep("r", 0, start, n, [0] * n, prefix, prefix, tree=tree)
    req.rows = start + tree.slot_map
    table = [5, 1, 4, 0, 2, 3]  # positions 0-15 in block 5, 16-31 in block 1, ...
    step = plan([req], [[table]], [block_size])
    attn = attention_layer(blocks=6, heads=kv_heads, block_size=block_size, dim=dim)
    attn.kv_cache = attn.kv_cache.to(dtype)
    keys = torch.randn(prefix + n, kv_heads, dim, generator=gen).to(dtype)  # prefix, then physical rows
    values = torch.randn(prefix + n, kv_heads, dim, generator=gen).to(dtype)
    attn.impl.do_kv_cache_update(
        attn, keys, values, attn.kv_cache, step.kv_slots(req, 0, torch.arange(prefix + n))
    )
    query = torch.randn(start + n + 1, heads, dim, generator=gen).to(dtype)
    output = torch.full_like(query, float("nan"))
    NativeTreeAttention(capacity=256).rows(step, 0, attn.layer_name, query, attn.kv_cache, output)

    want, _ = REFERENCE.tree_attention(query[req.rows].float(), keys.float(), values.float(), tree)
    torch.testing.assert_close(output[req.rows].float(), want, **TOL[dtype])
    assert output[:start].isnan().all() and output[start + n :].isnan().all()


def test_tree_attention_regathers_positions_past_the_last_committed_prefix() -> None:
    """A request's second tree step (its first step's rows overwritten by publication and the next
    tree) sees the cache as it is now, through the mirror kept from the first step."""
    gen, rnd = torch.Generator().manual_seed(7), random.Random(7)
    heads, kv_heads, dim, block_size = 4, 2, 64, 16
    attn = attention_layer(blocks=6, heads=kv_heads, block_size=block_size, dim=dim)
    attention = NativeTreeAttention(capacity=256)
    prefix = 21
    for _ in range(2):
        tree = _random_tree(rnd, prefix_len=prefix)
        n = tree.n_active
        req = RequestStep("r", 0, 0, n, [0] * n, prefix, prefix, tree=tree)
        req.rows = tree.slot_map
        step = plan([req], [[[5, 1, 4, 0, 2, 3]]], [block_size])
        keys = torch.randn(prefix + n, kv_heads, dim, generator=gen)
        values = torch.randn(prefix + n, kv_heads, dim, generator=gen)
        written = torch.arange(prefix - 3 if prefix > 21 else 0, prefix + n)  # published rows and the tree's
        attn.impl.do_kv_cache_update(
            attn, keys[written], values[written], attn.kv_cache, step.kv_slots(req, 0, written)
        )
        query = torch.randn(n, heads, dim, generator=gen)
        output = torch.full_like(query, float("nan"))
        attention.rows(step, 0, attn.layer_name, query, attn.kv_cache, output)
        cached_k, cached_v = gather_kv(attn.kv_cache, step.kv_slots(req, 0, torch.arange(prefix + n)))
        want, _ = REFERENCE.tree_attention(query[req.rows], cached_k, cached_v, tree)
        torch.testing.assert_close(output[req.rows], want, **TOL[torch.float32])
        prefix += 3  # three accepted tokens published


@pytest.mark.parametrize(
    "shape",
    [
        GdnShape(conv_dim=8192, conv_width=4, key_heads=16, value_heads=32, key_dim=128, value_dim=128),
        GdnShape(conv_dim=1536, conv_width=4, key_heads=1, value_heads=2, key_dim=512, value_dim=256),
    ],
    ids=["conv wider than the row buffers", "key heads wider than the head buffers"],
)
def test_layers_wider_than_the_native_buffers_are_refused(shape: GdnShape) -> None:
    weights = GdnWeights(torch.zeros(shape.conv_dim, shape.conv_width), torch.zeros(32), torch.zeros(32))
    with pytest.raises(ValueError, match="does not serve"):
        NativeGdn(shape, [weights], max_rows=8)
