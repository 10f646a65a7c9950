"""The plugin's GDN core and publication on vLLM's state layouts, against the project's model ops.

Chunks must continue a request's state across vLLM steps exactly as one chain forward would; every
tree row must see the state its own path leads to; publication must leave the state (recurrent and
conv) a chain forward of the accepted path leaves, and move the path's KV rows into place.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor

from lumotree.model import HybridLM, default_model_path, load_checkpoint
from lumotree.model.gdn import GatedDeltaNet
from lumotree.verify.kernel_sets import CPU_FAST
from lumotree.vllm.align import move_running_states, running_column
from lumotree.vllm.checkpoints import boundary_cuts, publish_gdn_path
from lumotree.vllm.gdn_core import GdnCore, TorchGdnCore, conv_state_view
from lumotree.vllm.paged_kv import gather_kv
from lumotree.vllm.publish import LayerIndex, publish_accepted
from lumotree.vllm.steps import RequestStep, StepPlan

from .conftest import MakeCore
from .fake_vllm import attention_layer, gdn_layer, plan
from .trees import tree_from_paths

SLOT = 2  # the request's state slot (others hold garbage that must stay untouched)


@pytest.fixture(scope="module")
def model() -> HybridLM:
    return load_checkpoint(default_model_path())


@pytest.fixture(scope="module")
def mixer(model: HybridLM) -> GatedDeltaNet:
    return model.model.layers[0].linear_attn


def _inputs(mixer: GatedDeltaNet, n: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """Projected inputs of n random hidden rows: mixed_qkv [n, C], b, a [n, HV]."""
    h = torch.randn(1, n, mixer.in_proj_qkv.in_features, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        mixed, _, a, b = mixer.project(h)
    return mixed[0], b[0], a[0]


def _chain(mixer: GatedDeltaNet, x: Tensor, b: Tensor, a: Tensor, conv: Tensor | None, state: Tensor | None):
    """The project model's chain forward of one GDN mixer: (o [n, HV, V], conv [C, W-1], state)."""
    with torch.no_grad():
        y, new_conv = mixer.conv(x[None], None if conv is None else conv[None])
        q, k, v = mixer.split_qkv(y)
        g, beta = mixer.gates(a[None], b[None])
        o, new_state = mixer.mix(q, k, v, g, beta, None if state is None else state[None])
    return o[0], new_conv[0], new_state[0]


def _chunk(index: int, start: int, x_rows: int, prefix: int) -> RequestStep:
    return RequestStep("r", index, start, x_rows, [0] * x_rows, prefix, prompt_len=100)


@pytest.mark.parametrize("dim_first", [False, True])
@pytest.mark.parametrize("spec_width", [0, 27])
def test_chunks_continue_the_state_across_steps(
    mixer: GatedDeltaNet, make_core: MakeCore, dim_first: bool, spec_width: int
) -> None:
    layer = gdn_layer(mixer, slots=4, spec_width=spec_width, dim_first=dim_first)
    core = make_core({layer.prefix: layer})
    untouched = [c.clone() for c in layer.kv_cache]
    x, b, a = _inputs(mixer, 12, seed=0)
    out = torch.zeros(12, mixer.num_v_heads, mixer.head_v_dim)
    prefix = 0
    for size in (5, 1, 6):  # a split prompt, then a one-token chunk
        rows = slice(prefix, prefix + size)
        step = plan([_chunk(0, 0, size, prefix)], [[[SLOT]]], [1])
        part = torch.zeros(size, mixer.num_v_heads, mixer.head_v_dim)
        core.forward(layer, step, 0, dim_first, x[rows], b[rows], a[rows], part)
        out[rows] = part
        prefix += size
    o, conv, state = _chain(mixer, x, b, a, None, None)
    torch.testing.assert_close(out, o, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer.kv_cache[1][SLOT], state, rtol=1e-5, atol=1e-5)
    assert torch.equal(conv_state_view(layer.kv_cache[0], SLOT, 4, dim_first), conv)
    for slot in (0, 1, 3):  # other requests' slots are never written
        assert torch.equal(layer.kv_cache[0][slot], untouched[0][slot])
        assert torch.equal(layer.kv_cache[1][slot], untouched[1][slot])


def _prefill_prefix(
    layer: torch.nn.Module, mixer: GatedDeltaNet, core: GdnCore, slot: int, seed: int
) -> tuple[Tensor, Tensor]:
    """Prefill a 7-token committed prefix into `slot`; copies of the slot's conv and recurrent state."""
    px, pb, pa = _inputs(mixer, 7, seed=seed)
    core.forward(
        layer, plan([_chunk(0, 0, 7, 0)], [[[slot]]], [1]), 0, False, px, pb, pa, torch.zeros(7, 4, 64)
    )
    return conv_state_view(layer.kv_cache[0], slot, 4, False).clone(), layer.kv_cache[1][slot].clone()


