"""Evaluate agent patches with the SWE-bench harness, or grade its existing logs offline (`--local`
grades without Docker: local_eval.py).

The harness (`swebench`, an optional dependency) runs tests in Docker containers. Without a reachable
Docker daemon nothing is run: non-empty patches are marked "not-evaluated". Empty patches count as
unresolved without evaluation, as in the paper (§VI). Grading reads the harness's per-instance
`test_output.txt` logs with swebench's own grader, which works offline.

swebench 5 records carry `image`, `eval_script`, `log_parser` and `eval_type`; classic SWE-bench records
(princeton-nlp/SWE-bench, _Lite, _Verified) do not. Their logs are graded with the parser swebench
maps their repository to and its evaluation type; running the harness needs the swebench 5 record.
"""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lumobench.agent.tasks import Task
from lumobench.errors import LumobenchError

if TYPE_CHECKING:  # swebench is optional: imported where it is used
    from swebench.types import TestSpec

RESOLVED, UNRESOLVED, EMPTY_PATCH, NOT_EVALUATED = "resolved", "unresolved", "empty-patch", "not-evaluated"
TEST_LOG = "test_output.txt"  # swebench's per-instance log name (harness/constants LOG_TEST_OUTPUT)
HARNESS_FIELDS = ("image", "eval_script", "log_parser", "eval_type")  # what swebench 5 records add
_PARSER_MODULES = ("python", "javascript", "c", "go", "java", "php", "ruby", "rust")


@dataclass(frozen=True)
class Prediction:
    """One line of a SWE-bench predictions JSONL."""

    instance_id: str
    model_name_or_path: str
    model_patch: str


@dataclass(frozen=True)
class Evaluation:
    """The outcome for one prediction: `status` is resolved, unresolved, empty-patch or not-evaluated;
    `seconds` the time its local grade took (None where it was not graded here)."""

    instance_id: str
    status: str
    detail: str = ""
    seconds: float | None = None


