"""Interleaved replay: every arm up at once, each request sent to every arm in turn, the order rotated.

Arms replayed one after another are measured minutes apart, and a shared machine drifts in between
(single-run ratios of two arms measured 1.50x to 2.35x within one hour on the 2-core VM). Interleaving
sends request j of repetition r to every arm before request j+1, starting with arm (r·n + j) mod k of
the k arms, so drift hits all arms alike and each request's rates pair up (`rates.paired_rate_ratio`).

Each arm keeps its own run directory, exactly as a sequential run writes it (rows, segments, /metrics
snapshots around each repetition, server.log); `run.json`'s `interleaved_with` names the whole group, so
`--resume` on any member continues all of them. Arms that boot per repetition are restarted at every
repetition; the others boot once. Idle arms must not perturb the measured one: before each request the
harness waits until the other arms' process groups are quiet (`proc_cpu.wait_quiet`: no CPU tick in
three consecutive 50 ms windows, at most 2 s), and every row records the CPU seconds the other arms used
while it streamed (`RequestRow.others_cpu_s`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

import aiohttp
import httpx

from lumobench.arms import ResolvedArm, resolve_arm
from lumobench.client import ServerUnreachable, new_session, send_request
from lumobench.errors import LumobenchError
from lumobench.launch import ArmServer, arm_redactor, free_port, port_in_use, start_arm
from lumobench.metrics import scrape
from lumobench.plan import Plan
from lumobench.probe import auth_headers
from lumobench.proc_cpu import group_cpu_seconds, wait_quiet
from lumobench.replay import AvailabilityCheck, ReplayOutcome, ReplayProgress, RunAborted
from lumobench.results import RequestRow, Segment, WriteFailed, missing_keys, now_iso

T = TypeVar("T")
#: memory the interleaved arms may take together, as a share of what the machine has available now
MEMORY_SHARE = 0.85


@dataclass
class Member:
    """One arm of an interleaved group: its plan, its server while it runs, and why it stopped."""

    plan: Plan
    progress: ReplayProgress | None = None
    server: ArmServer | None = None
    dead: str | None = None  # why this arm left the rotation (did not start, server went away)
    todo: set[tuple[int, str]] = field(default_factory=set)

    @property
    def name(self) -> str:
        return self.plan.meta.arm.name

    def pgid(self) -> int | None:
        proc = self.server.proc if self.server else None
        return proc.pid if proc is not None and proc.poll() is None else None


def available_memory_gb() -> float | None:
    """MemAvailable of /proc/meminfo in GiB (None where there is no /proc)."""
    try:
        for line in open("/proc/meminfo"):  # noqa: SIM115 (tiny file, read once)
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        return None
    return None


def choose_mode(
    launched: Sequence[ResolvedArm | None],
    requested: bool | None,
    concurrency: int,
    available_gb: float | None,
) -> tuple[bool, str | None]:
    """(interleave?, one-line note for the user) for the arms of one replay (None: an --endpoint).

    `requested`: --interleaved (True), --sequential (False) or None (interleave when the arms fit the
    machine). A forced --interleaved that cannot work raises `LumobenchError`."""
    if len(launched) < 2:
        if requested:
            raise LumobenchError("--interleaved needs at least two arms")
        return False, None
    if requested is False:
        return False, None
    arms = [a for a in launched if a is not None]
    why_not = None
    ports: dict[str, str] = {}
    for arm in arms:
        if (other := ports.setdefault(arm.base_url, arm.name)) != arm.name:
            why_not = f"arms {other} and {arm.name} both listen on {arm.base_url}"
    if concurrency > 1:
        why_not = f"--concurrency {concurrency}: interleaving sends one request at a time"
    if requested:
        if why_not:
            raise LumobenchError(f"--interleaved: {why_not}")
        return True, "interleaved: every arm up at once, each request sent to every arm in rotated order"
    if why_not is None:
        unknown = [a.name for a in arms if a.config.memory_gb is None]
        gpu = [a.name for a in arms if a.config.requires_gpu]
        need = sum(a.config.memory_gb or 0.0 for a in arms)
        if gpu:
            why_not = f"GPU arms ({', '.join(gpu)}) each size themselves to the whole GPU"
        elif unknown:
            why_not = f"no memory_gb estimate in arm file(s) {', '.join(unknown)}"
        elif available_gb is None or need > MEMORY_SHARE * available_gb:
            have = "unknown" if available_gb is None else f"{available_gb:.1f}"
            why_not = f"the arms need ~{need:.1f} GiB together and {have} GiB is available"
    if why_not:
        return False, f"arms run one after another ({why_not}); --interleaved forces interleaving"
    need = sum(a.config.memory_gb or 0.0 for a in arms)
    return True, (
        f"interleaved: {len(arms)} arms up at once (~{need:.1f} of {available_gb:.1f} GiB available), "
        "each request sent to every arm in rotated order; --sequential runs them one after another"
    )


def rotation(arms: Sequence[T], run_index: int, seq: int, n_requests: int) -> list[T]:
    """The arms in the order request `seq` of repetition `run_index` visits them: the first arm
    advances by one per request, across repetitions too."""
    start = (run_index * n_requests + seq) % len(arms)
    return [*arms[start:], *arms[:start]]


def on_free_port(m: Member, on_note: Callable[[str], None]) -> ResolvedArm:
    """The member's arm, moved to a free port when another process holds its own: on a shared machine a
    busy port must not cost one arm of a long interleaved group (the port used is in run.json)."""
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
    m.plan.meta.arm.config["argv"] = arm_redactor(moved).argv(moved.argv)
    m.plan.target = replace(m.plan.target, base_url=moved.base_url)
    return moved


def _start(
    members: Sequence[Member], on_status: Callable[[str], None], on_note: Callable[[str], None]
) -> None:
    """Boot each member's arm and wait until it is ready, one after another (so each start-up keeps the
    CPU it was timed with); a member that fails to start leaves the rotation with the reason."""
    for m in members:
        m.dead = None
        arm = on_free_port(m, on_note)
        try:
            m.server, info = start_arm(
                arm,
                m.plan.run.server_log,
                on_wait=lambda s, a=arm.name: on_status(f"starting arm {a}: waiting for {s}"),
            )
        except LumobenchError as exc:
            m.dead = str(exc).splitlines()[0]
            on_note(f"arm {arm.name} did not start: {m.dead}")
            continue
        m.plan.meta.engine_version, m.plan.meta.engine_config = info.engine_version, info.engine_config
        m.plan.meta.model = m.plan.target.model or info.model
        m.plan.target = replace(m.plan.target, model=m.plan.meta.model)
        m.plan.run.write_meta(m.plan.meta)


def _stop(members: Sequence[Member]) -> None:
    for m in members:
        if m.server is not None:
            m.server.stop()
            m.server = None


def _open_segment(m: Member, run_index: int) -> Segment:
    meta = m.plan.meta
    segment = Segment(
        run_index=run_index,
        segment=1 + max((s.segment for s in meta.segments if s.run_index == run_index), default=-1),
        started_at=now_iso(),
    )
    meta.segments.append(segment)
    meta.status = "running"
    m.plan.run.write_meta(meta)
    return segment


def _close_segment(m: Member, segment: Segment, outcome: str) -> None:
    segment.outcome, segment.finished_at = outcome, now_iso()  # type: ignore[assignment]
    if outcome in ("aborted", "interrupted"):
        m.plan.meta.status = outcome  # type: ignore[assignment]
    m.plan.run.write_meta(m.plan.meta)


async def _send(
    m: Member,
    session: aiohttp.ClientSession,
    availability: AvailabilityCheck,
    run_index: int,
    rid: str,
    slot: int,
    others: list[int],
) -> RequestRow | None:
    plan = m.plan
    record = next(r for r in plan.records if r.id == rid)
    seq = plan.meta.request_ids.index(rid)
    before = sum(group_cpu_seconds(others).values())
    try:
        row = await send_request(session, plan.target, record, run_index, seq)
    except ServerUnreachable as exc:
        m.dead = str(exc)
        return None
    row.others_cpu_s = round(sum(group_cpu_seconds(others).values()) - before, 3)
    row.slot = slot
    plan.run.append_row(row)
    if m.progress:
        m.progress.row_written(row)
    if row.status == "failed" and m.server is not None and m.server.exit_code() is not None:
        m.dead = f"the server of arm {m.name} exited during the run"
    try:
        await availability.after(row)  # an engine answering 503 to everything went away too
    except RunAborted as exc:
        m.dead = str(exc)
    return row


async def _scrape(m: Member) -> str | None:
    """The member's /metrics (None when it has none or is unreachable), with its API key if it has one."""
    async with httpx.AsyncClient(headers=auth_headers(m.plan.target.api_key)) as client:
        return await scrape(client, m.plan.target.base_url)


