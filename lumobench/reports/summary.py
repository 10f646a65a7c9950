"""Reports over run directories: Eq. 5 per arm on the matched set, per-run ranges, server counters.

One `ArmReport` per run directory. With several directories the rates pool the matched set (request
ids completed in every repetition of every compared arm); `completed`/`failed` count all rows. An arm
that completed nothing is reported as failed and left out of the matched set, so the others are still
compared. The reference arm (for "vs first" ratios and output agreement) is the first arm that did not
fail, or the one named; ratios are paired (each request's rates in both arms) with a paired bootstrap
interval.
Formats: a rich table, JSON (`{"arms": [...]}`, stable field names) and CSV.
"""

from __future__ import annotations

import csv
import io
import json
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from lumobench.agreement import agreement
from lumobench.errors import LumobenchError
from lumobench.metrics import SpecCounters, phase_totals, spec_delta
from lumobench.rates import (
    bootstrap_ci,
    matched_ids,
    paired_bootstrap_ratio,
    per_request_ratios,
    pooled,
    run_rates,
)
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
    # pooled rate over the reference arm's (the first arm that completed anything), with a paired
    # bootstrap interval: requests resampled together in both arms (None for the reference)
    ratio_vs_first: float | None = None
    ratio_ci95: tuple[float, float] | None = None
    run_rates: list[float | None]
    tokens: int  # Σ (n − 1) over the matched, eligible rows
    decode_s: float  # Σ (t_end − t_first) over the same rows
    accepted_per_event: float | None
    per_position_acceptance: list[float]
    tokens_per_chunk: float | None
    phase_ms: dict[str, float]  # mean ms per span by phase (target/drafter/dispatch), from /metrics
    # greedy/seeded requests whose output equals the reference arm's, of those both completed
    # (None: the reference itself, or a failed arm)
    same_output: int | None = None
    same_output_compared: int | None = None
    differing_outputs: list[str] = []
    #: "failed": the arm completed no request; it is left out of the matched set and of every ratio
    status: Literal["ok", "failed"] = "ok"
    reference: str | None = None  # the arm ratios and output agreement are taken against
    per_request_ratios: dict[str, float] = {}  # each matched request's rate over the reference's
    interleaved: bool = False  # measured in an interleaved group (arms up at once, requests rotated)
    # interleaved only: CPU seconds the other arms' servers used per second of this arm's requests
    others_cpu_per_s: float | None = None
    greedy: bool = False  # replayed with --greedy: every request sent as greedy decoding


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
    """A run directory's metadata and rows; rows a replay cannot have written (a second completed row
    for one key, a request or repetition the run does not have) are refused, naming the line."""
    run = RunDir.open(path)
    meta, rows = run.read_meta(), run.read_rows()
    ids, completed = set(meta.request_ids), set()
    for row in rows:
        where = f"{run.rows_path}: run {row.run_index + 1} request {row.request_id!a}"
        if row.request_id not in ids or row.run_index >= meta.runs:
            raise LumobenchError(f"{where} is not part of the run ({meta.runs} runs of {len(ids)} requests)")
        if row.status == "completed":
            if row.key in completed:
                raise LumobenchError(f"{where} has two completed rows (the file was edited or joined)")
            completed.add(row.key)
    return run, meta, rows


def _others_cpu_per_s(rows: Sequence[RequestRow]) -> float | None:
    measured = [r for r in rows if r.others_cpu_s is not None]
    wall = sum((r.t_end_ns or r.t_send_ns) - r.t_send_ns for r in measured) / 1e9
    return sum(r.others_cpu_s or 0.0 for r in measured) / wall if measured and wall > 0 else None


