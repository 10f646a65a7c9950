"""One request's output as text: engine token events -> detokenized, stop-string-trimmed deltas.

Tokens are detokenized one at a time, so when a stop string completes inside a speculative event the
output (ids, logprobs and the completion-token count) ends at the token that completed it, the finish
reason is "stop", and the engine is told so (`stop`): it finishes the request as stopped there and takes
what it made after that token out of its counters, so /metrics counts what the client received.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from lumotree.engine.async_engine import EngineDeadError
from lumotree.engine.sequence import GenerationRequest, SpecStats, TokenEvent, TokenLogprob
from lumotree.server.detokenizer import IncrementalDetokenizer, StopStringMatcher
from lumotree.server.tokenizer import ModelTokenizer


class EngineClient(Protocol):
    """What the server needs from the engine (`lumotree.engine.EngineProcess` or `AsyncEngine`)."""

    def generate(self, req: GenerationRequest) -> AsyncIterator[TokenEvent]: ...

    def stop(self, request_id: str, returned: int) -> None: ...


class EngineFailure(RuntimeError):
    """The engine could not run the request: it failed on it (500), refused it (400: a check the server
    does not repeat), or its thread died (503, and `dead` is set)."""

    def __init__(self, message: str, status: int = 500, dead: bool = False) -> None:
        super().__init__(message)
        self.status, self.dead = status, dead


@dataclass(frozen=True)
class TextOptions:
    """Text-side stopping and decoding settings of one request."""

    stop: tuple[str, ...] = ()
    include_stop: bool = False
    skip_special_tokens: bool = True


@dataclass
class OutputDelta:
    """What one engine event adds to the output, after detokenization and stop strings."""

    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob] | None
    finish_reason: str | None  # set on the last delta only
    num_prompt_tokens: int
    num_output_tokens: int  # cumulative, up to the stop string when one matched
    cached_prompt_tokens: int
    spec: SpecStats = field(default_factory=SpecStats)
    stop_reason: str | int | None = None  # the stop string, or the token id that stopped the output

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


async def stream_output(
    engine: EngineClient, tokenizer: ModelTokenizer, req: GenerationRequest, opts: TextOptions
) -> AsyncIterator[OutputDelta]:
    """Deltas of one request; raises EngineFailure if the engine reports an error."""
    detok = IncrementalDetokenizer(tokenizer, opts.skip_special_tokens)
    stops = StopStringMatcher(opts.stop, opts.include_stop)
    count, started = 0, False
    events = engine.generate(req)
    try:
        async for ev in events:
            started = True
            if ev.finish_reason == "error":
                raise EngineFailure(
                    f"the engine failed on request {req.request_id}: {ev.error or 'no detail'}"
                )
            text: list[str] = []
            taken = 0
            for token in ev.token_ids:
                taken += 1
                text.append(stops.push(detok.push(token)))
                if stops.matched is not None:
                    break
            count += taken
            reason = "stop" if stops.matched is not None else ev.finish_reason if ev.finished else None
            if ev.finished and stops.matched is None:
                text.append(stops.push(detok.flush()))
                text.append(stops.flush())
                if stops.matched is not None:  # the flushed tail completed a stop string
                    reason = "stop"
            yield OutputDelta(
                token_ids=list(ev.token_ids[:taken]),
                text="".join(text),
                logprobs=ev.logprobs[:taken] if ev.logprobs is not None else None,
                finish_reason=reason,
                num_prompt_tokens=ev.num_prompt_tokens,
                num_output_tokens=count,
                cached_prompt_tokens=ev.cached_prompt_tokens,
                spec=ev.spec,
                stop_reason=_stop_reason(reason, stops.matched, ev.token_ids),
            )
            if stops.matched is not None:
                engine.stop(req.request_id, count)
            if reason is not None:
                return
        raise EngineFailure(f"the engine's stream of request {req.request_id} ended before it finished")
    except EngineDeadError as exc:
        raise EngineFailure(str(exc), status=503, dead=True) from exc
    except ValueError as exc:
        if started:  # not the engine refusing the request: a bug
            raise
        raise EngineFailure(str(exc), status=400) from exc
    finally:
        # closing the engine's stream aborts the request there when it has not finished
        await events.aclose()  # type: ignore[attr-defined]


def _stop_reason(reason: str | None, matched: str | None, token_ids: list[int]) -> str | int | None:
    if reason != "stop":
        return None
    return matched if matched is not None else (token_ids[-1] if token_ids else None)
