"""The native CPU forward (lumotree.model.native) against the model's PyTorch modes: tree
verification within the paired rule of a float64 run (every tree shape, scratch and outputs
poisoned first), rows bitwise independent of the tree they sit in (a tree row equals the
autoregressive decode of its path, and publishing the path leaves the state autoregressive decoding
leaves), publication, logits and the MTP step equal to the model's, and the models it refuses; each
on every ISA path (`native_path` in conftest.py: host, AVX2, ARM64 NEON under qemu-user)."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from lumobench.checks.paired import paired_check
from lumobench.checks.random_trees import SHAPES, random_tree
from lumotree.drafting.draft_vocab import subset_head
from lumotree.drafting.mtp import MTPDrafter
from lumotree.drafting.native_mtp import NativeMTPDrafter
from lumotree.model import GDNState, HybridConfig, HybridLM, KVCache, ModelState
from lumotree.model.native import remote
from lumotree.model.native.model import NativeModel, unsupported_reason
from lumotree.model.tree_mode import publish_tree_, verify_tree
from lumotree.tree import TreeDescriptor, chain_tree
from lumotree.verify.kernel_sets import REFERENCE

PROMPT = 40
ModelFactory = Callable[..., HybridLM]
NativeFactory = Callable[..., NativeModel]


@pytest.fixture(name="bf16_model")
def _bf16_model_factory(
    tiny_config: Callable[..., HybridConfig], perturbed_model: ModelFactory
) -> ModelFactory:
    """bf16_model(seed=0) -> a random tiny model whose weights are bfloat16 values (what the native
    forward packs losslessly)."""

    def make(seed: int = 0) -> HybridLM:
        model = perturbed_model(tiny_config(), seed=seed)
        with torch.no_grad():
            for p in model.parameters():
                if p.ndim >= 2:
                    p.copy_(p.to(torch.bfloat16).float())
        return model

    return make


def _prefilled(model: HybridLM, seed: int, capacity: int = PROMPT + 64) -> ModelState:
    rng = random.Random(seed)
    state = model.new_state(capacity)
    with torch.inference_mode():
        model.prefill(torch.tensor([rng.randrange(model.config.vocab_size) for _ in range(PROMPT)]), state)
    return state


def _poison(native: NativeModel, state: ModelState) -> None:
    """NaN in every scratch buffer and in the KV rows past the committed prefix."""
    for t in native._scratch:
        t.fill_(float("nan"))
    for s in state.layers:
        if isinstance(s, KVCache):
            s.key[state.length :] = float("nan")
            s.value[state.length :] = float("nan")


def _tree(shape: str, seed: int, vocab: int) -> TreeDescriptor:
    return random_tree(shape, random.Random(f"{shape}{seed}"), vocab=vocab, prefix_len=PROMPT)


@pytest.mark.parametrize("shape", SHAPES)
def test_native_verify_is_within_the_paired_rule_of_float64(
    shape: str, bf16_model: ModelFactory, native_path: NativeFactory
) -> None:
    model = bf16_model()
    truth = copy.deepcopy(model).double()
    for seed in range(2):
        tree = _tree(shape, seed, model.config.vocab_size)
        state = _prefilled(model, seed)
        ref_state = copy.deepcopy(state)
        truth_state = ModelState(
            [
                GDNState(s.recurrent.double(), s.conv.double())
                if isinstance(s, GDNState)
                else KVCache(s.key.double(), s.value.double())
                for s in state.layers
            ],
            state.length,
        )
        native = native_path(model, state, tree_rows=32, max_rows=32)
        _poison(native, state)
        n = tree.n_active
        out = torch.full((n, model.config.hidden_size), float("nan"))
        got = native.verify(tree, out)
        with torch.inference_mode():
            want = verify_tree(model, ref_state, tree, REFERENCE).hidden[:n]
            ref = verify_tree(truth, truth_state, tree, REFERENCE).hidden[:n]
        assert got is out and not got.isnan().any()
        assert paired_check(got, want, ref, 1, torch.float32).ok
        slots = PROMPT + tree.slot_map[:n]  # the tree rows' KV, written where publication finds it
        for s, r, t in zip(state.layers, ref_state.layers, truth_state.layers, strict=True):
            if isinstance(s, KVCache):
                for name in ("key", "value"):
                    cells = [getattr(x, name)[slots] for x in (s, r, t)]
                    assert paired_check(*cells, 2, torch.float32).ok


def test_paired_check_catches_a_native_verify_of_the_wrong_state(bf16_model: ModelFactory) -> None:
    model = bf16_model()
    truth = copy.deepcopy(model).double()
    tree = _tree("paper", 0, model.config.vocab_size)
    state = _prefilled(model, 0)
    ref_state = copy.deepcopy(state)
    truth_state = copy.deepcopy(state)
    native = NativeModel(model, state, tree_rows=32, max_rows=32)
    gdn = next(s for s in state.layers if isinstance(s, GDNState))
    gdn.recurrent.mul_(1.01)  # a stale recurrent state, as a missed publication would leave
    got = native.verify(tree)
    with torch.inference_mode():
        want = verify_tree(model, ref_state, tree, REFERENCE).hidden[: tree.n_active]
        ref = verify_tree(truth.float(), truth_state, tree, REFERENCE).hidden[: tree.n_active]
    assert not paired_check(got, want, ref.double(), 1, torch.float32).ok


def _paths(tree: TreeDescriptor) -> list[list[int]]:
    """The spine, and the root path of the deepest node off the spine."""
    spine = tree.spine.tolist()
    off = [i for i in range(tree.n_active) if i not in spine]
    paths = [spine]
    if off:
        paths.append(tree.path_to(max(off, key=lambda i: int(tree.depth[i]))))
    return paths


@pytest.mark.parametrize("shape", ["chain", "deep_and_wide", "paper"])
def test_tree_rows_are_bitwise_the_autoregressive_decode_of_their_path(
    shape: str, bf16_model: ModelFactory, native_path: NativeFactory
) -> None:
    model = bf16_model(seed=1)
    tree = _tree(shape, 0, model.config.vocab_size)
    for path in _paths(tree):
        state = _prefilled(model, 1)
        ar_state = copy.deepcopy(state)
        native = native_path(model, state, tree_rows=32, max_rows=32)
        ar = native_path(model, ar_state, tree_rows=32, max_rows=32)
        rows = native.verify(tree)
        native.publish(tree, path)
        for depth, node in enumerate(path):
            step = chain_tree([int(tree.tokens[node])], prefix_len=PROMPT + depth)
            assert torch.equal(ar.verify(step)[0], rows[node]), f"row {node} at depth {depth}"
            ar.publish(step, [0])
        assert state.length == ar_state.length == PROMPT + len(path)
        for s, a in zip(state.layers, ar_state.layers, strict=True):
            if isinstance(s, GDNState):
                assert torch.equal(s.recurrent, a.recurrent) and torch.equal(s.conv, a.conv)
            else:
                assert torch.equal(s.key[: state.length], a.key[: state.length])
                assert torch.equal(s.value[: state.length], a.value[: state.length])


@pytest.mark.parametrize("shape", ["chain", "wide_fan", "paper"])
def test_native_publication_equals_the_reference_publication(
    shape: str, bf16_model: ModelFactory, native_path: NativeFactory
) -> None:
    model = bf16_model(seed=2)
    tree = _tree(shape, 1, model.config.vocab_size)
    for path in _paths(tree):
        state = _prefilled(model, 2)
        ref_state = copy.deepcopy(state)
        native = native_path(model, state, tree_rows=32, max_rows=32)
        native.verify(tree)
        native.publish(tree, path)
        with torch.inference_mode():
            forward = verify_tree(model, ref_state, tree, REFERENCE)
            publish_tree_(ref_state, forward, tree.padded_path(path), len(path), REFERENCE)
        assert state.length == ref_state.length
        n = state.length
        for s, r in zip(state.layers, ref_state.layers, strict=True):
            if isinstance(s, GDNState):
                torch.testing.assert_close(s.recurrent, r.recurrent, rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(s.conv, r.conv, rtol=1e-5, atol=1e-6)
            else:
                torch.testing.assert_close(s.key[:n], r.key[:n], rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(s.value[:n], r.value[:n], rtol=1e-5, atol=1e-6)


def test_publish_refuses_a_tree_it_did_not_verify_last(bf16_model: ModelFactory) -> None:
    model = bf16_model()
    state = _prefilled(model, 0)
    native = NativeModel(model, state, tree_rows=32, max_rows=32)
    first = chain_tree([3, 4], prefix_len=PROMPT)
    native.verify(first)
    native.verify(chain_tree([5], prefix_len=PROMPT))
    with pytest.raises(ValueError, match="last verification"):
        native.publish(first, [0, 1])


def test_native_logits_and_mtp_step_equal_the_models(
    bf16_model: ModelFactory, native_path: NativeFactory
) -> None:
    model = bf16_model(seed=3)
    state = _prefilled(model, 3)
    native = native_path(model, state, tree_rows=32, max_rows=64)
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(6, model.config.hidden_size, generator=gen)
    with torch.inference_mode():
        torch.testing.assert_close(native.logits(hidden), model.compute_logits(hidden), rtol=1e-5, atol=1e-5)
        tokens = torch.randint(0, model.config.vocab_size, (6,), generator=gen)
        ours, theirs = model.new_mtp_state(64), model.new_mtp_state(64)
        for rows in (slice(0, 5), slice(5, 6)):  # a commit of several rows, then one speculative row
            got = native.mtp_step(hidden[rows], tokens[rows], ours)
            out = model.mtp_hidden(hidden[rows], tokens[rows], theirs)
            want = (model.compute_logits(out[-1]), out)
            for g, w in zip(got, want, strict=True):
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
        assert ours.length == theirs.length == 6
        for a, b in zip(ours.layers, theirs.layers, strict=True):
            assert isinstance(a, KVCache) and isinstance(b, KVCache)
            torch.testing.assert_close(a.key[:6], b.key[:6], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(a.value[:6], b.value[:6], rtol=1e-5, atol=1e-6)


def test_unsupported_models_are_refused_with_the_reason(
    bf16_model: ModelFactory, tiny_config: Callable[..., HybridConfig], perturbed_model: ModelFactory
) -> None:
    assert unsupported_reason(bf16_model()) is None
    assert "bfloat16" in (unsupported_reason(perturbed_model(tiny_config())) or "")
    moe = tiny_config(num_experts=2, num_experts_per_tok=1, moe_intermediate_size=32)
    assert "MoE" in (unsupported_reason(HybridLM.random(moe)) or "")
    assert "dtype" in (unsupported_reason(bf16_model().to(torch.bfloat16)) or "")
    model = perturbed_model(tiny_config())
    with pytest.raises(ValueError, match="does not support"):
        NativeModel(model, model.new_state(8), tree_rows=4, max_rows=4)


@pytest.mark.parametrize("draft_vocab", [False, True])
def test_native_mtp_drafter_proposes_what_the_pytorch_drafter_proposes(
    bf16_model: ModelFactory, draft_vocab: bool, native_path: NativeFactory
) -> None:
    """Also with a draft vocabulary (every third id): the native proposals rank its rows only and
    equal the PyTorch drafter's over whole-vocabulary logits that are -inf outside it."""
    model = bf16_model(seed=4)
    ids = torch.arange(1, model.config.vocab_size, 3) if draft_vocab else None
    native = native_path(model, model.new_state(8), tree_rows=8, max_rows=64, draft_ids=ids)
    ours = NativeMTPDrafter(model, depth=4, topk=3, capacity=64, native=native)
    head = None if ids is None else subset_head(model.lm_head.weight, ids)
    theirs = MTPDrafter(model, depth=4, topk=3, capacity=64, head=head)
    gen = torch.Generator().manual_seed(1)
    vocab, width = model.config.vocab_size, model.config.hidden_size
    for rows in (7, 1, 3):  # a prefill commit, then cycles' queued paths
        hidden = torch.randn(rows, width, generator=gen)
        tokens = torch.randint(0, vocab, (rows,), generator=gen).tolist()
        proposal = ours.propose(hidden, tokens)
        assert proposal == theirs.propose(hidden, tokens)
        assert ours.committed == theirs.committed
        if ids is not None:
            assert {t for ranked in proposal.topk for t in ranked} <= set(ids.tolist())


