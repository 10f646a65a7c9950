"""Lossless speculation: for greedy requests, the token sequences of LumoTree (tree) and chain MTP-5
equal plain autoregressive decoding's, request by request, on the demo corpus (chat template
applied). A difference is allowed only where the autoregressive logits tie exactly."""

from __future__ import annotations

import pytest
import torch

from lumotree.engine import EngineConfig, GenerationRequest, LLMEngine
from lumotree.model import HybridLM
from lumotree.sampling import SamplingParams

from .helpers import output_tokens, run_requests

MAX_TOKENS = 40


def _greedy_outputs(
    kind: str, prompts: list[GenerationRequest], **config: object
) -> tuple[dict[str, list[int]], LLMEngine]:
    engine = LLMEngine(EngineConfig(drafter=kind, max_model_len=8192, **config))  # type: ignore[arg-type]
    requests = [
        GenerationRequest(p.request_id, p.prompt_token_ids, SamplingParams(0.0), MAX_TOKENS) for p in prompts
    ]
    events = run_requests(engine, requests)  # all submitted at once: they queue behind each other
    return {rid: output_tokens(ev) for rid, ev in events.items()}, engine


def _assert_only_exact_ties(model: HybridLM, prompt: list[int], want: list[int], got: list[int]) -> None:
    """At the first difference, the autoregressive logits must hold both tokens as tied maxima."""
    i = next(j for j, (a, b) in enumerate(zip(want, got, strict=False)) if a != b)
    with torch.inference_mode():
        state = model.new_state(len(prompt) + i + 1)
        logits = model.compute_logits(model.prefill(torch.tensor(prompt + want[:i]), state)[-1])
    best = logits.max()
    assert logits[want[i]] == best and logits[got[i]] == best, (
        f"outputs differ at token {i} without an exact tie: logits {float(logits[want[i]]):.6f} "
        f"(autoregressive) vs {float(logits[got[i]]):.6f} (speculative), max {float(best):.6f}"
    )


@pytest.fixture(scope="module")
def ar_outputs(demo_prompts: list[GenerationRequest]) -> dict[str, list[int]]:
    return _greedy_outputs("ar", demo_prompts)[0]


# "tree": the shape this CPU picks (compact on the native forward); "tree-paper": the paper's 28 rows
@pytest.mark.parametrize(
    ("kind", "shape"),
    [("tree", "auto"), ("tree", "paper"), ("mtp", "auto")],
    ids=["tree", "tree-paper", "mtp"],
)
def test_greedy_speculation_equals_autoregressive_on_the_demo_corpus(
    kind: str,
    shape: str,
    demo_prompts: list[GenerationRequest],
    ar_outputs: dict[str, list[int]],
    model: HybridLM,
) -> None:
    outputs, engine = _greedy_outputs(kind, demo_prompts, tree_shape=shape)
    for p in demo_prompts:
        want, got = ar_outputs[p.request_id], outputs[p.request_id]
        if want != got:
            _assert_only_exact_ties(model, p.prompt_token_ids, want, got)
    spec = engine.metrics().spec
    assert spec.num_drafts > 0 and spec.num_accepted_tokens > spec.num_drafts  # > 1 draft accepted per event
    assert sum(len(o) for o in outputs.values()) == sum(len(o) for o in ar_outputs.values())


def test_greedy_tree_on_the_core_references_equals_autoregressive(
    demo_prompts: list[GenerationRequest], ar_outputs: dict[str, list[int]], model: HybridLM
) -> None:
    """The same with the core's reference kernels (path scan) in the verification forward."""
    prompts = demo_prompts[:4]
    outputs, _ = _greedy_outputs("tree", prompts, kernels="reference")
    for p in prompts:
        if ar_outputs[p.request_id] != outputs[p.request_id]:
            _assert_only_exact_ties(
                model, p.prompt_token_ids, ar_outputs[p.request_id], outputs[p.request_id]
            )
