"""Engine-wide counters, phase timers and latency histograms (the server exports them with vLLM's
metric names).

Phase spans (paper Tables III/IX): "target" = the verification forward and the logits the walk
reads; "drafter" = MTP passes, suffix lookups and tree building; "dispatch" = acceptance walk, path
handling and state publication; "prefill" = prompt chunks (not part of the decode cycle); "cycle" =
the runner's whole decode cycle as it times it (device time on the GPU, wall time on the host), so
that wall time per cycle seen by clients can be set against it.

Latency histograms use vLLM 0.32's definitions and default buckets (vllm/v1/metrics/buckets.py),
measured in the engine from a request's arrival (`add_request`): time to first token, inter-token
latency (one observation per cycle that emitted tokens after the first, as vLLM observes one per
engine step), tokens per engine step that emitted tokens (the prompt tokens computed, on the step of
the first token, plus the tokens emitted), and for every request that finished after it was
scheduled: end-to-end latency, queue time (arrival to the start of its prefill), prefill time (to its
first token), decode time (first to last token), inference time (prefill start to last token), time
per output token (decode time / (tokens - 1)), and its prompt, generated and most generated tokens.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from lumotree.engine.sequence import Sequence, SpecStats

PHASES = ("target", "drafter", "dispatch", "prefill", "cycle")
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
INTER_TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
)  # fmt: skip


def token_count_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's buckets of per-request token counts: 1, 2, 5, 10, 20, 50, ... up to the context."""
    bounds, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_model_len:
                return tuple(float(b) for b in bounds)
            bounds.append(mantissa * scale)
        scale *= 10


