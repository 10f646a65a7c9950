"""Logprobs of emitted tokens in vLLM's layout, against a reference computed entry by entry in
float64 (log-sum-exp, sorted best, ranks counted), and placed in the rows vLLM parses."""

from __future__ import annotations

import math

import pytest
import torch

from lumotree.vllm.logprobs import token_logprobs
from lumotree.vllm.sampler import StepSamples

VOCAB = 12


def _reference(row: list[float], token: int, k: int, mode: str) -> tuple[list[int], list[float], int]:
    top = max(row)
    norm = top + math.log(sum(math.exp(v - top) for v in row))
    scores = [v - norm for v in row] if mode == "raw_logprobs" else list(row)
    best = sorted(range(len(row)), key=lambda t: -scores[t])[:k]
    rank = sum(1 for s in scores if s >= scores[token])
    return [token, *best], [scores[token], *(scores[t] for t in best)], rank


@pytest.mark.parametrize("mode", ["raw_logprobs", "raw_logits"])
@pytest.mark.parametrize("k", [0, 1, 5, VOCAB])
def test_token_logprobs_match_a_float64_reference(mode: str, k: int) -> None:
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(k)) * 4
    tokens = [3, 0, 11, int(logits[3].argmax())]
    got = token_logprobs(logits, tokens, k, mode)
    assert got.ids.shape == got.logprobs.shape == (4, k + 1) and got.ranks.shape == (4,)
    assert got.ids.dtype == torch.int32 and got.logprobs.dtype == torch.float32
    for i, token in enumerate(tokens):
        ids, values, rank = _reference(logits[i].double().tolist(), token, k, mode)
        assert got.ids[i].tolist() == ids
        assert got.logprobs[i].tolist() == pytest.approx(values, abs=1e-5)
        assert int(got.ranks[i]) == rank
    assert int(got.ranks[3]) == 1


def test_step_logprobs_sit_in_the_rows_of_the_sampled_token_tensor() -> None:
    logits = torch.randn(7, VOCAB, generator=torch.Generator().manual_seed(1))
    samples = StepSamples(tokens=[[4, 9], [], [2, 2, 6]], rows=[[5, 1], [], [0, 3, 6]])
    got = samples.logprobs(logits, 2, "raw_logprobs")
    width = samples.as_tensor().shape[1]
    assert width == 3 and got.ids.shape == (3 * width, 3)
    for i, (tokens, rows) in enumerate(zip(samples.tokens, samples.rows, strict=True)):
        for j, (token, row) in enumerate(zip(tokens, rows, strict=True)):
            want = token_logprobs(logits[row][None], [token], 2, "raw_logprobs")
            assert got.ids[i * width + j].tolist() == want.ids[0].tolist()
            assert torch.equal(got.logprobs[i * width + j], want.logprobs[0])
    valid = (samples.as_tensor() >= 0).flatten()  # what vLLM keeps of these rows
    assert got.ids[valid][:, 0].tolist() == [4, 9, 2, 2, 6]
