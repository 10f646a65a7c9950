"""Evaluate agent patches with the SWE-bench harness, or grade its existing logs offline.

The harness (`swebench`, an optional dependency) runs tests in Docker containers. Without a reachable
Docker daemon nothing is run: non-empty patches are marked "not-evaluated". Empty patches count as
unresolved without evaluation, as in the paper (§VI). Grading reads the harness's per-instance
`test_output.txt` logs with swebench's own grader, which works offline.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from lumobench.agent.tasks import Task
from lumobench.errors import LumobenchError

RESOLVED, UNRESOLVED, EMPTY_PATCH, NOT_EVALUATED = "resolved", "unresolved", "empty-patch", "not-evaluated"
TEST_LOG = "test_output.txt"  # swebench's per-instance log name (harness/constants LOG_TEST_OUTPUT)


@dataclass(frozen=True)
class Prediction:
    """One line of a SWE-bench predictions JSONL."""

    instance_id: str
    model_name_or_path: str
    model_patch: str


@dataclass(frozen=True)
class Evaluation:
    """The outcome for one prediction: `status` is resolved, unresolved, empty-patch or not-evaluated."""

    instance_id: str
    status: str
    detail: str = ""


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


def grade(
    predictions: Sequence[Prediction], tasks: dict[str, Task], logs: dict[str, Path]
) -> list[Evaluation]:
    """Grade each prediction from its harness log with swebench's grader; empty patches are unresolved
    without evaluation, predictions without a log are not evaluated."""
    try:
        from swebench.harness.grading import get_eval_report
        from swebench.harness.utils import make_test_spec
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
        spec = make_test_spec(tasks[prediction.instance_id].record)
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
    work_dir.mkdir(parents=True, exist_ok=True)
    evaluated = [p for p in predictions if p.model_patch.strip()]
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
