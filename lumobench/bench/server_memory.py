"""The LumoTree server's memory and event loop under large requests: peak RSS per prompt token, and
/health's longest wait while bodies too big for the context are refused (docs/engine-and-server.md, Server).

    lumobench bench server-memory [--max-model-len 32768] [--out FILE] [-- SERVER ARGS...]
                                        (or python -m lumobench.bench.server_memory)

Starts `python -m lumotree.server` on a free port, resets its peak RSS before each request
(/proc/PID/clear_refs) and reads VmHWM after it; /health is probed from another process (this one is
busy encoding the body) every 50 ms. Prompts are token ids of this checkout's Python sources (served
with max_tokens 1), then a text too long for the context but inside the tokenizing bound (tokenized,
then refused), then the bodies of issue 29.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import httpx
import typer

from lumobench.arms import REPO_ROOT
from lumobench.launch import free_port

PROBE = """
import sys, time, httpx
worst = 0.0
while True:
    start = time.monotonic()
    try:
        httpx.get(sys.argv[1] + "/health", timeout=60)
    except httpx.HTTPError:
        pass
    worst = max(worst, time.monotonic() - start)
    print(f"{worst:.3f}", flush=True)
    time.sleep(0.05)
"""


def _status_mb(pid: int, key: str) -> float:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith(key + ":"))
    return int(line.split()[1]) / 1024


def _measure(base: str, pid: int, path: str, body: bytes) -> dict[str, float | int]:
    """Send one body; the server's peak RSS above its level before, /health's longest wait."""
    prober = subprocess.Popen([sys.executable, "-c", PROBE, base], stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)
    before = _status_mb(pid, "VmRSS")
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak starts again from now
    start = time.monotonic()
    answer = httpx.post(base + path, content=body, headers={"content-type": "application/json"}, timeout=1800)
    took = time.monotonic() - start
    peak = _status_mb(pid, "VmHWM")
    time.sleep(1.0)
    prober.terminate()
    waits = (prober.stdout.read() if prober.stdout else "").split()
    return {
        "http_status": answer.status_code,
        "body_mb": round(len(body) / 1e6, 2),
        "seconds": round(took, 2),
        "rss_before_mb": round(before),
        "peak_above_mb": round(peak - before),
        "rss_after_mb": round(_status_mb(pid, "VmRSS")),
        "health_worst_s": float(waits[-1]) if waits else -1.0,
    }


def run(max_model_len: int, server_args: list[str]) -> list[dict[str, object]]:
    argv = [sys.executable, "-m", "lumotree.server", "--port", str(port := free_port())]
    server = subprocess.Popen(
        [*argv, "--max-model-len", str(max_model_len), *server_args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while not _healthy(base):
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("error: the server did not start")
            time.sleep(0.3)
        httpx.post(base + "/v1/completions", json={"prompt": "def f(x):", "max_tokens": 2}, timeout=600)
        text = "".join(p.read_text() for p in sorted((REPO_ROOT / "lumobench").glob("*.py")))
        ids: list[int] = httpx.post(base + "/tokenize", json={"prompt": text}, timeout=600).json()["tokens"]
        cases: list[tuple[str, str, dict[str, object]]] = [
            (f"{n} prompt tokens", "/v1/completions", {"prompt": ids[:n], "max_tokens": 1})
            for n in (1024, 4096, 16384, max_model_len - 768)
            if n <= len(ids)
        ]
        word = [{"role": "user", "content": "hi"}]
        tools = [{"type": "function", "function": {"name": f"f{i}"}} for i in range(400_000)]
        cases += [
            ("over the context, tokenized", "/v1/completions", {"prompt": "word " * (max_model_len * 10)}),
            ("900k one-word messages", "/v1/chat/completions", {"messages": word * 900_000}),
            ("400k tools", "/v1/chat/completions", {"messages": word, "tools": tools}),
            (
                "10 MB prompt",
                "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "word " * 2**21}]},
            ),
        ]
        out = []
        for name, path, body in cases:
            row = {"case": name, **_measure(base, server.pid, path, json.dumps(body).encode())}
            print(json.dumps(row), flush=True)
            out.append(row)
        return out
    finally:
        server.terminate()
        server.wait(60)


def _healthy(base: str) -> bool:
    try:
        return httpx.get(base + "/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def server_memory_command(
    server_args: Annotated[
        list[str] | None, typer.Argument(help="After --: more `python -m lumotree.server` options.")
    ] = None,
    max_model_len: Annotated[int, typer.Option(min=1, help="The server's context (tokens).")] = 32768,
    out: Annotated[Path | None, typer.Option(help="Also write the rows here (JSON).")] = None,
) -> None:
    """Peak RSS per prompt token and /health's longest wait while large bodies are refused."""
    rows = run(max_model_len, server_args or [])
    if out:
        out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    typer.run(server_memory_command)
