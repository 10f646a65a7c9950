"""Interleaved replay: rotation, when it is chosen, quiet idle arms, and the CLI end to end (scripted
servers stand for engines: their timing is known, so the rotation and the pairing can be checked)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from lumobench.arms import ResolvedArm, load_arm, resolve_arm
from lumobench.errors import LumobenchError
from lumobench.interleave import choose_mode, rotation
from lumobench.plan import ReplayArgs, plan_replay
from lumobench.proc_cpu import group_cpu_seconds, wait_quiet
from lumobench.replay import Member, on_free_port
from lumobench.results import RunDir

from .helpers import free_port, lumobench, small_corpus


def test_rotation_sends_each_request_to_every_arm_starting_one_further_each_time() -> None:
    arms = ["a", "b", "c"]
    orders = [rotation(arms, run, seq, 4) for run in range(2) for seq in range(4)]
    assert all(sorted(o) == arms for o in orders)
    assert [o[0] for o in orders] == ["a", "b", "c", "a", "b", "c", "a", "b"]  # continues across repetitions
    assert Counter(o.index("c") for o in orders) == Counter({0: 2, 1: 3, 2: 3})  # every arm takes every slot


def _arm(tmp_path: Path, name: str, fields: str, port: int | None = None) -> ResolvedArm:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'engine = "t"\nport = {port or free_port()}\ncommand = ["x"]\n{fields}\n')
    return resolve_arm(*load_arm(str(path)))


def test_interleaving_is_the_default_only_where_the_arms_fit(tmp_path: Path) -> None:
    a, b = _arm(tmp_path, "a", "memory_gb = 3.3"), _arm(tmp_path, "b", "memory_gb = 0.5")
    interleave, note = choose_mode([a, b], None, 1, available_gb=10.0)
    assert interleave and note is not None and "~3.8 of 10.0 GiB available" in note
    interleave, note = choose_mode([a, b], None, 1, available_gb=4.0)
    assert not interleave and "need ~3.8 GiB together and 4.0 GiB is available" in note  # type: ignore[operator]
    assert choose_mode([a, b], True, 1, available_gb=4.0)[0]  # --interleaved overrides the estimate
    assert choose_mode([a, b], False, 1, available_gb=10.0) == (False, None)  # --sequential
    unknown = _arm(tmp_path, "u", "")
    assert "no memory_gb estimate in arm file(s) u" in choose_mode([a, unknown], None, 1, 10.0)[1]  # type: ignore[operator]
    assert "--concurrency 2" in choose_mode([a, b], None, 2, 10.0)[1]  # type: ignore[operator]
    gpu = _arm(tmp_path, "g", "memory_gb = 1\nrequires_gpu = true")
    assert "GPU arms (g)" in choose_mode([a, gpu], None, 1, 10.0)[1]  # type: ignore[operator]
    twin = _arm(tmp_path, "twin", "memory_gb = 1", port=int(a.base_url.rsplit(":", 1)[1]))
    assert not choose_mode([a, twin], None, 1, 10.0)[0]
    with pytest.raises(LumobenchError, match="--interleaved: arms a and twin both listen on"):
        choose_mode([a, twin], True, 1, 10.0)
    with pytest.raises(LumobenchError, match="at least two arms"):
        choose_mode([a], True, 1, 10.0)
    assert choose_mode([a], None, 1, 10.0) == (False, None)


def test_wait_quiet_outlasts_a_process_group_that_spins_after_its_work() -> None:
    # stands for an idle engine that busy-polls for a while after a request (vLLM's worker: ~1 s)
    spin = "import time\nprint(flush=True)\nt = time.monotonic()\nwhile time.monotonic() - t < 0.6: pass\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", spin + "time.sleep(30)"], start_new_session=True, stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"\n"  # spinning from now on
        t0 = time.monotonic()
        waited = wait_quiet([proc.pid], max_wait_s=5.0)
        assert time.monotonic() - t0 >= waited > 0.4  # it waited the spin out (0.6 s from the line)
        before = group_cpu_seconds([proc.pid])[proc.pid]
        time.sleep(0.3)
        assert group_cpu_seconds([proc.pid])[proc.pid] - before < 0.03  # quiet once it returned
        assert before > 0.1  # the spin itself was counted
    finally:
        proc.kill()
        proc.wait()
    assert group_cpu_seconds([proc.pid]) == {proc.pid: 0.0}  # a group with no process left reads zero


def _rows(run_dir: Path) -> list:
    return RunDir(run_dir).read_rows()


def test_interleaved_replay_rotates_arms_per_request_and_pairs_their_rates(
    tmp_path: Path, scripted_arm: Callable[..., Path]
) -> None:
    fast = scripted_arm("fast", arm_fields="memory_gb = 0.1", tokens=12, tokens_per_event=3, interval_ms=4)
    slow = scripted_arm("slow", arm_fields="memory_gb = 0.1", tokens=12, tokens_per_event=1, interval_ms=4)
    out = tmp_path / "r"
    proc = lumobench(
        "replay", small_corpus(tmp_path, 3), "--arm", slow, "--arm", fast, "--runs", "2", "--out", out
    )
    assert proc.returncode == 0, proc.stderr
    assert "interleaved: 2 arms up at once" in proc.stderr
    assert "interleaved: all arms up at once, each request sent to every arm in rotated order" in proc.stdout
    dirs = {json.loads((d / "run.json").read_text())["arm"]["name"]: d for d in out.iterdir()}
    rows = {arm: _rows(d) for arm, d in dirs.items()}
    for arm, arm_rows in rows.items():
        assert Counter(r.key for r in arm_rows) == Counter(
            {(i, f"wal-t0{j}"): 1 for i in range(2) for j in (1, 2, 3)}
        )
        assert all(r.status == "completed" and r.others_cpu_s is not None for r in arm_rows)
        meta = RunDir(dirs[arm]).read_meta()
        assert (
            meta.interleaved_with == [d.name for d in (dirs["slow"], dirs["fast"])]
            and meta.status == "finished"
        )
        assert [(s.run_index, s.outcome) for s in meta.segments] == [(0, "finished"), (1, "finished")]
        assert (dirs[arm] / "metrics" / "run1.seg0.after.prom").is_file()
        # request j of repetition r went first to arm (3r + j) mod 2 of [slow, fast]
        first = {"slow": 0, "fast": 1}[arm]
        assert all(r.slot == (3 * r.run_index + r.seq + first) % 2 for r in arm_rows)
    # in time, too: every request reached both arms before the next request was sent anywhere
    timeline = sorted((r.t_send_ns, r.run_index, r.seq) for arm_rows in rows.values() for r in arm_rows)
    assert [(run, seq) for _, run, seq in timeline] == [
        (run, seq) for run in range(2) for seq in range(3) for _ in "ab"
    ]
    report = json.loads(lumobench("report", dirs["slow"], dirs["fast"], "--format", "json").stdout)["arms"]
    assert report[1]["reference"] == "slow" and report[1]["interleaved"]
    # 11 tokens after the first: 11 gaps of 4 ms vs 3 events after the first, ~11/3 = 3.7x
    assert 2.0 < report[1]["ratio_vs_first"] < 5.0
    lo, hi = report[1]["ratio_ci95"]
    assert lo <= report[1]["ratio_vs_first"] <= hi and len(report[1]["per_request_ratios"]) == 3


def test_an_arm_whose_port_was_taken_since_the_plan_starts_on_a_free_one(
    tmp_path: Path, scripted_arm: Callable[..., Path]
) -> None:
    """Up front a busy port is a user mistake (plan_replay refuses it); one taken later, e.g. between the
    repetitions of an arm that boots per repetition, moves the arm to a free port instead."""
    arm = scripted_arm("later", arm_fields="memory_gb = 0.1", tokens=4)
    args = ReplayArgs(corpus=small_corpus(tmp_path, 1), arms=(str(arm),), out=tmp_path / "r")
    (plan,) = plan_replay(args).plans
    assert plan.arm is not None
    port = plan.arm.port
    assert on_free_port(Member(plan), print) is plan.arm  # free: unchanged
    notes: list[str] = []
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        moved = on_free_port(Member(plan), notes.append)
    assert moved.port != port and plan.arm is moved and str(moved.port) in moved.argv
    assert plan.meta.endpoint == plan.target.base_url == moved.base_url
    assert plan.meta.arm.config["argv"] == moved.argv
    assert notes == [
        f"arm later: port {port} is in use by another process; started on {moved.base_url} instead"
    ]


def test_an_arm_that_turns_unavailable_leaves_the_rotation_as_aborted(
    tmp_path: Path, scripted_arm: Callable[..., Path]
) -> None:
    steady = scripted_arm("steady", arm_fields="memory_gb = 0.1", tokens=8)
    down = scripted_arm("down", arm_fields="memory_gb = 0.1", tokens=8, unavailable_after=2)
    out = tmp_path / "r"
    proc = lumobench("replay", small_corpus(tmp_path, 4), "--arm", steady, "--arm", down, "--out", out)
    assert proc.returncode == 3, proc.stderr
    assert "interleaved" in proc.stderr and "down: run aborted" in proc.stderr
    assert "health check" in proc.stderr  # the 503 and the failing /health, in one line
    dirs = {json.loads((d / "run.json").read_text())["arm"]["name"]: d for d in out.iterdir()}
    assert len(_rows(dirs["steady"])) == 4
    assert Counter(r.status for r in _rows(dirs["down"])) == Counter({"completed": 2, "failed": 1})


def test_an_arm_that_dies_leaves_the_rotation_and_resume_finishes_the_group(
    tmp_path: Path, scripted_arm: Callable[..., Path]
) -> None:
    steady = scripted_arm("steady", arm_fields="memory_gb = 0.1", tokens=8)
    # an arm that boots per repetition dies in repetition 0, comes back fresh for repetition 1
    crashy = scripted_arm(
        "crashy",
        arm_fields="memory_gb = 0.1\nboot_per_run = true",
        tokens=8,
        crash_once_file=str(tmp_path / "crashed"),
        crash_after=2,
    )
    out = tmp_path / "r"
    corpus = small_corpus(tmp_path, 4)
    proc = lumobench("replay", corpus, "--arm", steady, "--arm", crashy, "--runs", "2", "--out", out)
    assert proc.returncode == 3, proc.stderr
    assert "crashy: run aborted" in proc.stderr and "pooled tok/s" in proc.stdout
    dirs = {json.loads((d / "run.json").read_text())["arm"]["name"]: d for d in out.iterdir()}
    assert len(_rows(dirs["steady"])) == 8  # the other arm finished every request
    # repetition 0: two completed, the one in flight failed; repetition 1: all four, from a fresh boot
    assert Counter((r.run_index, r.status) for r in _rows(dirs["crashy"])) == Counter(
        {(0, "completed"): 2, (0, "failed"): 1, (1, "completed"): 4}
    )
    one_port = lumobench("replay", "--resume", dirs["steady"], "--port", "5000")
    assert one_port.returncode == 2 and "resume it without --port, or with --port 0" in one_port.stderr
    resumed = lumobench("replay", "--resume", dirs["steady"])
    assert resumed.returncode == 0, resumed.stderr
    everything = Counter({(i, f"wal-t0{j}"): 1 for i in range(2) for j in range(1, 5)})
    for arm in ("steady", "crashy"):
        assert Counter(r.key for r in _rows(dirs[arm])) == everything  # exactly one row per key
        assert all(r.status == "completed" for r in _rows(dirs[arm]))
    assert (dirs["steady"] / "server.log").read_text().count(
        "=== lumobench: starting arm"
    ) == 1  # done: not rebooted
    segments = [(s.run_index, s.outcome) for s in RunDir(dirs["crashy"]).read_meta().segments]
    assert segments == [(0, "aborted"), (1, "finished"), (0, "finished")]
    assert (dirs["crashy"] / "server.log").read_text().count("=== lumobench: starting arm") == 3
