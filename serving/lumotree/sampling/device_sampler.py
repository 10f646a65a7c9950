"""One request's acceptance on the device: per-row logits processing and the device walk, with no
host synchronisation.

The same processing as the engine's `RowSampler` (DESIGN §3.4): the logit bias, then penalties
over prompt + output + each row's own path drafts (`tree_generated_counts`, computed from the
device tables), then greedy argmax (lowest index on ties) or the exponential race with Philox
coins keyed by (seed, output position, token) — the fused selection kernel scores the race, so
coins are the core's. The
request's generated-token counts stay on the device and are advanced from the walk's outputs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from lumotree.sampling.device_walk import DeviceWalk
from lumotree.sampling.logits import SamplingParams, apply_penalties, logit_bias_vector, probabilities
from lumotree.sampling.rng import seed_key
from lumotree.verify.device_tree import DeviceTree


def stable_topk(scores: Tensor, k: int) -> Tensor:
    """`ordered_topk` without its NaN check (a host read): values descending, ties by index."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]


class DeviceSampler:
    """Chooses every tree row's token on the device and walks the tree (one walk).

    prompt: the request's prompt ids; generated: its output so far (ending with the pending root);
    position: len(generated), the output position the root row samples.
    """

    def __init__(
        self,
        params: SamplingParams,
        seed: int,
        prompt: Sequence[int],
        generated: Sequence[int],
        vocab: int,
        walk: DeviceWalk,
    ) -> None:
        self.params, self.walk = params, walk
        device = walk.choice.device
        self.needs_history = (
            params.repetition_penalty != 1.0
            or params.frequency_penalty != 0.0
            or params.presence_penalty != 0.0
        )
        self.vocab = vocab
        self.position = len(generated)
        self._seeds = torch.full((walk.walks,), seed_key(seed), dtype=torch.int64, device=device)
        self._root_position = torch.zeros(1, dtype=torch.int64, device=device)
        self._prompt_seen = torch.zeros(vocab, dtype=torch.bool, device=device)
        self._generated = torch.zeros(vocab, dtype=torch.float32, device=device)
        self._slots = torch.arange(walk.width, device=device)
        self._bias = logit_bias_vector(params, vocab, device)  # one copy per request
        if self.needs_history:
            ids = torch.as_tensor(list(prompt), dtype=torch.int64).to(device)
            self._prompt_seen[ids] = True
            if len(generated):
                out = torch.as_tensor(list(generated), dtype=torch.int64).to(device)
                self._generated.index_add_(0, out, torch.ones(len(generated), device=device))

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
        """Walk the loaded tree over its rows' raw logits [R, V]; results in `walk.result`."""
        x = logits if self._bias is None else logits + self._bias  # then penalties, as on the host
        if self.needs_history:
            x = apply_penalties(logits, self._prompt_seen, self.path_counts(tables), self.params)
        if self.params.greedy:
            self.walk.greedy_(x.float().contiguous())  # a no-op copy for the runner's fp32 logits
        else:
            self._root_position.fill_(self.position)
            probs = probabilities(x, self.params, topk=stable_topk)
            self.walk.sample_(probs.contiguous(), self._seeds, self._root_position)
        if self.needs_history:  # the emitted tokens join the history on the device
            r = self.walk.result
            valid = (self._slots < r.path_len[0]).float()
            self._generated.index_add_(0, r.emitted[0].clamp(min=0), valid)

    def advance(self, emitted: int) -> None:
        """After the cycle: `emitted` tokens were appended to the output."""
        self.position += emitted
