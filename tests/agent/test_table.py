"""The Table VII-style task table: evaluation column from the evaluation file beside the predictions,
empty patches unresolved without evaluation, non-attempts without evaluation, totals."""

from __future__ import annotations

import csv
import json
from datetime import datetime

import nbformat
from typer.testing import CliRunner

from lumobench.agent.evaluate import Evaluation, write_evaluations
from lumobench.agent.rundir import AgentRunDir, AgentRunMeta, TaskRow, evaluation_path
from lumobench.agent.table import TABLE_CSV, TABLE_MD, write_task_table
from lumobench.cli import app
from lumobench.reports.notebook import tables
from lumobench.results import ArmInfo


def _row(task: str, status: str, patch: str, agent_s: float, requests: int) -> TaskRow:
    return TaskRow(
        run_index=0,
        instance_id=task,
        status=status,
        patch=patch,
        agent_s=agent_s,
        requests=requests,
        output_tokens=requests * 100,
        log_dir=f"tasks/{task}.run1",
        started_at="t0",
        finished_at="t1",
    )


def test_table_rows_totals_and_evaluations(tmp_path):
    meta = AgentRunMeta(
        run_id="r",
        created="t",
        arm=ArmInfo(name="lumotree"),
        endpoint="http://x",
        model="m",
        agent="qwen-code@0.15.10",
        model_name_or_path="qwen-code-0.15.10__lumotree",
        tasks=["astropy"],
        task_ids=["a", "b", "c", "d"],
        runs=1,
        budget_s=9000,
        max_tokens=24000,
    )
    run = AgentRunDir.create(tmp_path / "run", meta)
    run.append_row(_row("a", "completed", "diff a\n", 600.0, 10))
    run.append_row(_row("b", "timeout", "", 9000.0, 40))
    run.append_row(_row("c", "api-error", "", 6.0, 0))
    run.append_row(_row("d", "completed", "diff d\n", 120.0, 5))
    run.write_predictions(meta)
    write_evaluations(
        [Evaluation("a", "resolved"), Evaluation("d", "unresolved")],
        evaluation_path(run.predictions_path(0, 1)),
    )
    md, csv_path = write_task_table(run)
    assert md.name == TABLE_MD and csv_path.name == TABLE_CSV
    with csv_path.open() as fh:
        rows = {r["task"]: r for r in csv.DictReader(fh)}
    assert {t: r["evaluation"] for t, r in rows.items()} == {
        "a": "resolved",
        "b": "unresolved (empty patch)",
        "c": "—",
        "d": "unresolved",
    }
    assert rows["a"]["agent_min"] == "10.0" and rows["a"]["output_tokens"] == "1000"
    total = md.read_text().splitlines()[-1]
    assert total == "| **total (4 attempts)** | | | 162.1 | 55 | 5,500 | 2 non-empty | 1 resolved |"
    assert len((run.path / "predictions.jsonl").read_text().splitlines()) == 3  # the api-error is no attempt


def _one_task_run(root, arm: str, output_tokens: int, requests: int = 1) -> AgentRunDir:
    meta = AgentRunMeta(
        run_id=f"r-{arm}",
        created="t",
        arm=ArmInfo(name=arm),
        endpoint="http://x",
        model="m",
        agent="qwen-code@0.15.10",
        model_name_or_path=f"qwen-code-0.15.10__{arm}",
        tasks=["a"],
        task_ids=["a"],
        runs=1,
        budget_s=300,
        max_tokens=1024,
    )
    run = AgentRunDir.create(root / f"r-{arm}", meta)
    row = _row("a", "completed", "", 30.0, 1).model_copy(
        update={"output_tokens": output_tokens, "started_at": "2026-12-02T21:00:00+00:00"}
    )
    run.append_row(row)
    # the proxy's request log of the attempt: `requests` requests of 5 s, 2 s until the first byte
    start = datetime.fromisoformat(row.started_at).timestamp()
    log = run.path / row.log_dir / "requests.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text(
        "".join(
            json.dumps(
                {
                    "task": "a",
                    "run": 1,
                    "http_status": 200,
                    "sent_s": start + 10 * i,
                    "first_byte_s": start + 10 * i + 2,
                    "end_s": start + 10 * i + 5,
                    "completion_tokens": output_tokens // requests,
                }
            )
            + "\n"
            for i in range(requests)
        )
    )
    return run


def test_report_of_several_agent_runs_names_the_run_and_arm_of_each_table(tmp_path):
    """One table per arm (the study's Table VI form): without a heading, three tables of the same tasks
    cannot be told apart, and three CSV headers make no CSV."""
    runs = [_one_task_run(tmp_path, arm, n) for arm, n in (("lumotree-ar", 1024), ("lumotree", 40))]
    paths = [str(r.path) for r in runs]
    markdown = CliRunner().invoke(app, ["report", *paths, "--format", "markdown"])
    assert markdown.exit_code == 0, markdown.output
    titles = [line for line in markdown.stdout.splitlines() if line.startswith("Agent run ")]
    assert titles == [
        "Agent run r-lumotree-ar: qwen-code@0.15.10 on arm lumotree-ar (m), budget 300 s",
        "Agent run r-lumotree: qwen-code@0.15.10 on arm lumotree (m), budget 300 s",
    ]
    first, second = markdown.stdout.split(titles[1])
    assert "| a | 1 | completed | 0.5 | 1 | 1,024 | empty |" in first
    assert "| a | 1 | completed | 0.5 | 1 | 40 | empty |" in second
    # each run's own task-table.md starts with the same title
    md, _ = write_task_table(runs[0])
    assert md.read_text().startswith(titles[0] + "\n\n")

    csv_out = CliRunner().invoke(app, ["report", *paths, "--format", "csv"])
    assert csv_out.exit_code == 0, csv_out.output
    rows = list(csv.DictReader(csv_out.stdout.splitlines()))
    assert [(r["agent_run"], r["arm"], r["task"], r["output_tokens"]) for r in rows] == [
        ("r-lumotree-ar", "lumotree-ar", "a", "1024"),
        ("r-lumotree", "lumotree", "a", "40"),
    ]


def test_agent_report_notebook_of_several_runs_keeps_each_arms_attempts_apart(tmp_path):
    """The notebook over the study's three agent runs: every task appears once per arm, and the busy
    time per attempt is per arm, not the three arms' requests of one task summed into one row."""
    runs = [
        _one_task_run(tmp_path, arm, n, k) for arm, n, k in (("lumotree-ar", 1024, 2), ("lumotree", 40, 1))
    ]
    out = tmp_path / "agent.ipynb"
    result = CliRunner().invoke(app, ["report", *(str(r.path) for r in runs), "--notebook", str(out)])
    assert result.exit_code == 0, result.output[-3000:]
    shown = tables(nbformat.read(out, as_version=4))
    assert [(t["arm"], t["task"], t["output_tokens"]) for t in shown["tasks"]] == [
        ("lumotree-ar", "a", 1024),
        ("lumotree", "a", 40),
    ]
    assert [(s["arm"], s["task"], s["requests"], s["busy_s"]) for s in shown["request_summary"]] == [
        ("lumotree-ar", "a", 2, 10.0),
        ("lumotree", "a", 1, 5.0),
    ]
