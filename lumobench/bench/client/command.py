"""`lumobench bench client`: CPU cost per streamed event and decode-time error of the replay client.

A scripted SSE server (separate process) emits chat chunks at known times and stamps each with its
`time.monotonic_ns()` (one clock for both processes on Linux). For each HTTP transport the client
streams the same response through the production SSE parser and chat recorder and we report:

- CPU µs per event: the client process's CPU time over the stream divided by the number of events;
- the socket floor: the same stream read by a bare blocking `recv` loop that parses nothing (the cost
  of one wake-up per event on this machine, which no client can avoid), and the transport's CPU above it;
- parse-only: the SSE parser + chat recorder fed the same bytes without any I/O;
- decode-time error: |client (t_end − t_first) − server (last stamp − first content stamp)| / server span.

Targets (issue 2): ≤ 10 µs CPU per event, ≤ 0.1 % decode-time error.
"""

from __future__ import annotations

import asyncio
import json
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import aiohttp
import httpx
import typer
from rich.console import Console
from rich.table import Table

from lumobench.bench.output import command_line
from lumobench.client import new_session, stream_into
from lumobench.launch import port_in_use
from lumobench.stream import ChatRecorder

TARGET_CPU_US = 10.0
TARGET_ERROR_PCT = 0.1


class StampedRecorder(ChatRecorder):
    """Chat recorder that also keeps the server's emission stamps of the first output and last event."""

    def __init__(self) -> None:
        super().__init__()
        self.server_first_ns: int | None = None
        self.server_last_ns: int | None = None

    def on_event(self, obj: dict[str, Any], t_ns: int) -> None:
        had_first = self.t_first_ns is not None
        super().on_event(obj, t_ns)
        stamp = obj.get("t_ns")
        if stamp is not None:
            if not had_first and self.t_first_ns is not None:
                self.server_first_ns = stamp
            self.server_last_ns = stamp


@dataclass
class StreamMeasurement:
    events: int
    cpu_us_per_event: float
    decode_error_pct: float
    client_decode_s: float
    server_decode_s: float


def _body(events: int) -> dict[str, Any]:
    return {
        "model": "scripted",
        "messages": [{"role": "user", "content": "bench"}],
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "max_tokens": events,
    }


async def _stream_aiohttp(url: str, body: dict[str, Any], rec: StampedRecorder) -> None:
    async with new_session(1, 60) as session, session.post(url, json=body) as resp:
        await stream_into(resp, rec)


async def _stream_httpx(url: str, body: dict[str, Any], rec: StampedRecorder) -> None:
    async with httpx.AsyncClient(timeout=60) as client, client.stream("POST", url, json=body) as resp:
        async for data in resp.aiter_raw():
            if rec.feed(data, time.monotonic_ns()):
                break


TRANSPORTS = {"aiohttp": _stream_aiohttp, "httpx": _stream_httpx}


def socket_floor(port: int, events: int) -> float:
    """CPU µs per read of a bare blocking recv loop over the same stream (no HTTP or SSE parsing)."""
    body = json.dumps(_body(events)).encode()
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Length: {len(body)}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(head.encode() + body)
        reads, cpu0 = 0, time.process_time_ns()
        while True:
            data = sock.recv(65536)
            reads += 1
            if not data or b"[DONE]" in data:
                break
        return (time.process_time_ns() - cpu0) / 1e3 / reads


