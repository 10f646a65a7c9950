"""The replay client: one streamed request per corpus record, timed per DESIGN §6.

Transport is aiohttp: measured against httpx with `lumobench bench client` (see results/cpu/ and
docs/harness.md), it costs less CPU per streamed event. Raw reads go to the byte-level SSE parser
unchanged.

Two clocks bound a request: `request_timeout_s`, the longest silence between two reads, and a total
deadline (`request_deadline`), so a server that keeps a stream open without finishing it (comments
forever, one endless line) fails that row instead of hanging the run.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

from lumobench.corpus import CorpusRecord
from lumobench.errors import LumobenchError
from lumobench.probe import auth_headers
from lumobench.results import RequestRow, now_iso
from lumobench.sse import SSELineTooLong
from lumobench.stream import ChatRecorder, GenerateRecorder, StreamRecorder

CHAT_PATH = "/v1/chat/completions"
GENERATE_PATH = "/generate"
#: the derived total deadline of one request: prefill and queueing, then a slow decode rate
DEADLINE_BASE_S = 300.0
DEADLINE_PER_TOKEN_S = 1.0
#: records without max_tokens may generate up to the server's context limit
DEADLINE_WITHOUT_MAX_TOKENS_S = 3600.0
ERROR_BODY_BYTES = 4096  # how much of a non-200 body is read for the row's error


class ServerUnreachable(LumobenchError):
    """The server refused the connection: it is not (or no longer) running."""


@dataclass(frozen=True)
class Target:
    """Where and how replay sends requests."""

    base_url: str
    api: Literal["chat", "generate"] = "chat"
    model: str | None = None
    stream_options: dict[str, Any] = field(default_factory=dict)
    extra_body: dict[str, Any] = field(default_factory=dict)
    request_timeout_s: float = 900.0  # longest silence allowed between two reads
    request_deadline_s: float | None = None  # longest total time per request; None: `request_deadline`
    api_key: str | None = field(default=None, repr=False)  # sent as `Authorization: Bearer KEY`
    health_path: str = "/health"  # probed when requests get "unavailable" answers
    #: every request's response cap becomes min(its own, this); a request without one gets this
    max_tokens_cap: int | None = None
    #: send every request as greedy decoding (`greedy_body`), whatever sampling the record carries
    greedy: bool = False


#: what `--greedy` takes out of a request besides setting temperature 0: the truncations and the seed
#: mean nothing without sampling, and the penalties are left out too, so that greedy means the argmax of
#: the model's own distribution on every engine (engines apply penalties in their own ways)
GREEDY_DROPPED = (
    "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "seed",
    "sampling_seed",  # the generate API's name for the seed
)  # fmt: skip


def _capped(limit: int | None, cap: int | None) -> int | None:
    return limit if cap is None else min(limit or cap, cap)


def greedy_body(params: dict[str, Any]) -> dict[str, Any]:
    """`params` (a chat body, or a generate body's sampling_params) as greedy decoding: temperature 0,
    `GREEDY_DROPPED` removed, everything else (max_tokens, ignore_eos, ...) kept."""
    return {k: v for k, v in params.items() if k not in GREEDY_DROPPED} | {"temperature": 0}


def build_request(record: CorpusRecord, target: Target) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) for one record; messages and tools are sent exactly as recorded, the response
    cap lowered to `target.max_tokens_cap` when there is one, and the sampling made greedy when
    `target.greedy` (after the extra bodies are merged, so an arm's extra_body cannot put it back)."""
    dumped = record.model_dump(mode="json", exclude_unset=True)
    cap = target.max_tokens_cap
    if target.api == "generate":
        if record.input_ids is None:
            raise LumobenchError(f"record {record.id} has no input_ids; the generate API replays token ids")
        params = record.sampling()
        params["max_new_tokens"] = params.pop("max_tokens", None)
        if "seed" in params:
            params["sampling_seed"] = params.pop("seed")
        body = {"input_ids": record.input_ids, "sampling_params": params, "stream": True}
        body |= target.extra_body | (record.extra_body or {})
        if cap is not None:
            body["sampling_params"] = {
                **body["sampling_params"],
                "max_new_tokens": _capped(body["sampling_params"].get("max_new_tokens"), cap),
            }
        if target.greedy:
            body["sampling_params"] = greedy_body(body["sampling_params"])
        return GENERATE_PATH, body
    body = {
        "model": target.model,
        "messages": dumped["messages"],
        "stream": True,
        "stream_options": {"include_usage": True, **target.stream_options},
        **record.sampling(),
    }
    for key in ("tools", "tool_choice"):
        if key in dumped:
            body[key] = dumped[key]
    body |= target.extra_body | (record.extra_body or {})
    if cap is not None:
        body["max_tokens"] = _capped(body.get("max_tokens"), cap)
        if body.get("max_completion_tokens") is not None:
            body["max_completion_tokens"] = _capped(body["max_completion_tokens"], cap)
    if target.greedy:
        body = greedy_body(body)
    return CHAT_PATH, body


def request_deadline(record: CorpusRecord, target: Target) -> float:
    """Seconds one request may take in all: the target's, else derived from the max_tokens it is sent
    with (the record's, capped by the target's max_tokens_cap)."""
    if target.request_deadline_s is not None:
        return target.request_deadline_s
    max_tokens = _capped(record.max_tokens, target.max_tokens_cap)
    if max_tokens is None:
        return DEADLINE_WITHOUT_MAX_TOKENS_S
    return DEADLINE_BASE_S + DEADLINE_PER_TOKEN_S * max_tokens


def request_headers(record: CorpusRecord, run_index: int) -> dict[str, str]:
    """Per-request headers: the request id servers log (`corpus check` guarantees it fits a header)."""
    return {"X-Request-Id": f"{record.id}.r{run_index}"}


def new_session(
    concurrency: int, request_timeout_s: float, api_key: str | None = None
) -> aiohttp.ClientSession:
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=request_timeout_s)
    return aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=concurrency), headers=auth_headers(api_key)
    )


