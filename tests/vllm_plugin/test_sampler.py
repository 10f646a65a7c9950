"""The step sampler: first tokens after prompts, greedy and seeded exactly as the project engine
chooses them, and a request whose LumoTree work raises fails alone."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from lumotree.drafting.drafter import Drafter
from lumotree.drafting.geometry import GeometryConfig
from lumotree.engine.acceptance import RowSampler
from lumotree.sampling import SamplingParams
from lumotree.verify.kernel_sets import CPU_FAST
from lumotree.vllm.gdn_core import TorchGdnCore
from lumotree.vllm.publish import LayerIndex
from lumotree.vllm.requests import RequestState
from lumotree.vllm.sampler import sample_step
from lumotree.vllm.steps import RequestStep

from .fake_vllm import plan

VOCAB = 50


class BrokenDrafter(Drafter):
    """A drafter that fails on the tokens it is given (stands for any failure inside the plugin)."""

    def emitted(self, tokens) -> None:  # type: ignore[no-untyped-def]
        raise RuntimeError("drafter exploded")


def _params(temperature: float, seed: int | None) -> SimpleNamespace:
    return SimpleNamespace(
        temperature=temperature, top_k=0, top_p=1.0, min_p=0.0, presence_penalty=0.0,
        frequency_penalty=0.0, repetition_penalty=1.0, seed=seed, eos_token_id=None,
        stop_token_ids=None, max_tokens=10,
    )  # fmt: skip


def _state(drafter: Drafter, temperature: float, seed: int | None) -> RequestState:
    state = RequestState(drafter, None, _params(temperature, seed), VOCAB, max_model_len=64)
    state.begin([1, 2, 3])
    return state


def test_first_tokens_follow_the_engines_rule_and_a_failing_request_fails_alone() -> None:
    geometry = GeometryConfig(0, 0, 0, (), rows=1)
    states = {
        "greedy": _state(Drafter(geometry), 0.0, None),
        "broken": _state(BrokenDrafter(geometry), 0.0, None),
        "seeded": _state(Drafter(geometry), 0.8, 1234),
    }
    requests = [
        RequestStep(name, i, 3 * i, 3, [1, 2, 3], 0, 3, ends_sequence=True) for i, name in enumerate(states)
    ]
    for i, req in enumerate(requests):
        req.logit_start = i
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(0))
    samples = sample_step(
        plan(requests, [[[0], [1], [2]]], [1]), logits, torch.randn(9, 8), states, [[], [], []],
        LayerIndex({}, {}, False), TorchGdnCore(CPU_FAST),
    )  # fmt: skip
    assert samples.tokens[0] == [int(logits[0].argmax())]
    assert samples.tokens[1] == [] and "drafter exploded" in samples.failed["broken"]
    seeded = RowSampler(SamplingParams(temperature=0.8), states["seeded"].prompt_seen, [], 1234)
    assert samples.tokens[2] == seeded.choose(logits[2][None], [[]])  # coins keyed by (seed, position, token)
    assert list(samples.failed) == ["broken"]
    assert samples.rows == [[0], [], [2]]  # the logits rows of the emitted tokens (their logprobs)
