"""Replay run directories as pandas DataFrames, built from the same functions as `lumobench report`.

`load_replay(paths)` gives the report's `ArmReport`s (so every number equals `--format json`) and:

- `arms`: one row per arm (run directory): the report's fields, intervals split into low/high columns;
- `requests`: one row per request row (repetition × request) with its TTFT, decode time, Eq. 5 rate;
- `segments`: one row per metrics segment (before/after `/metrics` snapshots): counter and span deltas;
- `chunks`: one row per output chunk with the completion tokens it carried;
- `acceptance`: per arm and draft depth, the share of speculative events that accepted that depth;
- `accepted_lengths`: per arm, the distribution of accepted drafts per speculative event.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lumobench.metrics import phase_totals, spec_delta
from lumobench.rates import eligible, matched_ids
from lumobench.reports.summary import ArmReport, build_report, load_run
from lumobench.results import RequestRow, RunDir, RunMeta

PHASES = ("target", "drafter", "dispatch")  # the spans of the paper's Tables III/IX
REQUEST_COLUMNS = [
    "arm",
    "run_index",
    "seq",
    "request_id",
    "status",
    "matched",
    "eligible",
    "prompt_tokens",
    "completion_tokens",
    "ttft_s",
    "decode_s",
    "e2e_s",
    "tokens_per_s",
    "output_chunks",
    "finish_reason",
]


@dataclass(frozen=True)
class ReplayData:
    reports: list[ArmReport]
    arms: pd.DataFrame
    requests: pd.DataFrame
    segments: pd.DataFrame
    chunks: pd.DataFrame
    acceptance: pd.DataFrame
    accepted_lengths: pd.DataFrame
    metas: list[RunMeta]

    @property
    def arm_names(self) -> list[str]:
        return [r.arm for r in self.reports]


def _pair(value: tuple[float, float] | None) -> tuple[float | None, float | None]:
    return value if value is not None else (None, None)


def arms_frame(reports: Sequence[ArmReport]) -> pd.DataFrame:
    """One row per arm: the report's scalar fields, CIs and per-run range as columns, spans by phase."""
    rows = []
    for rep in reports:
        known = [r for r in rep.run_rates if r is not None]
        ci_low, ci_high = _pair(rep.pooled_ci95)
        ratio_low, ratio_high = _pair(rep.ratio_ci95)
        rows.append(
            {
                "arm": rep.arm,
                "runs": rep.runs,
                "completed": rep.completed,
                "failed": rep.failed,
                "matched": rep.matched,
                "pooled_tokens_per_s": rep.pooled_tokens_per_s,
                "ci95_low": ci_low,
                "ci95_high": ci_high,
                "run_rate_min": min(known, default=None),
                "run_rate_max": max(known, default=None),
                "ratio_vs_first": rep.ratio_vs_first,
                "ratio_ci95_low": ratio_low,
                "ratio_ci95_high": ratio_high,
                "accepted_per_event": rep.accepted_per_event,
                "tokens_per_chunk": rep.tokens_per_chunk,
                "same_output": rep.same_output,
                "same_output_compared": rep.same_output_compared,
                **{f"{p}_ms": rep.phase_ms.get(p) for p in PHASES},
            }
        )
    return pd.DataFrame(rows)


def _request_record(arm: str, row: RequestRow, matched: bool, is_eligible: bool) -> dict:
    decode = row.decode_s
    n = row.completion_tokens
    return {
        "arm": arm,
        "run_index": row.run_index,
        "seq": row.seq,
        "request_id": row.request_id,
        "status": row.status,
        "matched": matched,
        "eligible": is_eligible,  # enters Eq. 5 (completed, n >= 2, timed)
        "prompt_tokens": row.prompt_tokens,
        "completion_tokens": n,
        "ttft_s": None if row.t_first_ns is None else (row.t_first_ns - row.t_send_ns) / 1e9,
        "decode_s": decode,
        "e2e_s": None if row.t_end_ns is None else (row.t_end_ns - row.t_send_ns) / 1e9,
        "tokens_per_s": (n - 1) / decode if is_eligible and decode else None,  # type: ignore[operator]
        "output_chunks": row.output_chunks,
        "finish_reason": row.finish_reason,
    }