def _tree_step(paths: list[list[int]], prefix: int, start: int):
    tree = tree_from_paths(0, paths, prefix_len=prefix)
    step = RequestStep("r", 0, start, tree.rows, [0] * tree.rows, prefix, prompt_len=prefix, tree=tree)
    step.rows = start + tree.slot_map
    return step


PATHS = [[1, 2, 3, 4], [1, 5], [6, 7, 8], [6, 9], [10]]


def test_tree_rows_see_their_paths_and_publication_equals_the_path_as_a_chain(
    mixer: GatedDeltaNet, make_core: MakeCore
) -> None:
    layer = gdn_layer(mixer, slots=4, spec_width=27)
    core = make_core({layer.prefix: layer})
    conv0, state0 = _prefill_prefix(layer, mixer, core, SLOT, seed=1)  # the committed prefix

    req = _tree_step(PATHS, prefix=7, start=3)  # rows 0..2 of the batch belong to another request
    n = req.tree.rows
    tx, tb, ta = _inputs(mixer, n, seed=2)  # logical order
    flat = 3 + n
    x, b, a = torch.zeros(flat, tx.shape[1]), torch.zeros(flat, tb.shape[1]), torch.zeros(flat, ta.shape[1])
    x[req.rows], b[req.rows], a[req.rows] = tx, tb, ta  # vLLM's flat layout: physical order
    out = torch.zeros(flat, mixer.num_v_heads, mixer.head_v_dim)
    step = plan([req], [[[SLOT]]], [1])
    core.forward(layer, step, 0, False, x, b, a, out)
    assert torch.equal(layer.kv_cache[1][SLOT], state0), "verification wrote the durable state"

    for node in range(n):
        path = req.tree.path_to(node)
        o, _, _ = _chain(mixer, tx[path], tb[path], ta[path], conv0, state0)
        torch.testing.assert_close(out[req.rows[node]], o[-1], rtol=1e-4, atol=1e-5)

    accepted = req.tree.path_to(int((req.tree.tokens == 8).nonzero()))  # root, 6, 7, 8: off the spine
    assert not req.tree.is_spine_prefix(accepted)
    publish_accepted(step, req, accepted, LayerIndex({layer.prefix: (layer, 0)}, {}, False), core)
    _, conv, state = _chain(mixer, tx[accepted], tb[accepted], ta[accepted], conv0, state0)
    torch.testing.assert_close(layer.kv_cache[1][SLOT], state, rtol=1e-5, atol=1e-5)
    assert torch.equal(conv_state_view(layer.kv_cache[0], SLOT, 4, False), conv)


def test_publication_moves_the_accepted_paths_kv_rows_into_place() -> None:
    heads, dim, block_size, prefix = 2, 64, 16, 21
    attn = attention_layer(blocks=6, heads=heads, block_size=block_size, dim=dim)
    table = [[4, 1, 5, 0]]  # the request's blocks: positions 0-15 in block 4, 16-31 in block 1, ...
    req = _tree_step(PATHS, prefix=prefix, start=0)
    step = plan([req], [table], [block_size])
    n = req.tree.rows
    keys, values = torch.randn(n, heads, dim), torch.randn(n, heads, dim)  # logical order
    slots = step.kv_slots(req, 0, prefix + req.tree.slot_map)  # where vLLM wrote each row
    attn.impl.do_kv_cache_update(attn, keys, values, attn.kv_cache, slots)
    accepted = req.tree.path_to(int((req.tree.tokens == 9).nonzero()))  # root, 6, 9
    layers = LayerIndex({}, {attn.layer_name: (attn, 0)}, False)
    publish_accepted(step, req, accepted, layers, TorchGdnCore(CPU_FAST))
    placed = step.kv_slots(req, 0, prefix + torch.arange(len(accepted)))
    got_k, got_v = gather_kv(attn.kv_cache, placed, attn.isa)
    assert torch.equal(got_k, keys[accepted]) and torch.equal(got_v, values[accepted])


@pytest.mark.parametrize(
    ("prefix", "path_len", "block_size", "cuts"),
    [
        (7, 4, 8, [1]),
        (5, 4, 8, [3]),
        (8, 4, 8, []),
        (6, 12, 4, [2, 6, 10]),
        (255, 28, 256, [1]),
        (9, 3, 1, [1, 2, 3]),
    ],
)
def test_boundary_cuts_are_exactly_the_path_lengths_that_end_a_block(
    prefix: int, path_len: int, block_size: int, cuts: list[int]
) -> None:
    assert boundary_cuts(prefix, path_len, block_size) == cuts
    assert cuts == [k for k in range(1, path_len + 1) if (prefix + k) % block_size == 0]


