"""The task table of an agent run, like the paper's Table VII: per task and run the agent minutes,
requests, output tokens, whether the patch is empty, and the evaluation; a total row at the end."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lumobench.agent.evaluate import EMPTY_PATCH, NOT_EVALUATED, RESOLVED, Evaluation, read_evaluations
from lumobench.agent.rundir import ATTEMPTED, AgentRunDir, AgentRunMeta, TaskRow, evaluation_path

TABLE_MD = "task-table.md"
TABLE_CSV = "task-table.csv"


@dataclass(frozen=True)
class TableRow:
    task: str
    run: int  # 1-based
    status: str
    agent_min: float | None
    requests: int | None
    output_tokens: int | None
    agent_requests: int | None
    agent_output_tokens: int | None
    counter_requests: int | None
    counter_output_tokens: int | None
    accepted_per_event: float | None
    patch: str  # "empty" or "non-empty"
    evaluation: str


def _evaluation(row: TaskRow, evaluations: dict[str, Evaluation]) -> str:
    if row.patch_empty:
        return "unresolved (empty patch)"
    found = evaluations.get(row.instance_id)
    if found is None or found.status in (NOT_EVALUATED, EMPTY_PATCH):
        return "not evaluated"
    return found.status


def table_rows(meta: AgentRunMeta, run: AgentRunDir) -> list[TableRow]:
    """One row per recorded (run, task) in run then task order, with the evaluation files beside the
    predictions (if `lumobench evaluate` wrote them)."""
    rows = run.latest_rows()
    out = []
    for run_index in range(meta.runs):
        evaluations = read_evaluations(evaluation_path(run.predictions_path(run_index, meta.runs)))
        for task_id in meta.task_ids:
            row = rows.get((run_index, task_id))
            if row is None:
                continue
            out.append(
                TableRow(
                    task=task_id,
                    run=run_index + 1,
                    status=row.status,
                    agent_min=None if row.agent_s is None else row.agent_s / 60,
                    requests=row.requests,
                    output_tokens=row.output_tokens,
                    agent_requests=row.agent_requests,
                    agent_output_tokens=row.agent_output_tokens,
                    counter_requests=row.counter_requests,
                    counter_output_tokens=row.counter_output_tokens,
                    accepted_per_event=row.accepted_per_event,
                    patch="empty" if row.patch_empty else "non-empty",
                    evaluation=_evaluation(row, evaluations) if row.status in ATTEMPTED else "—",
                )
            )
    return out


def _sum(values: Sequence[float | int | None]) -> float | int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _fmt(value: float | int | None, digits: int = 1) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}"


def to_markdown(rows: Sequence[TableRow]) -> str:
    """Markdown with a total row: minutes, requests and tokens summed; patches and resolved counted."""
    header = "| task | run | status | agent min | requests | output tokens | patch | evaluation |\n"
    header += "| --- | ---: | --- | ---: | ---: | ---: | --- | --- |\n"
    body = "".join(
        f"| {r.task} | {r.run} | {r.status} | {_fmt(r.agent_min)} | {_fmt(r.requests)} | "
        f"{_fmt(r.output_tokens)} | {r.patch} | {r.evaluation} |\n"
        for r in rows
    )
    nonempty = sum(r.patch == "non-empty" for r in rows)
    resolved = sum(r.evaluation == RESOLVED for r in rows)
    total = (
        f"| **total ({len(rows)} attempts)** | | | {_fmt(_sum([r.agent_min for r in rows]))} | "
        f"{_fmt(_sum([r.requests for r in rows]))} | {_fmt(_sum([r.output_tokens for r in rows]))} | "
        f"{nonempty} non-empty | {resolved} resolved |\n"
    )
    return header + body + total


def to_csv(rows: Sequence[TableRow], lead: dict[str, str] | None = None, header: bool = True) -> str:
    """CSV with every column: also the agent's own counts and the arm's /metrics counter deltas.
    `lead`: columns put before them in every row (e.g. agent_run and arm when several runs share one
    CSV); `header=False` leaves the header line out (the rows of a later run)."""
    buffer = io.StringIO()
    lead = lead or {}
    fields = list(TableRow.__dataclass_fields__)
    writer = csv.DictWriter(buffer, fieldnames=[*lead, *fields], lineterminator="\n")
    if header:
        writer.writeheader()
    for row in rows:
        writer.writerow({**lead, **{f: ("" if getattr(row, f) is None else getattr(row, f)) for f in fields}})
    return buffer.getvalue()


def table_title(meta: AgentRunMeta) -> str:
    """The line naming a task table's run: run id, agent, arm, model and budget."""
    return (
        f"Agent run {meta.run_id}: {meta.agent} on arm {meta.arm.name} ({meta.model}), "
        f"budget {meta.budget_s:.0f} s"
    )


def write_task_table(run: AgentRunDir) -> tuple[Path, Path]:
    """(Re)write task-table.md and task-table.csv of a run; returns their paths."""
    meta = run.read_meta()
    rows = table_rows(meta, run)
    md, csv_path = run.path / TABLE_MD, run.path / TABLE_CSV
    md.write_text(table_title(meta) + "\n\n" + to_markdown(rows))
    csv_path.write_text(to_csv(rows))
    return md, csv_path
