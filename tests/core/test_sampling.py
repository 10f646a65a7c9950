"""Logits processing, counter-based coins, the exponential race and the acceptance walks."""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
import textwrap
from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from lumobench.checks import audit
from lumobench.checks.random_trees import SHAPES, random_tree
from lumotree.sampling import (
    SamplingParams,
    exponential_race,
    greedy_walk,
    philox4x32,
    probabilities,
    row_penalized_logits,
    sample_walk,
    tree_probabilities,
    uniform_coins,
)
from lumotree.sampling.rng import uint_to_uniform_float


def test_philox_matches_random123_known_answers() -> None:
    assert [hex(int(w)) for w in philox4x32(0, 0, 0, 0, 0)] == [
        "0x6627e8d5",
        "0xe169c58d",
        "0xbc57ac4c",
        "0x9b00dbd8",
    ]
    ones = 0xFFFFFFFF
    assert [hex(int(w)) for w in philox4x32(2**64 - 1, ones, ones, ones, ones)] == [
        "0x408f276d",
        "0x41c83b0e",
        "0xa20bc7c6",
        "0x6d5451fd",
    ]
    pi = philox4x32(0x299F31D0A4093822, 0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344)
    assert [hex(int(w)) for w in pi] == ["0xd16cfe09", "0x94fdcceb", "0x5001e420", "0x24126ea1"]


TRITON_PROBE = textwrap.dedent("""
    import sys, torch, triton, triton.language as tl
    @triton.jit
    def coins(out_ptr, words_ptr, seed, step, N: tl.constexpr, NODES: tl.constexpr):
        tok = tl.arange(0, N)
        for node in tl.static_range(NODES):
            w0, _, _, _ = tl.philox(seed, tok, tl.full((N,), node, tl.uint32), tl.full((N,), step, tl.uint32),
                                    tl.zeros((N,), tl.uint32))
            tl.store(words_ptr + node * N + tok, w0.to(tl.int32, bitcast=True))
        tl.store(out_ptr + tok, tl.rand(seed, tok))  # tl.rand's own counter: (offset, 0, 0, 0)
    for seed in map(int, sys.argv[1:]):
        words = torch.zeros(3 * 64, dtype=torch.int32); rand = torch.zeros(64)
        coins[(1,)](rand, words, seed, 7, 64, 3)
        print(" ".join(map(str, words.tolist())))
        print(" ".join(map(str, rand.view(torch.int32).tolist())))
""")


def test_coins_match_triton_philox_and_rand_bit_for_bit() -> None:
    pytest.importorskip("triton")
    seeds = [0, 1234567, 2**63 + 12345]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run(
        [sys.executable, "-c", TRITON_PROBE, *map(str, seeds)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    lines = out.stdout.strip().splitlines()
    for i, seed in enumerate(seeds):
        triton_words = np.array(lines[2 * i].split(), dtype=np.int64).astype(np.uint32).reshape(3, 64)
        triton_rand = np.array(lines[2 * i + 1].split(), dtype=np.int64).astype(np.int32).view(np.float32)
        signed = seed - 2**64 if seed >= 2**63 else seed  # seeds travel as int64 bit patterns
        assert np.array_equal(
            philox4x32(seed, np.arange(64)[None], np.arange(3)[:, None], 7, 0)[0], triton_words
        )
        # positions (7 << 32) + i give the counter words (token, i, 7, 0) of the Triton run
        coins = uniform_coins(torch.full((3,), signed), (7 << 32) + torch.arange(3), 64)
        assert np.array_equal(coins.numpy(), uint_to_uniform_float(triton_words))
        assert np.array_equal(uint_to_uniform_float(philox4x32(seed, np.arange(64), 0, 0, 0)[0]), triton_rand)


def test_coins_are_distinct_per_position_and_seed_and_lie_in_unit_interval() -> None:
    base = uniform_coins(torch.tensor([5, 5, 6]), torch.tensor([3, 4, 3]), 1000)
    assert ((base >= 0) & (base < 1)).all()
    assert not torch.equal(base[0], base[1]) and not torch.equal(base[0], base[2])
    assert not torch.equal(base[0], uniform_coins(torch.tensor([5]), torch.tensor([3 + (1 << 32)]), 1000)[0])
    assert torch.equal(base, uniform_coins(torch.tensor([5, 5, 6]), torch.tensor([3, 4, 3]), 1000))


def test_exponential_race_samples_the_supplied_distribution() -> None:
    p = torch.tensor([0.5, 0.0, 0.2, 0.2, 0.1])
    coins = uniform_coins(torch.arange(40_000), torch.zeros(40_000, dtype=torch.long), 5)
    x = exponential_race(p.expand(40_000, 5), coins)
    counts = torch.bincount(x, minlength=5).numpy()
    assert counts[1] == 0
    assert chisquare(counts[[0, 2, 3, 4]], 40_000 * p[[0, 2, 3, 4]].numpy()).pvalue > 1e-4


def test_exponential_race_breaks_ties_by_lowest_index_and_never_picks_zero_probability() -> None:
    p = torch.tensor([[0.0, 0.5, 0.5], [0.0, 0.0, 1.0]])
    coins = torch.tensor([[0.3, 0.4, 0.4], [0.0, 0.9999, 0.0]])
    assert exponential_race(p, coins).tolist() == [1, 2]


def test_top_k_keeps_exactly_k_tokens_even_on_boundary_ties() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 2.0, 2.0, 0.0]])
    probs = probabilities(logits, SamplingParams(top_k=3))
    assert (probs[0] > 0).tolist() == [False, True, True, True, False, False]


