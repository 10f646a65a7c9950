"""`lumobench agent` end to end with the real Qwen Code process against the scripted model server (a test
double standing for a model that issues a fixed sequence of tool calls) on a local git repository."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
from typer.testing import CliRunner

from lumobench.cli import app
from lumobench.corpus import check_corpus
from lumobench.reports.notebook import figures, tables

from .conftest import (
    FIX_TURNS,
    CalcRepo,
    free_port,
    git,
    lumobench,
    make_calc_repo,
    make_scripted_arm,
    only_run_dir,
    read_jsonl,
    tree_state,
    write_tasks,
)

pytestmark = pytest.mark.integration


def _pytest_passes(repo: Path) -> bool:
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_calc.py"],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    return run.returncode == 0


def _tool_results(agent_log: Path) -> list[str]:
    results = []
    for event in read_jsonl(agent_log):
        if event["type"] == "user":
            results += [
                str(part.get("content"))
                for part in event["message"]["content"]
                if part.get("type") == "tool_result"
            ]
    return results


@dataclass(frozen=True)
class FixRun:
    """One `lumobench agent` run of the fixing script with --record, shared by the tests below."""

    root: Path
    calc: CalcRepo
    arm: Path
    run: Path
    corpus: Path


@pytest.fixture(scope="module")
def fix_run(qwen_cli, tmp_path_factory) -> FixRun:
    root = tmp_path_factory.mktemp("fix")
    calc = make_calc_repo(root)
    arm = make_scripted_arm(root, FIX_TURNS)
    tasks = write_tasks(root / "tasks.jsonl", [calc.task()])
    corpus = root / "captured.jsonl"
    # relative paths, run from the user's folder, as docs/agent.md's commands are (the default --out
    # is the relative "results"): the agent's HOME must not be resolved inside the task's clone
    result = lumobench(
        "agent",
        "--tasks",
        "tasks.jsonl",
        "--arm",
        arm,
        "--repos",
        "mirrors",
        "--budget-s",
        120,
        "--record",
        "captured.jsonl",
        cwd=root,
    )
    assert result.returncode == 0, result.stderr
    run = only_run_dir(root / "results")
    assert f"agent run: {run}\n" in result.stderr  # absolute, so it can be used from anywhere
    assert tasks.is_file() and corpus.is_file()
    return FixRun(root, calc, arm, run, corpus)


def test_agent_fixes_failing_test_and_its_patch_makes_it_pass(fix_run: FixRun):
    run = fix_run.run
    [row] = read_jsonl(run / "tasks.jsonl")
    assert row["status"] == "completed" and row["exit_code"] == 0 and not row["timed_out"]
    # five scripted responses, counted at the arm (usage), by its /metrics counters and by the agent
    assert row["requests"] == row["agent_requests"] == row["counter_requests"] == 5
    assert row["output_tokens"] == row["agent_output_tokens"] == row["counter_output_tokens"] > 0
    assert row["tool_calls"] == 4 and row["recorded"] == 5

    # the agent really ran the test (failing), edited, and re-ran it (passing)
    results = _tool_results(run / row["log_dir"] / "agent.jsonl")
    assert "1 failed" in results[0] and "1 passed" in results[-1]

    # the collected patch, applied to a fresh clone at the base commit, makes the test pass
    check = fix_run.root / "check"
    git(fix_run.root, "clone", "-q", str(fix_run.calc.mirror), str(check))
    git(check, "checkout", "-q", fix_run.calc.base)
    assert not _pytest_passes(check)
    subprocess.run(["git", "apply", "-"], cwd=check, input=row["patch"], text=True, check=True)
    assert _pytest_passes(check)

    [prediction] = read_jsonl(run / "predictions.jsonl")
    assert set(prediction) == {"instance_id", "model_name_or_path", "model_patch"}
    assert prediction["instance_id"] == "local__calc-1" and prediction["model_patch"] == row["patch"]
    assert prediction["model_name_or_path"] == "qwen-code-0.15.10__scripted"

    with (run / "task-table.csv").open() as fh:
        [table_row] = list(csv.DictReader(fh))
    assert (table_row["task"], table_row["patch"], table_row["requests"]) == (
        "local__calc-1",
        "non-empty",
        "5",
    )
    assert "| local__calc-1 | 1 | completed |" in (run / "task-table.md").read_text()
    meta = json.loads((run / "run.json").read_text())
    assert (meta["status"], meta["agent"], meta["model"]) == ("finished", "qwen-code@0.15.10", "scripted")


def test_agent_report_notebook_shows_the_task_table_and_each_request_on_a_timeline(fix_run: FixRun):
    out = fix_run.root / "agent-report.ipynb"
    result = CliRunner().invoke(app, ["report", str(fix_run.run), "--notebook", str(out)])
    assert result.exit_code == 0, result.output[-3000:]
    nb = nbformat.read(out, as_version=4)
    assert not [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert [name for name, _ in figures(nb)] == ["request_timeline"]
    shown = tables(nb)
    [row] = read_jsonl(fix_run.run / "tasks.jsonl")
    [task] = shown["tasks"]
    assert (task["task"], task["requests"], task["output_tokens"], task["patch"]) == (
        "local__calc-1",
        row["requests"],
        row["output_tokens"],
        "non-empty",
    )
    assert task["agent_min"] == pytest.approx(row["agent_s"] / 60)
    # the proxy's request log: one entry per request it counted, inside the attempt's wall time
    logged = read_jsonl(fix_run.run / row["log_dir"] / "requests.jsonl")
    [summary] = shown["request_summary"]
    assert len(logged) == summary["requests"] == row["requests"]
    assert summary["completion_tokens"] == row["output_tokens"]
    assert all(r["http_status"] == 200 and r["sent_s"] <= r["first_byte_s"] <= r["end_s"] for r in logged)
    assert 0 < summary["busy_s"] <= row["agent_s"]
    table = CliRunner().invoke(app, ["report", str(fix_run.run), "--format", "markdown"]).stdout
    assert "| local__calc-1 | 1 | completed |" in table and "**total (1 attempts)**" in table


def test_recorded_corpus_passes_check_and_replays_against_the_same_server(fix_run: FixRun):
    records, issues = check_corpus(fix_run.corpus)
    assert issues == [] and len(records) == 5
    assert {r.source.task for r in records} == {"local__calc-1"}
    assert len({r.source.conversation for r in records}) == 1
    assert [r.source.turn for r in records] == [0, 1, 2, 3, 4]
    assert records[-1].tools and records[-1].max_tokens == 24000 and records[-1].presence_penalty == 1.0
    assert lumobench("corpus", "check", fix_run.corpus).returncode == 0

    # select 3 of the 5, freeze the manifest, and replay the selection on the arm that served the agent
    manifest = fix_run.root / "selected.json"
    selected = lumobench("corpus", "select", fix_run.corpus, "--n", 3, "--out", manifest)
    assert selected.returncode == 0, selected.stderr
    replay = lumobench(
        "replay",
        fix_run.corpus,
        "--manifest",
        manifest,
        "--arm",
        fix_run.arm,
        "--out",
        fix_run.root / "replay",
    )
    assert replay.returncode == 0, replay.stderr
    rows = read_jsonl(only_run_dir(fix_run.root / "replay") / "requests.jsonl")
    chosen = json.loads(manifest.read_text())["records"]
    assert (
        [r["request_id"] for r in rows]
        == [m["id"] for m in chosen]
        == ["local__calc-1-00001", "local__calc-1-00003", "local__calc-1-00005"]
    )
    assert all(r["status"] == "completed" and r["completion_tokens"] >= 1 for r in rows)
    # the server answers a replayed request as it answered the agent: turn k's tool call again
    assert rows[1]["tool_calls"][0]["function"]["name"] == "edit"


def _marked_processes(text: str) -> list[int]:
    """Live processes whose environment mentions `text` (e.g. an agent's HOME folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "environ").read_bytes():
                    state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                    found += [int(entry.name)] if state != "Z" else []
            except OSError:
                continue
    return found


def test_stalled_server_ends_as_timeout_within_budget_leaving_no_processes(
    qwen_cli, calc_repo: CalcRepo, scripted_arm, tmp_path
):
    # turn 0 starts a background process (the agent detaches it), then the server stalls mid-stream
    turns = [
        {
            "tool_calls": [
                {
                    "name": "run_shell_command",
                    "arguments": {"command": "sleep 600", "is_background": True, "description": "background"},
                }
            ]
        }
    ]
    tasks = write_tasks(tmp_path / "tasks.jsonl", [calc_repo.task()])
    budget = 12
    result = lumobench(
        "agent",
        "--tasks",
        tasks,
        "--arm",
        scripted_arm(turns, stall_at_turn=1),
        "--repos",
        calc_repo.mirrors,
        "--out",
        tmp_path / "results",
        "--budget-s",
        budget,
    )
    assert result.returncode == 0, result.stderr
    run = only_run_dir(tmp_path / "results")
    [row] = read_jsonl(run / "tasks.jsonl")
    assert row["status"] == "timeout" and row["timed_out"]
    assert budget <= row["agent_s"] <= budget + 5
    assert _marked_processes(str(run / row["log_dir"] / "home")) == []


def test_unreachable_arm_is_recorded_as_api_error_not_as_empty_success(
    qwen_cli, calc_repo: CalcRepo, tmp_path
):
    tasks = write_tasks(tmp_path / "tasks.jsonl", [calc_repo.task()])
    result = lumobench(
        "agent",
        "--tasks",
        tasks,
        "--endpoint",
        f"http://127.0.0.1:{free_port()}/v1",
        "--model",
        "m",
        "--repos",
        calc_repo.mirrors,
        "--out",
        tmp_path / "results",
        "--budget-s",
        60,
    )
    assert result.returncode == 1 and "1 attempt(s) failed (api-error)" in result.stderr
    run = only_run_dir(tmp_path / "results")
    [row] = read_jsonl(run / "tasks.jsonl")
    assert row["status"] == "api-error" and "API Error" in row["error"]
    assert row["requests"] == 0
    assert read_jsonl(run / "predictions.jsonl") == []  # not an attempt: no empty-patch prediction


def test_agent_crash_is_recorded_with_its_exit_code(qwen_cli, calc_repo: CalcRepo, scripted_arm, tmp_path):
    # the tool call kills the agent's own Node process: a real abnormal exit of the agent
    turns = [
        {
            "tool_calls": [
                {
                    "name": "run_shell_command",
                    "arguments": {"command": "kill -KILL $PPID", "description": "crash"},
                }
            ]
        }
    ]
    tasks = write_tasks(tmp_path / "tasks.jsonl", [calc_repo.task()])
    result = lumobench(
        "agent",
        "--tasks",
        tasks,
        "--arm",
        scripted_arm(turns),
        "--repos",
        calc_repo.mirrors,
        "--out",
        tmp_path / "results",
        "--budget-s",
        60,
    )
    assert result.returncode == 1
    [row] = read_jsonl(only_run_dir(tmp_path / "results") / "tasks.jsonl")
    assert row["status"] == "agent-crash" and row["exit_code"] != 0
    assert row["error"].startswith(f"exit code {row['exit_code']}")


def test_resume_retries_unfinished_tasks_and_keeps_what_was_recorded(
    qwen_cli, calc_repo: CalcRepo, scripted_arm, tmp_path
):
    tasks = write_tasks(
        tmp_path / "tasks.jsonl", [calc_repo.task(), calc_repo.task("other__calc-2", "other/calc")]
    )
    # a short script: the agent writes one new file and finishes
    note = {"name": "write_file", "arguments": {"file_path": "{cwd}/NOTES.md", "content": "looked\n"}}
    arm = scripted_arm([{"tool_calls": [note]}, {"content": "done"}])
    (calc_repo.mirror / "calc.py").write_text("my local edits\n")  # a dirty mirror: used, never touched
    first = lumobench(
        "agent",
        "--tasks",
        tasks,
        "--arm",
        arm,
        "--repos",
        calc_repo.mirrors,
        "--no-clone",
        "--keep-workdirs",
        "--out",
        tmp_path / "results",
        "--budget-s",
        120,
    )
    assert first.returncode == 1
    run = only_run_dir(tmp_path / "results")
    rows = read_jsonl(run / "tasks.jsonl")
    assert [(r["instance_id"], r["status"]) for r in rows] == [
        ("local__calc-1", "completed"),
        ("other__calc-2", "error"),
    ]
    assert "no mirror of other/calc" in rows[1]["error"]
    assert "has uncommitted changes (1 paths)" in rows[0]["notes"][0]
    assert "+++ b/NOTES.md" in rows[0]["patch"] and "calc.py" not in rows[0]["patch"]
    assert (calc_repo.mirror / "calc.py").read_text() == "my local edits\n"

    os.symlink(calc_repo.mirror, calc_repo.mirrors / "other__calc")
    # --resume continues with the run's --repos, --no-clone and --keep-workdirs (run.json)
    second = lumobench("agent", "--resume", run)
    assert second.returncode == 0, second.stderr
    assert (run / "work" / "other__calc-2.run1" / "NOTES.md").is_file()
    rows = read_jsonl(run / "tasks.jsonl")
    assert [(r["instance_id"], r["status"]) for r in rows] == [
        ("local__calc-1", "completed"),
        ("other__calc-2", "error"),
        ("other__calc-2", "completed"),
    ]
    assert [p["instance_id"] for p in read_jsonl(run / "predictions.jsonl")] == [
        "local__calc-1",
        "other__calc-2",
    ]
    assert (run / "tasks" / "other__calc-2.run1.attempt1").is_dir()  # the failed attempt's logs are kept


def test_arm_that_cannot_start_aborts_with_a_clear_message(qwen_cli, calc_repo: CalcRepo, tmp_path):
    arm = tmp_path / "broken.toml"
    arm.write_text(
        f'name = "broken"\nengine = "scripted"\nport = {free_port()}\n'
        'command = ["{python}", "-c", "import sys; print(\'no model here\'); sys.exit(3)"]\n'
    )
    tasks = write_tasks(tmp_path / "tasks.jsonl", [calc_repo.task()])
    result = lumobench(
        "agent", "--tasks", tasks, "--arm", arm, "--repos", calc_repo.mirrors, "--out", tmp_path / "results"
    )
    assert result.returncode == 2
    assert "exited with code 3" in result.stderr and "no model here" in result.stderr
    assert "Traceback" not in result.stderr
    meta = json.loads((only_run_dir(tmp_path / "results") / "run.json").read_text())
    assert meta["status"] == "aborted" and "exited with code 3" in meta["error"]


def test_unknown_task_id_is_one_clear_line_and_creates_no_run(tmp_path):
    result = lumobench(
        "agent",
        "--tasks",
        "astropy__astropy-99999",
        "--endpoint",
        "http://127.0.0.1:9/v1",
        "--out",
        tmp_path / "results",
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: unknown task id astropy__astropy-99999 (looked in astropy)"
    ]
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_ctrl_c_and_sigterm_stop_agent_and_arm_and_mark_the_run_interrupted(
    signum: signal.Signals, qwen_cli, calc_repo: CalcRepo, scripted_arm, tmp_path
):
    tasks = write_tasks(tmp_path / "tasks.jsonl", [calc_repo.task()])
    out = tmp_path / "results"
    command = [
        sys.executable,
        "-m",
        "lumobench.cli",
        "agent",
        "--tasks",
        str(tasks),
        "--arm",
        str(scripted_arm(FIX_TURNS, stall_at_turn=0)),
        "--repos",
        str(calc_repo.mirrors),
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(log.stat().st_size for log in out.glob("*/tasks/*/agent.jsonl")):  # the agent is running
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=60)
    run = only_run_dir(out)
    assert proc.returncode == 130 and f"lumobench agent --resume {run}\n" in stderr
    assert "Task was destroyed" not in stderr and "Traceback" not in stderr, stderr
    assert json.loads((run / "run.json").read_text())["status"] == "interrupted"
    assert not (run / "tasks.jsonl").exists()  # the interrupted attempt is not a result; --resume reruns it
    assert _marked_processes(str(run / "tasks")) == []


def test_astropy_tasks_from_a_readonly_mirror_run_and_an_absent_base_commit_is_one_line(
    qwen_cli, readonly_mirrors: Path, scripted_arm, tmp_path
):
    """The issue's offline command on the real mirror (read-only): the present task runs in its own
    clone at the base commit, the absent one is one line naming it, the run goes on, exit code 1."""
    before = tree_state(readonly_mirrors)
    look = {"name": "run_shell_command", "arguments": {"command": "git log --oneline", "description": "look"}}
    arm = scripted_arm([{"tool_calls": [look]}, {"content": "nothing to change"}])
    result = lumobench(
        "agent", "--tasks", "astropy__astropy-14365,astropy__astropy-12907", "--arm", arm,
        "--repos", readonly_mirrors, "--no-clone", "--budget-s", 300, "--out", tmp_path / "results",
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    run = only_run_dir(tmp_path / "results")
    absent, present = read_jsonl(run / "tasks.jsonl")
    mirror = readonly_mirrors / "astropy__astropy.git"
    why = f"base commit 7269fa3e33e8 of astropy__astropy-14365 is not in mirror {mirror}"
    assert (absent["instance_id"], absent["status"]) == ("astropy__astropy-14365", "error")
    assert absent["error"] == why
    [line] = [line for line in result.stderr.splitlines() if "astropy__astropy-14365" in line]
    assert line.startswith("error astropy__astropy-14365 run 1: not started") and line.endswith(f"({why})")
    assert "1 attempt(s) failed (error)" in result.stderr and "Traceback" not in result.stderr
    assert present["instance_id"] == "astropy__astropy-12907"
    assert (present["status"], present["patch"]) == ("completed", "")
    [shown] = _tool_results(run / present["log_dir"] / "agent.jsonl")
    # the agent saw the base commit alone (shallow: "grafted"), with no branch of the mirror
    [commit] = shown.strip().splitlines()
    assert commit.startswith("d16bfe0 (grafted, HEAD) Merge pull request #12900")
    assert tree_state(readonly_mirrors) == before
