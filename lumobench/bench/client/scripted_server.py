"""A scripted SSE server: a small real HTTP/1.1 server that streams OpenAI-style chat chunks and
SGLang-style `/generate` events at known times, with faults on demand.

It is not an engine: it stands for one in the client benchmark (`lumobench bench client`) and in the
harness tests (dying mid-stream, HTTP errors, reads split anywhere, comments, multi-line data, a
process that crashes once, streams that never end, an engine that turns unavailable, an API key).
Its `/metrics` exposes vLLM-named speculative-decoding counters that grow deterministically, so
counter deltas can be checked exactly.

    python -m lumobench.bench.client.scripted_server --port 8500 [--script script.json] [--api-key KEY]

Script keys (all optional): tokens (completion tokens per request, capped by max_tokens), tokens_per_event,
interval_ms, reasoning_events, stamp (put the server's monotonic ns into each event), startup_delay_s,
faults ({request id: "die" | "http500" | "split" | "comments" | "multiline" | "comments_forever" |
"endless_line"}; the id is the part of the X-Request-Id header before ".r<run>"; the last two keep the
stream open for good: keep-alive comments and no data, or one `data:` line that never ends),
crash_once_file + crash_after (once `crash_after` requests were served, and only while that file does
not exist: create it and kill the process mid-stream, like an engine that crashes), draft_tokens (per
speculative event), unavailable_after (after that many generation requests, answer every one with
HTTP 503, and /health too unless health_stays_ok), pid_file (write the process id there),
echo_env (names of environment variables whose values it prints at startup, as engines print their
settings), events ({request id: [data of each event]}: stream exactly these events, then [DONE]: a
server whose chunks have any shape). It prints its command line at startup, as vLLM does. With
--api-key every route, /health included, needs `Authorization: Bearer KEY` (401 otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODEL_ID = "scripted"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


@dataclass
class Script:
    tokens: int = 24
    tokens_per_event: int = 1
    interval_ms: float = 1.0
    reasoning_events: int = 0
    stamp: bool = False
    startup_delay_s: float = 0.0
    faults: dict[str, str] = field(default_factory=dict)
    crash_once_file: str | None = None
    crash_after: int = 0
    draft_tokens: int = 3
    unavailable_after: int | None = None
    health_stays_ok: bool = False
    pid_file: str | None = None
    echo_env: list[str] = field(default_factory=list)
    events: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def from_json(cls, text: str) -> Script:
        return cls(**json.loads(text))


@dataclass
class Counters:
    """vLLM-named spec-decode counters: each output event is one speculative event with
    `tokens_per_event - 1` accepted drafts at positions 0..k-1."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_pos: dict[int, int] = field(default_factory=dict)

    def event(self, tokens: int, draft_tokens: int) -> None:
        self.drafts += 1
        self.draft_tokens += draft_tokens
        self.accepted += tokens - 1
        for pos in range(tokens - 1):
            self.per_pos[pos] = self.per_pos.get(pos, 0) + 1

    def prometheus(self) -> str:
        lines = [
            "# TYPE vllm:spec_decode_num_drafts_total counter",
            f'vllm:spec_decode_num_drafts_total{{model_name="{MODEL_ID}"}} {self.drafts}.0',
            f'vllm:spec_decode_num_draft_tokens_total{{model_name="{MODEL_ID}"}} {self.draft_tokens}.0',
            f'vllm:spec_decode_num_accepted_tokens_total{{model_name="{MODEL_ID}"}} {self.accepted}.0',
        ]
        lines += [
            f'{ACCEPTED_PER_POS}{{model_name="{MODEL_ID}",position="{p}"}} {n}.0'
            for p, n in sorted(self.per_pos.items())
        ]
        return "\n".join(lines) + "\n"