def build_report(paths: Sequence[Path], reference: str | None = None) -> list[ArmReport]:
    """One report row per run directory, rates over the matched set of all given directories.

    `reference`: the arm ratios and output agreement are taken against (default: the first arm that
    completed anything)."""
    loaded = [load_run(p) for p in paths]
    names = [
        meta.arm.name if [m.arm.name for _, m, _ in loaded].count(meta.arm.name) == 1 else meta.run_id
        for _, meta, _ in loaded
    ]
    failed_arm = [not any(r.status == "completed" for r in rows) for _, _, rows in loaded]
    matched = matched_ids(
        {
            n: (rows, meta.request_ids, meta.runs)
            for n, (_, meta, rows), failed in zip(names, loaded, failed_arm, strict=True)
            if not failed
        }
    )
    ref = next((i for i, failed in enumerate(failed_arm) if not failed), None)
    if reference is not None:
        if reference not in names:
            raise LumobenchError(f"--reference {reference}: no such arm among {', '.join(names)}")
        if failed_arm[ref := names.index(reference)]:
            raise LumobenchError(f"--reference {reference}: that arm completed nothing")
    reports = []
    for index, (name, (run, meta, rows)) in enumerate(zip(names, loaded, strict=True)):
        in_set = [r for r in rows if r.request_id in matched] if not failed_arm[index] else []
        total = pooled(in_set)
        spec = spec_totals(run)
        agree = ratio = ratio_ci = None
        per_request: dict[str, float] = {}
        if ref is not None and index != ref and not failed_arm[index]:
            _, ref_meta, ref_rows = loaded[ref]
            ref_set = [r for r in ref_rows if r.request_id in matched]
            shared = [i for i in ref_meta.deterministic_ids if i in set(meta.deterministic_ids)]
            agree = agreement(ref_rows, rows, shared)
            ref_rate = pooled(ref_set).rate
            ratio = total.rate / ref_rate if total.rate is not None and ref_rate else None
            ratio_ci = paired_bootstrap_ratio(ref_set, in_set)
            per_request = per_request_ratios(ref_set, in_set)
        reports.append(
            ArmReport(
                arm=name,
                run_dir=str(run.path),
                runs=meta.runs,
                completed=sum(r.status == "completed" for r in rows),
                failed=sum(r.status == "failed" for r in rows),
                status="failed" if failed_arm[index] else "ok",
                matched=0 if failed_arm[index] else len(matched),
                pooled_tokens_per_s=total.rate,
                pooled_ci95=bootstrap_ci(in_set),
                ratio_vs_first=ratio,
                ratio_ci95=ratio_ci,
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
                reference=names[ref] if ref is not None else None,
                per_request_ratios=per_request,
                interleaved=bool(meta.interleaved_with),
                others_cpu_per_s=_others_cpu_per_s(rows),
                greedy=meta.greedy,
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


def _ratio(rep: ArmReport) -> str:
    if rep.ratio_vs_first is None:
        return ""
    ci = f" ({rep.ratio_ci95[0]:.2f}–{rep.ratio_ci95[1]:.2f})" if rep.ratio_ci95 else ""
    return f"{rep.ratio_vs_first:.2f}x{ci}"


def _same(rep: ArmReport) -> str:
    if rep.status == "failed":
        return "–"
    return "ref" if rep.same_output is None else f"{rep.same_output}/{rep.same_output_compared}"


def versus_title(reports: Sequence[ArmReport]) -> str:
    """The ratio column's title: "vs first", or "vs ARM" when the reference is another arm."""
    ref = next((r.reference for r in reports if r.reference), None)
    return "vs first" if not reports or ref in (None, reports[0].arm) else f"vs {ref}"


def render_table(reports: Sequence[ArmReport]) -> Table:
    """Pooled rate, interval, per-run range, counts, paired ratio, acceptance, tokens per chunk, agreement."""
    table = Table(title="Eq. 5 pooled decode rate (tokens/s) over the matched set")
    for col in (
        "arm",
        "runs",
        "completed",
        "failed",
        "matched",
        "pooled tok/s",
        "95% CI",
        "per-run range",
        versus_title(reports),
        "accepted/event",
        "tok/chunk",
        "same output",
        "spans ms (target/drafter/dispatch)",
    ):
        table.add_column(col, justify="left" if col == "arm" else "right")
    for rep in reports:
        ci = f"{rep.pooled_ci95[0]:.2f}–{rep.pooled_ci95[1]:.2f}" if rep.pooled_ci95 else "–"
        table.add_row(
            rep.arm if rep.status == "ok" else f"{rep.arm} (failed)",
            str(rep.runs),
            str(rep.completed),
            str(rep.failed),
            str(rep.matched),
            _f(rep.pooled_tokens_per_s),
            ci,
            _range(rep.run_rates),
            _ratio(rep),
            _f(rep.accepted_per_event),
            _f(rep.tokens_per_chunk),
            _same(rep),
            "/".join(_f(rep.phase_ms.get(p)) for p in ("target", "drafter", "dispatch"))
            if rep.phase_ms
            else "–",
        )
    return table


def table_notes(reports: Sequence[ArmReport]) -> list[str]:
    """The lines printed under the table: what the reference is, failed arms, how arms were measured."""
    ref = next((r.reference for r in reports if r.reference), None)
    notes = []
    if ref and len(reports) > 1:
        notes.append(f"same output: greedy or seeded requests whose output equals {ref}'s")
    if failed := [r.arm for r in reports if r.status == "failed"]:
        notes.append(
            f"failed (completed nothing, left out of the matched set): {', '.join(failed)}"
            + ("; the other arms are compared" if ref else "")
        )
    if len(reports) > 1 and ref:
        notes.append(
            f"{versus_title(reports)}: pooled rate over {ref}'s on the matched set (paired bootstrap 95% CI: "
            "requests resampled together in both arms)"
        )
    idle = [r.others_cpu_per_s for r in reports if r.others_cpu_per_s is not None]
    if all(r.interleaved for r in reports) and len(reports) > 1:
        notes.append(
            "interleaved: all arms up at once, each request sent to every arm in rotated order"
            + (
                f"; idle arms used at most {1000 * max(idle):.1f} ms CPU per s of measured requests"
                if idle
                else ""
            )
        )
    elif len(reports) > 1:
        notes.append("measured one arm after another: ratios include any drift of the machine between arms")
    if greedy := [r.arm for r in reports if r.greedy]:
        notes.append(
            "replayed with --greedy (every request sent as greedy decoding, whatever its record's sampling)"
            + ("" if len(greedy) == len(reports) else f": {', '.join(greedy)} only")
        )
    return notes


def print_table(reports: Sequence[ArmReport], console: Console) -> None:
    """The table, its notes, then one line per arm whose greedy/seeded outputs differ from the reference's."""
    console.print(render_table(reports))
    for note in table_notes(reports):
        console.print(note, markup=False, highlight=False)
    for rep in reports:
        if rep.differing_outputs:
            ids = ", ".join(rep.differing_outputs)
            console.print(
                f"{rep.arm}: output differs from {rep.reference} for greedy/seeded requests: {ids}",
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
            "per_position_acceptance",
            "phase_ms",
            "differing_outputs",
            "ratio_ci95",
            "per_request_ratios",
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
