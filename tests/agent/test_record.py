"""The recording proxy: byte-for-byte streaming with sub-millisecond added latency, corpus records with
source metadata that `corpus check` accepts, usage counting, and a transparent unreachable upstream."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

import httpx
import pytest
from aiohttp import web

from lumobench.corpus import check_corpus
from lumobench.record import BackgroundProxy, ProxiedRequest, RecordingProxy

from .conftest import free_port
from .scripted_server import Script, ScriptedServer

N_EVENTS, SPACING_S = 60, 0.01


class BackgroundChatServer:
    """A test server on its own event loop thread whose /v1/chat/completions is `chat`."""

    handler_cancellation = False

    def __init__(self) -> None:
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        runner = web.AppRunner(app, handler_cancellation=self.handler_cancellation)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()


class TimedSSEServer(BackgroundChatServer):
    """A test SSE server: each event carries the perf_counter_ns at which it was written; it keeps the
    exact bytes it sent per request."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        super().__init__()

    async def chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        sent = bytearray()
        for i in range(N_EVENTS):
            delta = {
                "choices": [{"index": 0, "delta": {"content": f"t{i} "}}],
                "sent_ns": time.perf_counter_ns(),
            }
            event = b"data: " + json.dumps(delta).encode() + b"\n\n"
            await response.write(event)
            sent += event
            await asyncio.sleep(SPACING_S)
        usage = b'data: {"choices": [], "usage": {"completion_tokens": 60}}\n\ndata: [DONE]\n\n'
        await response.write(usage)
        self.sent.append(bytes(sent + usage))
        return response


def _stream(url: str) -> tuple[bytes, list[float]]:
    """Raw bytes of one streamed response and each event's delay (ms) from its send to its arrival."""
    raw, delays, pending = bytearray(), [], b""
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.stream("POST", url + "/chat/completions", json=body, timeout=30) as response:
        for chunk in response.iter_raw():
            now = time.perf_counter_ns()
            raw += chunk
            pending += chunk
            *events, pending = pending.split(b"\n\n")
            for event in events:
                payload = json.loads(event[6:]) if event.startswith(b"data: {") else {}
                if "sent_ns" in payload:
                    delays.append((now - payload["sent_ns"]) / 1e6)
    return bytes(raw), delays


def _wait_listening(port: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError("the recording proxy did not start listening")


def test_stream_passes_through_byte_for_byte_adding_under_a_millisecond(tmp_path):
    server = TimedSSEServer()
    port = free_port()
    corpus = tmp_path / "c.jsonl"
    proxy = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lumobench.cli",
            "record",
            "--upstream",
            f"http://127.0.0.1:{server.port}",
            "--out",
            str(corpus),
            "--port",
            str(port),
            "--task",
            "latency",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_listening(port, proxy)
        direct_delays, proxied_delays = [], []
        for _ in range(2):  # interleaved, so machine load hits both alike
            direct_raw, delays = _stream(f"http://127.0.0.1:{server.port}/v1")
            direct_delays += delays
            proxied_raw, delays = _stream(f"http://127.0.0.1:{port}/v1")
            proxied_delays += delays
            assert proxied_raw == server.sent[-1] and direct_raw == server.sent[-2]
    finally:
        proxy.send_signal(signal.SIGINT)
        _, stderr = proxy.communicate(timeout=30)
    assert len(proxied_delays) == 2 * N_EVENTS
    added_ms = statistics.median(proxied_delays) - statistics.median(direct_delays)
    print(
        f"median delay direct {statistics.median(direct_delays):.3f} ms, added by the proxy {added_ms:.3f} ms"
    )
    assert added_ms <= 1.0, f"median added latency {added_ms:.3f} ms per event"
    assert "recorded 2 requests" in stderr
    records, issues = check_corpus(corpus)
    assert issues == [] and [r.source.task for r in records] == ["latency", "latency"]


def _chat(url: str, messages: list[dict], **extra: object) -> httpx.Response:
    body = {
        "model": "scripted",
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}],
        **extra,
    }
    return httpx.post(url + "/chat/completions", json=body, timeout=30)


