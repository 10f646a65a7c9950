"""Every network call of the harness besides the replayed streams has a total deadline: against a fault
server (`fault_server.py`: endless SSE comments, headers then silence, a body dripping one byte at a
time, no answer at all) the endpoint probe, readiness checks, health checks, `/metrics` scrapes and the
agent's context probes end in time, and a replay whose probe fails says so in one line."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from lumobench import probe
from lumobench.agent import driver
from lumobench.agent.counters import snapshot
from lumobench.arms import ArmConfig, resolve_arm
from lumobench.client import Target
from lumobench.errors import LumobenchError
from lumobench.launch import ArmStartError, launched
from lumobench.metrics import scrape
from lumobench.record import RecordingProxy
from lumobench.replay import AvailabilityCheck, RunAborted
from lumobench.results import RequestRow

from .fault_server import MODES, fault_server
from .helpers import free_port, lumobench, small_corpus

FAULT_SERVER = Path(__file__).with_name("fault_server.py")
DEADLINE_S = 1.0


@pytest.fixture
def short_deadlines(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe and scrape deadlines at 1 s, so a test waits seconds rather than the defaults."""
    monkeypatch.setattr(probe, "PROBE_DEADLINE_S", DEADLINE_S)
    monkeypatch.setattr(probe, "SCRAPE_DEADLINE_S", DEADLINE_S)
    monkeypatch.setattr(driver, "TOKENIZE_DEADLINE_S", DEADLINE_S)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", MODES)
def test_a_bounded_call_ends_at_its_deadline_however_the_server_hangs(mode: str) -> None:
    with fault_server(mode) as url:
        start = time.monotonic()
        with pytest.raises(probe.ProbeError, match=f"GET {url}/v1/models: no complete answer within 1 s"):
            probe.call_sync("GET", url + "/v1/models", DEADLINE_S)
        assert DEADLINE_S <= time.monotonic() - start < DEADLINE_S + 2


@pytest.mark.timeout(60)
def test_a_bounded_call_stops_reading_past_its_size_limit() -> None:
    with fault_server("drip") as url, pytest.raises(probe.ProbeError, match="larger than 5 bytes"):
        asyncio.run(_call_with_limit(url, 5))


async def _call_with_limit(url: str, max_bytes: int) -> probe.Answer:
    async with httpx.AsyncClient() as client:
        return await probe.call(client, "GET", url + "/metrics", 30, max_bytes)


@pytest.mark.timeout(90)
def test_replay_against_an_endless_stream_server_fails_its_probe_in_one_line(tmp_path: Path) -> None:
    # the command: the requests had deadlines, the probe's GET /v1/models had none
    corpus = small_corpus(tmp_path, 2)
    with fault_server("comments") as url:
        start = time.monotonic()
        proc = lumobench(
            "replay", corpus, "--endpoint", url + "/v1", "--model", "m", "--request-timeout", "3",
            "--request-deadline", "10", "--out", tmp_path / "results", timeout=60,
        )  # fmt: skip
    elapsed = time.monotonic() - start
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert lines == [
        f"error: cannot reach endpoint {url}: GET {url}/v1/models: no complete answer within "
        f"{probe.PROBE_DEADLINE_S:g} s"
    ]
    assert elapsed < probe.PROBE_DEADLINE_S + 20
    assert not (tmp_path / "results").exists()  # refused before any run directory


@pytest.mark.timeout(60)
def test_readiness_of_an_arm_that_streams_forever_ends_at_its_timeout(tmp_path: Path) -> None:
    config = ArmConfig(
        name="endless",
        engine="fault",
        port=free_port(),
        command=["{python}", str(FAULT_SERVER), "--port", "{port}", "--mode", "comments"],
        readiness={"timeout_s": 2},  # type: ignore[arg-type]
    )
    start = time.monotonic()
    with (
        pytest.raises(ArmStartError, match="was not ready after 2 s"),
        launched(resolve_arm(config), tmp_path / "server.log"),
    ):
        pass
    assert time.monotonic() - start < 2 + probe.PROBE_DEADLINE_S


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("short_deadlines")
def test_health_checks_and_scrapes_end_at_their_deadline() -> None:
    row = RequestRow(
        run_index=0, seq=0, request_id="x", status="failed", http_status=503, t_send_ns=0, started_at=""
    )

    async def check(url: str) -> tuple[str | None, str]:
        async with httpx.AsyncClient() as client:
            scraped = await scrape(client, url)
            with pytest.raises(RunAborted) as aborted:
                await AvailabilityCheck(client, Target(base_url=url)).after(row)
        return scraped, str(aborted.value)

    with fault_server("comments") as url:
        start = time.monotonic()
        scraped, why = asyncio.run(check(url))
        assert snapshot(url) is None  # the agent's counters scrape
    assert scraped is None
    assert why == "the server answered HTTP 503 and its health check /health does not answer"
    assert time.monotonic() - start < 3 * DEADLINE_S + 3


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("short_deadlines")
def test_the_agents_probes_and_the_proxys_tokenize_end_at_their_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import lumobench.record as record

    monkeypatch.setattr(record, "TOKENIZE_DEADLINE_S", DEADLINE_S)
    body = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}'
    with fault_server("silent") as url:
        start = time.monotonic()
        with pytest.raises(LumobenchError, match="cannot read the served model"):
            driver.running_endpoint(url, None)
        served = driver.running_endpoint(url, "m")  # a model given: a silent models list is no error
        assert driver.probe_context(served) == driver.ArmContext(None, False)
        assert asyncio.run(_fit(RecordingProxy(url, None, fit_context=True), body)) == body  # sent unchanged
    assert time.monotonic() - start < 4 * DEADLINE_S + 4


async def _fit(proxy: RecordingProxy, body: bytes) -> bytes:
    await proxy._on_startup(None)  # type: ignore[arg-type]
    try:
        return await proxy._fit(body, {})
    finally:
        await proxy._on_cleanup(None)  # type: ignore[arg-type]
