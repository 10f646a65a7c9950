"""The acceptance of the request being decoded on the device: per-row logits processing and the
device walk, with no host synchronisation, over static buffers a captured cycle graph reads.

The same processing as the engine's `RowSampler` (DESIGN §3.4): the logit bias, then penalties
over prompt + output + each row's own path drafts (`path_counts`, computed from the device tables),
then greedy argmax (lowest index on ties) or the exponential race with Philox coins keyed by
(seed, output position, token) — the fused selection kernel scores the race, so coins are the
core's. The request's generated-token counts and the output position of the root row stay on the
device and advance with the walk's outputs, so cycles can follow each other without the host.

One `DeviceSampler` serves every request of a runner: `load` (between requests) refills its buffers
and settings; `key` names what the captured operations depend on (the settings baked into them as
Python numbers), so a runner keeps one cycle graph per key.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from lumotree.sampling.device_walk import DeviceForcing, DeviceWalk
from lumotree.sampling.logits import SamplingParams, apply_penalties, logit_bias_vector, probabilities
from lumotree.sampling.rng import seed_key
from lumotree.verify.device_tree import DeviceTree

SamplerKey = tuple[object, ...]


def stable_topk(scores: Tensor, k: int) -> Tensor:
    """`ordered_topk` without its NaN check (a host read): values descending, ties by index."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]


def sampler_key(params: SamplingParams) -> SamplerKey:
    """What the acceptance operations of `params` depend on (the bias values live in a buffer)."""
    penalties = (params.repetition_penalty, params.frequency_penalty, params.presence_penalty)
    sampling = () if params.greedy else (params.temperature, params.top_k, params.top_p, params.min_p)
    return (params.greedy, bool(params.logit_bias), *penalties, *sampling)


class DeviceSampler:
    """Chooses every tree row's token on the device and walks the tree (one walk); optionally the
    walk's path is then replaced by a forced-acceptance schedule's (`forcing`)."""

    def __init__(self, vocab: int, walk: DeviceWalk, forcing: DeviceForcing | None = None) -> None:
        self.vocab, self.walk, self.forcing = vocab, walk, forcing
        device = walk.choice.device
        self.params = SamplingParams(temperature=0.0)
        self.position = 0  # host mirror of the root row's output position
        self._seeds = torch.zeros(walk.walks, dtype=torch.int64, device=device)
        self._root_position = torch.zeros(1, dtype=torch.int64, device=device)
        self._prompt_seen = torch.zeros(vocab, dtype=torch.bool, device=device)
        self._generated = torch.zeros(vocab, dtype=torch.float32, device=device)
        self._bias = torch.zeros(vocab, dtype=torch.float32, device=device)
        self._slots = torch.arange(walk.width, device=device)

    @property
    def key(self) -> SamplerKey:
        return sampler_key(self.params)

    @property
    def needs_history(self) -> bool:
        p = self.params
        return p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0

    def load(
        self, params: SamplingParams, seed: int, prompt: Sequence[int], generated: Sequence[int]
    ) -> None:
        """A new request: prompt ids, its output so far (ending with the pending root)."""
        self.params, self.position = params, len(generated)
        device = self._seeds.device
        self._seeds.fill_(seed_key(seed))
        self._root_position.fill_(self.position)
        bias = logit_bias_vector(params, self.vocab, device)
        if bias is None:
            self._bias.zero_()
        else:
            self._bias.copy_(bias)
        self._prompt_seen.zero_()
        self._generated.zero_()
        if self.needs_history:
            self._prompt_seen[torch.as_tensor(list(prompt), dtype=torch.int64).to(device)] = True
            if len(generated):
                out = torch.as_tensor(list(generated), dtype=torch.int64).to(device)
                self._generated.index_add_(0, out, torch.ones(len(generated), device=device))

    def mutable(self) -> list[Tensor]:
        """The buffers `accept_` advances (a caller that runs it for warm-up restores them)."""
        return [self._generated, self._root_position]

    def path_counts(self, tables: DeviceTree) -> Tensor:
        """[R, V] generated-token counts of every row's history (output + its path drafts)."""
        rows = tables.rows
        active = torch.arange(rows, device=tables.tokens.device) < tables.n_active
        on_path = tables.ancestry.bool() & active[None, :] & active[:, None]
        on_path[:, 0] = False  # the root token is already the last generated token
        # scatter, not F.one_hot: one_hot checks its input's range on the host (a synchronisation)
        onehot = torch.zeros((rows, self.vocab), device=tables.tokens.device)
        onehot.scatter_(1, tables.tokens[:, None], 1.0)
        return self._generated[None, :] + on_path.float() @ onehot

    def accept_(self, logits: Tensor, tables: DeviceTree) -> None:
        """Walk the loaded tree over its rows' raw logits [R, V]; results in `walk.result`; the
        counts and the root position advance by the emitted tokens. Graph-capturable."""
        p, r = self.params, self.walk.result
        x = logits + self._bias if p.logit_bias else logits  # then penalties, as on the host
        if self.needs_history:
            x = apply_penalties(x, self._prompt_seen, self.path_counts(tables), p)
        if p.greedy:
            self.walk.greedy_(x.float().contiguous())  # a no-op copy for the runner's fp32 logits
        else:
            probs = probabilities(x, p, topk=stable_topk)
            self.walk.sample_(probs.contiguous(), self._seeds, self._root_position)
        if self.forcing is not None:
            self.forcing.force_(
                tables.spine_nodes, tables.tokens, self.walk.choice, r.accepted[0], r.path_len[:1],
                r.emitted[0], r.final_row[:1],
            )  # fmt: skip
        if self.needs_history:  # the emitted tokens join the history on the device
            valid = (self._slots < r.path_len[0]).float()
            self._generated.index_add_(0, r.emitted[0].clamp(min=0), valid)
        self._root_position += r.path_len[:1]

    def advance(self, emitted: Sequence[int]) -> None:
        """After the cycle (host): `emitted` tokens were appended to the output."""
        self.position += len(emitted)