def test_top_p_keeps_the_smallest_prefix_reaching_the_mass_and_min_p_cuts_below_a_fraction() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert ((probabilities(logits, SamplingParams(top_p=0.8)) > 0)[0]).tolist() == [True, True, False, False]
    assert ((probabilities(logits, SamplingParams(top_p=0.81)) > 0)[0]).tolist() == [True, True, True, False]
    assert ((probabilities(logits, SamplingParams(min_p=0.3)) > 0)[0]).tolist() == [True, True, True, False]
    kept = probabilities(logits, SamplingParams(temperature=0.5, top_p=0.8))[0]
    assert torch.allclose(kept[:2], torch.tensor([0.25, 0.09]) / 0.34)


def test_penalties_follow_vllm_formulas() -> None:
    logits = torch.tensor([2.0, -2.0, 1.0, 1.0])
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    out = row_penalized_logits(logits, prompt=[0], generated=[1, 2, 2], params=params)
    # token 0: prompt only -> 2/2; token 1: -2*2 -0.5 -0.25; token 2: 1/2 - 0.5*2 - 0.25; token 3 untouched
    assert out.tolist() == [1.0, -4.75, -0.75, 1.0]


def test_logit_bias_is_added_before_the_penalties_as_vllm_does() -> None:
    logits = torch.tensor([2.0, -2.0, 1.0, 1.0])
    params = SamplingParams(repetition_penalty=2.0, logit_bias=((0, 2.0), (3, -100.0)))
    out = row_penalized_logits(logits, prompt=[0], generated=[3], params=params)
    # vLLM's sampler: logits processors (logit bias) first, then the repetition penalty
    assert out.tolist() == [(2.0 + 2.0) / 2.0, -2.0, 1.0, (1.0 - 100.0) * 2.0]
    assert logits.tolist() == [2.0, -2.0, 1.0, 1.0]  # the caller's logits are not modified


def test_invalid_sampling_params_are_rejected() -> None:
    for bad in (
        {"temperature": -1.0},
        {"top_p": 0.0},
        {"top_k": -2},
        {"min_p": 1.5},
        {"repetition_penalty": 0.0},
        {"logit_bias": ((-1, 1.0),)},
        {"logit_bias": ((3, float("nan")),)},
    ):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


@pytest.mark.parametrize("shape", ["paper", "deep_and_wide", "repeated_subtrees"])
@pytest.mark.parametrize("bias", [(), ((2, 1.5), (5, -100.0), (11, 0.4))])
def test_tree_rows_equal_single_row_decoding_with_each_rows_own_path_history(shape: str, bias: tuple) -> None:
    rng, gen = random.Random(3), torch.Generator().manual_seed(3)
    tree = random_tree(shape, rng, vocab=24)
    prompt, generated = [rng.randrange(24) for _ in range(10)], [rng.randrange(24) for _ in range(5)]
    generated.append(int(tree.tokens[0]))
    logits = torch.randn(tree.rows, 24, generator=gen) * 2
    params = SamplingParams(
        temperature=0.7,
        top_k=12,
        top_p=0.9,
        min_p=0.02,
        presence_penalty=1.0,
        frequency_penalty=0.3,
        repetition_penalty=1.3,
        logit_bias=bias,
    )
    rows = tree_probabilities(logits, tree, prompt, generated, params)
    for u in range(tree.n_active):
        history = generated + tree.tokens[tree.path_to(u)[1:]].tolist()
        single = probabilities(row_penalized_logits(logits[u], prompt, history, params)[None], params)[0]
        assert torch.equal(rows[u], single)


