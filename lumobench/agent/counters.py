"""The arm's own counters around one agent attempt: `/metrics` snapshots before and after, and the
deltas of vLLM's request, generation-token and speculative-decoding counters (the LumoTree engine
exports the same names). The paper's agent table (§VII-A) takes decode figures from such deltas."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx

from lumobench.metrics import parse_prometheus, scrape, spec_delta

REQUESTS = "vllm:request_success_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"


@dataclass(frozen=True)
class CounterDeltas:
    """after − before of the arm's counters; None where the arm does not export a counter."""

    requests: int | None = None
    output_tokens: int | None = None
    accepted_per_event: float | None = None


def snapshot(base_url: str) -> str | None:
    """The arm's /metrics text now (None without a metrics endpoint)."""

    async def once() -> str | None:
        async with httpx.AsyncClient() as client:
            return await scrape(client, base_url)

    return asyncio.run(once())


def _total(samples: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float | None:
    return sum(value for _, value in samples[name]) if name in samples else None


def counter_deltas(before: str | None, after: str | None) -> CounterDeltas:
    """Deltas between two snapshots; counters that are absent or went backwards (restart) give None."""
    if before is None or after is None:
        return CounterDeltas()
    b, a = parse_prometheus(before), parse_prometheus(after)

    def delta(name: str) -> int | None:
        start, end = _total(b, name), _total(a, name)
        return None if start is None or end is None or end < start else round(end - start)

    spec = spec_delta(before, after)
    return CounterDeltas(delta(REQUESTS), delta(GENERATION_TOKENS), spec.accepted_per_event if spec else None)
