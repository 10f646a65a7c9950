"""The driver's rules, without running an agent: how an attempt's end is classified (and which line of the
agent's stderr explains it), what --resume continues with, when a run stops before its first attempt,
and how npm failures are reported."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lumobench.agent.driver import (
    AgentArgs,
    AgentSettings,
    ArmContext,
    agent_error_line,
    check_context,
    classify,
    find_mirrors,
    new_run,
    resume_settings,
)
from lumobench.agent.process import ProcessOutcome
from lumobench.agent.qwen_code import AgentReport, ensure_qwen_code, npm_failure
from lumobench.agent.tasks import Task, resolve_tasks
from lumobench.errors import LumobenchError

from .conftest import free_port, lumobench

# Qwen Code 0.15.10's stderr when its HOME is a relative path and it runs inside the task's clone
# (what the default --out results did), as captured on this machine
RELATIVE_HOME_CRASH = """An unexpected critical error occurred:
Error: ENOENT: no such file or directory, lstat '/tmp/q1/clone/results'
    at Module.realpathSync (node:fs:2741:29)
    at loadSettings (file:///cache/qwen-code/0.15.10/node_modules/@qwen-code/qwen-code/cli.js:472257:29)
    at main (file:///cache/qwen-code/0.15.10/node_modules/@qwen-code/qwen-code/cli.js:573116:70)
"""
ENOENT = "Error: ENOENT: no such file or directory, lstat '/tmp/q1/clone/results'"


def test_a_crash_before_the_first_model_request_is_an_error_naming_its_cause(tmp_path: Path) -> None:
    stderr = tmp_path / "agent.stderr"
    stderr.write_text(RELATIVE_HOME_CRASH)
    crashed = ProcessOutcome(exit_code=1, timed_out=False, wall_s=1.5, leftovers_killed=0)
    assert agent_error_line(stderr) == ENOENT  # not the stack frames below it
    status, error = classify(crashed, AgentReport(), stderr, requests=0)
    # not the agent's work: --resume retries it and it enters no predictions file
    assert (status, error) == ("error", f"Qwen Code exit code 1 before its first model request: {ENOENT}")
    assert classify(crashed, AgentReport(requests=2), stderr, requests=2) == (
        "agent-crash",
        f"exit code 1: {ENOENT}",
    )


def _meta(tmp_path: Path, settings: AgentSettings):
    task = Task("a__b-1", "a/b", "0" * 40, "fix it", {})
    args = AgentArgs(endpoint="http://x/v1", out=tmp_path / "results")
    return new_run(args, [task], ["a__b-1"], settings).read_meta()


def test_resume_continues_with_the_runs_repos_clone_and_workdir_settings(tmp_path: Path) -> None:
    started = AgentSettings(
        budget_s=60, max_tokens=512, repos_dir=tmp_path / "mirrors", allow_clone=False, keep_workdirs=True
    )
    meta = _meta(tmp_path, started)
    assert resume_settings(meta, AgentArgs()) == started
    overridden = resume_settings(meta, AgentArgs(repos=Path("elsewhere"), clone=True, keep_workdirs=False))
    assert overridden.repos_dir == Path("elsewhere").absolute()
    assert (overridden.allow_clone, overridden.keep_workdirs, overridden.max_tokens) == (True, False, 512)


def test_tasks_without_mirror_or_base_commit_are_named_and_none_usable_stops_the_run(
    readonly_mirrors: Path, tmp_path: Path
) -> None:
    tasks = [(0, Task(f"a__b-{i}", "a/b", "0" * 40, "x", {})) for i in range(3)]
    settings = AgentSettings(repos_dir=tmp_path / "none", allow_clone=False)
    with pytest.raises(LumobenchError, match=r"^no mirror of a/b under .*none \(looked for a__b, a/b, b\)$"):
        find_mirrors(tasks, settings)
    astropy = [(0, t) for t in resolve_tasks(["astropy__astropy-12907", "astropy__astropy-14365"])]
    settings = AgentSettings(repos_dir=readonly_mirrors, allow_clone=False)
    mirrors = find_mirrors([*tasks, *astropy], settings)
    mirror = readonly_mirrors / "astropy__astropy.git"
    assert mirrors["astropy__astropy-12907"] == mirror and "no mirror of a/b" in str(mirrors["a__b-0"])
    absent = f"base commit 7269fa3e33e8 of astropy__astropy-14365 is not in mirror {mirror}"
    assert mirrors["astropy__astropy-14365"] == absent
    with pytest.raises(LumobenchError, match=f"^{absent}$"):
        find_mirrors(astropy[1:], settings)


def test_an_arm_whose_context_cannot_fit_the_agent_stops_the_run(tmp_path: Path) -> None:
    check_context(ArmContext(32768, can_fit=True), 24000, "lumotree")  # the proxy fits each request
    check_context(ArmContext(None, can_fit=False), 24000, "scripted")  # nothing known: nothing to check
    with pytest.raises(LumobenchError, match=r"pass --max-tokens 12768 or less$"):
        check_context(ArmContext(32768, can_fit=False), 24000, "vllm")
    with pytest.raises(LumobenchError, match=r"context of 8192 tokens: Qwen Code's first prompt alone"):
        check_context(ArmContext(8192, can_fit=True), 128, "small")


@pytest.mark.integration
def test_readme_agent_command_without_mirrors_fails_fast_with_one_line(
    live_url: str, readonly_mirrors: Path, tmp_path: Path
) -> None:
    """docs/agent.md's command with a --repos folder that does not exist, and no cloning: one line, exit 2,
    before any agent or arm starts."""
    result = lumobench(
        "agent", "--tasks", "astropy", "--endpoint", f"{live_url}/v1", "--repos", tmp_path / "mirrors",
        "--no-clone", "--out", tmp_path / "results",
    )  # fmt: skip
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: no mirror of astropy/astropy under ")
    assert not (tmp_path / "mirrors").exists() and not (tmp_path / "results").exists()
    # with a mirror, the shared server (8,192-token context) is too small for Qwen Code's first prompt
    result = lumobench(
        "agent", "--tasks", "astropy__astropy-12907", "--endpoint", f"{live_url}/v1",
        "--repos", readonly_mirrors, "--out", tmp_path / "results",
    )  # fmt: skip
    assert result.returncode == 2 and "error: arm endpoint has a context of 8192 tokens" in result.stderr
    assert "Traceback" not in result.stderr


def test_npm_failures_name_the_cause_not_the_log_file(tmp_path: Path, monkeypatch) -> None:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed")
    # a registry nobody listens on: npm fails at once, offline
    monkeypatch.setenv("npm_config_registry", f"http://127.0.0.1:{free_port()}/")
    monkeypatch.setenv("npm_config_fetch_retries", "0")
    with pytest.raises(LumobenchError) as err:
        ensure_qwen_code("0.15.10", cache=tmp_path / "cache")
    message = str(err.value)
    assert message.startswith("installing @qwen-code/qwen-code@0.15.10 with npm failed: ECONNREFUSED: ")
    assert "A complete log" not in message and "\n" not in message
    notarget = (
        "npm error code ETARGET\n"
        "npm error notarget No matching version found for @qwen-code/qwen-code@0.0.0-nope.\n"
        "npm error notarget In most cases you or one of your dependencies are requesting\n"
        "npm error A complete log of this run can be found in: /root/.npm/_logs/x-debug-0.log\n"
    )
    assert (
        npm_failure(notarget, 1) == "ETARGET: No matching version found for @qwen-code/qwen-code@0.0.0-nope."
    )


def test_sighup_and_sigterm_interrupt_like_ctrl_c() -> None:
    """A closed terminal (SIGHUP) or `kill` (SIGTERM) must unwind like Ctrl-C, so `finally` blocks stop
    the agent, its shell children and the arm (the SIGTERM case runs a whole agent in test_agent_run)."""
    code = (
        "import os, signal, sys\nfrom lumobench.errors import interrupt_on_signals\ninterrupt_on_signals()\n"
        "for sig in (signal.SIGHUP, signal.SIGTERM):\n"
        "    try:\n        os.kill(os.getpid(), sig)\n        signal.pause()\n"
        "    except KeyboardInterrupt:\n        print(sig.name, 'unwound')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout.split("\n")) == (0, ["SIGHUP unwound", "SIGTERM unwound", ""])
