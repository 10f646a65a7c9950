"""Grade predictions without Docker (`lumobench evaluate --local`): what the SWE-bench harness does in
its container, done in the task version's cached environment (`local_env`), graded with swebench's
own parser and grader.

For each non-empty prediction: check the base commit out in the environment's `src/`, run the spec's
pre-install step, apply the patch (`git apply`, else `patch --fuzz=5`, as the harness tries), rebuild
what changed, reset the test files and apply the test patch, run `pytest -rA` on the test patch's
files (the record's eval script's command), and write the log as the harness does (between its
`>>>>> Start/End Test Output` markers, with the exit code) for `get_eval_report`: resolved when every
FAIL_TO_PASS and PASS_TO_PASS test passes. Logs: `<out>/<instance_id>/test_output.txt`, beside the
patch and the build output of that grade.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path

from lumobench.agent import local_env
from lumobench.agent.evaluate import EMPTY_PATCH, NOT_EVALUATED, RESOLVED, UNRESOLVED, Evaluation, Prediction
from lumobench.agent.evaluate import grading_spec as swebench_spec
from lumobench.agent.process import ProcessOutcome, run_budgeted
from lumobench.agent.repos import ensure_mirror, git, missing_commits
from lumobench.agent.tasks import Task
from lumobench.errors import LumobenchError

# swebench.harness.constants, written by the harness's eval script and read by its grader
START, END, EXIT_CODE = ">>>>> Start Test Output", ">>>>> End Test Output", ">>>>> Test Exit Code"
APPLY_FAILED, TIMED_OUT, TESTS_ERROR = (
    ">>>>> Patch Apply Failed",
    ">>>>> Tests Timed Out",
    ">>>>> Tests Errored",
)
BUILD_S = local_env.BUILD_TIMEOUT_S
_DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/", re.M)


def files_under_test(task: Task) -> list[str]:
    """The files the test patch touches: what the harness's eval script hands to pytest."""
    files = _DIFF_FILE.findall(str(task.record.get("test_patch") or ""))
    if not files:
        raise LumobenchError(f"task {task.instance_id} has no test_patch to grade with")
    return list(dict.fromkeys(files))


def _git_quiet(args: list[str], cwd: Path, stdin: str = "") -> str | None:
    """git's last error line, or None when it succeeded."""
    try:
        git(args, cwd=cwd, stdin=stdin)
    except LumobenchError as exc:
        return str(exc)
    return None


def _run(argv: list[str], env: local_env.LocalEnv, out: Path, name: str, timeout_s: float) -> ProcessOutcome:
    """Run one step of a grade in `src/`, its output in `out/<name>.out` and `.err`."""
    return run_budgeted(argv, env.src, env.environ(), out / f"{name}.out", out / f"{name}.err", timeout_s)


def _apply(patch: str, env: local_env.LocalEnv, out: Path) -> str | None:
    """Apply `patch` in `src/` as the harness does (git apply, then patch with fuzz); None when one
    of them applied it, else git's reason."""
    (out / "patch.diff").write_text(patch)
    why = _git_quiet(["apply", "--verbose", "-"], env.src, stdin=patch)
    if why is None or shutil.which("patch") is None:
        return why
    fuzzy = _run(
        ["patch", "--batch", "--fuzz=5", "-p1", "-i", str(out / "patch.diff")], env, out, "patch", 60
    )
    return None if fuzzy.exit_code == 0 else why


def _write_log(log: Path, *parts: str) -> None:
    log.write_text("\n".join(parts) + "\n")


def run_grade(
    task: Task, patch: str, env: local_env.LocalEnv, mirror: Path, out: Path, timeout_s: float
) -> Path:
    """Run the task's tests on `patch` in `env`; returns the harness-form log. The caller holds the
    environment's lock; `src/` is left at the base commit."""
    out.mkdir(parents=True, exist_ok=True)
    log = out / "test_output.txt"
    base = task.base_commit
    local_env.checkout(env, mirror, base)
    try:
        for command in local_env.PRE_INSTALL:
            if _run(["bash", "-c", command], env, out, "pre-install", 60).exit_code != 0:
                raise LumobenchError(f"the spec's pre-install step failed in {env.src}; see {out}")
        if (why := _apply(patch, env, out)) is not None:
            _write_log(log, APPLY_FAILED, why)
            return log
        build = _run([str(env.python), *local_env.REBUILD], env, out, "build", BUILD_S)
        if build.exit_code != 0:
            _write_log(log, TESTS_ERROR, f"setup.py build_ext failed (exit {build.exit_code}); see build.err")
            return log
        files = files_under_test(task)
        at_base = set(git(["ls-tree", "--name-only", base, "--", *files], cwd=env.src).splitlines())
        if at_base:
            git(["checkout", base, "--", *sorted(at_base)], cwd=env.src)
        for new in set(files) - at_base:  # created by the test patch: a candidate's copy goes first
            (env.src / new).unlink(missing_ok=True)
        why = _git_quiet(["apply", "--verbose", "-"], env.src, stdin=task.record["test_patch"])
        if why is not None:
            raise LumobenchError(f"the test patch of {task.instance_id} does not apply: {why}")
        tests = _run([str(env.python), "-m", "pytest", "-rA", *files], env, out, "pytest", timeout_s)
        output = "".join((out / f"pytest.{end}").read_text(errors="replace") for end in ("out", "err"))
        if tests.timed_out:
            _write_log(log, START, output, TIMED_OUT)
        else:
            _write_log(log, START, output, END, f"{EXIT_CODE}: {tests.exit_code}")
        return log
    finally:
        local_env.checkout(env, mirror, base)


