"""The engine's CPU-fast paths equal the core references: GDN verification (paired rule), layer-batched
replay (bitwise), grouped-query tree attention (paired rule), exact selection and sampling
distributions (bitwise), the lazy acceptance walk (same walks), and the MTP chain step."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from lumobench.checks.paired import paired_check
from lumobench.checks.random_trees import SHAPES, random_tree
from lumotree.drafting.selection import ordered_topk
from lumotree.drafting.selection_fast import ordered_topk_fast
from lumotree.engine.acceptance import RowSampler, history_counts, support_coins, walk
from lumotree.sampling import (
    SamplingParams,
    greedy_walk,
    probabilities,
    sample_walk,
    tree_penalized_logits,
    tree_probabilities,
    uniform_coins,
)
from lumotree.sampling.logits_fast import probabilities_fast, probabilities_rows
from lumotree.tree import TreeDescriptor
from lumotree.verify.attention.gqa import tree_attention_gqa
from lumotree.verify.attention.reference import tree_attention
from lumotree.verify.gdn.reference import GdnInputs, gdn_sequential_reference, gdn_verify, replay_accepted_
from lumotree.verify.gdn.stacked_replay import replay_layers_
from lumotree.verify.gdn.tree_wy import gdn_verify_wy

H, HV, K, V = 2, 4, 64, 64


def _gdn_inputs(tree: TreeDescriptor, seed: int) -> tuple[GdnInputs, torch.Tensor]:
    """(a layer's inputs, its durable state)."""
    g = torch.Generator().manual_seed(seed)
    r = tree.rows
    inputs = GdnInputs(
        torch.randn(r, H, K, generator=g),
        torch.randn(r, H, K, generator=g),
        torch.randn(r, HV, V, generator=g),
        torch.randn(r, HV, generator=g),
        torch.randn(r, HV, generator=g),
        torch.rand(HV, generator=g) * 2,
        torch.randn(HV, generator=g),
    )
    return inputs, torch.randn(HV, V, K, generator=g) * 0.5


def _to(args: tuple[GdnInputs, torch.Tensor], dtype: torch.dtype) -> tuple[GdnInputs, torch.Tensor]:
    return args[0].map(lambda t: t.to(dtype)), args[1].to(dtype)


@pytest.mark.parametrize("shape", SHAPES)
def test_wy_verify_is_within_the_paired_rule_of_the_float64_scan(shape: str) -> None:
    rng = random.Random(shape)
    for seed in range(3):
        tree = random_tree(shape, rng, prefix_len=9)
        args = _gdn_inputs(tree, seed)
        fast, native = gdn_verify_wy(*args, tree), gdn_verify(*args, tree)
        ref_o, ref_states = gdn_sequential_reference(*_to(args, torch.float64), tree)
        act = tree.active
        assert paired_check(fast.o[act], native.o[act], ref_o[act], 2, torch.float32).ok
        cut = tree.paths.cut_nodes
        assert fast.cut_states.shape == native.cut_states.shape
        if len(cut):
            cuts = paired_check(fast.cut_states, native.cut_states, ref_states[cut], 2, torch.float32)
            assert cuts.ok and cuts.cells == len(cut) * HV
        for name in ("q", "k", "v", "g", "beta"):  # the recorded operands are the reference's
            assert torch.equal(getattr(fast.operands, name), getattr(native.operands, name))


def test_paired_check_rejects_a_wy_verify_of_a_perturbed_node() -> None:
    tree = random_tree("paper", random.Random(3), prefix_len=9)
    args = _gdn_inputs(tree, 0)
    bad_v = args[0].v.clone()
    bad_v[int(tree.spine[2])] += 0.05  # one spine node's value, as a wrong gather would
    bad = (replace(args[0], v=bad_v), args[1])
    ref_o, _ = gdn_sequential_reference(*_to(args, torch.float64), tree)
    act = tree.active
    result = paired_check(
        gdn_verify_wy(*bad, tree).o[act], gdn_verify(*args, tree).o[act], ref_o[act], 2, torch.float32
    )
    assert not result.ok


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_layer_batched_replay_equals_reference_replay_bitwise(dtype: torch.dtype) -> None:
    rng = random.Random(1)
    for shape in ("chain", "paper", "deep_and_wide"):
        tree = random_tree(shape, rng, prefix_len=9)
        layers = [gdn_verify(*_to(_gdn_inputs(tree, s), dtype), tree) for s in range(3)]
        for node in (0, tree.n_active - 1, int(tree.spine[-1])):
            path = tree.path_to(node)
            accepted = tree.padded_path(path)
            start = [torch.randn(HV, V, K, dtype=dtype) for _ in layers]
            want = [s.clone() for s in start]
            for state, result in zip(want, layers, strict=True):
                replay_accepted_(state, result.operands, accepted, len(path))
            got = [s.clone() for s in start]
            replay_layers_(got, [r.operands for r in layers], accepted, len(path))
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("shape", SHAPES)
def test_gqa_tree_attention_is_within_the_paired_rule(shape: str) -> None:
    tree = random_tree(shape, random.Random(shape), prefix_len=300)
    g = torch.Generator().manual_seed(2)
    keys = tree.prefix_len + tree.rows
    k_cache, v_cache = torch.randn(keys + 5, 2, 64, generator=g), torch.randn(keys + 5, 2, 64, generator=g)
    q = torch.randn(tree.rows, 4, 64, generator=g)
    o, lse = tree_attention_gqa(q, k_cache, v_cache, tree)
    o_nat, lse_nat = tree_attention(q, k_cache, v_cache, tree)
    o_ref, lse_ref = tree_attention(q.double(), k_cache.double(), v_cache.double(), tree)
    assert paired_check(o, o_nat, o_ref, 2, torch.float32).ok
    assert paired_check(lse, lse_nat, lse_ref, 2, torch.float32).ok


def _selection_rows(seed: int, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    kind = seed % 3
    if kind == 0:  # many exact ties, across every top-k boundary
        return torch.randint(0, 4, (5, vocab), generator=g).float()
    x = torch.randn(5, vocab, generator=g) * 3
    if kind == 1:
        x[:, ::3] = float("-inf")
    return x


SAMPLING = [
    SamplingParams(0.6, top_k=20, top_p=0.95),
    SamplingParams(0.7, top_k=40, top_p=0.9, min_p=0.05),
    SamplingParams(0.3, top_p=0.9),
    SamplingParams(1.0),
    SamplingParams(0.8, top_k=5),
    SamplingParams(1.0, top_p=0.5, min_p=0.1),
]


@pytest.mark.parametrize("vocab", [50, 8192])
def test_fast_selection_and_distributions_equal_the_core_bitwise(vocab: int) -> None:
    for seed in range(24):
        x = _selection_rows(seed, vocab)
        for k in (1, 3, 20):
            assert torch.equal(ordered_topk_fast(x, k), ordered_topk(x, k))
        for params in SAMPLING:
            want = probabilities(x, params)
            got, cand = probabilities_rows(x, params)
            assert torch.equal(got, want)
            assert all(
                torch.equal(probabilities_fast(row, params), w) for row, w in zip(x, want, strict=True)
            )
            if cand is not None:  # the returned k-sets hold every row's support
                inside = torch.zeros_like(want, dtype=torch.bool).scatter_(-1, cand, True)
                assert not bool((want[~inside] > 0).any())


def test_support_coins_are_the_core_coins_at_those_tokens() -> None:
    tokens = torch.tensor([0, 3, 17, 4095, 8191])
    for seed in (0, 7, 2**63 - 1, -5):
        full = uniform_coins(torch.tensor([seed]), torch.tensor([11 + (3 << 32)]), 8192)[0]
        assert torch.equal(support_coins(seed, 11 + (3 << 32), tokens), full[tokens])


def _walk_case(
    tree: TreeDescriptor, seed: int, params: SamplingParams
) -> tuple[torch.Tensor, list[int], list[int]]:
    g = torch.Generator().manual_seed(seed)
    vocab = 40
    logits = torch.randn(tree.rows, vocab, generator=g) * 2
    # make drafts likely so walks go deep: raise each child's token in its parent's row
    for child in range(1, tree.n_active):
        logits[int(tree.parent[child]), int(tree.tokens[child])] += 2.5
    prompt = torch.randint(0, vocab, (12,), generator=g).tolist()
    generated = [*torch.randint(0, vocab, (5,), generator=g).tolist(), int(tree.tokens[0])]
    return logits, prompt, generated


@pytest.mark.parametrize("shape", SHAPES)
def test_lazy_walk_equals_the_core_walks(shape: str) -> None:
    rng = random.Random(shape)
    for case in range(6):
        tree = random_tree(shape, rng, vocab=40, prefix_len=20)
        for params in (
            SamplingParams(0.0, presence_penalty=0.7),
            SamplingParams(0.9, top_k=12, frequency_penalty=0.3),
            SamplingParams(1.0, top_p=0.8, repetition_penalty=1.2),
            # a bias that moves argmaxes and samples: the lazy walk applies it as the core does
            SamplingParams(0.0, logit_bias=((1, 3.0), (7, -100.0))),
            SamplingParams(0.8, top_k=20, logit_bias=((1, 3.0), (7, -100.0), (30, 1.0))),
        ):
            logits, prompt, generated = _walk_case(tree, case, params)
            seen = history_counts(prompt, logits.shape[1]) > 0
            for seed in range(4):
                sampler = RowSampler(params, seen, generated, seed)
                got = walk(tree, lambda nodes, lg=logits: lg[nodes], sampler)
                if params.greedy:
                    want = greedy_walk(tree_penalized_logits(logits, tree, prompt, generated, params), tree)
                else:
                    probs = tree_probabilities(logits, tree, prompt, generated, params)
                    # the root row samples the token after the pending root: position len(generated)
                    want = sample_walk(probs, tree, torch.tensor([seed]), len(generated))
                n = int(want.path_len[0])
                assert got.accepted == want.accepted[0, :n].tolist()
                assert got.emitted == want.emitted[0, :n].tolist()
