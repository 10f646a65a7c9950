"""`lumobench evaluate`: grading from existing SWE-bench harness logs (swebench's own grader, offline),
and the no-Docker path that marks tasks "not evaluated" (empty patches unresolved without evaluation)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lumobench.agent import evaluate as ev
from lumobench.agent.driver import AgentArgs, AgentSettings, new_run
from lumobench.agent.tasks import resolve_tasks
from lumobench.errors import LumobenchError

from .conftest import lumobench

pytest.importorskip("swebench", reason="grading needs the swebench package (dev extra)")

TASK = "astropy__astropy-12907"


def _harness_log(logs: Path, instance_id: str, statuses: dict[str, str], exit_code: int) -> Path:
    """A test_output.txt in the layout and shape the harness writes (bash -x trace, markers, pytest -rA)."""
    folder = logs / "run_evaluation" / "run1" / "qwen-code-0.15.10__lumotree" / instance_id
    folder.mkdir(parents=True)
    summary = "\n".join(f"{status} {test}" for test, status in statuses.items())
    (folder / ev.TEST_LOG).write_text(
        "+ git apply -v - <<'EOF_114329324912'\nApplied patch astropy/modeling/separable.py cleanly.\n"
        "+ : '>>>>> Start Test Output'\n+ pytest -rA astropy/modeling/tests/test_separable.py\n"
        "============================= test session starts ==============================\n"
        f"=========================== short test summary info ============================\n{summary}\n"
        "+ SWEBENCH_TEST_EXIT_CODE="
        f"{exit_code}\n+ : '>>>>> End Test Output'\n"
        f"+ echo '>>>>> Test Exit Code: {exit_code}'\n>>>>> Test Exit Code: {exit_code}\n"
    )
    return folder / ev.TEST_LOG


def _tests(task_id: str) -> tuple[list[str], list[str]]:
    record = resolve_tasks([task_id])[0].record
    return json.loads(record["FAIL_TO_PASS"]), json.loads(record["PASS_TO_PASS"])


def test_grading_existing_logs_tells_resolved_from_unresolved(tmp_path):
    f2p, p2p = _tests(TASK)
    other = "astropy__astropy-13033"
    f2p_other, p2p_other = _tests(other)
    _harness_log(tmp_path, TASK, {t: "PASSED" for t in f2p + p2p}, 0)
    # one FAIL_TO_PASS test still fails: not resolved
    _harness_log(tmp_path, other, {**{t: "PASSED" for t in f2p_other + p2p_other}, f2p_other[0]: "FAILED"}, 1)
    predictions = [
        ev.Prediction(TASK, "m", "diff --git a/x b/x\n"),
        ev.Prediction(other, "m", "diff --git a/y b/y\n"),
        ev.Prediction("astropy__astropy-14995", "m", ""),
    ]
    tasks = {t.instance_id: t for t in resolve_tasks([p.instance_id for p in predictions])}
    results = ev.grade(predictions, tasks, ev.find_test_logs(tmp_path))
    assert [(r.instance_id, r.status) for r in results] == [
        (TASK, ev.RESOLVED),
        (other, ev.UNRESOLVED),
        ("astropy__astropy-14995", ev.EMPTY_PATCH),
    ]


def test_a_log_without_test_output_is_not_resolved(tmp_path):
    log = _harness_log(tmp_path, TASK, {}, 0)
    log.write_text(">>>>> Patch Apply Failed\n")
    tasks = {t.instance_id: t for t in resolve_tasks([TASK])}
    [result] = ev.grade([ev.Prediction(TASK, "m", "diff\n")], tasks, ev.find_test_logs(tmp_path))
    assert result.status == ev.UNRESOLVED and "did not apply" in result.detail


def test_evaluate_without_docker_marks_not_evaluated_and_updates_files(tmp_path):
    predictions = tmp_path / "predictions.jsonl"
    predictions.write_text(
        json.dumps({"instance_id": TASK, "model_name_or_path": "m", "model_patch": "diff --git a/x b/x\n"})
        + "\n"
        + json.dumps({"instance_id": "astropy__astropy-14995", "model_name_or_path": "m", "model_patch": ""})
        + "\n"
    )
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}  # no docker on this PATH
    result = subprocess.run(
        [sys.executable, "-m", "lumobench.cli", "evaluate", str(predictions)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "docker is not installed" in result.stderr and "needs a Docker daemon" in result.stderr
    rows = [json.loads(line) for line in (tmp_path / "evaluation.jsonl").read_text().splitlines()]
    assert [(r["instance_id"], r["status"]) for r in rows] == [
        (TASK, ev.NOT_EVALUATED),
        ("astropy__astropy-14995", ev.EMPTY_PATCH),
    ]


def test_bad_predictions_are_reported_with_their_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(
        '{"instance_id": "a", "model_name_or_path": "m", "model_patch": ""}\n{"instance_id": "b"}\n'
    )
    with pytest.raises(LumobenchError, match="line 2: not a SWE-bench prediction"):
        ev.read_predictions(path)


def test_evaluate_grades_a_classic_record_from_the_tasks_its_run_recorded(tmp_path):
    # a classic SWE-bench Verified row (no image, eval_script, log_parser, eval_type), under an id that
    # no shipped list holds, in the task file the agent run was started with
    classic = {k: v for k, v in resolve_tasks([TASK])[0].record.items() if k not in ev.HARNESS_FIELDS}
    classic["instance_id"] = task_id = "astropy__astropy-12907-classic"
    task_file = tmp_path / "classic.jsonl"
    task_file.write_text(json.dumps(classic) + "\n")
    [task] = resolve_tasks([str(task_file)])
    args = AgentArgs(endpoint="http://x/v1", out=tmp_path / "results")
    run = new_run(args, [task], [str(task_file)], AgentSettings())
    (run.path / "predictions.jsonl").write_text(
        json.dumps({"instance_id": task_id, "model_name_or_path": "m", "model_patch": "diff --git a/x b/x\n"})
        + "\n"
    )
    f2p, p2p = json.loads(classic["FAIL_TO_PASS"]), json.loads(classic["PASS_TO_PASS"])
    _harness_log(tmp_path / "logs", task_id, {t: "PASSED" for t in f2p + p2p}, 0)
    result = lumobench("evaluate", run.path / "predictions.jsonl", "--logs", tmp_path / "logs")
    assert result.returncode == 0, result.stderr  # no --tasks: the run's own
    assert "1 resolved" in result.stdout
    [row] = [json.loads(line) for line in (run.path / "evaluation.jsonl").read_text().splitlines()]
    assert (row["instance_id"], row["status"]) == (task_id, ev.RESOLVED)
    # the harness itself (Docker) needs swebench 5 records: a classic one is refused in one line first
    prediction = ev.Prediction(task_id, "m", "diff --git a/x b/x\n")
    with pytest.raises(LumobenchError, match=r"astropy__astropy-12907-classic are classic records"):
        ev.run_harness([prediction], {task_id: task}, tmp_path / "harness", "r")
    assert not (tmp_path / "harness").exists()
