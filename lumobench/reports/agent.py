"""Agent run directories as DataFrames: the task table (the paper's agent table, from
`lumobench.agent.table`) and each attempt's request timeline (the proxy's `requests.jsonl`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pandas as pd

from lumobench.agent.rundir import REQUESTS_LOG, AgentRunDir, AgentRunMeta
from lumobench.agent.table import TableRow, table_rows, table_title, to_markdown
from lumobench.record import ProxiedRequest
from lumobench.results import read_jsonl

TIMELINE_COLUMNS = [
    "run_id",
    "arm",
    "task",
    "run",
    "request",
    "start_s",
    "first_byte_s",
    "end_s",
    "http_status",
    "completion_tokens",
]


@dataclass(frozen=True)
class AgentData:
    metas: list[AgentRunMeta]
    rows: list[TableRow]  # the task table's rows, every run directory in turn
    tasks: pd.DataFrame  # one row per attempt: run_id, arm and the task table's columns
    timeline: pd.DataFrame  # one row per chat request, seconds from the attempt's start

    def markdown(self) -> str:
        """Each run's task table as `lumobench agent` writes it to task-table.md (its title line, the
        table, the total row): several runs (e.g. one per arm) are never summed into one table."""
        tables = []
        for meta in self.metas:
            rows = [
                r for r, run_id in zip(self.rows, self.tasks.run_id, strict=True) if run_id == meta.run_id
            ]
            tables.append(table_title(meta) + "\n\n" + to_markdown(rows))
        return "\n".join(tables)


def timeline_frame(run: AgentRunDir, meta: AgentRunMeta) -> pd.DataFrame:
    """Every logged chat request of every attempt, times in seconds since that attempt started."""
    records = []
    for (run_index, task_id), row in sorted(run.latest_rows().items()):
        start = datetime.fromisoformat(row.started_at).timestamp()
        requests = read_jsonl(run.path / row.log_dir / REQUESTS_LOG, ProxiedRequest)
        for number, req in enumerate(requests, start=1):
            records.append(
                {
                    "run_id": meta.run_id,
                    "arm": meta.arm.name,
                    "task": task_id,
                    "run": run_index + 1,
                    "request": number,
                    "start_s": req.sent_s - start,
                    "first_byte_s": None if req.first_byte_s is None else req.first_byte_s - start,
                    "end_s": req.end_s - start,
                    "http_status": req.http_status,
                    "completion_tokens": req.completion_tokens,
                }
            )
    return pd.DataFrame(records, columns=TIMELINE_COLUMNS)


def load_agent(paths: Sequence[Path]) -> AgentData:
    """The task table and request timelines of one or more agent run directories."""
    metas, rows, tasks, timelines = [], [], [], []
    for path in paths:
        run = AgentRunDir.open(Path(path))
        meta = run.read_meta()
        table = table_rows(meta, run)
        metas.append(meta)
        rows += table
        tasks.append(
            pd.DataFrame(
                [{"run_id": meta.run_id, "arm": meta.arm.name, **dataclasses.asdict(r)} for r in table],
                columns=["run_id", "arm", *TableRow.__dataclass_fields__],
            )
        )
        timelines.append(timeline_frame(run, meta))
    return AgentData(
        metas=metas,
        rows=rows,
        tasks=pd.concat(tasks, ignore_index=True),
        timeline=pd.concat(timelines, ignore_index=True),
    )
