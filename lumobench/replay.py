"""Replay execution: carry out a plan (`run_plan`: launch its arm once or afresh per repetition,
record what the server reports in the run metadata) and send every missing (repetition, request) of
its run directory, recording the rows (`execute`).

The paper's protocol is one active request at a time (`concurrency=1`). Each repetition is one or
more segments (a resumed repetition opens a new one); `/metrics` is scraped before and after each
segment. A failed request is recorded and the run continues; a server that is gone aborts the run,
keeping every row written so far: the connection is refused, the launched process exited, or requests
get "unavailable" answers (HTTP 502/503/504) while the health check fails too, or several in a row.
The command line (`lumobench.commands.replay`) only shows what happens, through a `PlanUI`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, Protocol

import httpx

from lumobench.arms import ResolvedArm
from lumobench.client import ServerUnreachable, Target, new_session, send_request
from lumobench.corpus import CorpusRecord
from lumobench.errors import LumobenchError
from lumobench.launch import ArmServer, start_arm
from lumobench.metrics import scrape
from lumobench.plan import Plan
from lumobench.probe import ProbeError, auth_headers, call
from lumobench.results import RequestRow, RunDir, RunMeta, Segment, WriteFailed, missing_keys, now_iso

#: answers that mean "no server to serve this" rather than "this request is bad"
UNAVAILABLE_STATUSES = frozenset({502, 503, 504})
#: unavailable answers in a row that abort the run even while the health check still passes
UNAVAILABLE_IN_A_ROW = 3
#: after a dropped connection, how long a launched server may take to finish exiting: a crashing process
#: closes its sockets one by one, so the next request can still reach its listening socket
SERVER_EXIT_GRACE_S = 0.5


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


@dataclass
class ReplayOutcome:
    status: Literal["finished", "aborted"]
    completed: int
    failed: int
    message: str | None = None


def _next_segment(meta: RunMeta, run_index: int) -> int:
    return 1 + max((s.segment for s in meta.segments if s.run_index == run_index), default=-1)


async def _replay_keys(
    run: RunDir,
    keys: Sequence[tuple[int, str]],
    records: Mapping[str, CorpusRecord],
    seq_of: Mapping[str, int],
    target: Target,
    concurrency: int,
    server_alive: Callable[[], bool] | None,
    progress: ReplayProgress | None,
    probe: httpx.AsyncClient,
) -> tuple[int, int]:
    queue = list(keys)
    counts = {"completed": 0, "failed": 0}
    availability = AvailabilityCheck(probe, target)

    async def check_server(grace_s: float = 0.0) -> None:
        """Abort when the launched server process exited (waiting up to `grace_s` for it to)."""
        if server_alive is None:
            return
        deadline = time.monotonic() + grace_s
        while server_alive():
            if time.monotonic() >= deadline:
                return
            await asyncio.sleep(0.02)
        raise RunAborted("the server process exited during the run")

    async def worker() -> None:
        async with new_session(concurrency, target.request_timeout_s, target.api_key) as session:
            while queue:
                await check_server()
                run_index, rid = queue.pop(0)
                row = await send_request(session, target, records[rid], run_index, seq_of[rid])
                run.append_row(row)
                counts[row.status] += 1
                if progress:
                    progress.row_written(row)
                if row.status == "failed":
                    # a stream cut short (no HTTP error answer): the server may be exiting
                    await check_server(SERVER_EXIT_GRACE_S if row.http_status in (None, 200) else 0.0)
                await availability.after(row)

    tasks = [asyncio.create_task(worker()) for _ in range(max(1, min(concurrency, len(queue))))]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if task.exception():
                raise task.exception()  # type: ignore[misc]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return counts["completed"], counts["failed"]


async def execute(
    run: RunDir,
    meta: RunMeta,
    records: Sequence[CorpusRecord],
    target: Target,
    *,
    concurrency: int = 1,
    server_alive: Callable[[], bool] | None = None,
    progress: ReplayProgress | None = None,
    run_indices: Collection[int] | None = None,
) -> ReplayOutcome:
    """Replay every (repetition, request) of `meta` that has no row in `run` yet.

    `run_indices` restricts this call to those repetitions (one server boot per repetition); the run
    is marked finished once no row is missing. `records` must contain every id of `meta.request_ids`.
    On Ctrl-C (task cancellation) the current segment is marked interrupted and the cancellation
    propagates; rows already written stay.
    """
    try:
        return await _execute(run, meta, records, target, concurrency, server_alive, progress, run_indices)
    except WriteFailed as exc:  # a full disk, a folder made read-only: stop, keeping what is written
        meta.status = "aborted"
        for segment in meta.segments:
            if segment.outcome == "running":
                segment.outcome, segment.finished_at = "aborted", now_iso()
        with contextlib.suppress(WriteFailed):
            run.write_meta(meta)
        rows = run.read_rows()
        done, bad = sum(r.status == "completed" for r in rows), sum(r.status == "failed" for r in rows)
        return ReplayOutcome("aborted", done, bad, str(exc))


async def _execute(
    run: RunDir,
    meta: RunMeta,
    records: Sequence[CorpusRecord],
    target: Target,
    concurrency: int,
    server_alive: Callable[[], bool] | None,
    progress: ReplayProgress | None,
    run_indices: Collection[int] | None,
) -> ReplayOutcome:
    by_id = {r.id: r for r in records}
    seq_of = {rid: i for i, rid in enumerate(meta.request_ids)}
    rows = run.read_rows()
    todo = missing_keys(meta, rows)
    completed = sum(r.status == "completed" for r in rows)
    failed = sum(r.status == "failed" for r in rows)
    meta.status = "running"
    async with httpx.AsyncClient(headers=auth_headers(target.api_key)) as metrics_client:
        for run_index in range(meta.runs) if run_indices is None else sorted(run_indices):
            keys = [k for k in todo if k[0] == run_index]
            if not keys:
                continue
            if progress:
                progress.run_started(run_index, len(meta.request_ids), len(meta.request_ids) - len(keys))
            segment = Segment(
                run_index=run_index, segment=_next_segment(meta, run_index), started_at=now_iso()
            )
            meta.segments.append(segment)
            run.write_meta(meta)
            if (text := await scrape(metrics_client, target.base_url)) is not None:
                run.write_metrics(run_index, segment.segment, "before", text)
            try:
                ok, bad = await _replay_keys(
                    run, keys, by_id, seq_of, target, concurrency, server_alive, progress, metrics_client
                )
            except WriteFailed:
                raise
            except (RunAborted, ServerUnreachable) as exc:
                segment.outcome, segment.finished_at, meta.status = "aborted", now_iso(), "aborted"
                run.write_meta(meta)
                rows = run.read_rows()
                return ReplayOutcome(
                    "aborted",
                    sum(r.status == "completed" for r in rows),
                    sum(r.status == "failed" for r in rows),
                    str(exc),
                )
            except asyncio.CancelledError:
                segment.outcome, segment.finished_at, meta.status = "interrupted", now_iso(), "interrupted"
                run.write_meta(meta)
                raise
            except Exception:  # a bug: still leave a run that --resume can continue
                segment.outcome, segment.finished_at, meta.status = "aborted", now_iso(), "aborted"
                run.write_meta(meta)
                raise
            completed, failed = completed + ok, failed + bad
            if (text := await scrape(metrics_client, target.base_url)) is not None:
                run.write_metrics(run_index, segment.segment, "after", text)
            segment.outcome, segment.finished_at = "finished", now_iso()
            run.write_meta(meta)
    if not missing_keys(meta, run.read_rows()):
        meta.status = "finished"
    run.write_meta(meta)
    return ReplayOutcome("finished", completed, failed)


class PlanUI(Protocol):
    """What `run_plan` tells the person watching: a resumed run, an arm starting, the replay."""

    def resuming(self, run_path: Path, kept_rows: int) -> None: ...
    def arm_starting(self, arm: str, log: Path, waiting_for: str | None) -> None: ...
    def arm_started(self) -> None: ...  # also after a failed start; may be called twice
    def replaying(self, plan: Plan) -> AbstractContextManager[ReplayProgress]: ...


def run_plan(plan: Plan, concurrency: int, ui: PlanUI) -> ReplayOutcome:
    """Launch the plan's arm if there is one (once, or afresh per repetition when the run boots per
    repetition), replay what is missing, stop the arm. Ctrl-C propagates as KeyboardInterrupt."""
    kept = plan.run.prepare_resume()
    if kept:
        ui.resuming(plan.run.path, len(kept))
    if plan.arm is None:
        return _replay(plan, concurrency, None, None, ui)
    if not plan.meta.boot_per_run:
        return _launch_and_replay(plan, plan.arm, concurrency, None, ui)
    pending = sorted({run_index for run_index, _ in missing_keys(plan.meta, plan.run.read_rows())})
    outcome = ReplayOutcome("finished", len(kept), 0)
    for run_index in pending:
        outcome = _launch_and_replay(plan, plan.arm, concurrency, [run_index], ui)
        if outcome.status != "finished":
            break
    return outcome


def _launch_and_replay(
    plan: Plan, arm: ResolvedArm, concurrency: int, run_indices: list[int] | None, ui: PlanUI
) -> ReplayOutcome:
    """Start the plan's arm, record its engine version and served model, replay `run_indices`
    (None: all), stop the arm."""
    log = plan.run.server_log
    ui.arm_starting(arm.name, log, None)
    try:
        server, info = start_arm(arm, log, on_wait=lambda waiting: ui.arm_starting(arm.name, log, waiting))
        try:
            ui.arm_started()
            plan.meta.engine_version, plan.meta.engine_config = info.engine_version, info.engine_config
            plan.meta.model = plan.target.model or info.model
            plan.target = replace(plan.target, model=plan.meta.model)
            plan.run.write_meta(plan.meta)
            return _replay(plan, concurrency, server, run_indices, ui)
        finally:
            server.stop()
    finally:
        ui.arm_started()


def _replay(
    plan: Plan, concurrency: int, server: ArmServer | None, run_indices: list[int] | None, ui: PlanUI
) -> ReplayOutcome:
    alive = None if server is None else (lambda: server.exit_code() is None)
    with ui.replaying(plan) as progress:
        return asyncio.run(
            execute(
                plan.run,
                plan.meta,
                plan.records,
                plan.target,
                concurrency=concurrency,
                server_alive=alive,
                progress=progress,
                run_indices=run_indices,
            )
        )
