"""Replay against servers that misbehave (the scripted SSE server, a real HTTP server in another
process): streams that never finish fail their row within the deadline, an unavailable server aborts
the run, a keyed endpoint gets its key and the key never reaches the disk."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from lumobench.errors import LumobenchError
from lumobench.plan import Plan, ReplayArgs, Timeouts, plan_replay
from lumobench.replay import Member, ReplayOutcome, run_group
from lumobench.sse import MAX_LINE_BYTES

from .helpers import scripted_server, small_corpus

HARD_TIMEOUT_S = 60  # a hang fails the test instead of blocking the suite
pytestmark = pytest.mark.timeout(HARD_TIMEOUT_S)


def _plan(tmp_path: Path, url: str, n: int, timeouts: Timeouts, **kw: object) -> Plan:
    corpus = small_corpus(tmp_path, n, max_tokens=6)
    args = ReplayArgs(corpus=corpus, endpoint=url, label="faults", out=tmp_path / "r", timeouts=timeouts)
    (plan,) = plan_replay(replace(args, **kw)).plans  # type: ignore[arg-type]
    return plan


def _replay(plan: Plan) -> ReplayOutcome:
    (outcome,) = run_group([Member(plan)])
    return outcome


def test_streams_that_never_finish_fail_their_rows_within_the_deadline(tmp_path: Path) -> None:
    faults = {"wal-t01": "comments_forever", "wal-t02": "endless_line"}
    with scripted_server(tmp_path, tokens=6, faults=faults) as url:
        plan = _plan(tmp_path, url, 3, Timeouts(silence_s=5, deadline_s=4))
        start = time.monotonic()
        outcome = _replay(plan)
    assert (outcome.status, outcome.completed, outcome.failed) == ("finished", 1, 2)
    assert time.monotonic() - start < 30
    errors = {r.request_id: r.error for r in plan.run.read_rows()}
    # comments reset the silence timer (5 s) forever; the total deadline (4 s) ends the request
    assert errors["wal-t01"] == "no complete response within the request deadline of 4 s"
    assert errors["wal-t02"] == f"an SSE line is longer than {MAX_LINE_BYTES} bytes; the stream was abandoned"
    assert errors["wal-t03"] is None


@pytest.mark.parametrize(
    ("health_stays_ok", "rows", "why"),
    [
        (False, 2, "the server answered HTTP 503 and its health check /health answers HTTP 503"),
        (True, 4, "the server answered HTTP 503 to 3 requests in a row"),
    ],
)
def test_an_unavailable_server_aborts_the_run(
    tmp_path: Path, health_stays_ok: bool, rows: int, why: str
) -> None:
    with scripted_server(tmp_path, tokens=6, unavailable_after=1, health_stays_ok=health_stays_ok) as url:
        plan = _plan(tmp_path, url, 6, Timeouts())
        outcome = _replay(plan)
    assert (outcome.status, outcome.message) == ("aborted", why)
    kept = plan.run.read_rows()
    assert [r.status for r in kept] == ["completed"] + ["failed"] * (rows - 1)
    assert plan.run.read_meta().status == "aborted"  # --resume continues it


def test_a_keyed_endpoint_gets_the_key_from_the_named_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "sk-endpoint-7f3a9c1e5b"
    monkeypatch.setenv("FAULTS_TEST_KEY", key)
    with scripted_server(tmp_path, api_key=key, tokens=6) as url:
        with pytest.raises(LumobenchError, match="it needs an API key: --api-key-env NAME"):
            _plan(tmp_path, url, 2, Timeouts())
        plan = _plan(tmp_path, url, 2, Timeouts(), api_key_env="FAULTS_TEST_KEY")
        outcome = _replay(plan)
    assert (outcome.status, outcome.completed) == ("finished", 2)
    assert plan.run.read_meta().api_key_env == "FAULTS_TEST_KEY"
    assert all(key.encode() not in p.read_bytes() for p in plan.run.path.rglob("*") if p.is_file())


def test_a_server_that_exits_just_after_dropping_a_connection_aborts_at_that_row(tmp_path: Path) -> None:
    # a crashing engine closes its connections a moment before its process has exited: the next
    # request must not be sent (it could still reach the listening socket and fail a second row)
    with scripted_server(tmp_path, tokens=6, faults={"wal-t02": "die"}) as url:
        plan = _plan(tmp_path, url, 4, Timeouts())
        dropped_at: list[float] = []

        def server_alive() -> bool:  # stands for the launched process: exits 0.1 s after the drop
            rows = plan.run.read_rows()
            if not dropped_at and any(r.status == "failed" for r in rows):
                dropped_at.append(time.monotonic())
            return not dropped_at or time.monotonic() < dropped_at[0] + 0.1

        (outcome,) = run_group([Member(plan, server_alive=server_alive)])
    assert (outcome.status, outcome.message) == ("aborted", "the server process exited during the run")
    assert [(r.request_id, r.status) for r in plan.run.read_rows()] == [
        ("wal-t01", "completed"),
        ("wal-t02", "failed"),
    ]