@dataclass
class Histogram:
    """Observations in seconds: `counts[i]` of them fell in (bounds[i-1], bounds[i]]; the last entry
    counts those above every bound (Prometheus' +Inf bucket)."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    @property
    def count(self) -> int:
        return sum(self.counts)

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.total += seconds

    def retract(self, seconds: float) -> None:
        """Take back one earlier `observe(seconds)` (what the engine made after a stop string)."""
        self.counts[bisect.bisect_left(self.bounds, seconds)] -= 1
        self.total -= seconds

    def copy(self) -> Histogram:
        return Histogram(self.bounds, list(self.counts), self.total)


@dataclass
class PhaseSpan:
    """Sum of wall seconds and number of spans of one phase."""

    seconds: float = 0.0
    count: int = 0


@dataclass
class EngineMetrics:
    """Cumulative since the engine started (a snapshot: `LLMEngine.metrics()` returns a copy).

    Suggested Prometheus names: spec -> vllm:spec_decode_num_drafts_total, ..._num_draft_tokens_total,
    ..._num_accepted_tokens_total, ..._num_accepted_tokens_per_pos_total{position}; prompt_tokens ->
    vllm:prompt_tokens_total; generation_tokens -> vllm:generation_tokens_total; requests_finished
    -> vllm:request_success_total{finished_reason}; prefix_cache_queries / _hits (tokens) ->
    vllm:prefix_cache_queries_total / vllm:prefix_cache_hits_total; running / waiting ->
    vllm:num_requests_running / vllm:num_requests_waiting; the histograms -> vllm:time_to_first_token_seconds,
    vllm:inter_token_latency_seconds, vllm:e2e_request_latency_seconds, vllm:request_queue_time_seconds;
    kv_cache_usage (the active request's share of the KV rows, 0 when idle) -> vllm:kv_cache_usage_perc.
    """

    spec: SpecStats = field(default_factory=SpecStats)
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_finished: dict[str, int] = field(default_factory=dict)
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    running: int = 0
    waiting: int = 0
    spans: dict[str, PhaseSpan] = field(default_factory=lambda: {p: PhaseSpan() for p in PHASES})
    device_syncs: int = 0  # device->host synchronisations of decode cycles (device path: 1 each)
    time_to_first_token: Histogram = field(default_factory=lambda: Histogram(TIME_TO_FIRST_TOKEN_BUCKETS))
    inter_token_latency: Histogram = field(default_factory=lambda: Histogram(INTER_TOKEN_LATENCY_BUCKETS))
    e2e_request_latency: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS))
    request_queue_time: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS))
    kv_cache_usage: float = 0.0
    request_prefill_time: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS))
    request_decode_time: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS))
    request_inference_time: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS))
    request_time_per_output_token: Histogram = field(
        default_factory=lambda: Histogram(INTER_TOKEN_LATENCY_BUCKETS)
    )
    iteration_tokens: Histogram = field(default_factory=lambda: Histogram(ITERATION_TOKENS_BUCKETS))
    #: per-request token counts, in vLLM's 1-2-5 buckets up to the context (`for_context`)
    request_prompt_tokens: Histogram = field(default_factory=lambda: Histogram(token_count_buckets(32768)))
    request_generation_tokens: Histogram = field(
        default_factory=lambda: Histogram(token_count_buckets(32768))
    )
    request_max_num_generation_tokens: Histogram = field(
        default_factory=lambda: Histogram(token_count_buckets(32768))
    )

    @classmethod
    def for_context(cls, max_model_len: int) -> EngineMetrics:
        """Fresh counters whose token-count buckets reach `max_model_len`, as vLLM's do."""
        return cls(
            request_prompt_tokens=Histogram(token_count_buckets(max_model_len)),
            request_generation_tokens=Histogram(token_count_buckets(max_model_len)),
            request_max_num_generation_tokens=Histogram(token_count_buckets(max_model_len)),
        )

    def emitted(self, seq: Sequence, tokens: int, now: float) -> None:
        """One engine step emitted `tokens` of `seq` at `now` (monotonic s): time to first token or the
        inter-token latency, the step's tokens (with the prompt computed for the first), and the
        emission remembered on `seq` so `take_back` can undo it."""
        if seq.last_token_s is None:
            self.time_to_first_token.observe(now - seq.arrival_s)
            seq.first_token_s = now
            self.iteration_tokens.observe(len(seq.prompt) - seq.cached_prompt_tokens + tokens)
        else:
            self.inter_token_latency.observe(now - seq.last_token_s)
            self.iteration_tokens.observe(tokens)
        seq.last_token_s = now
        seq.emissions.append((len(seq.output), now))

    def request_done(self, seq: Sequence, now: float, sign: int = 1) -> None:
        """Observe (sign -1: take back) the per-request histograms of `seq`, finished at `now`."""
        if seq.scheduled_s is None:  # as vLLM: latencies of requests that left the queue
            return
        first = seq.first_token_s if seq.first_token_s is not None else now
        last = seq.last_token_s if seq.last_token_s is not None else now
        generated = len(seq.output)
        decode = last - first
        for histogram, value in (
            (self.e2e_request_latency, now - seq.arrival_s),
            (self.request_queue_time, seq.scheduled_s - seq.arrival_s),
            (self.request_prefill_time, first - seq.scheduled_s),
            (self.request_decode_time, decode),
            (self.request_inference_time, last - seq.scheduled_s),
            (self.request_time_per_output_token, decode / (generated - 1) if generated > 1 else 0.0),
            (self.request_prompt_tokens, len(seq.prompt)),
            (self.request_generation_tokens, generated),
            (self.request_max_num_generation_tokens, generated),  # n = 1: its own count
        ):
            (histogram.observe if sign > 0 else histogram.retract)(value)

    def take_back(self, seq: Sequence, returned: int) -> None:
        """Undo what the engine counted for `seq` after its first `returned` output tokens (a stop
        string ended the output there): generated tokens, the later steps' inter-token latencies and
        step tokens; `seq`'s output and emissions end at `returned`."""
        self.generation_tokens -= len(seq.output) - returned
        counts = [count for count, _ in seq.emissions]
        kept = next(i for i, count in enumerate(counts) if count >= returned)
        # the step that emitted the stop string's last token counts its tokens up to that one
        before = counts[kept - 1] if kept else 0
        prompt = len(seq.prompt) - seq.cached_prompt_tokens if kept == 0 else 0
        self.iteration_tokens.retract(prompt + counts[kept] - before)
        self.iteration_tokens.observe(prompt + returned - before)
        for i in range(kept + 1, len(counts)):  # the steps after it, whole
            self.inter_token_latency.retract(seq.emissions[i][1] - seq.emissions[i - 1][1])
            self.iteration_tokens.retract(counts[i] - counts[i - 1])
        del seq.output[returned:]
        seq.emissions[kept:] = [(returned, seq.emissions[kept][1])]
        seq.last_token_s = seq.emissions[kept][1]

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Hit tokens / queried prompt tokens (0 before any query)."""
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    @contextmanager
    def span(self, phase: str) -> Iterator[None]:
        """Time the enclosed block into `phase`."""
        start = time.perf_counter()
        try:
            yield
        finally:
            entry = self.spans[phase]
            entry.seconds += time.perf_counter() - start
            entry.count += 1

    def finished(self, reason: str) -> None:
        self.requests_finished[reason] = self.requests_finished.get(reason, 0) + 1

    def copy(self) -> EngineMetrics:
        return EngineMetrics(
            spec=self.spec.copy(),
            prompt_tokens=self.prompt_tokens,
            generation_tokens=self.generation_tokens,
            requests_finished=dict(self.requests_finished),
            prefix_cache_queries=self.prefix_cache_queries,
            prefix_cache_hits=self.prefix_cache_hits,
            running=self.running,
            waiting=self.waiting,
            spans={k: PhaseSpan(v.seconds, v.count) for k, v in self.spans.items()},
            device_syncs=self.device_syncs,
            time_to_first_token=self.time_to_first_token.copy(),
            inter_token_latency=self.inter_token_latency.copy(),
            e2e_request_latency=self.e2e_request_latency.copy(),
            request_queue_time=self.request_queue_time.copy(),
            kv_cache_usage=self.kv_cache_usage,
            request_prefill_time=self.request_prefill_time.copy(),
            request_decode_time=self.request_decode_time.copy(),
            request_inference_time=self.request_inference_time.copy(),
            request_time_per_output_token=self.request_time_per_output_token.copy(),
            iteration_tokens=self.iteration_tokens.copy(),
            request_prompt_tokens=self.request_prompt_tokens.copy(),
            request_generation_tokens=self.request_generation_tokens.copy(),
            request_max_num_generation_tokens=self.request_max_num_generation_tokens.copy(),
        )
