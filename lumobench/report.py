"""Reports over run directories: Eq. 5 per arm on the matched set, per-run ranges, server counters.

One `ArmReport` per run directory. With several directories the rates pool the matched set (request
ids completed in every repetition of every compared arm); `completed`/`failed` count all rows.
Formats: a rich table, JSON (`{"arms": [...]}`, stable field names) and CSV.
"""

from __future__ import annotations

import csv
import io
import json
import shlex
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from lumobench.agreement import agreement
from lumobench.metrics import SpecCounters, phase_totals, spec_delta
from lumobench.rates import bootstrap_ci, matched_ids, paired_bootstrap_ratio, pooled, run_rates
from lumobench.results import RequestRow, RunDir, RunMeta


class ArmReport(BaseModel):
    arm: str
    run_dir: str
    runs: int
    completed: int
    failed: int
    matched: int  # request ids in the matched set
    pooled_tokens_per_s: float | None
    pooled_ci95: tuple[float, float] | None
    # pooled rate over the first arm's, with a paired bootstrap interval (None for the first arm)
    ratio_vs_first: float | None = None
    ratio_ci95: tuple[float, float] | None = None
    run_rates: list[float | None]
    tokens: int  # Σ (n − 1) over the matched, eligible rows
    decode_s: float  # Σ (t_end − t_first) over the same rows
    accepted_per_event: float | None
    per_position_acceptance: list[float]
    tokens_per_chunk: float | None
    phase_ms: dict[str, float]  # mean ms per span by phase (target/drafter/dispatch), from /metrics
    # greedy/seeded requests whose output equals the first arm's, of those both completed (None: first)
    same_output: int | None = None
    same_output_compared: int | None = None
    differing_outputs: list[str] = []


def _tokens_per_chunk(rows: Sequence[RequestRow]) -> float | None:
    chunks = sum(r.output_chunks for r in rows if r.status == "completed")
    tokens = sum(r.completion_tokens or 0 for r in rows if r.status == "completed")
    return tokens / chunks if chunks else None


def spec_totals(run: RunDir) -> SpecCounters | None:
    """Speculative counter deltas summed over the run's metric segments (None: no counters)."""
    total: SpecCounters | None = None
    for _, _, before, after in run.metric_segments():
        delta = spec_delta(before, after)
        if delta is not None:
            total = delta if total is None else total + delta
    return total


def _phase_ms(run: RunDir) -> dict[str, float]:
    """Mean milliseconds per span of each phase, pooled over the run's metric segments."""
    seconds: dict[str, float] = {}
    counts: dict[str, float] = {}
    for _, _, before, after in run.metric_segments():
        for phase, (s, c) in phase_totals(before, after).items():
            seconds[phase] = seconds.get(phase, 0.0) + s
            counts[phase] = counts.get(phase, 0.0) + c
    return {p: 1000 * seconds[p] / counts[p] for p in sorted(seconds) if counts[p] > 0}


def load_run(path: Path) -> tuple[RunDir, RunMeta, list[RequestRow]]:
    run = RunDir.open(path)
    return run, run.read_meta(), run.read_rows()


def build_report(paths: Sequence[Path]) -> list[ArmReport]:
    """One report row per run directory, rates over the matched set of all given directories."""
    loaded = [load_run(p) for p in paths]
    names = [
        meta.arm.name if [m.arm.name for _, m, _ in loaded].count(meta.arm.name) == 1 else meta.run_id
        for _, meta, _ in loaded
    ]
    matched = matched_ids(
        {n: (rows, meta.request_ids, meta.runs) for n, (_, meta, rows) in zip(names, loaded, strict=True)}
    )
    reports = []
    _, base_meta, base_rows = loaded[0]
    base_set = [r for r in base_rows if r.request_id in matched]
    base_rate = pooled(base_set).rate
    for index, (name, (run, meta, rows)) in enumerate(zip(names, loaded, strict=True)):
        in_set = [r for r in rows if r.request_id in matched]
        total = pooled(in_set)
        ratio = total.rate / base_rate if index and total.rate is not None and base_rate else None
        spec = spec_totals(run)
        also = set(meta.deterministic_ids)
        shared = [i for i in base_meta.deterministic_ids if i in also]
        agree = agreement(base_rows, rows, shared) if index else None
        reports.append(
            ArmReport(
                arm=name,
                run_dir=str(run.path),
                runs=meta.runs,
                completed=sum(r.status == "completed" for r in rows),
                failed=sum(r.status == "failed" for r in rows),
                matched=len(matched),
                pooled_tokens_per_s=total.rate,
                pooled_ci95=bootstrap_ci(in_set),
                ratio_vs_first=ratio,
                ratio_ci95=paired_bootstrap_ratio(base_set, in_set) if index else None,
                run_rates=run_rates(in_set, meta.runs),
                tokens=total.tokens,
                decode_s=total.seconds,
                accepted_per_event=spec.accepted_per_event if spec else None,
                per_position_acceptance=spec.per_position_rates() if spec else [],
                tokens_per_chunk=_tokens_per_chunk(rows),
                phase_ms=_phase_ms(run),
                same_output=agree.same if agree else None,
                same_output_compared=agree.compared if agree else None,
                differing_outputs=list(agree.differing) if agree else [],
            )
        )
    return reports


