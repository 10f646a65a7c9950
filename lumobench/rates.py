"""Eq. 5 of the paper (DESIGN §6): pooled decode rate over completed requests, matched sets, bootstrap.

    R = Σ (n_i − 1) / Σ (t_end,i − t_first,i)

over completed requests with n_i ≥ 2, pooled across requests and repetitions. The first token is
excluded from the numerator because its time (first-output latency) is excluded from the denominator.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from lumobench.results import RequestRow


@dataclass(frozen=True)
class Pooled:
    tokens: int  # Σ (n − 1)
    seconds: float  # Σ (t_end − t_first)
    requests: int  # rows that entered the sum

    @property
    def rate(self) -> float | None:
        """Tokens per second, or None when nothing qualified."""
        return self.tokens / self.seconds if self.seconds > 0 else None


def eligible(rows: Iterable[RequestRow]) -> list[RequestRow]:
    """Rows that enter Eq. 5: completed, n ≥ 2, both timestamps present."""
    return [
        r
        for r in rows
        if r.status == "completed"
        and r.completion_tokens is not None
        and r.completion_tokens >= 2
        and r.t_first_ns is not None
        and r.t_end_ns is not None
    ]


def pooled(rows: Iterable[RequestRow]) -> Pooled:
    """Eq. 5 totals over the eligible rows among `rows`."""
    good = eligible(rows)
    tokens = sum(r.completion_tokens - 1 for r in good)  # type: ignore[operator]
    ns = sum(r.t_end_ns - r.t_first_ns for r in good)  # type: ignore[operator]
    return Pooled(tokens, ns / 1e9, len(good))


def run_rates(rows: Iterable[RequestRow], runs: int) -> list[float | None]:
    """Eq. 5 within each repetition 0..runs-1."""
    by_run: dict[int, list[RequestRow]] = defaultdict(list)
    for r in rows:
        by_run[r.run_index].append(r)
    return [pooled(by_run[i]).rate for i in range(runs)]


def completed_everywhere(rows: Iterable[RequestRow], request_ids: Sequence[str], runs: int) -> set[str]:
    """Request ids whose every repetition 0..runs-1 has a completed row."""
    done = {(r.run_index, r.request_id) for r in rows if r.status == "completed"}
    return {rid for rid in request_ids if all((i, rid) in done for i in range(runs))}


def matched_ids(arms: Mapping[str, tuple[Sequence[RequestRow], Sequence[str], int]]) -> set[str]:
    """The matched set: request ids completed in every repetition of every compared arm.

    `arms`: name -> (rows, request ids of that run, number of repetitions).
    """
    sets = [completed_everywhere(rows, ids, runs) for rows, ids, runs in arms.values()]
    return set.intersection(*sets) if sets else set()


def request_totals(rows: Iterable[RequestRow]) -> dict[str, tuple[int, int]]:
    """Per request id over its eligible rows (all repetitions together): (Σ (n − 1), Σ decode ns)."""
    totals: dict[str, tuple[int, int]] = {}
    for r in eligible(rows):
        tokens, ns = totals.get(r.request_id, (0, 0))
        totals[r.request_id] = (tokens + r.completion_tokens - 1, ns + r.t_end_ns - r.t_first_ns)  # type: ignore[operator]
    return totals


def _percentiles(stats: list[float], level: float) -> tuple[float, float]:
    stats.sort()
    n = len(stats)
    return stats[int((1 - level) / 2 * (n - 1))], stats[int((1 + level) / 2 * (n - 1))]


def _rate(totals: Sequence[tuple[int, int]]) -> float:
    ns = sum(d for _, d in totals)
    return sum(t for t, _ in totals) / (ns / 1e9) if ns > 0 else 0.0


def bootstrap_ci(
    rows: Sequence[RequestRow], resamples: int = 2000, level: float = 0.95, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile interval of the pooled rate, resampling requests (all repetitions of a request move
    together, since they share a prompt). None with fewer than two requests."""
    totals = list(request_totals(rows).values())
    if len(totals) < 2:
        return None
    rng = random.Random(seed)
    return _percentiles([_rate(rng.choices(totals, k=len(totals))) for _ in range(resamples)], level)


def paired_bootstrap_ratio(
    base: Sequence[RequestRow],
    rows: Sequence[RequestRow],
    resamples: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float] | None:
    """Percentile interval of pooled rate(rows) / pooled rate(base), resampling request ids that are
    eligible in both: one draw picks the same requests for both arms (a paired bootstrap), so the
    prompts' own spread cancels out of the ratio. None with fewer than two shared requests."""
    a, b = request_totals(rows), request_totals(base)
    ids = sorted(a.keys() & b.keys())
    if len(ids) < 2:
        return None
    rng = random.Random(seed)
    stats = []
    for _ in range(resamples):
        pick = rng.choices(ids, k=len(ids))
        base_rate = _rate([b[i] for i in pick])
        stats.append(_rate([a[i] for i in pick]) / base_rate if base_rate > 0 else 0.0)
    return _percentiles(stats, level)
