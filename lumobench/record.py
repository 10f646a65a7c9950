"""Recording proxy: sits in front of any OpenAI-compatible server and turns live traffic (e.g. an agent
run) into a replay corpus (DESIGN §6, paper §VI).

With a corpus, every `POST /v1/chat/completions` the upstream accepts (HTTP 200) becomes one
`CorpusRecord`, appended and flushed in capture order, with `source` = {task, conversation, turn,
captured_at}. Either way the proxy counts answered chat requests and the completion tokens of the
upstream's usage reports (that is how agent runs count an arm's work); with a `request_log` it also
writes one `ProxiedRequest` per chat request (its timeline). Responses are passed through
byte for byte as they arrive (no re-chunking, no decompression), so a streaming client sees the
upstream's events with one extra local hop. Every other path is forwarded unrecorded.

`conversation` is a stable hash of the task label, the run label and the conversation's opening (its
first system and first user message): successive requests of one agent conversation share it, and a
sub-agent (different system prompt) gets its own. `turn` counts that conversation's earlier requests.

A client that goes away (an agent's request timeout, Ctrl-C) takes its upstream request with it: the
proxy's handler is cancelled and closes the upstream connection, so a one-request-at-a-time engine
aborts it instead of finishing an answer nobody reads. With `fit_context` (agent runs) a chat
request whose prompt + `max_tokens` exceeds the upstream's context gets `max_tokens` lowered to the
room its prompt leaves, measured with the upstream's `/tokenize` (vLLM's and LumoTree's), instead
of an HTTP 400; the corpus records what the upstream received.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from pydantic import BaseModel, ValidationError

from lumobench.corpus import SAMPLING_FIELDS, CorpusRecord, check_corpus
from lumobench.errors import LumobenchError
from lumobench.results import append_jsonl

RECORDED_PATH = "/v1/chat/completions"
#: the upstream's /tokenize of one request (a long agent prompt tokenizes in well under a second)
TOKENIZE_DEADLINE_S = 60.0
MAX_TOKENIZE_ANSWER = 64 * 1024 * 1024  # the ids of a 262k-token prompt are ~2 MB of JSON
# Request fields the corpus record carries itself; everything else except transport settings goes
# into `extra_body` so a replay sends the same request.
_RECORD_FIELDS = {"messages", "tools", "tool_choice", *SAMPLING_FIELDS}
_TRANSPORT_FIELDS = {"model", "stream", "stream_options", "n"}
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "host",
    "upgrade",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
}


def conversation_key(messages: list[dict[str, Any]], task: str | None, run: int | None) -> str:
    """12 hex digits naming a conversation: task, run and its first system and first user message."""
    opening = [next((m for m in messages if m.get("role") == role), None) for role in ("system", "user")]
    text = json.dumps([task, run, opening], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class CorpusWriter:
    """Appends captured requests to a corpus JSONL (flushed per record); continues an existing corpus
    (ids and per-conversation turn counts carry on). Requests the corpus schema rejects go, with the
    reason, to `<corpus>.rejected.jsonl` so the corpus itself always passes `corpus check`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rejected_path = path.with_name(path.name + ".rejected.jsonl")
        self.turns: Counter[str] = Counter()
        self.count = 0
        if path.exists() and path.stat().st_size:
            records, issues = check_corpus(path)
            if issues:
                raise LumobenchError(f"cannot append to {path}: {issues[0]} (run `lumobench corpus check`)")
            self.count = len(records)
            self.turns.update(r.source.conversation for r in records if r.source and r.source.conversation)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def record(self, body: dict[str, Any], task: str | None, run: int | None) -> CorpusRecord | None:
        """Append `body` (a chat-completions request) as the next record; None if it was rejected."""
        with self._lock:
            messages = body.get("messages") or []
            conversation = conversation_key(messages, task, run)
            source: dict[str, Any] = {
                "task": task,
                "conversation": conversation,
                "turn": self.turns[conversation],
                "captured_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
            }
            if run is not None:
                source["run"] = run
            fields = {k: v for k, v in body.items() if k in _RECORD_FIELDS and v is not None}
            extra = {k: v for k, v in body.items() if k not in _RECORD_FIELDS | _TRANSPORT_FIELDS}
            record_id = f"{task or 'capture'}-{self.count + 1:05d}"
            raw = {"id": record_id, **fields, "source": source, **({"extra_body": extra} if extra else {})}
            try:
                record = CorpusRecord.model_validate(raw)
            except ValidationError as exc:
                with self.rejected_path.open("a") as fh:
                    fh.write(json.dumps({"error": str(exc.errors()[0]), "request": body}) + "\n")
                return None
            with self.path.open("a") as fh:
                fh.write(json.dumps(raw, ensure_ascii=False) + "\n")
                fh.flush()
            self.count += 1
            self.turns[conversation] += 1
            return record


