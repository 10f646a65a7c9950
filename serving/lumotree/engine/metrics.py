"""Engine-wide counters and phase timers (the server exports them with vLLM's metric names).

Phase spans (paper Tables III/IX): "target" = the verification forward and the logits the walk
reads; "drafter" = MTP passes, suffix lookups and tree building; "dispatch" = acceptance walk, path
handling and state publication; "prefill" = prompt chunks (not part of the decode cycle).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from lumotree.engine.sequence import SpecStats

PHASES = ("target", "drafter", "dispatch", "prefill")


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
    vllm:num_requests_running / vllm:num_requests_waiting.
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
        )