def test_remote_calls_replay_the_in_process_library_bit_for_bit(
    bf16_model: ModelFactory, tmp_path: Path
) -> None:
    """remote.py (what the NEON path's tests run through under qemu) with the host's own driver:
    verification, publication, logits and an MTP proposal equal the in-process library's."""
    model = bf16_model(seed=5)
    driver = remote.build_driver("cc", "native", tmp_path / "driver")
    here, there = _prefilled(model, 5), _prefilled(model, 5)
    ours = NativeModel(model, here, tree_rows=32, max_rows=32)
    theirs = NativeModel(model, there, tree_rows=32, max_rows=32)
    remote.attach(theirs, [str(driver)])
    tree = _tree("paper", 2, model.config.vocab_size)
    assert torch.equal(ours.verify(tree), theirs.verify(tree))
    path = _paths(tree)[-1]
    ours.publish(tree, path)
    theirs.publish(tree, path)
    for a, b in zip(here.layers, there.layers, strict=True):
        pairs = [(a.recurrent, b.recurrent), (a.conv, b.conv)] if isinstance(a, GDNState) else []
        pairs += [] if isinstance(a, GDNState) else [(a.key, b.key), (a.value, b.value)]
        assert all(torch.equal(x, y) for x, y in pairs)
    hidden = torch.randn(3, model.config.hidden_size, generator=torch.Generator().manual_seed(5))
    assert torch.equal(ours.logits(hidden), theirs.logits(hidden))
    tokens = torch.tensor([1, 2, 3])
    assert ours.mtp_propose(hidden, tokens, model.new_mtp_state(16), 3, 2) == theirs.mtp_propose(
        hidden, tokens, model.new_mtp_state(16), 3, 2
    )
