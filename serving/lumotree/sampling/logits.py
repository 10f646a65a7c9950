"""Per-row logits processing, exactly as single-row decoding does it (vLLM's order and formulas).

Order, all in float32: logit bias (the same per-token offsets on every row, as vLLM's logits
processor adds them), repetition penalty (prompt + generated tokens), frequency and presence
penalties (generated tokens, counted), temperature, min-p, top-k (exactly k, ties by lower index),
top-p (smallest prefix by probability descending, ties by lower index, whose mass reaches top_p),
then softmax. For a tree row u the "generated" history is the request's output so far (ending
with the pending root token) plus the drafts on u's own root-to-node path, u included: the
history row u would have had in single-row decoding.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lumotree.drafting.selection import ordered_topk
from lumotree.tree import TreeDescriptor


@dataclass(frozen=True)
class SamplingParams:
    """Request sampling settings. temperature 0 = greedy; top_k 0 = off; logit_bias: (token id,
    offset) pairs added to those tokens' logits before everything else."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        for token, offset in self.logit_bias:
            if token < 0 or not math.isfinite(offset):
                raise ValueError(f"logit_bias needs token ids >= 0 and finite offsets, got {token}: {offset}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _bincount(tokens: Sequence[int], vocab: int) -> Tensor:
    counts = torch.zeros(vocab, dtype=torch.float32)
    if len(tokens):
        ids = torch.as_tensor(list(tokens), dtype=torch.long)
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise ValueError(f"history token out of range for a vocabulary of {vocab}")
        counts += torch.bincount(ids, minlength=vocab).float()
    return counts


def logit_bias_vector(
    params: SamplingParams, vocab: int, device: torch.device | None = None
) -> Tensor | None:
    """The request's logit bias as a float32 [V] vector on `device` (None without a bias)."""
    if not params.logit_bias:
        return None
    ids, offsets = zip(*params.logit_bias, strict=True)
    if max(ids) >= vocab:
        raise ValueError(f"logit_bias token id {max(ids)} is outside a vocabulary of {vocab}")
    bias = torch.zeros(vocab, dtype=torch.float32)
    bias[list(ids)] = torch.tensor(offsets, dtype=torch.float32)
    return bias if device is None else bias.to(device)


def apply_logit_bias(logits: Tensor, params: SamplingParams) -> Tensor:
    """logits [..., V] -> float32 [..., V] with the request's logit bias added (a new tensor when
    there is a bias: callers' logits rows stay untouched)."""
    logits = logits.float()
    bias = logit_bias_vector(params, logits.shape[-1])
    return logits if bias is None else logits + bias


def apply_penalties(
    logits: Tensor, prompt_seen: Tensor, generated_counts: Tensor, params: SamplingParams
) -> Tensor:
    """logits [N, V]; prompt_seen [V] bool; generated_counts [N, V] float -> penalised float32 [N, V]."""
    logits = logits.float()
    seen = generated_counts > 0
    if params.repetition_penalty != 1.0:
        hit = seen | prompt_seen[None, :]
        r = params.repetition_penalty
        logits = torch.where(hit, torch.where(logits > 0, logits / r, logits * r), logits)
    if params.frequency_penalty:
        logits = logits - params.frequency_penalty * generated_counts
    if params.presence_penalty:
        logits = logits - params.presence_penalty * seen.float()
    return logits


def probabilities(
    logits: Tensor, params: SamplingParams, topk: Callable[[Tensor, int], Tensor] = ordered_topk
) -> Tensor:
    """Penalised logits [N, V] -> sampling probabilities [N, V] float32 (temperature > 0).

    topk: the ordered top-k selection (the reference by default; the device path passes a
    variant without the NaN check, whose host read would synchronise every cycle)."""
    if params.greedy:
        raise ValueError("temperature 0 is greedy decoding; it has no sampling distribution")
    logits = logits.float() / params.temperature
    neg_inf = float("-inf")  # a Python scalar: a CPU tensor here would synchronise a GPU caller
    if params.min_p > 0.0:
        p = torch.softmax(logits, dim=-1)
        logits = torch.where(p >= params.min_p * p.amax(dim=-1, keepdim=True), logits, neg_inf)
    if 0 < params.top_k < logits.shape[-1]:
        keep = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, topk(logits, params.top_k), True)
        logits = torch.where(keep, logits, neg_inf)
    if params.top_p < 1.0:
        p = torch.softmax(logits, dim=-1)
        order = torch.sort(p, dim=-1, descending=True, stable=True).indices
        sorted_p = p.gather(-1, order)
        # Exclusive running sum in sorted order: the mass strictly ahead of each token.
        mass_before = torch.cumsum(sorted_p, dim=-1).roll(1, dims=-1)
        mass_before[..., 0] = 0.0
        keep = torch.zeros_like(p, dtype=torch.bool).scatter_(-1, order, mass_before < params.top_p)
        logits = torch.where(keep, logits, neg_inf)
    return torch.softmax(logits, dim=-1)


def row_penalized_logits(
    logits: Tensor, prompt: Sequence[int], generated: Sequence[int], params: SamplingParams
) -> Tensor:
    """Single-row decoding: logits [V] with history prompt + generated -> biased, penalised float32 [V]."""
    vocab = logits.shape[-1]
    return apply_penalties(
        apply_logit_bias(logits[None], params),
        _bincount(prompt, vocab) > 0,
        _bincount(generated, vocab)[None],
        params,
    )[0]


def tree_generated_counts(tree: TreeDescriptor, generated: Sequence[int], vocab: int) -> Tensor:
    """[R, V] counts of each row's generated history: `generated` + its path's drafts (itself included)."""
    if not len(generated) or int(generated[-1]) != int(tree.tokens[0]):
        raise ValueError("`generated` must end with the root (pending) token of the tree")
    on_path = tree.ancestry & tree.active[None, :] & tree.active[:, None]
    on_path[:, 0] = False  # the root token is already the last entry of `generated`
    onehot = torch.nn.functional.one_hot(tree.tokens, vocab).float()
    return _bincount(generated, vocab)[None, :] + on_path.float() @ onehot


def tree_penalized_logits(
    logits: Tensor,
    tree: TreeDescriptor,
    prompt: Sequence[int],
    generated: Sequence[int],
    params: SamplingParams,
) -> Tensor:
    """logits [R, V] of the tree rows -> biased, penalised float32 [R, V] with per-path histories."""
    vocab = logits.shape[-1]
    counts = tree_generated_counts(tree, generated, vocab)
    return apply_penalties(apply_logit_bias(logits, params), _bincount(prompt, vocab) > 0, counts, params)


def tree_probabilities(
    logits: Tensor,
    tree: TreeDescriptor,
    prompt: Sequence[int],
    generated: Sequence[int],
    params: SamplingParams,
) -> Tensor:
    """logits [R, V] -> the sampling distribution of every tree row [R, V] float32."""
    return probabilities(tree_penalized_logits(logits, tree, prompt, generated, params), params)
