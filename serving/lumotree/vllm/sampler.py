"""The step's sampling in place of vLLM's sampler and chain rejection sampler: per request, the
first token after its prompt, or the exact target-only acceptance walk over its tree (the project
engine's `RowSampler` + `walk`: per-path penalties, Philox coins keyed by (seed, output position,
token)), then publication of the accepted path. A request that fails here fails alone.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lumotree.engine.acceptance import RowSampler, walk
from lumotree.verify.kernel_sets import TreeKernels
from lumotree.vllm.publish import LayerIndex, publish_accepted
from lumotree.vllm.requests import RequestState
from lumotree.vllm.steps import RequestStep, StepPlan

log = logging.getLogger(__name__)
PLACEHOLDER = -1  # vLLM's PLACEHOLDER_TOKEN_ID: padding in sampled_token_ids


@dataclass
class StepSamples:
    """Emitted tokens per request (input-batch order; empty for chunks mid-prompt and failures),
    and the requests that failed, with their message."""

    tokens: list[list[int]] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    def as_tensor(self) -> Tensor:
        """[num_reqs, width] int32, PLACEHOLDER-padded; width >= 2 so that vLLM parses it as a
        speculative output (which drops placeholders) even when every request emitted one token."""
        width = max([2, *(len(t) for t in self.tokens)])
        out = torch.full((len(self.tokens), width), PLACEHOLDER, dtype=torch.int32)
        for i, tokens in enumerate(self.tokens):
            out[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
        return out


def sample_step(
    plan: StepPlan,
    logits: Tensor,
    hidden: Tensor,
    states: dict[str, RequestState],
    outputs: Sequence[Sequence[int]],
    layers: LayerIndex,
    kernels: TreeKernels,
) -> StepSamples:
    """Sample every request of the plan. logits: the step's logits rows (1 + drafts per request,
    physical order); hidden: the step's target rows [N, H]; outputs[i]: request i's output tokens
    so far (a tree's root is the last of them)."""
    result = StepSamples()
    for req, output in zip(plan.requests, outputs, strict=True):
        state = states.get(req.req_id)
        if state is None:  # failed before it could be sampled (its error is recorded)
            result.tokens.append([])
            continue
        try:
            tokens = _sample_request(plan, req, logits, hidden, state, output, layers, kernels)
        except Exception as exc:  # one request's failure must not take the server down
            log.exception("lumotree: request %s failed", req.req_id)
            result.failed[req.req_id] = f"lumotree: {type(exc).__name__}: {exc}"
            tokens = []
        result.tokens.append(tokens)
    return result


def _sample_request(
    plan: StepPlan,
    req: RequestStep,
    logits: Tensor,
    hidden: Tensor,
    state: RequestState,
    output: Sequence[int],
    layers: LayerIndex,
    kernels: TreeKernels,
) -> list[int]:
    """Emitted tokens of one request (publication done); feeds its drafter what vLLM keeps."""
    if state.prompt_seen is None:
        raise RuntimeError("the request was sampled before its prompt began")
    sampler = RowSampler(state.sampling, state.prompt_seen, output, state.seed)
    if req.tree is None:
        state.prefill_rows(hidden[req.tokens], req.token_ids)
        if not req.ends_sequence:
            return []
        emitted = sampler.choose(logits[req.logit_start][None], [[]])
        rows = hidden[req.start + req.count - 1][None]
    else:
        assert req.rows is not None
        slot_map = req.tree.slot_map
        acc = walk(
            req.tree, lambda nodes: logits[req.logit_start + slot_map[torch.as_tensor(nodes)]], sampler
        )
        publish_accepted(plan, req, acc.accepted, layers, kernels)
        emitted, rows = acc.emitted, hidden[req.rows[torch.as_tensor(acc.accepted)]]
    kept, stopped = state.stop.kept(emitted, req.prompt_len, len(output))
    state.sampled(rows, kept, stopped)
    return list(emitted)
