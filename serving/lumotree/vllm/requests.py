"""Per-request LumoTree state inside vLLM's worker: the drafter (the project engine's, one per
request), the sampling settings in the core's terms, the seed of the acceptance coins, and the tree
proposed for the request's next step.

The MTP drafter's rows follow the engine's protocol (lumotree.drafting.mtp): prefill rows are
(h_t, x_{t+1}) committed chunk by chunk; after each sampled step the accepted nodes' target rows
are kept with the tokens that follow them until the next proposal's first pass takes them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lumotree.drafting.drafter import Drafter
from lumotree.drafting.mtp import MTPDrafter
from lumotree.engine.acceptance import history_counts
from lumotree.sampling import SamplingParams
from lumotree.tree import TreeDescriptor
from lumotree.vllm.mtp_source import commit
from lumotree.vllm.processing import TokenFilters

_SAMPLING_EPS = 1e-5  # vLLM: a temperature below this is greedy
#: per-request switch (OpenAI API: "vllm_xargs": {"lumotree_drafts": 0}): verify root-only trees
DRAFTS_ARG = "lumotree_drafts"
_SEEDS = random.SystemRandom()


class UnsupportedRequest(ValueError):
    """A request asks for something the LumoTree sampler does not do (the message names it)."""


#: what vLLM requests may ask for that the plugin does not do (refused at admission)
UNSUPPORTED = ("min_tokens", "structured_outputs", "logprob_token_ids")


def unsupported_parameters(params: object) -> list[str]:
    """The names of set sampling parameters the LumoTree walk cannot honour."""
    return [name for name in UNSUPPORTED if getattr(params, name, None)]


def drafting(params: object) -> bool:
    """The request's "lumotree_drafts" switch (default on); UnsupportedRequest for a value that is
    not 0, 1, true or false."""
    value = str((getattr(params, "extra_args", None) or {}).get(DRAFTS_ARG, 1)).lower()
    if value not in ("0", "1", "false", "true"):
        raise UnsupportedRequest(f"{DRAFTS_ARG} must be 0, 1, true or false, not {value!r}")
    return value in ("1", "true")


def core_sampling(params: object) -> SamplingParams:
    """vLLM SamplingParams -> the core's; UnsupportedRequest naming what the walk cannot honour."""
    asked = unsupported_parameters(params)
    if asked:
        raise UnsupportedRequest(f"the LumoTree sampler does not support {', '.join(asked)}")
    temperature = float(params.temperature)  # type: ignore[attr-defined]
    greedy = temperature < _SAMPLING_EPS
    top_k = int(params.top_k)  # type: ignore[attr-defined]
    return SamplingParams(
        temperature=0.0 if greedy else temperature,
        top_k=0 if greedy or top_k < 0 else top_k,
        top_p=1.0 if greedy else float(params.top_p),  # type: ignore[attr-defined]
        min_p=0.0 if greedy else float(params.min_p),  # type: ignore[attr-defined]
        presence_penalty=float(params.presence_penalty),  # type: ignore[attr-defined]
        frequency_penalty=float(params.frequency_penalty),  # type: ignore[attr-defined]
        repetition_penalty=float(params.repetition_penalty),  # type: ignore[attr-defined]
        logit_bias=tuple(
            sorted((int(t), float(b)) for t, b in (getattr(params, "logit_bias", None) or {}).items())
        ),
    )


@dataclass(frozen=True)
class StopRule:
    """vLLM's stop check (v1/core/sched/utils.check_stop), applied before the drafter sees tokens."""

    eos: int | None
    stop_ids: frozenset[int]
    max_tokens: int
    max_model_len: int

    def kept(self, tokens: Sequence[int], prompt_len: int, output_len: int) -> tuple[list[int], bool]:
        """The tokens vLLM keeps of a step's emitted ones, and whether the request stops."""
        out: list[int] = []
        for token in tokens:
            out.append(int(token))
            n_out = output_len + len(out)
            if (
                token == self.eos
                or token in self.stop_ids
                or prompt_len + n_out >= self.max_model_len
                or n_out >= self.max_tokens
            ):
                return out, True
        return out, False


class RequestState:
    """What LumoTree keeps about one request between vLLM steps (drafting=False: the request asked
    for no drafts; its steps verify root-only trees, as the "ar" drafter's do)."""

    def __init__(
        self, drafter: Drafter, mtp: MTPDrafter | None, params: object, vocab: int, max_model_len: int
    ) -> None:
        self.drafter, self.mtp = drafter, mtp
        self.sampling = core_sampling(params)
        self.filters = TokenFilters.of(params)
        seed = getattr(params, "seed", None)
        self.seed = int(seed) if seed is not None else _SEEDS.getrandbits(63)
        self.stop = StopRule(
            eos=getattr(params, "eos_token_id", None),  # None when ignore_eos
            stop_ids=frozenset(getattr(params, "stop_token_ids", None) or ()),
            max_tokens=int(getattr(params, "max_tokens", None) or max_model_len),
            max_model_len=max_model_len,
        )
        self.vocab = vocab
        self.drafting = drafting(params)
        self.prompt_seen: Tensor | None = None
        self.pending: TreeDescriptor | None = None
        self.last_hidden: Tensor | None = None  # target row of the last prefilled token
        self.stopped = False
        self._rows: list[tuple[Tensor, list[int]]] = []  # true MTP rows for the next proposal

    def begin(self, prompt: Sequence[int]) -> None:
        """A sequence (re)starts from an empty state with this prompt."""
        self.drafter.begin(prompt)
        if self.mtp is not None:
            self.mtp.reset()
        self.prompt_seen = history_counts(prompt, self.vocab) > 0
        self.pending, self.last_hidden, self.stopped, self._rows = None, None, False, []

    def prefill_rows(self, hidden: Tensor, chunk: Sequence[int]) -> None:
        """A prefilled chunk's tokens and target rows [n, H]: MTP rows (h_t, x_{t+1}), the
        previous chunk's last row joined to this chunk's first token."""
        if self.mtp is not None:
            hidden = hidden.to(self.mtp.model.dtype)
            if self.last_hidden is None:
                commit(self.mtp, hidden[:-1], chunk[1:])
            else:
                commit(self.mtp, torch.cat([self.last_hidden, hidden[:-1]]), chunk)
        self.last_hidden = hidden[-1:]

    def sampled(self, hidden: Tensor, kept: Sequence[int], stopped: bool) -> None:
        """Tokens vLLM keeps from a step (each produced by a row of `hidden` [n, H])."""
        self.drafter.emitted(kept)
        self.stopped = stopped
        if not stopped and self.mtp is not None:
            self._rows.append((hidden[: len(kept)].to(self.mtp.model.dtype), list(kept)))

    def propose(self, root: int, prefix_len: int) -> TreeDescriptor:
        """The next tree below the pending `root` (its MTP passes take the rows kept since the last)."""
        proposal = None
        if self.mtp is not None:
            hidden = torch.cat([h for h, _ in self._rows])
            proposal = self.mtp.propose(hidden, [t for _, tokens in self._rows for t in tokens])
            self._rows = []
        topology = self.drafter.topology(root, proposal)
        rows = self.drafter.geometry.rows if self.drafter.kind == "tree" else None
        self.pending = topology.descriptor(
            prefix_len=prefix_len, rows=rows, max_depth=self.drafter.geometry.max_depth
        )
        return self.pending