async def stream_into(resp: aiohttp.ClientResponse, recorder: StreamRecorder) -> int | None:
    """Feed raw reads to `recorder` until the stream completes; return the t_end candidate (EOF time)."""
    # a plain loop over readany(): cheaper per event than the async-generator iter_any()
    readany, feed, clock = resp.content.readany, recorder.feed, time.monotonic_ns
    while data := await readany():
        if feed(data, clock()):
            return recorder.t_end_ns
    return clock()


async def send_request(
    session: aiohttp.ClientSession, target: Target, record: CorpusRecord, run_index: int, seq: int
) -> RequestRow:
    """Send one record, stream the answer and return its row (failed rows carry the error).

    Raises `ServerUnreachable` when the connection is refused: no request was made, so no row.
    """
    path, body = build_request(record, target)
    recorder: StreamRecorder = GenerateRecorder() if target.api == "generate" else ChatRecorder()
    deadline_s = request_deadline(record, target)
    budget = asyncio.timeout(deadline_s)
    started_at = now_iso()
    t_send = time.monotonic_ns()
    status: int | None = None
    error: str | None = None
    t_end: int | None = None
    try:
        headers = request_headers(record, run_index)
        async with budget, session.post(target.base_url + path, json=body, headers=headers) as resp:
            status = resp.status
            if resp.status != 200:
                detail = (await resp.content.read(ERROR_BODY_BYTES)).decode(errors="replace")
                error = f"HTTP {resp.status}: {detail[:300].strip()}"
            else:
                t_end = await stream_into(resp, recorder)
    except aiohttp.ClientConnectorError as exc:
        raise ServerUnreachable(f"cannot connect to {target.base_url}: {exc.os_error or exc}") from None
    except SSELineTooLong as exc:
        error = f"{exc}; the stream was abandoned"
    except (aiohttp.ClientError, TimeoutError) as exc:
        if budget.expired():
            error = f"no complete response within the request deadline of {deadline_s:g} s"
        else:
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    error = error or recorder.failure()
    return RequestRow(
        run_index=run_index,
        seq=seq,
        request_id=record.id,
        status="failed" if error else "completed",
        error=error,
        http_status=status,
        prompt_tokens=recorder.prompt_tokens,
        completion_tokens=recorder.completion_tokens,
        t_send_ns=t_send,
        t_first_ns=recorder.t_first_ns,
        t_end_ns=recorder.t_end_ns if recorder.done else t_end,
        chunks=recorder.chunks,
        output_chunks=recorder.output_chunks,
        chunk_tokens=recorder.chunk_tokens or None,
        chunk_ns=recorder.chunk_ns or None,
        finish_reason=recorder.finish_reason,
        token_ids=recorder.token_ids or None,
        started_at=started_at,
        **recorder.text_fields(),
    )
