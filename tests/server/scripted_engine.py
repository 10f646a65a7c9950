"""A fake engine for HTTP-layer tests: it replays scripted token chunks instead of running a model.

It stands only for the engine's streaming contract (`AsyncEngine.generate`): one `TokenEvent` per
chunk (several tokens per event, as speculative cycles emit them), cumulative counts and spec stats,
`max_tokens` truncation with finish reason "length", an abort recorded when the consumer closes
the stream early, and a stop (`stop`: the server matched a stop string) counted as the engine counts it,
with the tokens the client received. Tests of real generation use the real engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from lumotree.engine.metrics import EngineMetrics
from lumotree.engine.sequence import GenerationRequest, SpecStats, TokenEvent, TokenLogprob


@dataclass
class ScriptedEngine:
    chunks: list[list[int]] = field(default_factory=lambda: [[5]])
    finish_reason: str = "stop"
    delay_s: float = 0.0
    requests: list[GenerationRequest] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    stopped: dict[str, int] = field(default_factory=dict)  # request id -> tokens returned
    totals: EngineMetrics = field(default_factory=EngineMetrics)

    async def generate(self, req: GenerationRequest) -> AsyncIterator[TokenEvent]:
        self.requests.append(req)
        out, finished = 0, False
        spec = SpecStats()
        try:
            for i, chunk in enumerate(self.chunks):
                await asyncio.sleep(self.delay_s)
                chunk = chunk[: req.max_tokens - out]
                out += len(chunk)
                # a chunk of k tokens counts as one speculative event that accepted k - 1 drafts
                for counters in (spec, self.totals.spec):  # per request, and engine-wide as the engine does
                    counters.record(draft_tokens=8, accepted=len(chunk) - 1, max_depth=8)
                length = out >= req.max_tokens
                finished = length or i == len(self.chunks) - 1
                reason = ("length" if length else self.finish_reason) if finished else None
                logprobs = None
                if req.logprobs is not None:
                    top = tuple((t + j, -0.5 - j) for j, t in enumerate(range(req.logprobs)))
                    logprobs = [TokenLogprob(t, -0.25, top) for t in chunk]
                if finished:
                    self.totals.finished(reason or "stop")
                yield TokenEvent(
                    request_id=req.request_id,
                    token_ids=chunk,
                    logprobs=logprobs,
                    finished=finished,
                    finish_reason=reason,
                    num_prompt_tokens=len(req.prompt_token_ids),
                    num_output_tokens=out,
                    cached_prompt_tokens=0,
                    spec=spec.copy(),
                )
                if finished:
                    return
        finally:
            if req.request_id in self.stopped:
                self.totals.generation_tokens += self.stopped[req.request_id]
                self.totals.finished("stop")
            else:
                self.totals.generation_tokens += out
                if not finished:
                    self.aborted.append(req.request_id)
                    self.totals.finished("abort")

    def stop(self, request_id: str, returned: int) -> None:
        self.stopped[request_id] = returned

    def metrics(self) -> EngineMetrics:
        return self.totals.copy()
