"""`POST /generate`, SGLang's native API: `text` or `input_ids` in; `text`, `output_ids` and `meta_info`
out. Streamed events carry the cumulative text and ids and a cumulative `meta_info.completion_tokens`
(replay's first-token clock for this API starts at its first increase)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from lumotree.engine.sequence import GenerationRequest, TokenLogprob
from lumotree.server.context import ServingContext, new_id
from lumotree.server.errors import bad_request
from lumotree.server.generation import EngineFailure, OutputDelta, TextOptions
from lumotree.server.outputs import finite_logprob, spec_stats
from lumotree.server.params import SamplingInput, build_request
from lumotree.server.protocol import GenerateMetaInfo, GenerateRequest, GenerateResponse
from lumotree.server.sse import DONE, sse_event, stream_error


def prepare_generate(ctx: ServingContext, req: GenerateRequest) -> tuple[GenerationRequest, TextOptions]:
    if (req.text is None) == (req.input_ids is None):
        raise bad_request("give exactly one of text and input_ids", "input_ids")
    ids = ctx.prompt_ids(req.text, "text") if req.text is not None else list(req.input_ids or ())
    p = req.sampling_params
    sampling = SamplingInput(
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=p.top_k,
        min_p=p.min_p,
        presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty,
        repetition_penalty=p.repetition_penalty,
        max_tokens=p.max_new_tokens,
        seed=p.sampling_seed,
        stop=p.stop,
        stop_token_ids=p.stop_token_ids,
        ignore_eos=p.ignore_eos,
        skip_special_tokens=p.skip_special_tokens,
        n=p.n,
    )
    logprobs = req.top_logprobs_num if req.return_logprob else None
    field = "text" if req.text is not None else "input_ids"
    return build_request(new_id("gen"), ids, sampling, ctx.limits, logprobs, prompt_field=field)


def _finish_reason(d: OutputDelta, gen: GenerationRequest) -> dict[str, Any] | None:
    if d.finish_reason is None:
        return None
    if d.finish_reason == "stop":
        return {"type": "stop", "matched": d.stop_reason}
    if d.finish_reason == "length":
        return {"type": "length", "length": gen.max_tokens}
    return {"type": d.finish_reason}


class _Accumulator:
    """Cumulative text, ids and logprobs of one /generate response."""

    def __init__(self, gen: GenerationRequest) -> None:
        self.gen = gen
        self.text = ""
        self.ids: list[int] = []
        self.lps: list[TokenLogprob] = []

    def add(self, d: OutputDelta) -> GenerateResponse:
        self.text += d.text
        self.ids += d.token_ids
        self.lps += d.logprobs or []
        want = self.gen.logprobs is not None
        return GenerateResponse(
            text=self.text,
            output_ids=list(self.ids),
            meta_info=GenerateMetaInfo(
                id=self.gen.request_id,
                prompt_tokens=d.num_prompt_tokens,
                completion_tokens=d.num_output_tokens,
                cached_tokens=d.cached_prompt_tokens,
                finish_reason=_finish_reason(d, self.gen),
                spec_decode=spec_stats(d.spec) if d.finished else None,
                output_token_logprobs=[[finite_logprob(lp.logprob), lp.token_id, None] for lp in self.lps]
                if want
                else None,
                output_top_logprobs=[[[finite_logprob(v), i, None] for i, v in lp.top] for lp in self.lps]
                if want
                else None,
            ),
        )


async def generate_stream(
    ctx: ServingContext, gen: GenerationRequest, opts: TextOptions
) -> AsyncIterator[bytes]:
    acc = _Accumulator(gen)
    try:
        async with contextlib.aclosing(ctx.output(gen, opts)) as deltas:
            async for d in deltas:
                if d.token_ids or d.finished:
                    yield sse_event(acc.add(d))
    except EngineFailure as exc:
        yield stream_error(exc)
    yield DONE


async def generate_full(ctx: ServingContext, gen: GenerationRequest, opts: TextOptions) -> GenerateResponse:
    acc = _Accumulator(gen)
    out: GenerateResponse | None = None
    async for d in ctx.output(gen, opts):
        out = acc.add(d)
    assert out is not None  # stream_output raises unless it yielded a finished delta
    return out