def grade_log(task: Task, prediction: Prediction, log: Path) -> Evaluation:
    """The prediction's outcome from its log, by swebench's grader, with the test counts as detail."""
    from swebench.harness.grading import get_eval_report

    report = get_eval_report(swebench_spec(task), asdict(prediction), str(log), include_tests_status=True)
    entry = report[prediction.instance_id]
    if not entry["patch_successfully_applied"]:
        first = log.read_text(errors="replace").splitlines()[:2]
        why = {
            APPLY_FAILED: "the patch did not apply",
            TESTS_ERROR: "the build failed after the patch",
            TIMED_OUT: "the tests timed out",
        }.get(first[0] if first else "", "no test results in the log")
        return Evaluation(prediction.instance_id, UNRESOLVED, why)
    counts = []
    for kind in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        tests = entry["tests_status"][kind]
        passed, total = len(tests["success"]), len(tests["success"]) + len(tests["failure"])
        counts.append(f"{kind} {passed}/{total}")
    status = RESOLVED if entry["resolved"] else UNRESOLVED
    return Evaluation(prediction.instance_id, status, ", ".join(counts) + " pass")


def evaluate_locally(
    predictions: Sequence[Prediction],
    tasks: dict[str, Task],
    repos_dir: Path,
    out: Path,
    note: Callable[[str], None],
    cache_dir: Path = local_env.CACHE_DIR / "local-eval",
    rebuild: bool = False,
    timeout_s: float = 1800.0,
) -> list[Evaluation]:
    """Grade every prediction locally, one environment per task version (built once, in version order,
    and reused); a task that cannot be graded here is "not-evaluated" with one line saying why."""
    if importlib.util.find_spec("swebench") is None:
        raise LumobenchError("grading needs the swebench package (pip install 'lumobench[swebench]')")
    results: dict[str, Evaluation] = {}
    rebuilt: set[tuple[str, str]] = set()

    def done(evaluation: Evaluation, seconds: float | None = None) -> None:
        if seconds is not None:
            evaluation = replace(evaluation, seconds=round(seconds, 1))
        results[evaluation.instance_id] = evaluation
        took = "" if seconds is None else f" ({seconds:.0f} s)"
        note(f"{evaluation.status} {evaluation.instance_id}: {evaluation.detail}{took}")

    def version(p: Prediction) -> tuple[str, str]:
        task = tasks[p.instance_id]
        return task.repo, str(task.record.get("version", ""))

    for prediction in sorted(predictions, key=version):
        task = tasks[prediction.instance_id]
        if not prediction.model_patch.strip():
            done(Evaluation(prediction.instance_id, EMPTY_PATCH, "empty patch: unresolved"))
            continue
        started = time.monotonic()
        repo, task_version = version(prediction)
        try:
            if why := local_env.unsupported(repo, task_version):
                raise LumobenchError(why)
            mirror = ensure_mirror(repo, repos_dir, allow_clone=False)
            if missing_commits(mirror, [task.base_commit]):
                raise LumobenchError(f"base commit {task.base_commit[:12]} is not in mirror {mirror}")
            root = local_env.env_root(repo, task_version, cache_dir)
            fresh = rebuild and (repo, task_version) not in rebuilt
            rebuilt.add((repo, task_version))
            with local_env.locked(root):
                if fresh or not (root / "env.json").is_file():
                    note(f"building the {repo} {task_version} environment once, into {root} (minutes)")
                env = local_env.ensure_env(repo, task_version, mirror, task.base_commit, cache_dir, fresh)
                grade_dir = out / prediction.instance_id
                log = run_grade(task, prediction.model_patch, env, mirror, grade_dir, timeout_s)
        except LumobenchError as exc:
            done(Evaluation(prediction.instance_id, NOT_EVALUATED, str(exc)))
            continue
        done(grade_log(task, prediction, log), time.monotonic() - started)
    return [results[p.instance_id] for p in predictions]