async def replay_repetition(members: Sequence[Member], run_index: int, quiet_wait: bool = True) -> None:
    """Send every missing request of repetition `run_index` to every live member, rotating the order.

    Members that go away are marked dead (their segment aborted) and skipped from then on. On Ctrl-C
    (cancellation) the open segments are marked interrupted and the cancellation propagates.
    """
    active = [m for m in members if not m.dead and any(k[0] == run_index for k in m.todo)]
    if not active:
        return
    request_ids = members[0].plan.meta.request_ids
    segments: dict[int, Segment] = {}
    for m in active:
        if m.progress:
            done = len(request_ids) - sum(k[0] == run_index for k in m.todo)
            m.progress.run_started(run_index, len(request_ids), done)
        segments[id(m)] = _open_segment(m, run_index)
        if (text := await _scrape(m)) is not None:
            m.plan.run.write_metrics(run_index, segments[id(m)].segment, "before", text)
    sessions = {id(m): new_session(1, m.plan.target.request_timeout_s, m.plan.target.api_key) for m in active}
    probes = {id(m): httpx.AsyncClient(headers=auth_headers(m.plan.target.api_key)) for m in active}
    checks = {id(m): AvailabilityCheck(probes[id(m)], m.plan.target) for m in active}
    try:
        for seq, rid in enumerate(request_ids):
            for slot, m in enumerate(rotation(members, run_index, seq, len(request_ids))):
                if m.dead or id(m) not in segments or (run_index, rid) not in m.todo:
                    continue
                others = [g for x in members if x is not m and (g := x.pgid()) is not None]
                if quiet_wait:
                    await asyncio.to_thread(wait_quiet, others)
                await _send(m, sessions[id(m)], checks[id(m)], run_index, rid, slot, others)
                m.todo.discard((run_index, rid))
                if m.dead:
                    _close_segment(m, segments.pop(id(m)), "aborted")
    except asyncio.CancelledError:
        for m in active:
            if id(m) in segments:
                _close_segment(m, segments.pop(id(m)), "interrupted")
        raise
    finally:
        for session in sessions.values():
            await session.close()
        for probe in probes.values():
            await probe.aclose()
    for m in active:
        if id(m) not in segments:
            continue
        segment = segments.pop(id(m))
        if (text := await _scrape(m)) is not None:
            m.plan.run.write_metrics(run_index, segment.segment, "after", text)
        _close_segment(m, segment, "finished")


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


