"""Interleaving: whether the arms of one replay run all up at once (`choose_mode`), and the order in
which each request visits them (`rotation`); the loop that does it is `lumobench.replay.run_group`.

Arms replayed one after another are measured minutes apart, and a shared machine drifts in between
(single-run ratios of two arms measured 1.50x to 2.35x within one hour on the 2-core VM). Interleaving
sends request j of repetition r to every arm before request j+1, starting with arm (r·n + j) mod k of
the k arms, so drift hits all arms alike and each request's rates pair up (`rates.paired_rate_ratio`).

Each arm keeps its own run directory, exactly as a sequential run writes it (rows, segments, /metrics
snapshots around each repetition, server.log); `run.json`'s `interleaved_with` names the whole group, so
`--resume` on any member continues all of them. Idle arms must not perturb the measured one: before
each request the harness waits until the other arms' process groups are quiet (`proc_cpu.wait_quiet`:
no CPU tick in three consecutive 50 ms windows, at most 2 s), and every row records the CPU seconds the
other arms used while it streamed (`RequestRow.others_cpu_s`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from lumobench.arms import ResolvedArm
from lumobench.errors import LumobenchError

T = TypeVar("T")
#: memory the interleaved arms may take together, as a share of what the machine has available now
MEMORY_SHARE = 0.85


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