@pytest.mark.parametrize("cut_at", [[1, 3], [2], [4], [1, 2, 3, 4]])
def test_publication_in_segments_saves_the_state_after_exactly_each_cut(
    mixer: GatedDeltaNet, make_core: MakeCore, cut_at: list[int]
) -> None:
    """What vLLM's align mode caches for a block must be the state after exactly its tokens, also
    when the accepted path crosses the block's end part-way."""
    layer = gdn_layer(mixer, slots=4, spec_width=27)
    core = make_core({layer.prefix: layer})
    conv0, state0 = _prefill_prefix(layer, mixer, core, SLOT, seed=3)
    conv = conv_state_view(layer.kv_cache[0], SLOT, 4, False)
    state = layer.kv_cache[1][SLOT]

    req = _tree_step(PATHS, prefix=7, start=0)
    tx, tb, ta = _inputs(mixer, req.tree.rows, seed=4)  # logical order
    x, b, a = torch.zeros_like(tx), torch.zeros_like(tb), torch.zeros_like(ta)
    x[req.rows], b[req.rows], a[req.rows] = tx, tb, ta  # vLLM's flat layout: physical order
    step = plan([req], [[[SLOT]]], [1])
    core.forward(layer, step, 0, False, x, b, a, torch.zeros(req.tree.rows, 4, 64))
    accepted = req.tree.path_to(int((req.tree.tokens == 8).nonzero()))  # root, 6, 7, 8: off the spine
    saved: dict[int, tuple[Tensor, Tensor]] = {}

    def save(k: int) -> None:
        saved[k] = (conv.clone(), state.clone())

    publish_gdn_path(core, req, [layer.prefix], [state], [conv], accepted, cut_at, save)
    assert sorted(saved) == cut_at
    for k in [*cut_at, len(accepted)]:
        path = accepted[:k]
        _, want_conv, want_state = _chain(mixer, tx[path], tb[path], ta[path], conv0, state0)
        got_conv, got_state = saved.get(k, (conv, state))  # the last: the durable states
        torch.testing.assert_close(got_state, want_state, rtol=1e-5, atol=1e-5)
        assert torch.equal(got_conv, want_conv), k


def test_running_column_is_the_block_of_the_last_scheduled_token() -> None:
    assert [running_column(c, s, 4) for c, s in [(0, 1), (0, 4), (0, 5), (7, 1), (7, 2), (8, 28)]] == [
        0,
        0,
        1,
        1,
        2,
        8,
    ]


def test_align_mode_moves_the_running_state_and_publication_saves_the_crossed_block_end(
    mixer: GatedDeltaNet, make_core: MakeCore
) -> None:
    """Align mode (block size 4): the committed state moves from the last step's column to this
    step's; publication of a path whose root ends block 1 leaves that block's slot the state after
    exactly 8 tokens and the running slot the state after the whole path; nothing else written."""
    layer = gdn_layer(mixer, slots=7, spec_width=27)
    core = make_core({layer.prefix: layer})
    conv0, state0 = _prefill_prefix(layer, mixer, core, 6, seed=5)
    table = [0, 4, 6, 0, 5]  # the request's blocks: column 1 -> slot 4, 2 -> 6 (last step's), 4 -> 5
    untouched = [c.clone() for c in layer.kv_cache]

    req = _tree_step(PATHS, prefix=7, start=0)
    current = running_column(7, req.tree.rows, 4)
    assert current == 4
    layers = LayerIndex({layer.prefix: (layer, 0)}, {}, False)
    move_running_states(layers.gdn.values(), lambda group: table, 2, current, False)
    assert torch.equal(layer.kv_cache[1][5], state0)
    step = StepPlan(
        [req], [np.asarray([table], dtype=np.int32)], [4], align_block_size=4, state_columns={"r": current}
    )
    tx, tb, ta = _inputs(mixer, req.tree.rows, seed=6)
    x, b, a = torch.zeros_like(tx), torch.zeros_like(tb), torch.zeros_like(ta)
    x[req.rows], b[req.rows], a[req.rows] = tx, tb, ta
    core.forward(layer, step, 0, False, x, b, a, torch.zeros(req.tree.rows, 4, 64))
    accepted = req.tree.path_to(int((req.tree.tokens == 8).nonzero()))  # root, 6, 7, 8
    publish_accepted(step, req, accepted, layers, core)

    for slot, nodes in ((4, accepted[:1]), (5, accepted)):
        _, conv, state = _chain(mixer, tx[nodes], tb[nodes], ta[nodes], conv0, state0)
        torch.testing.assert_close(layer.kv_cache[1][slot], state, rtol=1e-5, atol=1e-5)
        assert torch.equal(conv_state_view(layer.kv_cache[0], slot, 4, False), conv)
    for slot in (0, 1, 2, 3, 6):  # the null block, other requests' slots, the last step's column
        assert torch.equal(layer.kv_cache[0][slot], untouched[0][slot])
        assert torch.equal(layer.kv_cache[1][slot], untouched[1][slot])
