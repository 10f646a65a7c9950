"""Replay execution, one loop for every replay: a group of plans is booted, every missing (repetition,
request) of its run directories is sent, and the arms are stopped (`run_group`). A sequential replay
is a group of one arm at a time; an interleaved replay puts every arm in one group.

Within a repetition, request j goes to every arm of the group before request j+1, starting with arm
(r·n + j) mod k of the k arms (`interleave.rotation`), so a drifting machine moves all arms alike and
each request's rates pair up. Before each request of a group of several, the harness waits until the
other arms' process groups are quiet (`proc_cpu.wait_quiet`) and each row records the CPU seconds they
used while it streamed (`RequestRow.others_cpu_s`) and its place in the rotation (`slot`). A group of
one sends with up to `concurrency` requests in flight (the paper's protocol is one).

Each repetition is a run segment per arm (`RunDir.segment`: run.json and /metrics snapshots around
it). A failed request is recorded and the run goes on; a server that is gone takes its arm out of the
rotation, keeping every row written so far: the connection is refused, the launched process exited,
or requests get "unavailable" answers (HTTP 502/503/504) while the health check fails too, or several
in a row. Arms that boot per repetition are started afresh at every repetition (and get another
chance there); the others boot once. A group of one stops at its first failure, as a sequential run
always has: a start that fails raises, a server that goes away ends the run. The command line
(`lumobench.commands.replay`) only shows what happens, through a `GroupUI`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal, Protocol

import aiohttp
import httpx

from lumobench.arms import ResolvedArm, resolve_arm
from lumobench.client import ServerUnreachable, Target, new_session, send_request
from lumobench.corpus import CorpusRecord
from lumobench.errors import LumobenchError
from lumobench.interleave import rotation
from lumobench.launch import ArmServer, free_port, port_in_use, start_arm
from lumobench.metrics import scrape
from lumobench.plan import Plan
from lumobench.probe import ProbeError, auth_headers, call
from lumobench.proc_cpu import group_cpu_seconds, wait_quiet
from lumobench.redact import Redactor
from lumobench.results import RequestRow, Segment, WriteFailed, missing_keys, now_iso

#: answers that mean "no server to serve this" rather than "this request is bad"
UNAVAILABLE_STATUSES = frozenset({502, 503, 504})
#: unavailable answers in a row that abort the run even while the health check still passes
UNAVAILABLE_IN_A_ROW = 3
#: after a dropped connection, how long a launched server may take to finish exiting: a crashing process
#: closes its sockets one by one, so the next request can still reach its listening socket
SERVER_EXIT_GRACE_S = 0.5
SERVER_EXITED = "the server process exited during the run"


class RunAborted(LumobenchError):
    """The server went away; rows so far are kept and `--resume` continues the run."""


class AvailabilityCheck:
    """Aborts a run whose server answers "unavailable" (HTTP 502/503/504): at once when its health check
    fails too, else after `UNAVAILABLE_IN_A_ROW` such answers in a row. Call `after` with every row."""

    def __init__(self, client: httpx.AsyncClient, target: Target) -> None:
        self.client, self.target, self.in_a_row = client, target, 0

    async def after(self, row: RequestRow) -> None:
        self.in_a_row = self.in_a_row + 1 if row.http_status in UNAVAILABLE_STATUSES else 0
        if not self.in_a_row:
            return
        health = await self._health_status()
        if health != 200:
            raise RunAborted(
                f"the server answered HTTP {row.http_status} and its health check {self.target.health_path} "
                + (f"answers HTTP {health}" if health else "does not answer")
            )
        if self.in_a_row >= UNAVAILABLE_IN_A_ROW:
            raise RunAborted(
                f"the server answered HTTP {row.http_status} to {UNAVAILABLE_IN_A_ROW} requests in a row"
            )

    async def _health_status(self) -> int | None:
        try:
            return (await call(self.client, "GET", self.target.base_url + self.target.health_path)).status
        except ProbeError:
            return None


class ReplayProgress(Protocol):
    def run_started(self, run_index: int, total: int, already_done: int) -> None: ...
    def row_written(self, row: RequestRow) -> None: ...


class GroupUI(Protocol):
    """What `run_group` tells the person watching (each member's progress is its `progress`)."""

    def resuming(self, run_path: Path, kept_rows: int) -> None: ...
    def starting(self, arm: str, log: Path, waiting_for: str | None) -> None: ...
    def started(self) -> None: ...  # also after a failed start
    def note(self, text: str) -> None: ...  # a line to keep: a moved port, an arm that did not start


class QuietUI:
    """A `GroupUI` that shows nothing (tests, benchmarks)."""

    def resuming(self, run_path: Path, kept_rows: int) -> None:
        pass

    def starting(self, arm: str, log: Path, waiting_for: str | None) -> None:
        pass

    def started(self) -> None:
        pass

    def note(self, text: str) -> None:
        pass


@dataclass
class ReplayOutcome:
    status: Literal["finished", "aborted"]
    completed: int
    failed: int
    message: str | None = None


@dataclass
class Member:
    """One arm of a group: its plan, its progress display, its server while it runs, and why it left the
    rotation. `server_alive` stands for the launched process where there is none to watch (tests)."""

    plan: Plan
    progress: ReplayProgress | None = None
    server_alive: Callable[[], bool] | None = None
    server: ArmServer | None = None
    dead: str | None = None  # why this arm left the rotation (did not start, server went away)
    todo: set[tuple[int, str]] = field(default_factory=set)

    def pgid(self) -> int | None:
        proc = self.server.proc if self.server else None
        return proc.pid if proc is not None and proc.poll() is None else None

    def record(self, rid: str) -> tuple[CorpusRecord, int]:
        """The corpus record of request `rid` and its place in the replay order."""
        seq = self.plan.meta.request_ids.index(rid)
        return next(r for r in self.plan.records if r.id == rid), seq

    def _alive(self) -> bool | None:
        """Whether the launched server process still runs (None: no process to watch, an endpoint)."""
        if self.server_alive is not None:
            return self.server_alive()
        return None if self.server is None else self.server.exit_code() is None

    async def exited(self, grace_s: float = 0.0) -> bool:
        """Whether the launched server process exited, waiting up to `grace_s` for it to (never for a
        running endpoint)."""
        deadline = time.monotonic() + grace_s
        while self._alive():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return self._alive() is False


@dataclass
class _Link:
    """A member's connections during one repetition, and its open segment."""

    segment: Segment
    session: aiohttp.ClientSession
    availability: AvailabilityCheck


def on_free_port(m: Member, on_note: Callable[[str], None]) -> ResolvedArm:
    """The member's arm, moved to a free port when another process holds its own: on a shared machine a
    busy port must not cost one arm of a long replay (the port used is in run.json)."""
    arm = m.plan.arm
    assert arm is not None
    port = int(arm.base_url.rsplit(":", 1)[1])
    if not port_in_use(arm.config.host, port):
        return arm
    moved = resolve_arm(
        arm.config, arm.source, port=free_port(arm.config.host), model=arm.model, api_key_env=arm.api_key_env
    )
    on_note(f"arm {arm.name}: port {port} is in use by another process; started on {moved.base_url} instead")
    m.plan.arm, m.plan.meta.endpoint = moved, moved.base_url
    m.plan.meta.arm.config["argv"] = Redactor.for_arm(moved).argv(moved.argv)
    m.plan.target = replace(m.plan.target, base_url=moved.base_url)
    return moved


def _start(members: Sequence[Member], ui: GroupUI, alone: bool) -> None:
    """Boot each member's arm and wait until it is ready, one after another (so each start-up keeps the
    CPU it was timed with), recording what it serves in run.json. In a group of several, a member that
    fails to start leaves the rotation with the reason; alone, the error propagates."""
    for m in members:
        if m.plan.arm is None:  # a running endpoint
            continue
        m.dead = None
        arm = on_free_port(m, ui.note)
        log = m.plan.run.server_log
        ui.starting(arm.name, log, None)
        try:
            m.server, info = start_arm(arm, log, on_wait=partial(ui.starting, arm.name, log))
            m.plan.meta.model = m.plan.target.model or info.model
            m.plan.meta.engine_version, m.plan.meta.engine_config = info.engine_version, info.engine_config
        except LumobenchError as exc:
            if alone:
                raise
            m.dead = str(exc).splitlines()[0]
            ui.note(f"arm {arm.name} did not start: {m.dead}")
            continue
        finally:
            ui.started()
        m.plan.target = replace(m.plan.target, model=m.plan.meta.model)
        m.plan.run.write_meta(m.plan.meta)


def _stop(members: Sequence[Member]) -> None:
    for m in members:
        if m.server is not None:
            m.server.stop()
            m.server = None


async def _send(
    m: Member, link: _Link, run_index: int, rid: str, slot: int | None, others: list[int] | None
) -> None:
    """Send request `rid` to the member and record its row; a member whose server went away is marked
    dead. `slot` and `others` (the other arms' process groups) are given in a group of several."""
    if await m.exited():
        m.dead = SERVER_EXITED
        return
    plan = m.plan
    record, seq = m.record(rid)
    before = sum(group_cpu_seconds(others).values()) if others is not None else 0.0
    try:
        row = await send_request(link.session, plan.target, record, run_index, seq)
    except ServerUnreachable as exc:
        m.dead = str(exc)
        return
    if others is not None:
        row.others_cpu_s = round(sum(group_cpu_seconds(others).values()) - before, 3)
        row.slot = slot
    plan.run.append_row(row)
    if m.progress:
        m.progress.row_written(row)
    # a stream cut short (no HTTP error answer): the server may be exiting
    grace_s = SERVER_EXIT_GRACE_S if row.http_status in (None, 200) else 0.0
    if row.status == "failed" and await m.exited(grace_s):
        m.dead = SERVER_EXITED
        return
    try:
        await link.availability.after(row)  # an engine answering 503 to everything went away too
    except RunAborted as exc:
        m.dead = str(exc)


async def replay_repetition(
    members: Sequence[Member], run_index: int, concurrency: int = 1, quiet_wait: bool = True
) -> None:
    """Send every missing request of repetition `run_index` to every live member, in rotated order.

    Members that go away are marked dead (their segment aborted) and skipped from then on. On Ctrl-C
    (cancellation) the open segments are marked interrupted and the cancellation propagates.
    """
    active = [m for m in members if not m.dead and any(k[0] == run_index for k in m.todo)]
    if not active:
        return
    request_ids = members[0].plan.meta.request_ids
    several = len(members) > 1
    links: dict[int, _Link] = {}
    async with AsyncExitStack() as stack:
        for m in active:
            target = m.plan.target
            if m.progress:
                done = len(request_ids) - sum(k[0] == run_index for k in m.todo)
                m.progress.run_started(run_index, len(request_ids), done)
            probe = await stack.enter_async_context(httpx.AsyncClient(headers=auth_headers(target.api_key)))
            segment = await stack.enter_async_context(
                m.plan.run.segment(m.plan.meta, run_index, partial(scrape, probe, target.base_url))
            )
            session = new_session(concurrency, target.request_timeout_s, target.api_key)
            await stack.enter_async_context(session)
            links[id(m)] = _Link(segment, session, AvailabilityCheck(probe, target))
        jobs = deque(
            (m, rid, slot)
            for seq, rid in enumerate(request_ids)
            for slot, m in enumerate(rotation(members, run_index, seq, len(request_ids)))
            if id(m) in links and (run_index, rid) in m.todo
        )

        async def worker() -> None:
            while jobs:
                m, rid, slot = jobs.popleft()
                if m.dead:
                    continue
                others = [g for x in members if x is not m and (g := x.pgid()) is not None]
                if several and quiet_wait:
                    await asyncio.to_thread(wait_quiet, others)
                link = links[id(m)]
                await _send(m, link, run_index, rid, slot if several else None, others if several else None)
                m.todo.discard((run_index, rid))
                if m.dead and link.segment.outcome == "running":
                    m.plan.run.close_segment(m.plan.meta, link.segment, "aborted")

        await _all_or_none([worker() for _ in range(max(1, min(concurrency, len(jobs))))])


async def _all_or_none(coroutines: list[Coroutine[Any, Any, None]]) -> None:
    """Run the coroutines together; the first that raises cancels the others and its error propagates."""
    tasks = [asyncio.create_task(c) for c in coroutines]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if task.exception():
                raise task.exception()  # type: ignore[misc]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _abort_all(members: Sequence[Member], why: str) -> None:
    """Take every member out of the rotation, marking its open segment aborted where it can be written."""
    for m in members:
        m.dead = m.dead or why
        m.plan.meta.status = "aborted"
        for segment in m.plan.meta.segments:
            if segment.outcome == "running":
                segment.outcome, segment.finished_at = "aborted", now_iso()
        with contextlib.suppress(WriteFailed):
            m.plan.run.write_meta(m.plan.meta)


def _outcome(m: Member, alone: bool) -> ReplayOutcome:
    rows = m.plan.run.read_rows()
    completed = sum(r.status == "completed" for r in rows)
    failed = sum(r.status == "failed" for r in rows)
    missing = missing_keys(m.plan.meta, rows)
    if missing or (alone and m.dead):
        why = m.dead or "it did not start or went away in an earlier repetition"
        return ReplayOutcome(
            "aborted", completed, failed, why if alone else f"{len(missing)} requests not replayed ({why})"
        )
    m.plan.meta.status = "finished"
    try:
        m.plan.run.write_meta(m.plan.meta)
    except WriteFailed as exc:  # every row is in; --resume finds nothing missing and marks it finished
        return ReplayOutcome("aborted", completed, failed, str(exc))
    return ReplayOutcome("finished", completed, failed)


def run_group(
    members: Sequence[Member], ui: GroupUI | None = None, concurrency: int = 1, quiet_wait: bool = True
) -> list[ReplayOutcome]:
    """Boot the group's arms, replay every missing (repetition, request), stop the arms.

    Returns one outcome per member; Ctrl-C propagates as KeyboardInterrupt after every server stopped.
    `concurrency` > 1 is for a group of one. Resumed runs keep their completed rows (`prepare_resume`).
    """
    ui = ui or QuietUI()
    alone = len(members) == 1
    for m in members:
        if kept := m.plan.run.prepare_resume():
            ui.resuming(m.plan.run.path, len(kept))
        m.todo = set(missing_keys(m.plan.meta, m.plan.run.read_rows()))
        if not alone:  # the group, so that --resume on any member continues all of them
            m.plan.meta.interleaved_with = [x.plan.meta.run_id for x in members]
            m.plan.run.write_meta(m.plan.meta)
    try:
        _start([m for m in members if not m.plan.meta.boot_per_run and m.todo], ui, alone)
        for run_index in sorted({k[0] for m in members for k in m.todo}):
            due = {id(m) for m in members for k in m.todo if k[0] == run_index}
            fresh = [m for m in members if m.plan.meta.boot_per_run and id(m) in due]
            try:
                _start(fresh, ui, alone)
                asyncio.run(replay_repetition(members, run_index, concurrency, quiet_wait))
            except WriteFailed as exc:  # one disk for the whole group: every arm stops, rows kept
                _abort_all(members, str(exc))
                break
            finally:
                _stop(fresh)
            if alone and members[0].dead:
                break
    finally:
        _stop(members)
    return [_outcome(m, alone) for m in members]
