"""vLLM's per-row processing in the plugin's walk (allowed_token_ids, bad_words, logit bias, penalties)
against a reference written token by token from vLLM's rules, and the lossless property with them:
a tree's walk emits what decoding one token at a time emits, greedy and seeded."""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence

import pytest
import torch
from torch import Tensor

from lumotree.engine.acceptance import walk
from lumotree.sampling import SamplingParams
from lumotree.vllm.processing import FilteredRowSampler, TokenFilters

from .trees import tree_from_paths

VOCAB = 16
PROMPT = [1, 2, 2, 9]


def _reference_row(
    row: Sequence[float], history: Sequence[int], filters: TokenFilters, params: SamplingParams
) -> list[float]:
    """One row processed as vLLM's Sampler does, one token at a time: allowed ids, bad words
    (banned where the history ends with the word's other tokens), logit bias, repetition penalty
    (prompt + output), frequency and presence penalties (output)."""
    out = []
    bias = dict(params.logit_bias)
    for token, value in enumerate(row):
        if filters.allowed and token not in filters.allowed:
            value = -math.inf
        for word in filters.bad_words:
            before = list(word[:-1])
            if (
                word[-1] == token
                and len(history) >= len(before)
                and list(history)[len(history) - len(before) :] == before
            ):
                value = -math.inf
        value += bias.get(token, 0.0)
        count = list(history).count(token)
        if (count or token in PROMPT) and params.repetition_penalty != 1.0:
            value = value / params.repetition_penalty if value > 0 else value * params.repetition_penalty
        value -= params.frequency_penalty * count + params.presence_penalty * (count > 0)
        out.append(value)
    return out


FILTERS = [
    TokenFilters(),
    TokenFilters(allowed=(0, 3, 4, 5, 7, 11, 12)),
    TokenFilters(bad_words=((5,), (3, 4), (4, 3, 7), (11, 12, 13, 14, 15, 3))),
    TokenFilters(allowed=(3, 4, 7, 12), bad_words=((12,), (7, 4))),
]
PARAMS = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.0, logit_bias=((3, 4.0), (7, -100.0)), repetition_penalty=1.3),
    SamplingParams(temperature=0.9, logit_bias=((4, 2.5),), presence_penalty=0.7, frequency_penalty=0.2),
    SamplingParams(temperature=1.1, top_k=5, top_p=0.9, min_p=0.02, logit_bias=((12, 3.0),)),
]


@pytest.mark.parametrize("filters", FILTERS)
@pytest.mark.parametrize("params", PARAMS[:3])
def test_tree_rows_are_processed_as_single_rows_with_their_path_histories(
    filters: TokenFilters, params: SamplingParams
) -> None:
    rng = torch.Generator().manual_seed(3)
    generated = [3, 4, 4, 3]
    paths = [[7, 4, 3], [4, 3, 7], [5, 12]]
    logits = torch.randn(8, VOCAB, generator=rng) * 3
    prompt_seen = torch.zeros(VOCAB, dtype=torch.bool)
    prompt_seen[PROMPT] = True
    sampler = FilteredRowSampler(params, filters, prompt_seen, generated, seed=1)
    path_drafts = [[], *[path[: i + 1] for path in paths for i in range(len(path))]][:8]
    got = sampler.penalised(logits, path_drafts)
    for row, path, value in zip(logits.tolist(), path_drafts, got.tolist(), strict=True):
        want = _reference_row(row, [*generated, *path], filters, params)
        assert value == pytest.approx(want, rel=1e-6, abs=1e-6)  # -inf where the reference bans


def _row_logits(history: Sequence[int]) -> Tensor:
    """The "model": a fixed pseudo-random row per history (so a tree row and a single row with the
    same history get the same logits)."""
    key = int.from_bytes(hashlib.sha256(repr(list(history)).encode()).digest()[:8], "little")
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(key)) * 2


def _decode(generated: list[int], steps: int, params: SamplingParams, filters: TokenFilters) -> list[int]:
    """Decoding one token per step (root-only trees): the no-draft reference."""
    prompt_seen = torch.zeros(VOCAB, dtype=torch.bool)
    prompt_seen[PROMPT] = True
    out = list(generated)
    for _ in range(steps):
        sampler = FilteredRowSampler(params, filters, prompt_seen, out, seed=77)
        out += sampler.choose(_row_logits(out)[None], [[]])
    return out[len(generated) :]


@pytest.mark.parametrize("filters", FILTERS)
@pytest.mark.parametrize("params", PARAMS)
def test_a_trees_walk_emits_what_one_token_a_step_decoding_emits(
    filters: TokenFilters, params: SamplingParams
) -> None:
    generated = [3, 4, 4, 3]
    expected = _decode(generated, 24, params, filters)
    prompt_seen = torch.zeros(VOCAB, dtype=torch.bool)
    prompt_seen[PROMPT] = True
    if filters.allowed:
        assert set(expected) <= set(filters.allowed)
    out, rng = list(generated), random.Random(5)
    while len(out) - len(generated) < 12:
        done = len(out) - len(generated)
        spine = expected[done : done + rng.randint(0, 4)]  # the right drafts, then wrong siblings
        paths = [spine, *([[rng.randrange(VOCAB) for _ in range(rng.randint(1, 3))] for _ in range(3)])]
        tree = tree_from_paths(out[-1], [p for p in paths if p], prefix_len=len(out))
        tokens = tree.tokens.tolist()

        def rows(nodes: list[int], tree=tree, tokens=tokens, out=out) -> Tensor:
            histories = []
            for node in nodes:
                path = []
                while node > 0:
                    path.append(tokens[node])
                    node = int(tree.parent[node])
                histories.append([*out, *reversed(path)])
            return torch.stack([_row_logits(h) for h in histories])

        acc = walk(tree, rows, FilteredRowSampler(params, filters, prompt_seen, out, seed=77))
        assert acc.emitted[: len(spine)] == spine and len(acc.emitted) > len(spine)  # the spine is accepted
        out += acc.emitted
    emitted = out[len(generated) :]
    assert emitted == expected[: len(emitted)]


def test_advancing_the_sampler_keeps_the_bad_word_context() -> None:
    filters = TokenFilters(bad_words=((1, 2, 3),))
    sampler = FilteredRowSampler(
        SamplingParams(temperature=0.0), filters, torch.zeros(VOCAB, dtype=torch.bool), [9, 1], 0
    )
    sampler.advance([2])
    row = torch.zeros(1, VOCAB)
    row[0, 3] = 5.0
    assert sampler.choose(row, [[]]) != [3]  # 1, 2 then 3 is banned
    assert sampler.choose(row, [[7]]) == [3]  # its own path broke the word