class ProxiedRequest(BaseModel):
    """One chat request through the proxy. Times are wall-clock seconds since the epoch (`time.time()`):
    when the request arrived, when the arm's first response bytes came back, when the response ended."""

    task: str | None
    run: int | None
    http_status: int | None  # None: the arm could not be reached
    sent_s: float
    first_byte_s: float | None
    end_s: float
    completion_tokens: int | None


@dataclass
class TrafficCounts:
    """Chat requests the upstream answered with 200 and the completion tokens its usage reported."""

    requests: int = 0
    completion_tokens: int = 0
    without_usage: int = 0  # answered requests whose response carried no usage
    capped: int = 0  # requests whose max_tokens was lowered to fit the upstream's context


def completion_tokens_of(body: bytes) -> int | None:
    """`usage.completion_tokens` of a chat response: a JSON body or an SSE stream (searched from the end,
    where servers put the usage chunk); None when absent."""
    candidates = (
        [body]
        if body.lstrip().startswith(b"{")
        else [line[5:].strip() for line in reversed(body.splitlines()) if line.startswith(b"data:")]
    )
    for payload in candidates:
        if b'"usage"' not in payload:
            continue
        try:
            usage = json.loads(payload).get("usage") or {}
        except (json.JSONDecodeError, AttributeError):
            continue
        if isinstance(usage.get("completion_tokens"), int):
            return usage["completion_tokens"]
    return None


