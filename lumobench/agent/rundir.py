"""An agent run's directory: `run.json` (AgentRunMeta), `tasks.jsonl` (one TaskRow per task and run,
appended and fsync'd as each task ends), SWE-bench predictions, the task table and per-task logs.

    run.json                         AgentRunMeta (schema_version, arm, endpoint, Qwen Code version, ...)
    tasks.jsonl                      TaskRow per attempt; a later row for the same key supersedes
    predictions.jsonl                SWE-bench predictions (predictions-run{k}.jsonl when --runs > 1)
    evaluation.jsonl                 written by `lumobench evaluate` beside its predictions file
    task-table.md, task-table.csv    the Table VII-style task table
    tasks/<instance>.run{k}/         agent.jsonl (its stream-json events), agent.stderr, patch.diff, home/,
                                     requests.jsonl (one ProxiedRequest per chat request: its timeline)
    server.log                       the arm's output, when lumobench launched it
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from lumobench import __version__
from lumobench.agent.paths import CACHE_DIR
from lumobench.errors import LumobenchError
from lumobench.results import ArmInfo, append_jsonl, claim_run_path, read_jsonl, write_json_atomic

AGENT_SCHEMA_VERSION = 1
RUN_FILE = "run.json"
TASKS_FILE = "tasks.jsonl"
REQUESTS_LOG = "requests.jsonl"  # per attempt, in its log folder
RunStatus = Literal["running", "finished", "interrupted", "aborted"]
#: completed: the agent finished; timeout: the wall budget ended it; api-error: it reported that the
#: arm failed ("[API Error: ...]"); agent-crash: it exited abnormally after working on the task; error:
#: the attempt could not start (repository, setup, or the agent died before its first model request).
TaskStatus = Literal["completed", "timeout", "api-error", "agent-crash", "error"]
#: statuses that describe the agent's work (and so enter predictions); `--resume` retries the others
ATTEMPTED: tuple[TaskStatus, ...] = ("completed", "timeout", "agent-crash")


class AgentRunMeta(BaseModel):
    """`run.json` of an agent run."""

    schema_version: int = AGENT_SCHEMA_VERSION
    kind: Literal["agent"] = "agent"
    run_id: str
    created: str
    lumobench_version: str = __version__
    argv: list[str] = Field(default_factory=list)
    arm: ArmInfo
    arm_spec: str | None = None  # the --arm value (a .toml path made absolute), to relaunch on --resume
    endpoint: str
    model: str
    agent: str  # e.g. "qwen-code@0.15.10"
    model_name_or_path: str  # what the predictions name
    tasks: list[str]  # the --tasks values, to resolve the same tasks on --resume
    task_ids: list[str]
    runs: int = Field(ge=1)
    budget_s: float = Field(gt=0)
    max_tokens: int = Field(ge=1)
    sampling: dict[str, float | int] = Field(default_factory=dict)
    repos_dir: str = str(CACHE_DIR / "repos")  # --repos (absolute), --clone/--no-clone, --keep-workdirs:
    allow_clone: bool = True  # what --resume continues with unless given again
    keep_workdirs: bool = False
    record: str | None = None  # corpus the recording proxy wrote
    host: dict[str, object] = Field(default_factory=dict)
    status: RunStatus = "running"
    error: str | None = None


class TaskRow(BaseModel):
    """One attempt at one task. Seconds are wall-clock; token counts are completion tokens.

    `requests`/`output_tokens` are the arm's own usage reports, counted at the proxy in front of it;
    `counter_*` are deltas of the arm's /metrics counters (None when it exports none);
    `agent_requests`/`agent_output_tokens` are what Qwen Code reported about itself."""

    run_index: int = Field(ge=0)
    instance_id: str
    status: TaskStatus
    error: str | None = None
    exit_code: int | None = None
    timed_out: bool = False
    agent_s: float | None = None
    requests: int | None = None
    output_tokens: int | None = None
    responses_without_usage: int | None = None
    capped_requests: int | None = None  # requests whose max_tokens the proxy fitted into the context
    counter_requests: int | None = None  # Δ of the arm's /metrics request counter
    counter_output_tokens: int | None = None  # Δ of its generation-token counter
    accepted_per_event: float | None = None  # Δaccepted drafts / Δspeculative events
    agent_requests: int | None = None
    agent_output_tokens: int | None = None
    tool_calls: int | None = None
    recorded: int | None = None  # corpus records captured during this task
    leftover_processes: int = 0
    notes: list[str] = Field(default_factory=list)  # e.g. a mirror with uncommitted changes (left untouched)
    patch: str = ""
    log_dir: str
    started_at: str
    finished_at: str

    @property
    def key(self) -> tuple[int, str]:
        return (self.run_index, self.instance_id)

    @property
    def patch_empty(self) -> bool:
        return not self.patch.strip()


class AgentRunDir:
    """An agent run directory on disk (layout in the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path.absolute()  # the agent's HOME lies below it and the agent runs elsewhere

    @classmethod
    def create(cls, path: Path, meta: AgentRunMeta) -> AgentRunDir:
        """A new run directory at `path` (or beside it, `claim_run_path`); `meta.run_id` becomes its name."""
        path = claim_run_path(path)
        meta.run_id = path.name
        run = cls(path)
        run.write_meta(meta)
        return run

    @classmethod
    def open(cls, path: Path) -> AgentRunDir:
        try:
            kind = json.loads((path / RUN_FILE).read_text()).get("kind")
        except (OSError, ValueError):
            raise LumobenchError(
                f"{path} is not a lumobench run directory (no readable {RUN_FILE})"
            ) from None
        if kind != "agent":
            raise LumobenchError(f"{path} is not an agent run (its {RUN_FILE} has kind {kind!r})")
        return cls(path)

    def read_meta(self) -> AgentRunMeta:
        meta = AgentRunMeta.model_validate_json((self.path / RUN_FILE).read_bytes())
        if meta.schema_version != AGENT_SCHEMA_VERSION:
            raise LumobenchError(
                f"{self.path} has agent-run schema {meta.schema_version}; expected {AGENT_SCHEMA_VERSION}"
            )
        return meta

    def write_meta(self, meta: AgentRunMeta) -> None:
        write_json_atomic(self.path / RUN_FILE, meta)

    def append_row(self, row: TaskRow) -> None:
        append_jsonl(self.path / TASKS_FILE, row)

    def latest_rows(self) -> dict[tuple[int, str], TaskRow]:
        """The latest row per (run, task): earlier attempts stay in the file, superseded."""
        return {row.key: row for row in read_jsonl(self.path / TASKS_FILE, TaskRow)}

    def log_dir(self, run_index: int, instance_id: str) -> Path:
        """`tasks/<id>.run<k>`; an id that is not one plain file name (tasks.py refuses those) is refused
        here too, so no attempt writes outside the run directory."""
        name = f"{instance_id}.run{run_index + 1}"
        if Path(name).name != name or name.startswith(".") or "\\" in name:
            raise LumobenchError(f"task id {instance_id!a} cannot name a folder inside the run directory")
        return self.path / "tasks" / name

    def predictions_path(self, run_index: int, runs: int) -> Path:
        return self.path / ("predictions.jsonl" if runs == 1 else f"predictions-run{run_index + 1}.jsonl")

    def write_predictions(self, meta: AgentRunMeta) -> None:
        """Rewrite every run's predictions file from the latest rows of attempted tasks (task order)."""
        rows = self.latest_rows()
        for run_index in range(meta.runs):
            lines = [
                json.dumps(
                    {
                        "instance_id": task_id,
                        "model_name_or_path": meta.model_name_or_path,
                        "model_patch": rows[(run_index, task_id)].patch,
                    }
                )
                for task_id in meta.task_ids
                if (run_index, task_id) in rows and rows[(run_index, task_id)].status in ATTEMPTED
            ]
            path = self.predictions_path(run_index, meta.runs)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text("".join(line + "\n" for line in lines))
            tmp.replace(path)


def evaluation_path(predictions: Path) -> Path:
    """Where `lumobench evaluate` writes the outcomes of a predictions file: beside it, "predictions" in
    the name replaced by "evaluation" (or ".evaluation.jsonl" appended to the stem)."""
    name = predictions.name
    if "predictions" in name:
        return predictions.with_name(name.replace("predictions", "evaluation", 1))
    return predictions.with_name(predictions.stem + ".evaluation.jsonl")
