"""A fault server: a real HTTP/1.1 server that answers every request (any method, any path) without
ever finishing, the ways a broken or hostile server can, so the harness's deadlines can be tested.

It is not an engine and serves no model: it stands for a server that accepted a connection and then
hangs. Modes:
- `comments`: 200, `text/event-stream`, an SSE comment every 20 ms, forever (each read resets a
  per-read timeout);
- `silent`: the status line and headers, then nothing;
- `drip`: 200 with a declared 1 MB JSON body sent one byte every 50 ms;
- `mute`: reads the request and never answers at all.

    with fault_server("comments") as url: ...              # in a thread of this process
    python tests/harness/fault_server.py --port P --mode comments   # as a process (a launched arm)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

MODES = ("comments", "silent", "drip", "mute")


async def _read_request(reader: asyncio.StreamReader) -> bool:
    """Read one request's head and body; False when the client went away."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    if length:
        await reader.readexactly(length)
    return True


async def _answer(mode: str, writer: asyncio.StreamWriter) -> None:
    if mode == "mute":
        await asyncio.Event().wait()
    if mode == "drip":
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n")
        while True:
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(0.05)
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
    await writer.drain()
    if mode == "silent":
        await asyncio.Event().wait()
    while True:
        writer.write(b": keep-alive\n\n")
        await writer.drain()
        await asyncio.sleep(0.02)


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _handler(mode: str) -> Handler:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            if await _read_request(reader):
                await _answer(mode, writer)
        writer.close()

    return handle


async def _serve(sock: socket.socket, mode: str, started: threading.Event | None = None) -> None:
    server = await asyncio.start_server(_handler(mode), sock=sock)
    if started is not None:
        started.set()
    async with server:
        await server.serve_forever()


@contextmanager
def fault_server(mode: str) -> Iterator[str]:
    """Serve `mode` on a free loopback port from a daemon thread; yield the base URL."""
    assert mode in MODES, mode
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    loop = asyncio.new_event_loop()
    started = threading.Event()
    serving = loop.create_task(_serve(sock, mode, started))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    assert started.wait(10), "the fault server did not start"
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:

        async def stop() -> None:
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        assert serving.done()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", choices=MODES, default="comments")
    args = parser.parse_args()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    asyncio.run(_serve(sock, args.mode))


if __name__ == "__main__":
    main()