def _outcome(m: Member) -> ReplayOutcome:
    rows = m.plan.run.read_rows()
    completed = sum(r.status == "completed" for r in rows)
    failed = sum(r.status == "failed" for r in rows)
    if missing := missing_keys(m.plan.meta, rows):
        why = m.dead or "it did not start or went away in an earlier repetition"
        return ReplayOutcome("aborted", completed, failed, f"{len(missing)} requests not replayed ({why})")
    m.plan.meta.status = "finished"
    try:
        m.plan.run.write_meta(m.plan.meta)
    except WriteFailed as exc:  # every row is in; --resume finds nothing missing and marks it finished
        return ReplayOutcome("aborted", completed, failed, str(exc))
    return ReplayOutcome("finished", completed, failed)


def run_interleaved(
    plans: Sequence[Plan],
    progress_for: Callable[[Plan], ReplayProgress | None],
    on_status: Callable[[str], None],
    on_note: Callable[[str], None],
    quiet_wait: bool = True,
) -> list[ReplayOutcome]:
    """Boot the group's arms, replay every missing (repetition, request) interleaved, stop the arms.

    Arms that boot per repetition get a fresh start (and another chance) at every repetition; the
    others boot once and leave the rotation for good if they go away. Returns one outcome per plan;
    Ctrl-C propagates as KeyboardInterrupt after every server stopped. `on_status`: transient boot
    progress ("" when done); `on_note`: lines to keep (a moved port, an arm that did not start).
    """
    members = [Member(p, progress_for(p)) for p in plans]
    for m in members:
        m.todo = set(missing_keys(m.plan.meta, m.plan.run.read_rows()))
    once = [m for m in members if not m.plan.meta.boot_per_run]
    try:
        _start([m for m in once if m.todo], on_status, on_note)
        for run_index in sorted({k[0] for m in members for k in m.todo}):
            fresh = [m for m in members if m.plan.meta.boot_per_run]
            fresh = [m for m in fresh if any(k[0] == run_index for k in m.todo)]
            try:
                _start(fresh, on_status, on_note)
                on_status("")
                asyncio.run(replay_repetition(members, run_index, quiet_wait))
            except WriteFailed as exc:  # one disk for the whole group: every arm stops, rows kept
                _abort_all(members, str(exc))
                break
            finally:
                _stop(fresh)
    finally:
        _stop(members)
    return [_outcome(m) for m in members]
