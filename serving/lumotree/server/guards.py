"""ASGI guards in front of every route: the Host header check and the request-body size limit.

- Host: a server bound to loopback answers only requests whose `Host` names a loopback address. A
  web page the user visits can make the browser send requests to 127.0.0.1 through a DNS name it
  controls (DNS rebinding); those carry the attacker's name in `Host` and get 403. No CORS headers are
  ever sent, so other sites' scripts cannot read the answers either.
- Body size: a body larger than the limit gets 413, known by its Content-Length or as soon as a
  chunked upload grows past the limit; it never reaches the JSON parser or the tokenizer. The rest
  of the body is read and dropped first, so the client, still sending, gets the answer rather than
  a reset connection. The server's default limit follows its context (`params.RequestLimits`).
- Work per body: each request may hold at most `body_values` JSON values (`protocol.BODY_VALUES`,
  checked before its fields are validated), and after a body of 256 KiB or more the freed memory goes
  back to the system (`memory.release`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from lumotree.server import memory
from lumotree.server.protocol import BODY_VALUES

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: the largest request body a server accepts by default, whatever its context: a long agent prompt with
#: its tools is a few MB
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
#: bodies from this size on leave enough freed memory behind to be worth returning (a 500 KB prompt
#: is ~100k tokens, whose tokenizing took ~160 MB that stayed in the heaps without a release)
RELEASE_AFTER_BYTES = 2**18
LOOPBACK_NAMES = ("localhost", "*.localhost", "127.0.0.1", "::1")


def is_loopback(host: str) -> bool:
    """Whether a bind address or host name is this machine only (127.0.0.0/8, ::1, localhost)."""
    name = host.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def default_allowed_hosts(bind_host: str) -> list[str] | None:
    """Loopback names when bound to loopback; None (any Host) when the server was bound to be reached."""
    return list(LOOPBACK_NAMES) if is_loopback(bind_host) else None


def _host_name(header: str) -> str:
    """The name of a Host header without its port: `[::1]:8000` -> `::1`, `a.b:80` -> `a.b`."""
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def host_allowed(header: str, allowed: Iterable[str]) -> bool:
    """Whether a Host header names one of `allowed` (exact names, `*.suffix` patterns, or `*`)."""
    name = _host_name(header.strip()).lower().rstrip(".")
    for pattern in (p.lower() for p in allowed):
        if pattern in ("*", name) or (pattern.startswith("*.") and name.endswith(pattern[1:])):
            return True
    return False


async def _send_error(send: Send, status: int, message: str, code: str) -> None:
    kind = "permission_error" if status == 403 else "invalid_request_error"
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _drain(receive: Receive, more: bool = True) -> None:
    """Read and drop the rest of a request body."""
    while more:
        message = await receive()
        more = message["type"] == "http.request" and bool(message.get("more_body"))


class RequestGuards:
    """ASGI middleware: Host check (when `allowed_hosts` is not None), then the body size limit, the
    JSON-value limit (`body_values`, None: none) and giving memory back after large bodies."""

    def __init__(
        self,
        app: ASGIApp,
        allowed_hosts: list[str] | None,
        max_body_bytes: int | None,
        body_values: int | None = None,
    ) -> None:
        self.app, self.allowed_hosts, self.max_body_bytes = app, allowed_hosts, max_body_bytes
        self.body_values = body_values

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        size = [0]  # body bytes received

        async def counted() -> Message:
            message = await receive()
            size[0] += len(message.get("body", b""))
            return message

        token = BODY_VALUES.set(self.body_values)
        try:
            await self._guarded(scope, counted, send)
        finally:
            BODY_VALUES.reset(token)
            if size[0] >= RELEASE_AFTER_BYTES:
                await asyncio.to_thread(memory.release)

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host")
        if self.allowed_hosts is not None and host is not None and not host_allowed(host, self.allowed_hosts):
            return await _send_error(
                send,
                403,
                f"Host {host!r} is not allowed: this server is bound to loopback and answers only "
                "loopback names (start it with --allowed-hosts to add names)",
                "host_not_allowed",
            )
        limit = self.max_body_bytes
        if limit is None:
            return await self.app(scope, receive, send)
        too_large = (
            f"the request body is larger than this server's limit of {limit} bytes (--max-request-bytes)"
        )
        declared = headers.get("content-length")
        if declared is not None:  # the HTTP server holds the body to this length
            if declared.isdigit() and int(declared) > limit:
                await _drain(receive)
                return await _send_error(send, 413, too_large, "request_too_large")
            return await self.app(scope, receive, send)
        # a chunked body (no declared length): read it here, up to the limit, then hand it on whole
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away mid-body
            body += message.get("body", b"")
            if len(body) > limit:
                await _drain(receive, bool(message.get("more_body")))
                return await _send_error(send, 413, too_large, "request_too_large")
            if not message.get("more_body"):
                break
        first: Message | None = {"type": "http.request", "body": bytes(body), "more_body": False}

        async def replay_receive() -> Message:
            nonlocal first
            if first is not None:
                message, first = first, None
                return message
            return await receive()

        await self.app(scope, replay_receive, send)