def test_tree_processing_requires_history_ending_with_the_root() -> None:
    tree = random_tree("chain", random.Random(0), vocab=16)
    with pytest.raises(ValueError, match="root"):
        tree_probabilities(torch.zeros(tree.rows, 16), tree, [], [int(tree.tokens[0]) + 1], SamplingParams())


def test_walk_outputs_are_fixed_shape_and_describe_one_consistent_path() -> None:
    s = audit.make_step(random.Random(5), torch.Generator().manual_seed(5), 48, 0)
    probs = tree_probabilities(s.logits, s.tree, s.prompt, s.generated, audit.AUDIT_PARAMS)
    walks = sample_walk(probs, s.tree, torch.arange(500), position=9)
    width = s.tree.max_depth + 1
    assert walks.accepted.shape == walks.emitted.shape == (500, width)
    assert int(walks.path_len.max()) > 3
    for w in range(500):
        n = int(walks.path_len[w])
        nodes = walks.accepted[w, :n].tolist()
        assert nodes[0] == 0 and (walks.accepted[w, n:] == -1).all() and (walks.emitted[w, n:] == -1).all()
        assert all(int(s.tree.parent[b]) == a for a, b in itertools.pairwise(nodes))
        assert walks.emitted[w, : n - 1].tolist() == s.tree.tokens[nodes[1:]].tolist()
        assert int(walks.final_row[w]) == nodes[-1]
        last = int(walks.emitted[w, n - 1])
        assert last not in s.tree.child_tokens[nodes[-1]].tolist() and probs[nodes[-1], last] > 0
    again = sample_walk(probs, s.tree, torch.arange(500), position=9)
    assert torch.equal(again.emitted, walks.emitted)
    assert not torch.equal(sample_walk(probs, s.tree, torch.arange(500), position=10).emitted, walks.emitted)


def test_coins_depend_on_the_output_position_not_on_the_tree() -> None:
    # A chain of one draft and a wide fan: the token after the root is sampled at the same position
    # with the same coins, so equal root rows give equal first tokens whatever the tree.
    rng = random.Random(3)
    chain, fan = random_tree("chain", rng, vocab=32), random_tree("wide_fan", rng, vocab=32)
    root_row = torch.softmax(torch.randn(32), dim=-1)
    firsts = []
    for tree in (chain, fan):
        probs = torch.softmax(torch.randn(tree.rows, 32), dim=-1)
        probs[0] = root_row
        # children never match: point the child table at no token so every walk stops at the root
        no_children = replace(tree, child_tokens=torch.full_like(tree.child_tokens, -1))
        firsts.append(sample_walk(probs, no_children, torch.arange(300), position=17).emitted[:, 0])
    assert torch.equal(firsts[0], firsts[1])


def test_greedy_walk_emits_what_stepwise_greedy_decoding_emits() -> None:
    result = audit.check_greedy_walk(12, seed=2)
    assert result.ok and "0 of" not in result.detail


def test_greedy_walk_takes_the_lowest_index_on_a_tie() -> None:
    tree = random_tree("wide_fan", random.Random(0), vocab=64)
    logits = torch.zeros(tree.rows, 64)
    first, second = sorted(int(t) for t in tree.child_tokens[0] if t >= 0)[:2]
    logits[0, [first, second]] = 5.0
    walk = greedy_walk(logits, tree)
    assert walk.emitted[0, 0] == first and int(walk.path_len[0]) == 2


def test_sampler_audit_accepts_the_walk_and_detects_every_planted_fault() -> None:
    result = audit.check_sampler_audit(steps=3, walks=20_000, min_visits=500, seed=0)
    assert result.ok and result.cases == 3 and result.faults_planted == len(audit.SAMPLER_FAULTS), result


@pytest.mark.slow
def test_sampler_audit_at_full_size() -> None:
    result = audit.check_sampler_audit(steps=6, walks=200_000, min_visits=2_000, seed=0)
    assert result.ok, result


def test_all_shapes_walk_without_error() -> None:
    rng = random.Random(9)
    for shape in SHAPES:
        tree = random_tree(shape, rng, vocab=32)
        probs = torch.softmax(torch.randn(tree.rows, 32), dim=-1)
        walks = sample_walk(probs, tree, torch.arange(64), position=0)
        assert (walks.path_len >= 1).all() and (walks.path_len <= int(tree.depth.max()) + 1).all()