class RecordingProxy:
    """The proxy as an aiohttp application. With a corpus it records; it always counts chat requests and
    completion tokens (`take_counts`). `task` and `run` label what is captured from now on (the agent
    driver sets them per task)."""

    def __init__(
        self,
        upstream: str,
        corpus: Path | None,
        task: str | None = None,
        run: int | None = None,
        fit_context: bool = False,
    ) -> None:
        self.upstream = upstream.rstrip("/").removesuffix("/v1")
        self.writer = CorpusWriter(corpus) if corpus is not None else None
        self.task = task
        self.run = run
        self.fit_context = fit_context
        self.recorded = 0
        self.request_log: Path | None = None  # where each chat request's ProxiedRequest goes (if set)
        self._counts = TrafficCounts()
        self._counts_lock = threading.Lock()
        self._session: aiohttp.ClientSession | None = None

    def take_counts(self) -> TrafficCounts:
        """The counts since the last call (and reset them)."""
        with self._counts_lock:
            counts, self._counts = self._counts, TrafficCounts()
        return counts

    def peek_counts(self) -> TrafficCounts:
        """The counts since the last `take_counts`, without resetting them (for progress displays)."""
        with self._counts_lock:
            return replace(self._counts)

    async def _on_startup(self, _: web.Application) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        self._session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)

    async def _on_cleanup(self, _: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        return app

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        sent = time.time()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        url = self.upstream + request.rel_url.path_qs
        is_chat = request.method == "POST" and request.path == RECORDED_PATH
        if self.fit_context and is_chat:
            body = await self._fit(body, headers)
        try:
            upstream = await self._session.request(request.method, url, data=body, headers=headers)
        except aiohttp.ClientError:
            if is_chat:
                self._log(None, sent, None, None)
            # mirror the upstream's state: its client sees a dropped connection, as it would without us
            # (an HTTP 502 would instead send agents into long retry back-offs)
            if request.transport is not None:
                request.transport.abort()
            return web.Response(status=502)
        first_byte = None
        async with upstream:
            chat = is_chat and upstream.status == 200
            if chat:
                self._record(body)
            response = web.StreamResponse(
                status=upstream.status,
                reason=upstream.reason,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP},
            )
            await response.prepare(request)
            received = bytearray()
            # forward each read as it arrives: SSE events keep the upstream's timing and bytes
            async for chunk in upstream.content.iter_any():
                first_byte = first_byte or time.time()
                await response.write(chunk)
                if chat:
                    received += chunk
            await response.write_eof()
        tokens = self._count(bytes(received), upstream.headers.get("Content-Encoding")) if chat else None
        if is_chat:
            self._log(upstream.status, sent, first_byte, tokens)
        return response

    def _log(self, status: int | None, sent: float, first_byte: float | None, tokens: int | None) -> None:
        if self.request_log is not None:
            row = ProxiedRequest(
                task=self.task,
                run=self.run,
                http_status=status,
                sent_s=sent,
                first_byte_s=first_byte,
                end_s=time.time(),
                completion_tokens=tokens,
            )
            append_jsonl(self.request_log, row)

    async def _fit(self, body: bytes, headers: dict[str, str]) -> bytes:
        """`body` with max_tokens lowered to the room its prompt leaves in the upstream's context (as
        given); an upstream without /tokenize turns fitting off for the rest of the run."""
        assert self._session is not None
        try:
            chat = json.loads(body)
            field = "max_completion_tokens" if chat.get("max_completion_tokens") else "max_tokens"
            wanted = int(chat.get(field) or 0)
        except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
            return body
        if wanted <= 0:
            return body
        probe = {k: chat[k] for k in ("model", "messages", "tools", "chat_template_kwargs") if k in chat}
        try:
            async with (
                asyncio.timeout(TOKENIZE_DEADLINE_S),
                self._session.post(
                    self.upstream + "/tokenize",
                    json={**probe, "add_generation_prompt": True},
                    headers=headers,
                ) as resp,
            ):
                if resp.status == 404:
                    self.fit_context = False
                answer: Any = {}
                if resp.status == 200:
                    text = bytearray()
                    async for chunk in resp.content.iter_any():
                        text += chunk
                        if len(text) > MAX_TOKENIZE_ANSWER:
                            raise ValueError("the /tokenize answer is too large")
                    answer = json.loads(text)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return body  # sent as it came: the upstream answers it (or refuses it) itself
        if not isinstance(answer, dict):
            return body
        prompt, context = answer.get("count"), answer.get("max_model_len")
        fits = not (isinstance(prompt, int) and isinstance(context, int)) or prompt + wanted <= context
        if fits or prompt >= context:  # unknown, fitting, or no room at all (the upstream says so)
            return body
        chat[field] = context - prompt
        with self._counts_lock:
            self._counts.capped += 1
        return json.dumps(chat, ensure_ascii=False).encode()

    def _record(self, body: bytes) -> None:
        if self.writer is None:
            return
        try:
            parsed = json.loads(body)
        except json.JSONDecodeError:
            return  # the upstream accepted it, but it is no chat request we can store
        if isinstance(parsed, dict) and self.writer.record(parsed, self.task, self.run) is not None:
            self.recorded += 1

    def _count(self, response: bytes, encoding: str | None) -> int | None:
        """Count one answered chat request; its completion tokens (None without a readable usage)."""
        tokens = None if encoding else completion_tokens_of(response)
        with self._counts_lock:
            self._counts.requests += 1
            if tokens is None:
                self._counts.without_usage += 1
            else:
                self._counts.completion_tokens += tokens
        return tokens


class BackgroundProxy:
    """Runs a `RecordingProxy` on 127.0.0.1 in a daemon thread (context manager); `url` ends in /v1."""

    def __init__(self, proxy: RecordingProxy, port: int = 0, host: str = "127.0.0.1") -> None:
        self.proxy = proxy
        self.host = host
        self._port = port
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="recording-proxy", daemon=True)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.proxy.app(), shutdown_timeout=1.0, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self._port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def __enter__(self) -> BackgroundProxy:
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        except OSError as exc:
            self._stop_loop()
            raise LumobenchError(
                f"recording proxy cannot listen on {self.host}:{self._port}: {exc}"
            ) from None
        return self

    def __exit__(self, *_: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
        self._stop_loop()

    def _stop_loop(self) -> None:
        """Cancel what still runs on the loop (a stream cut by Ctrl-C), wait for it, stop and close the
        loop: a task left pending would be reported as "destroyed but pending" at exit."""

        async def cancel_the_rest() -> None:
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        if self._loop.is_running():
            with contextlib.suppress(TimeoutError):
                asyncio.run_coroutine_threadsafe(cancel_the_rest(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()