def report_command(paths: Sequence[Path]) -> str:
    """The command that turns these run directories into a shareable report page."""
    return "lumobench report " + " ".join(shlex.quote(str(p)) for p in paths) + " --html report.html"


def table_console(stderr: bool = False) -> Console:
    """A console that keeps report tables unwrapped when output is not a terminal (logs, CI)."""
    probe = Console(stderr=stderr)
    return probe if probe.is_terminal else Console(stderr=stderr, width=200)


def _f(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _range(rates: Sequence[float | None]) -> str:
    known = [r for r in rates if r is not None]
    return f"{min(known):.2f}–{max(known):.2f}" if known else "–"


def render_table(reports: Sequence[ArmReport]) -> Table:
    """Pooled rate, interval, per-run range, counts, acceptance, tokens per chunk, output agreement."""
    table = Table(
        title="Eq. 5 pooled decode rate (tokens/s) over the matched set",
        caption="vs first: pooled rate over the first arm's (paired bootstrap 95% CI); same output: greedy "
        "or seeded requests whose output equals the first arm's",
    )
    for col in (
        "arm",
        "runs",
        "completed",
        "failed",
        "matched",
        "pooled tok/s",
        "95% CI",
        "per-run range",
        "vs first",
        "accepted/event",
        "tok/chunk",
        "same output",
        "spans ms (target/drafter/dispatch)",
    ):
        table.add_column(col, justify="left" if col == "arm" else "right")
    for rep in reports:
        rel = "" if rep.ratio_vs_first is None else f"{rep.ratio_vs_first:.2f}x"
        if rep.ratio_ci95:
            rel += f" ({rep.ratio_ci95[0]:.2f}–{rep.ratio_ci95[1]:.2f})"
        ci = f"{rep.pooled_ci95[0]:.2f}–{rep.pooled_ci95[1]:.2f}" if rep.pooled_ci95 else "–"
        table.add_row(
            rep.arm,
            str(rep.runs),
            str(rep.completed),
            str(rep.failed),
            str(rep.matched),
            _f(rep.pooled_tokens_per_s),
            ci,
            _range(rep.run_rates),
            rel,
            _f(rep.accepted_per_event),
            _f(rep.tokens_per_chunk),
            "ref" if rep.same_output is None else f"{rep.same_output}/{rep.same_output_compared}",
            "/".join(_f(rep.phase_ms.get(p)) for p in ("target", "drafter", "dispatch"))
            if rep.phase_ms
            else "–",
        )
    return table


def print_table(reports: Sequence[ArmReport], console: Console) -> None:
    """The table, then one line per arm whose greedy/seeded outputs differ from the first arm's."""
    console.print(render_table(reports))
    for rep in reports:
        if rep.differing_outputs:
            ids = ", ".join(rep.differing_outputs)
            console.print(
                f"{rep.arm}: output differs from {reports[0].arm} for greedy/seeded requests: {ids}",
                style="yellow",
                markup=False,
            )


def render_json(reports: Sequence[ArmReport]) -> str:
    return json.dumps({"arms": [r.model_dump(mode="json") for r in reports]}, indent=2)


def render_csv(reports: Sequence[ArmReport]) -> str:
    buf = io.StringIO()
    fields = [
        f
        for f in ArmReport.model_fields
        if f
        not in (
            "run_rates",
            "pooled_ci95",
            "ratio_ci95",
            "per_position_acceptance",
            "phase_ms",
            "differing_outputs",
        )
    ]
    writer = csv.writer(buf, lineterminator="\n")
    phases = ("target", "drafter", "dispatch")
    writer.writerow(
        [*fields, "ci95_low", "ci95_high", "ratio_ci95_low", "ratio_ci95_high"]
        + ["run_rate_min", "run_rate_max", "run_rates"]
        + [f"{p}_ms" for p in phases]
    )
    for rep in reports:
        known = [r for r in rep.run_rates if r is not None]
        ci = rep.pooled_ci95 or (None, None)
        ratio_ci = rep.ratio_ci95 or (None, None)
        writer.writerow(
            [getattr(rep, f) for f in fields]
            + [
                ci[0],
                ci[1],
                ratio_ci[0],
                ratio_ci[1],
                min(known, default=None),
                max(known, default=None),
                " ".join("" if r is None else f"{r:.6g}" for r in rep.run_rates),
            ]
            + [rep.phase_ms.get(p) for p in phases]
        )
    return buf.getvalue()
