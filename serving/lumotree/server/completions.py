"""`POST /v1/completions`: one text or token-id prompt, streamed or whole, with legacy logprobs."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator

from lumotree.engine.sequence import GenerationRequest
from lumotree.server.context import ServingContext, new_id
from lumotree.server.errors import bad_request
from lumotree.server.generation import EngineFailure, OutputDelta, TextOptions
from lumotree.server.outputs import completion_logprobs, stop_reason, usage
from lumotree.server.params import SamplingInput, build_request
from lumotree.server.protocol import (
    CompletionChoice,
    CompletionChunk,
    CompletionChunkChoice,
    CompletionRequest,
    CompletionResponse,
)
from lumotree.server.sse import DONE, sse_event, stream_error


def completion_prompt_ids(ctx: ServingContext, req: CompletionRequest) -> list[int]:
    """Token ids of the single prompt (a string or a list of ids; a batch of one is accepted)."""
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise bad_request("batched prompts are not supported: send one prompt per request", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        return ctx.prompt_ids(prompt, "prompt")
    return list(prompt)  # type: ignore[arg-type]


def prepare_completion(ctx: ServingContext, req: CompletionRequest) -> tuple[GenerationRequest, TextOptions]:
    ctx.check_model(req.model)
    if req.echo:
        raise bad_request("echo is not supported", "echo")
    if req.suffix is not None:
        raise bad_request("suffix (insertion) is not supported", "suffix")
    return build_request(
        new_id("cmpl"),
        completion_prompt_ids(ctx, req),
        SamplingInput.from_openai(req),
        ctx.limits,
        req.logprobs,
    )


def _choice(
    ctx: ServingContext, req: CompletionRequest, gen: GenerationRequest, d: OutputDelta, offset: int
) -> CompletionChunkChoice:
    return CompletionChunkChoice(
        index=0,
        text=d.text,
        logprobs=completion_logprobs(ctx.tokenizer, d.logprobs, offset) if d.logprobs is not None else None,
        finish_reason=d.finish_reason,
        stop_reason=stop_reason(d, gen),
        token_ids=d.token_ids if req.return_token_ids else None,
    )


async def completion_stream(
    ctx: ServingContext, req: CompletionRequest, gen: GenerationRequest, opts: TextOptions
) -> AsyncIterator[bytes]:
    """SSE events of a streamed completion; engine failures end the stream with an error event."""
    created = int(time.time())
    continuous = req.continuous_usage
    offset, first = 0, True
    last: OutputDelta | None = None
    try:
        async with contextlib.aclosing(ctx.output(gen, opts)) as deltas:
            async for d in deltas:
                last = d
                if not (
                    d.text
                    or d.finished
                    or (d.token_ids and (req.return_token_ids or d.logprobs or continuous))
                ):
                    continue
                choice = _choice(ctx, req, gen, d, offset)
                if first and req.return_token_ids:
                    choice.prompt_token_ids = gen.prompt_token_ids
                first = False
                offset += len(d.text)
                closing = d.finished and not req.include_usage
                yield sse_event(
                    CompletionChunk(
                        id=gen.request_id,
                        created=created,
                        model=ctx.model_name,
                        choices=[choice],
                        usage=usage(d, False) if continuous else None,
                        system_fingerprint=ctx.system_fingerprint if closing else None,
                    )
                )
    except EngineFailure as exc:
        yield stream_error(exc)
        yield DONE
        return
    if req.include_usage and last is not None:
        yield sse_event(
            CompletionChunk(
                id=gen.request_id,
                created=created,
                model=ctx.model_name,
                choices=[],
                usage=usage(last, True),
                system_fingerprint=ctx.system_fingerprint,
            )
        )
    yield DONE


async def completion_full(
    ctx: ServingContext, req: CompletionRequest, gen: GenerationRequest, opts: TextOptions
) -> CompletionResponse:
    """The whole completion (raises EngineFailure)."""
    text: list[str] = []
    ids: list[int] = []
    lps = []
    last: OutputDelta | None = None
    async for d in ctx.output(gen, opts):
        last = d
        text.append(d.text)
        ids += d.token_ids
        lps += d.logprobs or []
    assert last is not None  # stream_output raises unless it yielded a finished delta
    return CompletionResponse(
        id=gen.request_id,
        created=int(time.time()),
        model=ctx.model_name,
        choices=[
            CompletionChoice(
                index=0,
                text="".join(text),
                logprobs=completion_logprobs(ctx.tokenizer, lps, 0) if gen.logprobs is not None else None,
                finish_reason=last.finish_reason,
                stop_reason=stop_reason(last, gen),
                token_ids=ids if req.return_token_ids else None,
                prompt_token_ids=gen.prompt_token_ids if req.return_token_ids else None,
            )
        ],
        usage=usage(last, final=True),
        system_fingerprint=ctx.system_fingerprint,
    )
