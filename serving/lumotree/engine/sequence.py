"""One request's data: what the server submits, what the engine streams back, and the engine's
per-request bookkeeping (`Sequence`). The engine knows nothing about text; ids only."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from lumotree.sampling import SamplingParams


@dataclass(frozen=True)
class GenerationRequest:
    """A request as the server hands it over (token ids in, token ids out)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams  # temperature 0 = greedy
    max_tokens: int
    seed: int | None = None  # None -> the engine draws one (reported in every TokenEvent)
    stop_token_ids: tuple[int, ...] = ()  # EOS ids are added by the engine unless ignore_eos
    ignore_eos: bool = False
    logprobs: int | None = None  # None = off; k >= 0: logprob of each emitted token + its top-k


@dataclass
class SpecStats:
    """Speculation counters (vLLM's spec-decode metric semantics), per request or summed engine-wide.

    num_drafts: speculative events (cycles that verified >= 1 draft); num_draft_tokens: draft rows
    verified (tree: active draft rows; chain: k); num_accepted_tokens: accepted drafts (the bonus or
    correction token excluded); accepted_per_pos[j]: events that accepted a draft at depth j + 1.
    """

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def record(self, draft_tokens: int, accepted: int, max_depth: int) -> None:
        """Count one verification cycle that verified `draft_tokens` drafts and accepted `accepted`."""
        if draft_tokens == 0:
            return
        if len(self.accepted_per_pos) < max_depth:
            self.accepted_per_pos.extend([0] * (max_depth - len(self.accepted_per_pos)))
        self.num_drafts += 1
        self.num_draft_tokens += draft_tokens
        self.num_accepted_tokens += accepted
        for pos in range(accepted):
            self.accepted_per_pos[pos] += 1

    def copy(self) -> SpecStats:
        return SpecStats(
            self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens, list(self.accepted_per_pos)
        )


@dataclass(frozen=True)
class TokenLogprob:
    """Log-probability (natural log, of the model's raw distribution: log_softmax of the logits
    before penalties and temperature) of one emitted token, and the `top` k best (id, logprob)
    of the same row, best first (ties: lower id first)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class TokenEvent:
    """One per engine cycle per request that produced tokens (or finished)."""

    request_id: str
    token_ids: list[int]  # emitted this cycle: 1 for AR, 1..depth+1 for speculation, 0 on abort
    logprobs: list[TokenLogprob] | None
    finished: bool
    finish_reason: str | None  # "stop" (EOS / stop id), "length" (max_tokens / context), "abort", "error"
    num_prompt_tokens: int
    num_output_tokens: int  # cumulative
    cached_prompt_tokens: int  # prefix-cache hit length
    spec: SpecStats  # cumulative for this request
    seed: int | None = None  # the seed the request runs with (drawn by the engine if it had none)
    error: str | None = None  # what went wrong, with finish_reason "error"


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    PREFILL = "prefill"
    DECODE = "decode"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """The engine's state of one request (its tensors live in the model runner while it runs).

    `output` holds every emitted token; its last entry is the pending token (emitted, its state not
    yet made) while the sequence decodes. The token at output index i is sampled with the coins of
    (seed, i), whatever tree the drafter proposed.
    """

    request: GenerationRequest
    seed: int
    stop_ids: frozenset[int]
    status: SequenceStatus = SequenceStatus.WAITING
    output: list[int] = field(default_factory=list)
    prefilled: int = 0  # prompt tokens folded into the state so far
    cached_prompt_tokens: int = 0
    spec: SpecStats = field(default_factory=SpecStats)
    finish_reason: str | None = None
    # time.monotonic() seconds: arrival (add_request), start of its prefill, its last emitted tokens
    arrival_s: float = 0.0
    scheduled_s: float | None = None
    last_token_s: float | None = None
    first_token_s: float | None = None
    #: (output length after each emitting step, its time): what `LLMEngine.stop_request` takes back
    emissions: list[tuple[int, float]] = field(default_factory=list)
    finished_s: float | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prompt(self) -> list[int]:
        return self.request.prompt_token_ids

    @property
    def finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def event(
        self, token_ids: list[int], logprobs: list[TokenLogprob] | None, error: str | None = None
    ) -> TokenEvent:
        """The TokenEvent reporting `token_ids` (just emitted) and the sequence's totals."""
        return TokenEvent(
            request_id=self.request_id,
            token_ids=token_ids,
            logprobs=logprobs,
            finished=self.finished,
            finish_reason=self.finish_reason,
            num_prompt_tokens=len(self.prompt),
            num_output_tokens=len(self.output),
            cached_prompt_tokens=self.cached_prompt_tokens,
            spec=self.spec.copy(),
            seed=self.seed,
            error=error,
        )
