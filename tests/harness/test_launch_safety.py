"""Launched arms and their run directories: a keyed arm gets its key and no secret reaches the disk, a
killed lumobench leaves no server behind, a run has one writer, `--resume --port` and `serve --port 0`
take the port asked for. Arms are the scripted SSE server (a real HTTP server process)."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from lumobench.arms import load_arm, resolve_arm
from lumobench.errors import LumobenchError
from lumobench.launch import ArmStartError, launched
from lumobench.plan import Plan, ReplayArgs, plan_replay
from lumobench.redact import Redactor
from lumobench.replay import Member, ReplayOutcome, run_group
from lumobench.results import RunDir

from .helpers import REPO, free_port, processes_with, small_corpus

HARD_TIMEOUT_S = 60


def _arm(tmp_path: Path, script: dict, extra: str = "", command: str | None = None) -> tuple[Path, Path]:
    """An arm file for the scripted server with `script`; returns (arm file, script file)."""
    script_path = tmp_path / "script.json"
    script_path.write_text(json.dumps(script))
    server = '"{python}", "-m", "lumobench.bench.client.scripted_server", "--port", "{port}"'
    command = command or f'[{server}, "--script", "{script_path}"]'
    arm = tmp_path / "arm.toml"
    head = f'engine = "scripted"\nport = {free_port()}\ncommand = {command}\n'
    arm.write_text(head + extra + "\n[readiness]\ntimeout_s = 30\n")
    return arm, script_path


def _new_plan(tmp_path: Path, arm: Path, n: int) -> Plan:
    corpus = small_corpus(tmp_path, n, max_tokens=4)
    (plan,) = plan_replay(ReplayArgs(corpus=corpus, arms=(str(arm),), out=tmp_path / "r")).plans
    return plan


def _launch_and_replay(plan: Plan) -> ReplayOutcome:
    assert plan.arm is not None
    (outcome,) = run_group([Member(plan)])  # launches the arm, replays, stops it
    return outcome


@pytest.mark.timeout(HARD_TIMEOUT_S)
def test_a_keyed_arm_gets_its_key_and_no_secret_reaches_the_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, token, password = "sk-live-3f9a8b7c6d5e", "hf_env_secret_4567890", "url-pass-secret-99"
    monkeypatch.setenv("ARM_TEST_KEY", key)
    arm, _ = _arm(
        tmp_path,
        {"tokens": 4, "echo_env": ["HF_TOKEN", "UPSTREAM"]},
        extra=(
            'api_key_env = "ARM_TEST_KEY"\n[env]\n'
            f'HF_TOKEN = "{token}"\nUPSTREAM = "http://bench:{password}@mirror.example/v1"\n'
            'PLAIN = "visible-value"\n'
        ),
        command=(
            '["{python}", "-m", "lumobench.bench.client.scripted_server", "--port", "{port}", '
            f'"--script", "{tmp_path / "script.json"}", "--api-key", "${{ARM_TEST_KEY}}"]'
        ),
    )
    plan = _new_plan(tmp_path, arm, 2)
    # the server refuses every route without the key, /health included: readiness and requests sent it
    outcome = _launch_and_replay(plan)
    assert (outcome.status, outcome.completed) == ("finished", 2)
    files = [p for p in plan.run.path.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"run.json", "requests.jsonl", "server.log", "lumobench.lock"}
    for secret in (key, token, password):
        assert [p.name for p in files if secret.encode() in p.read_bytes()] == []
    log = plan.run.server_log.read_text()
    assert "HF_TOKEN=***" in log and "--api-key ***" in log and "'--api-key', '***'" in log
    assert "UPSTREAM=http://bench:***@mirror.example/v1" in log
    meta = plan.run.read_meta()
    assert meta.api_key_env == "ARM_TEST_KEY" and meta.arm.config["env"]["PLAIN"] == "visible-value"
    assert meta.arm.config["env"]["HF_TOKEN"] == "***" and meta.arm.config["argv"][-1] == "***"


def _wait_for(condition: object, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a killed server reparented to init may linger as a zombie for a moment
    return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"


def test_kill_9_leaves_no_server_behind_and_a_run_has_one_writer(tmp_path: Path) -> None:
    server_pid, child_pid = tmp_path / "server.pid", tmp_path / "child.pid"
    # the arm's process group: a shell's background child and the server it execs
    arm, script = _arm(
        tmp_path,
        {"tokens": 30, "interval_ms": 100, "pid_file": str(server_pid)},
        command=(
            f'["sh", "-c", "sleep 300 & echo $! > {child_pid}; exec {sys.executable} -m '
            f'lumobench.bench.client.scripted_server --port {{port}} --script {tmp_path / "script.json"}"]'
        ),
    )
    corpus, out = small_corpus(tmp_path, 8, max_tokens=30), tmp_path / "r"
    first = subprocess.Popen(
        [sys.executable, "-m", "lumobench.cli", "replay", str(corpus), "--arm", str(arm), "--out", str(out)],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for(lambda: any(p.stat().st_size for p in out.glob("*/requests.jsonl")), "the first row")
        (run_dir,) = out.iterdir()
        # a second process may not write the same run while the first does
        with pytest.raises(LumobenchError, match=rf"in use by another lumobench process \(pid {first.pid}: "):
            plan_replay(ReplayArgs(resume=run_dir))
        assert first.poll() is None, "the first replay finished too early for the test"
        first.kill()  # SIGKILL: no finally block, no handler runs in lumobench
        first.wait(30)
        pids = [int(server_pid.read_text()), int(child_pid.read_text())]
        _wait_for(lambda: not any(_alive(pid) for pid in pids), "the arm's processes to die", timeout_s=30)
    finally:
        first.kill()
    script.write_text(json.dumps({"tokens": 30, "interval_ms": 1}))  # the resumed run need not be slow
    port = free_port()
    (plan,) = plan_replay(ReplayArgs(resume=run_dir, port=port)).plans
    plan.run.prepare_resume()
    assert _launch_and_replay(plan).status == "finished"
    assert Counter(r.key for r in RunDir(run_dir).read_rows()) == Counter(
        {(0, f"wal-t0{j}"): 1 for j in range(1, 9)}
    )
    assert plan.run.read_meta().endpoint == f"http://127.0.0.1:{port}"


def test_serve_port_0_picks_a_free_port_and_prints_it(tmp_path: Path) -> None:
    arm, _ = _arm(tmp_path, {"tokens": 4})
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lumobench.cli",
            "serve",
            str(arm),
            "--port",
            "0",
            "--quiet",
            "--log",
            str(tmp_path / "s.log"),
        ],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stderr], daemon=True).start()  # type: ignore[union-attr]
    seen: list[str] = []
    try:
        while not any("ready at" in line for line in seen):
            seen.append(lines.get(timeout=HARD_TIMEOUT_S))
        picked = int(re.search(r"picked free port (\d+)", "".join(seen)).group(1))  # type: ignore[union-attr]
        assert f"ready at http://127.0.0.1:{picked} " in "".join(seen)
        assert f"port = {picked}\n" not in arm.read_text()
        assert httpx.get(f"http://127.0.0.1:{picked}/health", timeout=10).status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    assert proc.returncode == 0


def test_secrets_are_found_by_name_and_position_not_everywhere() -> None:
    argv = ["vllm", "serve", "--api-key", "sk-aaaaaaaa1", "--hf-token=hf_bbbbbbbb2", "--tokenizer", "/m/tok"]
    argv += ["--max-num-batched-tokens", "8192", "--upstream", "http://u:pw-cccccccc3@h/v1"]
    redactor = Redactor.for_launch(argv, {"HF_TOKEN": "1", "AWS_SECRET_ACCESS_KEY": "s", "PORT_MAP": "a:b"})
    assert redactor.argv(argv) == [
        "vllm", "serve", "--api-key", "***", "--hf-token=***", "--tokenizer", "/m/tok",
        "--max-num-batched-tokens", "8192", "--upstream", "http://u:***@h/v1",
    ]  # fmt: skip
    assert redactor.env({"HF_TOKEN": "1", "PORT_MAP": "a:b"}) == {"HF_TOKEN": "***", "PORT_MAP": "a:b"}
    # long secrets are masked wherever they appear; "1" is masked only in its own place
    assert redactor.text("key sk-aaaaaaaa1 and 1 more") == "key *** and 1 more"
    assert redactor.raw(b"token=hf_bbbbbbbb2\n") == b"token=***\n"


def _watchdogs_of(pid: int) -> list[int]:
    """Pids of the live watchdog processes guarding process group `pid`."""
    return [w for w in processes_with("lumobench.watchdog", str(pid)) if _alive(w)]


@pytest.mark.parametrize("pause", [True, False], ids=["watchdog-restarted", "killed-back-to-back"])
def test_killing_the_watchdog_and_then_lumobench_leaves_no_server_behind(tmp_path: Path, pause: bool) -> None:
    server_pid = tmp_path / "server.pid"
    arm, _ = _arm(tmp_path, {"tokens": 30, "interval_ms": 100, "pid_file": str(server_pid)})
    corpus, out = small_corpus(tmp_path, 8, max_tokens=30), tmp_path / "r"
    lumobench_proc = subprocess.Popen(
        [sys.executable, "-m", "lumobench.cli", "replay", str(corpus), "--arm", str(arm), "--out", str(out)],
        cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_for(lambda: any(p.stat().st_size for p in out.glob("*/requests.jsonl")), "the first row")
        pid = int(server_pid.read_text())
        (watchdog,) = _watchdogs_of(pid)
        os.kill(watchdog, signal.SIGKILL)
        if pause:  # lumobench starts it again: the new one stops the group when lumobench dies
            _wait_for(lambda: [w for w in _watchdogs_of(pid) if w != watchdog], "a new watchdog", 10)
        lumobench_proc.kill()
        lumobench_proc.wait(30)
        # back to back, no watchdog is left: the kernel's parent-death signal stops the server
        _wait_for(lambda: not _alive(pid), "the arm to die", timeout_s=30)
    finally:
        lumobench_proc.kill()


def test_a_keyed_arm_without_its_key_fails_readiness_at_once_naming_the_key(tmp_path: Path) -> None:
    arm, _ = _arm(tmp_path, {"tokens": 4})
    arm.write_text(
        arm.read_text().replace('"--port", "{port}"', '"--port", "{port}", "--api-key", "k-123"', 1)
    )
    config, source = load_arm(str(arm))
    start = time.monotonic()
    needs_key = "with HTTP 401: the server requires an API key: set api_key_env"
    with (
        pytest.raises(ArmStartError, match=needs_key),
        launched(resolve_arm(config, source), tmp_path / "s.log"),
    ):
        pass
    assert time.monotonic() - start < 20  # not the readiness timeout (30 s here, 120-400 s in arm files)