def test_records_carry_task_conversation_and_turn_and_pass_corpus_check(tmp_path):
    corpus = tmp_path / "captured.jsonl"
    first = [{"role": "system", "content": "agent A"}, {"role": "user", "content": "task one"}]
    second = [{"role": "system", "content": "sub-agent"}, {"role": "user", "content": "look around"}]
    with ScriptedServer(Script(turns=[{"content": "ok"}])) as server:
        proxy = RecordingProxy(server.url, corpus, task="t1", run=1)
        with BackgroundProxy(proxy) as background:
            assert _chat(
                background.url, first, temperature=0.6, top_k=20, chat_template_kwargs={"x": 1}
            ).is_success
            assert _chat(
                background.url,
                [*first, {"role": "assistant", "content": "hm"}, {"role": "user", "content": "go on"}],
            ).is_success
            assert _chat(background.url, second).is_success
            # a request the corpus schema rejects (tool result answering no call) is kept aside
            assert _chat(
                background.url, [*first, {"role": "tool", "tool_call_id": "nope", "content": "x"}]
            ).is_success
            assert httpx.get(background.url + "/models").json()["data"][0]["id"] == "scripted"
            counts = proxy.take_counts()
    records, issues = check_corpus(corpus)
    assert issues == []
    assert [r.id for r in records] == ["t1-00001", "t1-00002", "t1-00003"]
    assert [(r.source.task, r.source.turn) for r in records] == [("t1", 0), ("t1", 1), ("t1", 0)]
    assert records[0].source.conversation == records[1].source.conversation != records[2].source.conversation
    assert (records[0].temperature, records[0].top_k, records[0].extra_body) == (
        0.6,
        20,
        {"chat_template_kwargs": {"x": 1}},
    )
    raw = json.loads(corpus.read_text().splitlines()[0])
    assert not {"model", "stream", "stream_options"} & set(raw)
    rejected = [
        json.loads(line) for line in (tmp_path / "captured.jsonl.rejected.jsonl").read_text().splitlines()
    ]
    assert len(rejected) == 1 and "tool_call_id" in rejected[0]["error"]
    assert (counts.requests, counts.without_usage, counts.completion_tokens) == (4, 0, 4)

    # a new proxy on the same corpus continues ids and turn counts
    with (
        ScriptedServer(Script(turns=[{"content": "ok"}])) as server,
        BackgroundProxy(RecordingProxy(server.url, corpus, task="t1", run=1)) as background,
    ):
        _chat(background.url, first)
    records, _ = check_corpus(corpus)
    assert (records[-1].id, records[-1].source.turn) == ("t1-00004", 2)


def test_unreachable_upstream_drops_the_connection_and_records_nothing(tmp_path):
    corpus = tmp_path / "c.jsonl"
    proxy = RecordingProxy(f"http://127.0.0.1:{free_port()}", corpus)
    with BackgroundProxy(proxy) as background, pytest.raises(httpx.RemoteProtocolError):
        _chat(background.url, [{"role": "user", "content": "hi"}])
    assert not corpus.exists()


def test_request_log_times_every_chat_request_in_order(tmp_path):
    log = tmp_path / "requests.jsonl"
    messages = [{"role": "user", "content": "hi"}]
    with ScriptedServer(Script(turns=[{"content": "ok"}])) as server:
        proxy = RecordingProxy(server.url, None, task="t1", run=2)
        proxy.request_log = log
        with BackgroundProxy(proxy) as background:
            before = time.time()
            assert _chat(background.url, messages).is_success
            assert _chat(background.url, messages, max_tokens=1).is_success
            assert httpx.get(background.url + "/models").is_success  # not a chat request: not logged
            after = time.time()
    rows = [ProxiedRequest.model_validate_json(line) for line in log.read_text().splitlines()]
    assert [(r.task, r.run, r.http_status, r.completion_tokens) for r in rows] == [("t1", 2, 200, 1)] * 2
    for r in rows:
        assert before <= r.sent_s <= r.first_byte_s <= r.end_s <= after  # type: ignore[operator]
    assert rows[0].end_s <= rows[1].sent_s


