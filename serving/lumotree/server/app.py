"""The FastAPI application: routes, API-key check and error mapping (DESIGN §5).

`create_app(ctx, metrics)` serves one model. Generation routes (`/v1/*`, `/generate`, `/tokenize`)
require `Authorization: Bearer KEY` when the server has an API key; `/health`, `/version` and
`/metrics` stay open, as in vLLM. Every route sits behind `guards.RequestGuards` (Host check, body
size limit). Prompts are rendered and tokenized in a worker thread, so a huge prompt never stalls
the event loop (`/health`, other streams).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Literal

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel

from lumotree import __version__
from lumotree.server.chat import chat_full, chat_prompt_ids, chat_stream, prepare_chat
from lumotree.server.completions import completion_full, completion_stream, prepare_completion
from lumotree.server.context import ServingContext
from lumotree.server.disconnect import ClientDisconnected, unless_disconnected
from lumotree.server.errors import APIError, error_response, install_error_handlers
from lumotree.server.generation import EngineFailure
from lumotree.server.guards import RequestGuards
from lumotree.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    GenerateRequest,
    GenerateResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)
from lumotree.server.sglang import generate_full, generate_stream, prepare_generate
from lumotree.server.sse import MEDIA_TYPE

_ERRORS = {
    400: {"model": ErrorResponse, "description": "invalid request"},
    401: {"model": ErrorResponse, "description": "missing or wrong API key"},
    404: {"model": ErrorResponse, "description": "unknown model"},
    413: {"model": ErrorResponse, "description": "request body over the server's limit"},
}
_STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _streamed(model: type) -> dict:
    return {200: {"model": model, "content": {MEDIA_TYPE: {}}, "description": "JSON, or SSE with stream"}}


def create_app(
    ctx: ServingContext,
    metrics: Callable[[], str],
    *,
    allowed_hosts: list[str] | None = None,
    max_body_bytes: int | Literal["context"] | None = "context",
) -> FastAPI:
    """The HTTP app over `ctx`; `metrics()` renders the Prometheus text of GET /metrics (it may block
    for one engine cycle, so it runs in a worker thread).

    allowed_hosts: Host header names answered (None: any; see `guards.default_allowed_hosts`);
    max_body_bytes: the largest request body, 413 beyond ("context": what a request at the full
    context can need, `RequestLimits.body_bytes`; None: no byte limit). Every body may hold at most
    `RequestLimits.body_values` JSON values, and no prompt text longer than the context can be is
    tokenized (`ServingContext.prompt_ids`), whatever the byte limit."""
    app = FastAPI(title="LumoTree", version=__version__, summary="OpenAI-compatible LumoTree server")
    install_error_handlers(app)
    app.add_middleware(
        RequestGuards,
        allowed_hosts=allowed_hosts,
        max_body_bytes=ctx.limits.body_bytes if max_body_bytes == "context" else max_body_bytes,
        body_values=ctx.limits.body_values,
    )

    def authorized(request: Request) -> None:
        if ctx.api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not secrets.compare_digest(given.encode(), f"Bearer {ctx.api_key}".encode()):
            raise APIError(401, "missing or wrong API key (send Authorization: Bearer KEY)")

    guarded = [Depends(authorized)]

    async def answer(
        request: Request,
        stream: bool,
        streamer: Callable[[], AsyncIterator[bytes]],
        whole: Callable[[], Awaitable[BaseModel]],
    ) -> Response:
        if stream:
            return StreamingResponse(streamer(), media_type=MEDIA_TYPE, headers=_STREAM_HEADERS)
        try:
            result = await unless_disconnected(request, whole())
        except ClientDisconnected:
            return Response(status_code=499)
        except EngineFailure as exc:
            return error_response(APIError(exc.status, str(exc), code="engine_error"))
        return JSONResponse(result.model_dump(mode="json"))

    @app.api_route(
        "/health",
        methods=["GET", "HEAD"],
        response_class=Response,
        summary="200 (empty body) when the server can take requests, 503 when its engine died",
        responses={200: {"content": None}, 503: {"model": ErrorResponse, "description": "engine died"}},
    )
    async def health() -> Response:
        dead = ctx.engine_dead or getattr(ctx.engine, "dead", None)
        if dead is not None:
            return error_response(APIError(503, dead, code="engine_dead"))
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict[str, object]:
        """The version, and the engine's configuration on this machine (kernels, native ISA path,
        tree shape, rows): lumobench records it in run.json."""
        return {"version": __version__, "engine": ctx.engine_info}

    @app.get("/metrics", response_class=PlainTextResponse, summary="Prometheus text (vLLM metric names)")
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(await asyncio.to_thread(metrics), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models", dependencies=guarded, responses=_ERRORS)
    async def models() -> ModelList:
        card = ModelCard(
            id=ctx.model_name,
            created=ctx.created,
            root=ctx.model_path,
            max_model_len=ctx.limits.max_model_len,
        )
        return ModelList(data=[card])

    @app.post(
        "/v1/chat/completions", dependencies=guarded, responses=_ERRORS | _streamed(ChatCompletionResponse)
    )
    async def chat_completions(req: ChatCompletionRequest, request: Request) -> Response:
        gen, opts = await asyncio.to_thread(prepare_chat, ctx, req)
        return await answer(
            request,
            req.stream,
            lambda: chat_stream(ctx, req, gen, opts),
            lambda: chat_full(ctx, req, gen, opts),
        )

    @app.post("/v1/completions", dependencies=guarded, responses=_ERRORS | _streamed(CompletionResponse))
    async def completions(req: CompletionRequest, request: Request) -> Response:
        gen, opts = await asyncio.to_thread(prepare_completion, ctx, req)
        return await answer(
            request,
            req.stream,
            lambda: completion_stream(ctx, req, gen, opts),
            lambda: completion_full(ctx, req, gen, opts),
        )

    @app.post("/generate", dependencies=guarded, responses=_ERRORS | _streamed(GenerateResponse))
    async def generate(req: GenerateRequest, request: Request) -> Response:
        gen, opts = await asyncio.to_thread(prepare_generate, ctx, req)
        return await answer(
            request,
            req.stream,
            lambda: generate_stream(ctx, gen, opts),
            lambda: generate_full(ctx, gen, opts),
        )

    def tokenize_ids(req: TokenizeRequest) -> list[int]:
        ctx.check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise APIError(400, "give exactly one of prompt and messages", param="prompt")
        if req.messages is not None:
            chat = ChatCompletionRequest(
                messages=req.messages, tools=req.tools, add_generation_prompt=req.add_generation_prompt
            )
            return chat_prompt_ids(ctx, chat)
        return ctx.prompt_ids(req.prompt or "", "prompt")

    @app.post("/tokenize", dependencies=guarded, responses=_ERRORS)
    async def tokenize(req: TokenizeRequest) -> TokenizeResponse:
        ids = await asyncio.to_thread(tokenize_ids, req)
        return TokenizeResponse(count=len(ids), max_model_len=ctx.limits.max_model_len, tokens=ids)

    return app
