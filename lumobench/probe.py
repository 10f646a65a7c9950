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
import contextlib
import json
from dataclasses import dataclass, field
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


def auth_headers(api_key: str | None) -> dict[str, str]:
    """`Authorization: Bearer KEY` for a server that wants an API key (none without one)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


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


@dataclass(frozen=True)
class EndpointInfo:
    """What a running server says about itself: the cards of its models list (`/v1/models`) and, where
    it has `/version`, its engine version and configuration (LumoTree: drafter, kernels, tree shape)."""

    cards: tuple[dict[str, Any], ...] = ()
    engine_version: str | None = None
    engine_config: dict[str, Any] = field(default_factory=dict)

    @property
    def model(self) -> str | None:
        """The first served model id (None when the list is empty)."""
        return self.cards[0]["id"] if self.cards else None

    def max_model_len(self, model: str | None = None) -> int | None:
        """The context window the list gives for `model` (else for its first model), as vLLM and
        LumoTree list it; None when it says nothing."""
        card = next((c for c in self.cards if c["id"] == model), self.cards[0] if self.cards else {})
        context = card.get("max_model_len")
        return context if isinstance(context, int) and not isinstance(context, bool) else None


def model_cards(models: Answer) -> tuple[dict[str, Any], ...]:
    """The cards of a `/v1/models` answer that carry a string id, in order (() for any other body)."""
    try:
        data = models.json()["data"] if models.status == 200 else []
    except (ValueError, KeyError, TypeError):
        return ()
    if not isinstance(data, list):
        return ()
    return tuple(c for c in data if isinstance(c, dict) and isinstance(c.get("id"), str))


def probe_endpoint(base_url: str, api_key: str | None = None) -> EndpointInfo:
    """Ask a running server what it serves (`/v1/models`) and runs (`/version`); raises `LumobenchError`
    in one line when it cannot be reached, refuses the key, or does not answer within the deadline."""
    headers = auth_headers(api_key)
    try:
        models = call_sync("GET", base_url + "/v1/models", headers=headers)
        if models.status in (401, 403):
            raise LumobenchError(
                f"endpoint {base_url} refused the models list (HTTP {models.status}): "
                + ("a wrong API key?" if api_key else "it needs an API key: --api-key-env NAME")
            )
        version = call_sync("GET", base_url + "/version", headers=headers)
    except ProbeError as exc:
        raise LumobenchError(f"cannot reach endpoint {base_url}: {exc}") from None
    body: object = {}
    if version.status == 200:
        with contextlib.suppress(ValueError):
            body = version.json()
    engine = body.get("version") if isinstance(body, dict) else None
    config = body.get("engine") if isinstance(body, dict) else None
    return EndpointInfo(
        model_cards(models),
        engine if isinstance(engine, str) else None,
        config if isinstance(config, dict) else {},
    )