class StallingUpstream(BackgroundChatServer):
    """A test upstream that answers a chat request with headers, then stays silent (a long prefill, or a
    request queued behind another); it notes when the request's connection is gone."""

    handler_cancellation = True  # the server cancels a handler whose client went away

    def __init__(self) -> None:
        self.started = threading.Event()
        self.gone = threading.Event()
        super().__init__()

    async def chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        self.started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.gone.set()
            raise
        return response


def test_a_client_that_goes_away_takes_its_upstream_request_with_it(tmp_path):
    upstream = StallingUpstream()
    with BackgroundProxy(RecordingProxy(f"http://127.0.0.1:{upstream.port}", None)) as background:
        body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
        with httpx.stream("POST", background.url + "/chat/completions", json=body, timeout=30):
            assert upstream.started.wait(10)
        # the agent gave up (its request timeout, Ctrl-C): the upstream must not keep working for nobody
        assert upstream.gone.wait(5), "the proxy kept the abandoned upstream request open"


@pytest.mark.integration
def test_max_tokens_is_fitted_into_the_context_of_the_real_engine(live_url: str, tmp_path):
    messages = [{"role": "user", "content": "Write a haiku about write-ahead logs."}]
    prompt = httpx.post(live_url + "/tokenize", json={"messages": messages}).json()
    body = {"messages": messages, "max_tokens": 24000, "temperature": 0, "stop": ["\n"]}
    direct = httpx.post(live_url + "/v1/chat/completions", json=body, timeout=60)
    assert direct.status_code == 400 and direct.json()["error"]["code"] == "context_length_exceeded"
    corpus = tmp_path / "captured.jsonl"
    proxy = RecordingProxy(live_url, corpus, fit_context=True)
    with BackgroundProxy(proxy) as background:
        fitted = httpx.post(background.url + "/chat/completions", json=body, timeout=120)
    assert fitted.status_code == 200, fitted.text
    assert proxy.take_counts().capped == 1
    [captured] = check_corpus(corpus)[0]
    # what the engine received: the room the prompt leaves in its context
    assert captured.max_tokens == prompt["max_model_len"] - prompt["count"]


STOP_MID_STREAM = """
import asyncio, threading, httpx
from aiohttp import web
from lumobench.record import BackgroundProxy, RecordingProxy

started = threading.Event()

async def chat(request):
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    started.set()
    await asyncio.sleep(60)  # a long prefill
    return response

async def serve():
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner.addresses[0][1]

loop = asyncio.new_event_loop()
threading.Thread(target=loop.run_forever, daemon=True).start()
port = asyncio.run_coroutine_threadsafe(serve(), loop).result(10)
client = httpx.Client(timeout=30)
with BackgroundProxy(RecordingProxy(f"http://127.0.0.1:{port}", None)) as proxy:
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    with client.stream("POST", proxy.url + "/chat/completions", json=body):
        assert started.wait(10)
    # the agent is gone (killed), its upstream request still runs, then the proxy stops
print("proxy stopped mid-stream")
"""


def test_stopping_the_proxy_mid_stream_leaves_no_pending_task():
    # what Ctrl-C during an agent's request does: the agent is killed, then the background proxy stops
    proc = subprocess.run([sys.executable, "-c", STOP_MID_STREAM], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "proxy stopped mid-stream" in proc.stdout, proc.stderr
    assert "Task was destroyed but it is pending" not in proc.stderr, proc.stderr
