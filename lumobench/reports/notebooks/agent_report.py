# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Agent run
#
# Qwen Code on SWE-bench-format tasks against one arm: per task and run the agent's wall time, the
# chat requests it made and the completion tokens the arm reported (counted at the proxy in front of
# the arm), whether the patch is empty, and the evaluation (the paper's agent table). Below it, each
# attempt's requests on a time line, from the proxy's request log.
#
# Made by `lumobench report RUN_DIR --notebook OUT.ipynb` (or `--html`); the source is
# `lumobench/reports/notebooks/agent_report.py`.

# %%
from pathlib import Path

import pandas as pd

from lumobench.reports import plots
from lumobench.reports.agent import load_agent
from lumobench.reports.display import show_figure, show_markdown, show_table
from lumobench.reports.tables import frame_table

# %% tags=["parameters"]
RUNS: list[str] = []  # agent run directories (lumobench report sets it)

# %%
if not RUNS:
    raise ValueError("set RUNS to agent run directories")
data = load_agent([Path(r) for r in RUNS])
runs = pd.DataFrame(
    {
        "run id": [m.run_id for m in data.metas],
        "agent": [m.agent for m in data.metas],
        "arm": [m.arm.name for m in data.metas],
        "model": [m.model for m in data.metas],
        "tasks": [len(m.task_ids) for m in data.metas],
        "runs": [m.runs for m in data.metas],
        "budget s": [m.budget_s for m in data.metas],
        "max tokens": [m.max_tokens for m in data.metas],
        "status": [m.status for m in data.metas],
    }
)
show_table(frame_table(runs, "Agent runs", digits=0), "runs")

# %% [markdown]
# ## Task table
#
# Requests and output tokens are the arm's own usage reports; `lumobench agent` writes the same
# table to `task-table.md` beside the run.

# %%
table = data.tasks[
    [
        "arm",
        "task",
        "run",
        "status",
        "agent_min",
        "requests",
        "output_tokens",
        "accepted_per_event",
        "patch",
        "evaluation",
    ]
]
show_table(
    frame_table(
        table,
        "Tasks",
        note="agent_min: wall minutes of the attempt; accepted_per_event: Δ of the arm's counters",
    ),
    "tasks",
    values=data.tasks.to_dict(orient="records"),
)
show_markdown(data.markdown())

# %% [markdown]
# ## Requests per task
#
# Each chat request from the moment the proxy received it to the end of the arm's response; the dark
# part is the wait for the first bytes (prefill and queueing), the rest is streaming.

# %%
if len(data.timeline):
    show_figure(plots.agent_timeline_figure(data.timeline), "request_timeline")
    per_task = (
        data.timeline.assign(seconds=data.timeline.end_s - data.timeline.start_s)
        .groupby(["run_id", "arm", "task", "run"], as_index=False, sort=False)
        .agg(
            requests=("request", "count"),
            completion_tokens=("completion_tokens", "sum"),
            busy_s=("seconds", "sum"),
            first_byte_wait_s=(
                "first_byte_s",
                lambda s: float((s - data.timeline.loc[s.index, "start_s"]).sum()),
            ),
        )
    )
    show_table(
        frame_table(per_task.drop(columns="run_id"), "Time the arm was busy per attempt"),
        "request_summary",
        values=per_task.to_dict(orient="records"),
    )
else:
    show_markdown("No request log in these runs (`tasks/<id>.run<k>/requests.jsonl`): they predate it.")
