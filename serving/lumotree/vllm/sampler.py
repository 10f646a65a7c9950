"""The step's sampling in place of vLLM's sampler and chain rejection sampler: per request, the
first token after its prompt, or the exact target-only acceptance walk over its tree (the project
engine's `RowSampler` + `walk`: per-path filters, logit bias and penalties, Philox coins keyed by
(seed, output position, token)), then publication of the accepted path; the logprobs of the emitted
tokens from the rows that produced them. A request that fails here fails alone.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lumotree.engine.acceptance import walk
from lumotree.vllm.gdn_core import GdnCore
from lumotree.vllm.logprobs import TokenLogprobs, padded, token_logprobs
from lumotree.vllm.processing import FilteredRowSampler
from lumotree.vllm.publish import LayerIndex, publish_accepted
from lumotree.vllm.requests import RequestState
from lumotree.vllm.steps import RequestStep, StepPlan

log = logging.getLogger(__name__)
PLACEHOLDER = -1  # vLLM's PLACEHOLDER_TOKEN_ID: padding in sampled_token_ids


@dataclass
class StepSamples:
    """Emitted tokens per request (input-batch order; empty for chunks mid-prompt and failures),
    the step's logits row that produced each of them, and the requests that failed, with their
    message."""

    tokens: list[list[int]] = field(default_factory=list)
    rows: list[list[int]] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def width(self) -> int:
        """Columns of `as_tensor`: >= 2 so that vLLM parses it as a speculative output (which drops
        placeholders) even when every request emitted one token."""
        return max([2, *(len(t) for t in self.tokens)])

    def as_tensor(self) -> Tensor:
        """[num_reqs, width] int32, PLACEHOLDER-padded."""
        out = torch.full((len(self.tokens), self.width), PLACEHOLDER, dtype=torch.int32)
        for i, tokens in enumerate(self.tokens):
            out[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
        return out

    def logprobs(self, logits: Tensor, k: int, mode: str) -> TokenLogprobs:
        """Every emitted token's logprob and its row's k best from the step's raw logits, in the
        rows of `as_tensor` flattened (placeholders: zeros)."""
        per_request = [
            token_logprobs(logits[rows], tokens, k, mode) if tokens else None
            for tokens, rows in zip(self.tokens, self.rows, strict=True)
        ]
        return padded(per_request, self.width, k)


def sample_step(
    plan: StepPlan,
    logits: Tensor,
    hidden: Tensor,
    states: dict[str, RequestState],
    outputs: Sequence[Sequence[int]],
    layers: LayerIndex,
    core: GdnCore,
) -> StepSamples:
    """Sample every request of the plan. logits: the step's logits rows (1 + drafts per request,
    physical order); hidden: the step's target rows [N, H]; outputs[i]: request i's output tokens
    so far (a tree's root is the last of them)."""
    result = StepSamples()
    for req, output in zip(plan.requests, outputs, strict=True):
        state = states.get(req.req_id)
        tokens: list[int] = []
        rows: list[int] = []
        if state is not None:  # else it failed before it could be sampled (its error is recorded)
            try:
                tokens, rows = _sample_request(plan, req, logits, hidden, state, output, layers, core)
            except Exception as exc:  # one request's failure must not take the server down
                log.exception("lumotree: request %s failed", req.req_id)
                result.failed[req.req_id] = f"lumotree: {type(exc).__name__}: {exc}"
                tokens, rows = [], []
        result.tokens.append(tokens)
        result.rows.append(rows)
    return result


def _sample_request(
    plan: StepPlan,
    req: RequestStep,
    logits: Tensor,
    hidden: Tensor,
    state: RequestState,
    output: Sequence[int],
    layers: LayerIndex,
    core: GdnCore,
) -> tuple[list[int], list[int]]:
    """Emitted tokens of one request (publication done) and the logits rows that produced them;
    feeds its drafter what vLLM keeps."""
    if state.prompt_seen is None:
        raise RuntimeError("the request was sampled before its prompt began")
    sampler = FilteredRowSampler(state.sampling, state.filters, state.prompt_seen, output, state.seed)
    if req.tree is None:
        state.prefill_rows(hidden[req.tokens], req.token_ids)
        if not req.ends_sequence:
            return [], []
        emitted = sampler.choose(logits[req.logit_start][None], [[]])
        logit_rows = [req.logit_start]
        hidden_rows = hidden[req.start + req.count - 1][None]
    else:
        assert req.rows is not None
        slot_map = req.tree.slot_map
        acc = walk(
            req.tree, lambda nodes: logits[req.logit_start + slot_map[torch.as_tensor(nodes)]], sampler
        )
        publish_accepted(plan, req, acc.accepted, layers, core)
        accepted = torch.as_tensor(acc.accepted)
        emitted, hidden_rows = acc.emitted, hidden[req.rows[accepted]]
        logit_rows = (req.logit_start + slot_map[accepted]).tolist()
    kept, stopped = state.stop.kept(emitted, req.prompt_len, len(output))
    state.sampled(hidden_rows, kept, stopped)
    return list(emitted), logit_rows
