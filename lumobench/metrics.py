"""Server metrics: Prometheus text scraped from `/metrics` and vLLM's speculative-decoding counters.

Counter names are vLLM's (the LumoTree engine exports the same): drafts = speculative events,
accepted = accepted draft tokens (the bonus/correction token excluded), and per-position accepted
counts. Deltas are taken between the snapshots before and after each run segment.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

import httpx

from lumobench import probe

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
# LumoTree's phase timers (target forward, drafter, dispatch; the paper's Tables VI and IX), a summary.
PHASE_SUM, PHASE_COUNT = "lumotree:phase_seconds_sum", "lumotree:phase_seconds_count"

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples by metric name: [(labels, value)]. Comments and malformed lines are skipped."""
    out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)].append((dict(_LABEL.findall(m.group(2) or "")), value))
    return out


@dataclass
class SpecCounters:
    """Speculative-decoding counters (summed over models/engines), or their difference."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_pos: dict[int, float] = field(default_factory=dict)

    def __sub__(self, other: SpecCounters) -> SpecCounters:
        positions = set(self.accepted_per_pos) | set(other.accepted_per_pos)
        return SpecCounters(
            self.drafts - other.drafts,
            self.draft_tokens - other.draft_tokens,
            self.accepted - other.accepted,
            {p: self.accepted_per_pos.get(p, 0.0) - other.accepted_per_pos.get(p, 0.0) for p in positions},
        )

    def __add__(self, other: SpecCounters) -> SpecCounters:
        positions = set(self.accepted_per_pos) | set(other.accepted_per_pos)
        return SpecCounters(
            self.drafts + other.drafts,
            self.draft_tokens + other.draft_tokens,
            self.accepted + other.accepted,
            {p: self.accepted_per_pos.get(p, 0.0) + other.accepted_per_pos.get(p, 0.0) for p in positions},
        )

    @property
    def accepted_per_event(self) -> float | None:
        """Δaccepted / Δdrafts: accepted drafts per speculative event (None without events)."""
        return self.accepted / self.drafts if self.drafts > 0 else None

    def per_position_rates(self) -> list[float]:
        """Accepted-at-position-k / drafts, for k = 0, 1, ... (the acceptance curve)."""
        if self.drafts <= 0:
            return []
        return [
            self.accepted_per_pos.get(p, 0.0) / self.drafts
            for p in range(max(self.accepted_per_pos, default=-1) + 1)
        ]


def spec_counters(text: str) -> SpecCounters | None:
    """The spec-decode counters in a /metrics snapshot, or None if the server exports none."""
    samples = parse_prometheus(text)
    if DRAFTS not in samples:
        return None
    per_pos: dict[int, float] = defaultdict(float)
    for labels, value in samples.get(ACCEPTED_PER_POS, []):
        if labels.get("position", "").isdigit():
            per_pos[int(labels["position"])] += value
    return SpecCounters(
        drafts=sum(v for _, v in samples[DRAFTS]),
        draft_tokens=sum(v for _, v in samples.get(DRAFT_TOKENS, [])),
        accepted=sum(v for _, v in samples.get(ACCEPTED, [])),
        accepted_per_pos=dict(per_pos),
    )


def spec_delta(before: str, after: str) -> SpecCounters | None:
    """after − before, or None when either lacks the counters or they went backwards (server restart)."""
    b, a = spec_counters(before), spec_counters(after)
    if a is None or b is None:
        return None
    delta = a - b
    if delta.drafts < 0 or delta.accepted < 0:
        return None
    return delta


def _by_phase(samples: dict[str, list[tuple[dict[str, str], float]]], name: str) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for labels, value in samples.get(name, []):
        if "phase" in labels:
            out[labels["phase"]] += value
    return out


def phase_totals(before: str, after: str) -> dict[str, tuple[float, float]]:
    """Per phase (target, drafter, dispatch, ...): (Δseconds, Δcount) between two snapshots.

    Empty when the server exports no phase timers or the counters went backwards (restart)."""
    b, a = parse_prometheus(before), parse_prometheus(after)
    b_sum, a_sum = _by_phase(b, PHASE_SUM), _by_phase(a, PHASE_SUM)
    b_count, a_count = _by_phase(b, PHASE_COUNT), _by_phase(a, PHASE_COUNT)
    out = {}
    for phase in a_sum.keys() & b_sum.keys():
        seconds, count = a_sum[phase] - b_sum[phase], a_count.get(phase, 0.0) - b_count.get(phase, 0.0)
        if seconds < 0 or count < 0:
            return {}
        out[phase] = (seconds, count)
    return out


async def scrape(client: httpx.AsyncClient, base_url: str) -> str | None:
    """GET /metrics within `probe.SCRAPE_DEADLINE_S`; None when the server has no metrics endpoint, cannot be
    reached or does not answer in time (the run goes on without that snapshot)."""
    try:
        answer = await probe.call(client, "GET", base_url + "/metrics", probe.SCRAPE_DEADLINE_S)
    except probe.ProbeError:
        return None
    return answer.text if answer.status == 200 else None
