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
engine step), end-to-end latency and queue time (arrival to the start of its prefill) of every
request that finished after it was scheduled.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from lumotree.engine.sequence import SpecStats

PHASES = ("target", "drafter", "dispatch", "prefill", "cycle")
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
        )
