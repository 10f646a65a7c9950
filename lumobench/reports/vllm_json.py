"""A replay run as `vllm bench serve --save-result` would have written it (vLLM 0.32's field names),
so lumobench runs and vLLM benchmark files can be loaded and plotted together.

Computed from the run's completed rows, as vLLM computes them from its successful requests:
- TTFT = t_first − t_send; lumobench's t_first is the first chunk with content, reasoning or tool
  calls (DESIGN §6), vLLM's the first chunk with choices (a role-only chunk counts there);
- E2EL ("latency") = arrival of the last output chunk − t_send (t_end when the row has no chunk times);
- TPOT = (E2EL − TTFT) / (n − 1) for n > 1; ITL = the gaps between successive output chunks (null
  for runs recorded before rows kept chunk arrival times);
- duration = Σ over repetitions of (last end − first send): the time the benchmark was sending; for an
  interleaved run, whose repetitions also hold the other arms' requests, the time this arm's own
  requests were in flight (the union of their send-to-end intervals);
- spec_decode_* from the `/metrics` counter deltas, as vLLM takes them.
Statistics are numpy mean / median / std / percentile (linear), in milliseconds. vLLM-only concepts
(goodput, request rate, burstiness) get vLLM's values for an unpaced run; lumobench's own numbers go
under the `lumobench` key.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from lumobench.reports.summary import ArmReport, build_report, load_run, spec_totals
from lumobench.results import RequestRow, RunDir, RunMeta

PERCENTILES = (99.0,)  # vLLM's default --metric-percentiles


def _stats(name: str, seconds: Sequence[float]) -> dict[str, float]:
    """vLLM's mean/median/std/pXX_{name}_ms (0 for an empty list, as vLLM does)."""
    values = np.asarray(seconds or [0.0], dtype=float) * 1000
    out = {
        f"mean_{name}_ms": float(np.mean(values)),
        f"median_{name}_ms": float(np.median(values)),
        f"std_{name}_ms": float(np.std(values)),
    }
    for p in PERCENTILES:
        word = str(int(p)) if int(p) == p else str(p)
        out[f"p{word}_{name}_ms"] = float(np.percentile(values, p))
    return out


def _last_output_ns(row: RequestRow) -> int:
    return row.chunk_ns[-1] if row.chunk_ns else row.t_end_ns  # type: ignore[return-value]


def _itls(row: RequestRow) -> list[float]:
    times = [t for t in row.chunk_ns or [] if row.t_first_ns is not None and t >= row.t_first_ns]
    return [(b - a) / 1e9 for a, b in itertools.pairwise(times)]


def _in_flight_ns(rows: Sequence[RequestRow]) -> int:
    """Time covered by the rows' [t_send, t_end] intervals (their union)."""
    total, reached = 0, None
    for start, end in sorted((r.t_send_ns, r.t_end_ns) for r in rows if r.t_end_ns is not None):
        if reached is None or start > reached:
            total, reached = total + end - start, end
        elif end > reached:
            total, reached = total + end - reached, end
    return total


def _duration_s(rows: Sequence[RequestRow], interleaved: bool) -> float:
    """vLLM's duration: per repetition, first send to last end. An interleaved repetition also holds
    the other arms' requests between this arm's: there it is the time this arm's own requests were in
    flight, so throughputs are this arm's and not the group's."""
    total = 0
    for run_index in sorted({r.run_index for r in rows}):
        mine = [r for r in rows if r.run_index == run_index and r.t_end_ns is not None]
        if mine and interleaved:
            total += _in_flight_ns(mine)
        elif mine:
            total += max(r.t_end_ns for r in mine) - min(r.t_send_ns for r in mine)  # type: ignore[type-var]
    return total / 1e9


def vllm_result(run: RunDir, meta: RunMeta, rows: Sequence[RequestRow], report: ArmReport) -> dict[str, Any]:
    """One run directory in `--save-result` form (without `--save-detailed`'s per-request lists)."""
    done = [
        r for r in rows if r.status == "completed" and r.t_first_ns is not None and r.t_end_ns is not None
    ]
    duration = _duration_s(rows, bool(meta.interleaved_with))
    total_in = sum(r.prompt_tokens or 0 for r in done)
    total_out = sum(r.completion_tokens or 0 for r in done)
    ttfts = [(r.t_first_ns - r.t_send_ns) / 1e9 for r in done]  # type: ignore[operator]
    e2els = [(_last_output_ns(r) - r.t_send_ns) / 1e9 for r in done]
    tpots = [
        (e2el - ttft) / (r.completion_tokens - 1)  # type: ignore[operator]
        for r, ttft, e2el in zip(done, ttfts, e2els, strict=True)
        if (r.completion_tokens or 0) > 1
    ]
    itls = [gap for r in done for gap in _itls(r)]
    timed_chunks = any(r.chunk_ns for r in done)
    result: dict[str, Any] = {
        "date": datetime.fromisoformat(meta.created).strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "openai-chat" if meta.api == "chat" else "sglang",
        "backend": "openai-chat" if meta.api == "chat" else "sglang",
        "label": report.arm,
        "model_id": meta.model,
        "tokenizer_id": meta.model,
        "num_prompts": len(meta.request_ids) * meta.runs,
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": meta.concurrency,
        "duration": duration,
        "completed": len(done),
        "failed": len(rows) - len(done),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(done) / duration if duration else 0.0,
        "request_goodput": None,
        "output_throughput": total_out / duration if duration else 0.0,
        "total_token_throughput": (total_in + total_out) / duration if duration else 0.0,
        **_stats("ttft", ttfts),
        **_stats("tpot", tpots),
        **(_stats("itl", itls) if timed_chunks else dict.fromkeys(_stats("itl", []))),
        **_stats("e2el", e2els),
    }
    spec = spec_totals(run)
    if spec is not None and spec.draft_tokens > 0:
        result |= {
            "spec_decode_acceptance_rate": spec.accepted / spec.draft_tokens * 100,
            "spec_decode_acceptance_length": 1 + spec.accepted / spec.drafts if spec.drafts else 0.0,
            "spec_decode_num_drafts": int(spec.drafts),
            "spec_decode_draft_tokens": int(spec.draft_tokens),
            "spec_decode_accepted_tokens": int(spec.accepted),
            "spec_decode_per_position_acceptance_rates": spec.per_position_rates(),
        }
    result["lumobench"] = {
        "run_id": meta.run_id,
        "run_dir": str(run.path),
        "corpus": meta.corpus,
        "runs": meta.runs,
        "matched": report.matched,
        "pooled_tokens_per_s": report.pooled_tokens_per_s,
        "ttft_definition": "first chunk with content, reasoning or tool calls",
        "duration_definition": "time this arm's requests were in flight (interleaved run)"
        if meta.interleaved_with
        else "first send to last end per repetition",
    }
    return result


def vllm_results(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """One `--save-result` object per run directory, in the order given."""
    reports = build_report(paths)
    out = []
    for path, report in zip(paths, reports, strict=True):
        run, meta, rows = load_run(Path(path))
        out.append(vllm_result(run, meta, rows, report))
    return out


def render_vllm_json(paths: Sequence[Path]) -> str:
    """One JSON object per line, as `vllm bench serve --append-result` writes a results file."""
    return "".join(json.dumps(r) + "\n" for r in vllm_results(paths))