def parse_only(events: int) -> float:
    """CPU µs per event of the SSE parser + chat recorder on pre-built vLLM-shaped events (no I/O)."""
    reads = [
        "data: "
        + json.dumps(
            {
                "id": "b",
                "object": "chat.completion.chunk",
                "model": "scripted",
                "choices": [
                    {"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None, "token_ids": [i]}
                ],
                "usage": {"prompt_tokens": 9, "completion_tokens": i + 1, "total_tokens": i + 10},
            }
        )
        + "\n\n"
        for i in range(events)
    ]
    data = [r.encode() for r in reads]
    rec = ChatRecorder()
    cpu0 = time.process_time_ns()
    for i, chunk in enumerate(data):
        rec.feed(chunk, i)
    return (time.process_time_ns() - cpu0) / 1e3 / events


def measure_stream(transport: str, url: str, events: int) -> StreamMeasurement:
    """Stream one response of `events` output events and measure it (client CPU and timing error)."""
    rec = StampedRecorder()
    cpu0 = time.process_time_ns()
    # a whole stream's deadline: the scripted server emits `events` events ~1 ms apart
    asyncio.run(asyncio.wait_for(TRANSPORTS[transport](url, _body(events), rec), 60 + events * 0.05))
    cpu = time.process_time_ns() - cpu0
    if rec.failure() or rec.server_first_ns is None or rec.server_last_ns is None or rec.t_first_ns is None:
        raise RuntimeError(f"{transport}: stream failed: {rec.failure() or 'no stamped events'}")
    assert rec.t_end_ns is not None
    client_s = (rec.t_end_ns - rec.t_first_ns) / 1e9
    server_s = (rec.server_last_ns - rec.server_first_ns) / 1e9
    return StreamMeasurement(
        events=rec.output_chunks,
        cpu_us_per_event=cpu / 1e3 / max(rec.chunks, 1),
        decode_error_pct=abs(client_s - server_s) / server_s * 100,
        client_decode_s=client_s,
        server_decode_s=server_s,
    )


def run_benchmark(events: int, interval_ms: float, repeats: int, port: int) -> dict[str, Any]:
    """Start the scripted server, measure each transport `repeats` times, return a JSON-able summary."""
    if port_in_use("127.0.0.1", port):
        raise typer.BadParameter(f"port {port} is in use", param_hint="--port")
    script = {"tokens": events, "interval_ms": interval_ms, "stamp": True}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(script, fh)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lumobench.bench.client.scripted_server",
            "--port",
            str(port),
            "--script",
            fh.name,
        ]
    )
    try:
        _wait_listening(port)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        floor = statistics.median(socket_floor(port, events) for _ in range(repeats))
        results: dict[str, Any] = {}
        for transport in TRANSPORTS:
            measure_stream(transport, url, 50)  # warm-up: imports, first connection
            runs = [measure_stream(transport, url, events) for _ in range(repeats)]
            cpu = statistics.median(r.cpu_us_per_event for r in runs)
            results[transport] = {
                "cpu_us_per_event_median": cpu,
                "cpu_us_per_event_above_floor": cpu - floor,
                "decode_error_pct_median": statistics.median(r.decode_error_pct for r in runs),
                "decode_error_pct_max": max(r.decode_error_pct for r in runs),
                "runs": [asdict(r) for r in runs],
            }
    finally:
        server.terminate()
        server.wait()
        Path(fh.name).unlink()
    chosen = min(results, key=lambda t: results[t]["cpu_us_per_event_median"])
    return {
        "command": command_line("client"),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "aiohttp": aiohttp.__version__,
            "httpx": httpx.__version__,
        },
        "events_per_stream": events,
        "interval_ms": interval_ms,
        "repeats": repeats,
        "targets": {"cpu_us_per_event": TARGET_CPU_US, "decode_error_pct": TARGET_ERROR_PCT},
        "socket_floor_cpu_us_per_event": floor,
        "parse_only_cpu_us_per_event": parse_only(events),
        "transports": results,
        "lowest_cpu": chosen,
    }


def _wait_listening(port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise RuntimeError(f"scripted server on port {port} did not start")


def client_command(
    events: Annotated[int, typer.Option(help="Output events per measured stream.", min=10)] = 2000,
    interval_ms: Annotated[float, typer.Option(help="Time between events emitted by the server (ms).")] = 1.0,
    repeats: Annotated[int, typer.Option(help="Measured streams per transport.", min=1)] = 5,
    port: Annotated[int, typer.Option(help="Local port for the scripted server.")] = 8599,
    out: Annotated[Path | None, typer.Option(help="Also write the JSON summary here.")] = None,
) -> None:
    """Measure the replay client's CPU per streamed event and its decode-time error (aiohttp vs httpx)."""
    summary = run_benchmark(events, interval_ms, repeats, port)
    table = Table(title=f"client overhead: {events} events at {interval_ms} ms, {repeats} streams each")
    for col in ("transport", "CPU µs/event", "above socket floor", "decode-time error % (median / max)"):
        table.add_column(col)
    for name, res in summary["transports"].items():
        table.add_row(
            name,
            f"{res['cpu_us_per_event_median']:.1f}",
            f"{res['cpu_us_per_event_above_floor']:.1f}",
            f"{res['decode_error_pct_median']:.4f} / {res['decode_error_pct_max']:.4f}",
        )
    table.add_row("socket floor (recv only)", f"{summary['socket_floor_cpu_us_per_event']:.1f}", "0", "")
    table.add_row("parse only (no I/O)", f"{summary['parse_only_cpu_us_per_event']:.1f}", "", "")
    console = Console()
    console.print(table)
    console.print(f"targets: ≤ {TARGET_CPU_US} µs CPU per event, ≤ {TARGET_ERROR_PCT} % decode-time error")
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(summary, indent=2) + "\n")
        typer.echo(f"wrote {out}")