class ScriptedServer:
    def __init__(self, script: Script, api_key: str | None = None) -> None:
        self.script = script
        self.api_key = api_key
        self.counters = Counters()
        self.served = 0
        self.generation_requests = 0

    # -- HTTP plumbing ----------------------------------------------------------------------------
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *header_lines = head.decode("latin-1").split("\r\n")
                method, path, _ = request_line.split(" ", 2)
                headers = {
                    k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines if h)
                }
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                await self.route(method, path, headers, body, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @staticmethod
    async def respond(writer: asyncio.StreamWriter, status: int, payload: str, ctype: str) -> None:
        data = payload.encode()
        reason = {
            200: "OK",
            401: "Unauthorized",
            404: "Not Found",
            500: "Internal Server Error",
            503: "Service Unavailable",
        }[status]
        head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(data)}\r\n\r\n"
        writer.write(head.encode() + data)
        await writer.drain()

    def _unavailable(self) -> bool:
        limit = self.script.unavailable_after
        return limit is not None and self.generation_requests > limit

    async def route(
        self, method: str, path: str, headers: dict[str, str], body: bytes, writer: asyncio.StreamWriter
    ) -> None:
        if self.api_key is not None and headers.get("authorization") != f"Bearer {self.api_key}":
            await self.respond(
                writer, 401, json.dumps({"error": {"message": "API key needed"}}), "application/json"
            )
        elif method == "GET" and path == "/health":
            down = self._unavailable() and not self.script.health_stays_ok
            await self.respond(writer, 503 if down else 200, "", "text/plain")
        elif method == "GET" and path == "/v1/models":
            await self.respond(writer, 200, json.dumps({"data": [{"id": MODEL_ID}]}), "application/json")
        elif method == "GET" and path == "/version":
            await self.respond(writer, 200, json.dumps({"version": "scripted-1"}), "application/json")
        elif method == "GET" and path == "/metrics":
            await self.respond(writer, 200, self.counters.prometheus(), "text/plain; version=0.0.4")
        elif method == "POST" and path in ("/v1/chat/completions", "/generate"):
            self.generation_requests += 1
            if self._unavailable():
                await self.respond(
                    writer, 503, json.dumps({"error": {"message": "engine gone"}}), "application/json"
                )
                return
            request_id = headers.get("x-request-id", "")
            fault = self.script.faults.get(request_id.rsplit(".r", 1)[0])
            if fault == "http500":
                await self.respond(
                    writer, 500, json.dumps({"error": {"message": "scripted failure"}}), "application/json"
                )
                return
            await self.stream(path, json.loads(body), request_id, fault, writer)
        else:
            await self.respond(writer, 404, "not found", "text/plain")

    # -- streaming --------------------------------------------------------------------------------
    async def stream(
        self, path: str, req: dict[str, Any], request_id: str, fault: str | None, writer: asyncio.StreamWriter
    ) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        if fault in ("comments_forever", "endless_line"):
            await self.never_finish(writer, fault)
            return
        if (given := self.script.events.get(request_id.rsplit(".r", 1)[0])) is not None:
            for data in [*given, "[DONE]"]:
                await self.write_event(writer, data, None)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return
        chat = path == "/v1/chat/completions"
        params = req if chat else req.get("sampling_params", {})
        limit = params.get("max_tokens" if chat else "max_new_tokens") or self.script.tokens
        total = min(self.script.tokens, limit)
        prompt_tokens = (
            len(json.dumps(req.get("messages", ""))) // 4 if chat else len(req.get("input_ids", []))
        )
        usage_each = chat and bool((req.get("stream_options") or {}).get("continuous_usage_stats"))
        crash = self._should_crash()
        start = time.monotonic()
        sent, events = 0, 0

        async def emit(obj: dict[str, Any] | str) -> None:
            if self.script.stamp and isinstance(obj, dict):
                obj["t_ns"] = time.monotonic_ns()  # emission time, for the client benchmark
            data = obj if isinstance(obj, str) else json.dumps(obj)
            await self.write_event(writer, data, fault)

        if chat:
            await emit(self._chat_chunk(request_id, {"role": "assistant", "content": ""}))
            for i in range(self.script.reasoning_events):
                await self._wait_until(start, events)
                events += 1
                await emit(self._chat_chunk(request_id, {"reasoning_content": f"think{i} "}))
        else:
            await emit({"text": "", "output_ids": [], "meta_info": self._meta(prompt_tokens, 0, None)})
        while sent < total:
            await self._wait_until(start, events)
            k = min(self.script.tokens_per_event, total - sent)
            ids = list(range(100 + sent, 100 + sent + k))
            sent += k
            events += 1
            self.counters.event(k, self.script.draft_tokens)
            if chat:
                chunk = self._chat_chunk(
                    request_id, {"content": "".join(f"t{i} " for i in ids)}, token_ids=ids
                )
                if usage_each:
                    chunk["usage"] = self._usage(prompt_tokens, sent)
            else:
                done = {"type": "length", "length": total} if sent == total else None
                chunk = {
                    "text": "".join(f"t{i} " for i in range(100, 100 + sent)),
                    "output_ids": list(range(100, 100 + sent)),
                    "meta_info": self._meta(prompt_tokens, sent, done),
                }
            await emit(chunk)
            if (fault == "die" or crash) and sent >= total // 2:
                if crash:
                    os._exit(17)  # the whole server dies mid-stream, like a killed engine
                writer.transport.abort()  # connection dropped without the terminating chunk
                return
        if chat:
            await emit(self._chat_chunk(request_id, {}, finish_reason="length"))
            if (req.get("stream_options") or {}).get("include_usage"):
                await emit(
                    {
                        "id": request_id,
                        "object": "chat.completion.chunk",
                        "choices": [],
                        "usage": self._usage(prompt_tokens, sent),
                    }
                )
        await emit("[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    @staticmethod
    async def never_finish(writer: asyncio.StreamWriter, fault: str) -> None:
        """Keep the stream open for good: a comment every 0.2 s, or one data line 64 KB at a time."""
        piece = b": keep-alive\n\n" if fault == "comments_forever" else b"x" * 65536
        if fault == "endless_line":
            piece = b"data: " + piece
        while True:
            writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            await writer.drain()
            if fault == "endless_line":
                piece = b"x" * 65536
            await asyncio.sleep(0.2 if fault == "comments_forever" else 0)

    def _should_crash(self) -> bool:
        self.served += 1
        marker = self.script.crash_once_file
        if marker is None or self.served <= self.script.crash_after or Path(marker).exists():
            return False
        Path(marker).write_text("crashed\n")
        return True

    async def _wait_until(self, start: float, events: int) -> None:
        # absolute schedule: event k leaves at start + k * interval, so delays do not accumulate
        delay = start + events * self.script.interval_ms / 1000 - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    @staticmethod
    async def write_event(writer: asyncio.StreamWriter, data: str, fault: str | None) -> None:
        if fault == "multiline" and data.startswith("{") and ", " in data:
            head, tail = data.split(", ", 1)  # JSON allows the newline the two data lines join with
            raw = f"data: {head},\ndata: {tail}\n\n".encode()
        else:
            raw = f"data: {data}\n\n".encode()
        if fault == "comments":
            raw = b": keep-alive\n\n" + raw
        if fault == "split":
            # CRLF line ends, written a few bytes at a time so reads cut lines, fields and CRLF pairs
            raw = raw.replace(b"\n", b"\r\n")
            for i in range(0, len(raw), 7):
                piece = raw[i : i + 7]
                writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                await writer.drain()
                await asyncio.sleep(0)
            return
        writer.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
        await writer.drain()

    @staticmethod
    def _chat_chunk(
        request_id: str,
        delta: dict[str, Any],
        token_ids: list[int] | None = None,
        finish_reason: str | None = None,
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        if token_ids is not None:
            choice["token_ids"] = token_ids
        return {"id": request_id, "object": "chat.completion.chunk", "model": MODEL_ID, "choices": [choice]}

    @staticmethod
    def _usage(prompt: int, completion: int) -> dict[str, int]:
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    @staticmethod
    def _meta(prompt: int, completion: int, finish: dict[str, Any] | None) -> dict[str, Any]:
        return {"prompt_tokens": prompt, "completion_tokens": completion, "finish_reason": finish}


async def serve(host: str, port: int, script: Script, api_key: str | None = None) -> None:
    await asyncio.sleep(script.startup_delay_s)
    server = await asyncio.start_server(ScriptedServer(script, api_key).handle, host, port)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--script", type=Path, help="JSON file with script keys (see module docstring)")
    parser.add_argument("--api-key", help="Require Authorization: Bearer KEY on every route")
    args = parser.parse_args()
    script = Script.from_json(args.script.read_text()) if args.script else Script()
    print(f"scripted server: args {sys.argv[1:]}", flush=True)
    for name in script.echo_env:
        print(f"scripted server: {name}={os.environ.get(name)}", flush=True)
    if script.pid_file:
        Path(script.pid_file).write_text(f"{os.getpid()}\n")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.host, args.port, script, args.api_key))


if __name__ == "__main__":
    main()
