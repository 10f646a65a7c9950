"""`lumobench evaluate --local`: grading without Docker in one cached venv per task version.

The default run checks the command's bad input, the test files it hands pytest, the grading of captured
logs and the tasks it cannot grade here, none of which builds Astropy; the slow test grades one gold
and one empty patch end to end on the real mirror (the first run builds the 4.3 environment, minutes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lumobench.agent import local_env
from lumobench.agent.evaluate import Prediction, read_evaluations
from lumobench.agent.local_eval import evaluate_locally, files_under_test, grade_log
from lumobench.agent.tasks import Task, resolve_tasks

from .conftest import lumobench, tree_state

pytest.importorskip("swebench", reason="grading needs the swebench package (dev extra)")

DATA = Path(__file__).resolve().parent / "data"
TASK = "astropy__astropy-12907"


def _predictions(path: Path, patches: dict[str, str]) -> Path:
    rows = [{"instance_id": i, "model_name_or_path": "m", "model_patch": p} for i, p in patches.items()]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_pytest_gets_the_files_the_records_eval_script_tests():
    for task in resolve_tasks(["astropy"]):
        script = task.record["eval_script"]
        command = script.split(": '>>>>> Start Test Output'\n")[1].splitlines()[0]
        assert command == "pytest -rA " + " ".join(files_under_test(task)), task.instance_id


def test_captured_logs_grade_gold_resolved_and_a_non_fix_unresolved():
    """Logs `evaluate --local` wrote for 12907 (gold patch; a patch that only adds a comment), graded
    again by swebench's grader."""
    task = resolve_tasks([TASK])[0]
    gold = grade_log(task, Prediction(TASK, "m", "x"), DATA / "12907-gold.test_output.txt")
    assert (gold.status, gold.detail) == ("resolved", "FAIL_TO_PASS 2/2, PASS_TO_PASS 13/13 pass")
    wrong = grade_log(task, Prediction(TASK, "m", "x"), DATA / "12907-wrong.test_output.txt")
    assert (wrong.status, wrong.detail) == ("unresolved", "FAIL_TO_PASS 0/2, PASS_TO_PASS 13/13 pass")


def test_tasks_it_cannot_grade_here_are_one_line_each_and_build_nothing(readonly_mirrors, tmp_path):
    tasks = {t.instance_id: t for t in resolve_tasks(["astropy__astropy-14995", TASK])}
    tasks["other__repo-1"] = Task("other__repo-1", "other/repo", "0" * 40, "x", {"version": "1.0"})
    tasks["astropy__astropy-1"] = Task(
        "astropy__astropy-1", "astropy/astropy", "0" * 40, "x", {"version": "1.3"}
    )
    predictions = [
        Prediction("astropy__astropy-14995", "m", "diff"),
        Prediction("other__repo-1", "m", "diff"),
        Prediction("astropy__astropy-1", "m", "diff"),
        Prediction(TASK, "m", ""),
    ]
    lines: list[str] = []
    results = evaluate_locally(predictions, tasks, readonly_mirrors, tmp_path / "out", lines.append, tmp_path)
    mirror = readonly_mirrors / "astropy__astropy.git"
    assert [(r.status, r.detail) for r in results] == [
        ("not-evaluated", f"base commit b16c7d12ccbc is not in mirror {mirror}"),
        ("not-evaluated", "local grading knows SWE-bench's specs for astropy/astropy only, not other/repo"),
        ("not-evaluated", "local grading has no spec for astropy/astropy version '1.3' (it has 4.1, 4.2, "
         "4.3, 5.0, 5.1, 5.2)"),
        ("empty-patch", "empty patch: unresolved"),
    ]  # fmt: skip
    assert sorted(lines) == sorted(f"{r.status} {r.instance_id}: {r.detail}" for r in results)
    assert list(tmp_path.iterdir()) == []  # no environment, no log


def test_bad_local_options_are_one_line_errors(tmp_path):
    preds = _predictions(tmp_path / "predictions.jsonl", {TASK: ""})
    for args, message in (
        (["--local", "--logs", tmp_path], "error: give --local or --logs, not both"),
        (["--rebuild"], "error: --repos and --rebuild belong to --local"),
        (
            ["--local", "--repos", tmp_path / "nowhere"],
            f"error: no folder of mirrors at {tmp_path / 'nowhere'} (give --repos DIR)",
        ),
    ):
        result = lumobench("evaluate", preds, *args)
        assert (result.returncode, result.stderr.strip()) == (2, message)


@pytest.mark.slow
def test_gold_patch_resolves_and_empty_patch_does_not_end_to_end(readonly_mirrors, tmp_path):
    """`lumobench evaluate --local` on the real read-only mirror: 12907's gold patch resolves it in the
    cached 4.3 environment (built on first use), the empty patch is unresolved, the mirror unchanged."""
    before = tree_state(readonly_mirrors)
    task = resolve_tasks([TASK])[0]
    preds = _predictions(tmp_path / "predictions.jsonl", {TASK: task.record["patch"]})
    result = lumobench("evaluate", preds, "--local", "--repos", readonly_mirrors)
    assert result.returncode == 0, result.stderr
    assert f"resolved {TASK}: FAIL_TO_PASS 2/2, PASS_TO_PASS 13/13 pass (" in result.stderr
    assert result.stdout.startswith("1 resolved, 0 unresolved, 0 empty-patch, 0 not-evaluated")
    [evaluation] = read_evaluations(tmp_path / "evaluation.jsonl").values()
    assert evaluation.status == "resolved" and evaluation.seconds is not None
    log = tmp_path / "evaluation.local" / TASK / "test_output.txt"
    assert "PASSED astropy/modeling/tests/test_separable.py::test_custom_model_separable" in log.read_text()
    built = json.loads((local_env.env_root("astropy/astropy", "4.3") / "env.json").read_text())
    assert built["status"] == "ok" and built["python"].startswith("3.11")

    _predictions(preds, {TASK: ""})
    result = lumobench("evaluate", preds, "--local", "--repos", readonly_mirrors)
    assert result.returncode == 0 and f"empty-patch {TASK}: empty patch: unresolved" in result.stderr
    assert tree_state(readonly_mirrors) == before