def requests_frame(arm: str, rows: Sequence[RequestRow], matched: set[str]) -> pd.DataFrame:
    """One row per request row of one arm; `tokens_per_s` is the request's own Eq. 5 rate."""
    good = {id(r) for r in eligible(rows)}
    records = [_request_record(arm, r, r.request_id in matched, id(r) in good) for r in rows]
    return pd.DataFrame(records, columns=REQUEST_COLUMNS)


def segments_frame(arm: str, run: RunDir) -> pd.DataFrame:
    """One row per metrics segment: speculative counter deltas and per-phase span deltas."""
    records = []
    for run_index, segment, before, after in run.metric_segments():
        spec = spec_delta(before, after)
        record = {
            "arm": arm,
            "run_index": run_index,
            "segment": segment,
            "drafts": spec.drafts if spec else None,
            "draft_tokens": spec.draft_tokens if spec else None,
            "accepted": spec.accepted if spec else None,
            "accepted_per_event": spec.accepted_per_event if spec else None,
        }
        for phase, (seconds, count) in phase_totals(before, after).items():
            record[f"{phase}_s"], record[f"{phase}_count"] = seconds, count
        records.append(record)
    return pd.DataFrame(records)


def chunks_frame(arm: str, rows: Sequence[RequestRow]) -> pd.DataFrame:
    """Completion tokens carried by each output chunk of the completed rows that report per-chunk
    counts (differences of the cumulative `chunk_tokens`)."""
    records = []
    for row in rows:
        if row.status != "completed" or not row.chunk_tokens:
            continue
        previous = 0
        for index, cumulative in enumerate(row.chunk_tokens):
            records.append(
                {
                    "arm": arm,
                    "run_index": row.run_index,
                    "request_id": row.request_id,
                    "chunk": index,
                    "tokens": cumulative - previous,
                }
            )
            previous = cumulative
    return pd.DataFrame(records, columns=["arm", "run_index", "request_id", "chunk", "tokens"])


def acceptance_frame(reports: Sequence[ArmReport]) -> pd.DataFrame:
    """Per arm with speculation and draft depth k (1-based): events that accepted a draft at depth k,
    over all events (the report's `per_position_acceptance`)."""
    records = [
        {"arm": rep.arm, "depth": k + 1, "share_of_events": rate}
        for rep in reports
        for k, rate in enumerate(rep.per_position_acceptance)
    ]
    return pd.DataFrame(records, columns=["arm", "depth", "share_of_events"])


def accepted_length_shares(per_position: Sequence[float]) -> list[float]:
    """Share of speculative events that accepted exactly L = 0, 1, ..., K drafts, from the shares r_k of
    events that accepted a draft at depth k = 1..K. An event that accepts depth k accepted every depth
    above it, so P(L = k) = r_k − r_(k+1), with r_0 = 1 and r_(K+1) = 0."""
    above = [1.0, *per_position]
    return [above[k] - (above[k + 1] if k + 1 < len(above) else 0.0) for k in range(len(above))]


def accepted_lengths_frame(reports: Sequence[ArmReport]) -> pd.DataFrame:
    records = [
        {"arm": rep.arm, "accepted": length, "share_of_events": share}
        for rep in reports
        if rep.per_position_acceptance
        for length, share in enumerate(accepted_length_shares(rep.per_position_acceptance))
    ]
    return pd.DataFrame(records, columns=["arm", "accepted", "share_of_events"])


def load_replay(paths: Sequence[Path]) -> ReplayData:
    """Everything the replay report shows, for run directories compared as `lumobench report` does."""
    reports = build_report(paths)
    loaded = [load_run(Path(p)) for p in paths]
    names = {rep.run_dir: rep.arm for rep in reports}
    matched = matched_ids({names[str(run.path)]: (rows, m.request_ids, m.runs) for run, m, rows in loaded})
    requests, segments, chunks = [], [], []
    for run, _, rows in loaded:
        arm = names[str(run.path)]
        requests.append(requests_frame(arm, rows, matched))
        segments.append(segments_frame(arm, run))
        chunks.append(chunks_frame(arm, rows))
    return ReplayData(
        reports=reports,
        arms=arms_frame(reports),
        requests=pd.concat(requests, ignore_index=True),
        segments=pd.concat(segments, ignore_index=True),
        chunks=pd.concat(chunks, ignore_index=True),
        acceptance=acceptance_frame(reports),
        accepted_lengths=accepted_lengths_frame(reports),
        metas=[m for _, m, _ in loaded],
    )
