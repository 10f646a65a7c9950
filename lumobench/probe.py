"""Bounded HTTP calls: every request the harness makes besides the replayed streams (the endpoint probe,
readiness and health checks, `/metrics` scrapes, the agent's context probe) has a total deadline and a
size limit.

A per-read timeout alone never ends a server that keeps answering without finishing (SSE comments
forever, one byte a second): each read resets it. Here the whole exchange, from connecting to the last
byte, must fit `deadline_s`, and a body may hold at most `max_bytes`; otherwise `ProbeError` says
which call failed and why, in one line.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import httpx

from lumobench.errors import LumobenchError

#: an endpoint probe or health check: a server answers these in milliseconds
PROBE_DEADLINE_S = 10.0
#: a /metrics scrape may wait for one engine cycle (seconds on a loaded CPU)
SCRAPE_DEADLINE_S = 30.0
#: the largest body read: vLLM's /metrics with every histogram is ~100 KB
MAX_BODY_BYTES = 16 * 1024 * 1024


class ProbeError(LumobenchError):
    """A bounded call failed: no connection, no complete answer within its deadline, or too large.
    `why` is the reason alone (the message also names the call)."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where}: {why}")
        self.why = why


@dataclass(frozen=True)
class Answer:
    """A complete HTTP answer: status and body."""

    status: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")

    def json(self) -> Any:
        """The body as JSON (ValueError if it is not)."""
        return json.loads(self.body)


async def call(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    deadline_s: float | None = None,
    max_bytes: int = MAX_BODY_BYTES,
    **kwargs: Any,
) -> Answer:
    """One request with its whole answer read within `deadline_s` (default `PROBE_DEADLINE_S`), at
    most `max_bytes` of body."""
    where = f"{method} {url}"
    deadline_s = PROBE_DEADLINE_S if deadline_s is None else deadline_s
    kwargs.setdefault("timeout", deadline_s)  # httpx's own per-read default (5 s) would cut it shorter
    try:
        async with asyncio.timeout(deadline_s), client.stream(method, url, **kwargs) as resp:
            body = bytearray()
            async for chunk in resp.aiter_bytes():
                body += chunk
                if len(body) > max_bytes:
                    raise ProbeError(where, f"the answer is larger than {max_bytes} bytes")
            return Answer(resp.status_code, bytes(body))
    except TimeoutError:
        raise ProbeError(where, f"no complete answer within {deadline_s:g} s") from None
    except httpx.HTTPError as exc:
        raise ProbeError(where, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from None


def call_sync(
    method: str,
    url: str,
    deadline_s: float | None = None,
    headers: dict[str, str] | None = None,
    **kwargs: Any,
) -> Answer:
    """`call` from synchronous code (not from inside a running event loop)."""

    async def once() -> Answer:
        async with httpx.AsyncClient(headers=headers) as client:
            return await call(client, method, url, deadline_s, **kwargs)

    return asyncio.run(once())
