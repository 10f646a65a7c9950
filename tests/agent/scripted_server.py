"""Scripted model server: a TEST DOUBLE standing for a model that issues a fixed sequence of tool calls.

It is a real HTTP server speaking the OpenAI chat-completions streaming protocol (SSE chunks, `tool_calls`
deltas split across chunks, a final usage chunk, `[DONE]`), so the real Qwen Code process talks to it
exactly as it would to a serving arm. It does not model language: turn k of the script is played when
the request's conversation already holds k assistant tool-call messages. Requests without tools (the
agent's side requests) get a short plain answer. `/metrics` exports vLLM's request and generation-token
counters for what it served.

`{cwd}` in tool arguments is replaced by the agent's working directory, read from the context message
Qwen Code sends ("I'm currently working in the directory: ...").

Variants for failure tests: `stall_at_turn` holds the stream open without sending any token from that
turn on (a stalled server), which is how budget enforcement is tested.

Run standalone: python tests/agent/scripted_server.py --port P --script SCRIPT.json [--stall-at-turn K]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

_CWD_RE = re.compile(r"I'm currently working in the directory: (\S+)")


@dataclass
class Script:
    """A fixed sequence of assistant turns: each is {"tool_calls": [{"name", "arguments"}]} or {"content"}."""

    turns: list[dict[str, Any]]
    stall_at_turn: int | None = None
    requests: list[dict[str, Any]] = field(default_factory=list)
    served: int = 0  # completed responses and their tokens, exported on /metrics like vLLM's counters
    generated: int = 0

    @classmethod
    def load(cls, path: Path, stall_at_turn: int | None = None) -> Script:
        return cls(turns=json.loads(path.read_text())["turns"], stall_at_turn=stall_at_turn)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def _working_dir(messages: list[dict[str, Any]]) -> str:
    for message in messages:
        match = _CWD_RE.search(_text_of(message.get("content")))
        if match:
            return match.group(1)
    return "."


def _turn_index(messages: list[dict[str, Any]]) -> int:
    return sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))


def _substitute(value: Any, cwd: str) -> Any:
    if isinstance(value, str):
        return value.replace("{cwd}", cwd)
    if isinstance(value, dict):
        return {k: _substitute(v, cwd) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, cwd) for v in value]
    return value


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _chunks_for_turn(turn: dict[str, Any], cwd: str, turn_no: int) -> tuple[list[dict[str, Any]], str, int]:
    """Choice deltas for one turn (tool-call arguments split in two pieces), its finish reason and a
    nominal completion-token count (one per delta piece)."""
    if "tool_calls" not in turn:
        text = turn.get("content", "Done.")
        words = text.split(" ")
        deltas = [{"content": w + (" " if i < len(words) - 1 else "")} for i, w in enumerate(words)]
        return deltas, "stop", len(deltas)
    deltas: list[dict[str, Any]] = []
    for index, call in enumerate(turn["tool_calls"]):
        arguments = json.dumps(_substitute(call["arguments"], cwd))
        half = len(arguments) // 2
        call_id = f"call_{turn_no}_{index}"
        deltas.append(
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": call_id,
                        "type": "function",
                        "function": {"name": call["name"], "arguments": arguments[:half]},
                    }
                ]
            }
        )
        deltas.append({"tool_calls": [{"index": index, "function": {"arguments": arguments[half:]}}]})
    return deltas, "tool_calls", len(deltas)


def build_app(script: Script) -> web.Application:
    """The aiohttp application serving `POST /v1/chat/completions`, `GET /v1/models`, `GET /health`."""

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        script.requests.append(body)
        messages = body.get("messages", [])
        model = body.get("model", "scripted")
        if body.get("tools"):
            turn_no = _turn_index(messages)
            turn = script.turns[turn_no] if turn_no < len(script.turns) else {"content": "Done."}
        else:
            turn_no, turn = -1, {"content": "OK."}
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        base = {
            "id": f"chatcmpl-{len(script.requests)}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }
        await response.write(
            _sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
        )
        if script.stall_at_turn is not None and turn_no >= script.stall_at_turn:
            await asyncio.sleep(3600)  # a stalled server: connection open, no tokens
        deltas, finish, n_tokens = _chunks_for_turn(turn, _working_dir(messages), turn_no)
        for delta in deltas:
            await response.write(
                _sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
            )
        await response.write(_sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 1000, "completion_tokens": n_tokens, "total_tokens": 1000 + n_tokens}
            await response.write(_sse({**base, "choices": [], "usage": usage}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        script.served += 1
        script.generated += n_tokens
        return response

    async def metrics(_: web.Request) -> web.Response:
        # the two vLLM counters an arm exports for requests and generated tokens
        text = (
            f'vllm:request_success_total{{finished_reason="stop",model_name="scripted"}} {script.served}\n'
            f'vllm:generation_tokens_total{{model_name="scripted"}} {script.generated}\n'
        )
        return web.Response(text=text)

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "scripted", "object": "model"}]})

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    return app


class ScriptedServer:
    """Runs the scripted server on 127.0.0.1 in a background thread (context manager); `url` ends in /v1."""

    def __init__(self, script: Script, port: int = 0) -> None:
        self.script = script
        self._port = port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _start(self) -> None:
        self._runner = web.AppRunner(build_app(self.script), shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self._port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def __exit__(self, *_: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


def main() -> None:
    parser = argparse.ArgumentParser(description="Scripted OpenAI-compatible model server (a test double).")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--script", type=Path, required=True)
    parser.add_argument("--stall-at-turn", type=int, default=None)
    args = parser.parse_args()
    app = build_app(Script.load(args.script, args.stall_at_turn))
    # a stalled stream must not hold up shutdown (aiohttp waits for open handlers up to this long)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, shutdown_timeout=1.0)


if __name__ == "__main__":
    main()