def read_predictions(path: Path) -> list[Prediction]:
    """Parse a predictions JSONL; every line needs instance_id, model_name_or_path and model_patch."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise LumobenchError(f"cannot read predictions {path}: {exc.strerror or exc}") from None
    predictions = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            predictions.append(
                Prediction(row["instance_id"], row["model_name_or_path"], row["model_patch"] or "")
            )
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise LumobenchError(f"{path} line {lineno}: not a SWE-bench prediction ({exc!r})") from None
    if not predictions:
        raise LumobenchError(f"{path} holds no predictions")
    return predictions


def docker_unavailable() -> str | None:
    """None when a Docker daemon answers; otherwise why not, in one line."""
    docker = shutil.which("docker")
    if docker is None:
        return "docker is not installed"
    try:
        out = subprocess.run(
            [docker, "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=20,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return "the Docker daemon did not answer within 20 s"
    if out.returncode != 0 or not out.stdout.strip():
        lines = [line for line in (out.stderr or out.stdout).splitlines() if line.strip()]
        return f"no Docker daemon is reachable ({lines[-1].strip() if lines else 'docker info failed'})"
    return None


def find_test_logs(logs_dir: Path) -> dict[str, Path]:
    """Per-instance harness logs under `logs_dir` (swebench writes
    `logs/run_evaluation/<run_id>/<model>/<instance_id>/test_output.txt`), keyed by instance id."""
    return {log.parent.name: log for log in sorted(logs_dir.rglob(TEST_LOG))}


def _classic_log_parser(task: Task) -> str:
    """The name (in swebench's parser registry) of the log parser swebench maps the task's repository to."""
    from swebench.harness.log_parsers import PARSER_REGISTRY

    for name in _PARSER_MODULES:
        module = importlib.import_module(f"swebench.harness.log_parsers.{name}")
        for attr in dir(module):
            if attr.startswith("MAP_REPO_TO_PARSER") and task.repo in getattr(module, attr):
                parser = getattr(module, attr)[task.repo]
                return next(key for key, fn in PARSER_REGISTRY.items() if fn is parser)
    raise LumobenchError(
        f"task {task.instance_id} is a classic SWE-bench record without log_parser, and swebench knows no "
        f"log parser for {task.repo}; give its swebench 5 record (with {', '.join(HARNESS_FIELDS)})"
    )


def grading_spec(task: Task) -> TestSpec:
    """swebench's TestSpec for grading the task's log: from a swebench 5 record as is, from a classic
    record with its repository's parser (image and eval script are not needed to grade)."""
    from swebench.harness.constants import FAIL_ONLY_REPOS, EvalType
    from swebench.harness.utils import make_test_spec
    from swebench.types import TestSpec

    record = task.record
    if all(field in record for field in HARNESS_FIELDS):
        return make_test_spec(record)

    def tests(key: str) -> list[str]:
        value = record.get(key) or "[]"
        return json.loads(value) if isinstance(value, str) else list(value)

    eval_type = EvalType.FAIL_ONLY if task.repo in FAIL_ONLY_REPOS else EvalType.PASS_AND_FAIL
    return TestSpec(
        instance_id=task.instance_id,
        image="",
        eval_script_list=[],
        repo=task.repo,
        version=str(record.get("version", "")),
        FAIL_TO_PASS=tests("FAIL_TO_PASS"),
        PASS_TO_PASS=tests("PASS_TO_PASS"),
        log_parser=_classic_log_parser(task),
        eval_type=eval_type.value,
    )


def grade(
    predictions: Sequence[Prediction], tasks: dict[str, Task], logs: dict[str, Path]
) -> list[Evaluation]:
    """Grade each prediction from its harness log with swebench's grader; empty patches are unresolved
    without evaluation, predictions without a log are not evaluated."""
    try:
        from swebench.harness.grading import get_eval_report
    except ImportError:
        raise LumobenchError(
            "grading needs the swebench package (pip install 'lumobench[swebench]')"
        ) from None
    results = []
    for prediction in predictions:
        if not prediction.model_patch.strip():
            results.append(Evaluation(prediction.instance_id, EMPTY_PATCH, "empty patch: unresolved"))
            continue
        log = logs.get(prediction.instance_id)
        if log is None:
            results.append(Evaluation(prediction.instance_id, NOT_EVALUATED, "no harness log"))
            continue
        spec = grading_spec(tasks[prediction.instance_id])
        report = get_eval_report(spec, asdict(prediction), str(log), include_tests_status=False)
        entry = report[prediction.instance_id]
        detail = "" if entry["patch_successfully_applied"] else "patch did not apply or tests did not run"
        results.append(
            Evaluation(prediction.instance_id, RESOLVED if entry["resolved"] else UNRESOLVED, detail)
        )
    return results


def run_harness(
    predictions: Sequence[Prediction],
    tasks: dict[str, Task],
    work_dir: Path,
    run_id: str,
    max_workers: int = 1,
    timeout_s: int = 1800,
) -> Path:
    """Run `swebench.harness.run_evaluation` (needs Docker) on the non-empty predictions, in `work_dir`;
    returns the folder its logs are under."""
    evaluated = [p for p in predictions if p.model_patch.strip()]
    classic = [
        p.instance_id for p in evaluated if not all(f in tasks[p.instance_id].record for f in HARNESS_FIELDS)
    ]
    if classic:
        raise LumobenchError(
            f"the SWE-bench harness (swebench 5) needs records with {', '.join(HARNESS_FIELDS)}; "
            f"{', '.join(classic)} are classic records (grade their harness logs offline with --logs)"
        )
    work_dir.mkdir(parents=True, exist_ok=True)
    dataset = work_dir / "tasks.jsonl"
    dataset.write_text("".join(json.dumps(tasks[p.instance_id].record) + "\n" for p in evaluated))
    preds = work_dir / "predictions.jsonl"
    preds.write_text("".join(json.dumps(asdict(p)) + "\n" for p in evaluated))
    argv = [
        sys.executable,
        "-m",
        "swebench.harness.run_evaluation",
        "--dataset_name",
        str(dataset),
        "--predictions_path",
        str(preds),
        "--run_id",
        run_id,
        "--max_workers",
        str(max_workers),
        "--timeout",
        str(timeout_s),
        "--report_dir",
        str(work_dir),
    ]
    with (work_dir / "harness.log").open("wb") as log:
        code = subprocess.run(
            argv, cwd=work_dir, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        ).returncode
    if code != 0:
        raise LumobenchError(f"the SWE-bench harness failed (exit {code}); see {work_dir / 'harness.log'}")
    return work_dir / "logs"


def mark_not_evaluated(predictions: Iterable[Prediction], why: str) -> list[Evaluation]:
    """Outcomes when the harness cannot run: empty patches unresolved, the rest not evaluated (`why`)."""
    return [
        Evaluation(p.instance_id, NOT_EVALUATED, why)
        if p.model_patch.strip()
        else Evaluation(p.instance_id, EMPTY_PATCH, "empty patch: unresolved")
        for p in predictions
    ]


def write_evaluations(evaluations: Sequence[Evaluation], path: Path) -> None:
    """Write one JSON object per prediction: instance_id, status, detail."""
    path.write_text("".join(json.dumps(asdict(e)) + "\n" for e in evaluations))


def read_evaluations(path: Path) -> dict[str, Evaluation]:
    """Evaluations written by `write_evaluations`, keyed by instance id ({} when the file is absent)."""
    if not path.is_file():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {row["instance_id"]: Evaluation(**row) for row in rows}
