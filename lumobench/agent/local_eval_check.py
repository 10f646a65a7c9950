"""Validate `lumobench evaluate --local` on every task of a mirror: the gold patch must resolve it, the
empty patch and a wrong patch must not. Writes one JSON entry per task (version, environment build,
the three outcomes with their seconds).

    python -m lumobench.agent.local_eval_check --repos ../shared/data/repos --out results/cpu/local-eval.json

The wrong patch adds one comment line at the top of the first file the gold patch changes: it applies
and builds, and leaves the bug in place, so the task's FAIL_TO_PASS tests must still fail. Each kind
runs as the real command (`lumobench evaluate PREDICTIONS --local`), in a subprocess.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict
from importlib.metadata import version
from pathlib import Path

from lumobench.agent import local_env
from lumobench.agent.evaluate import read_evaluations
from lumobench.agent.repos import collect_patch, ensure_mirror, missing_commits, prepare_workspace
from lumobench.agent.tasks import Task, resolve_tasks
from lumobench.errors import LumobenchError
from lumobench.results import host_info, now_iso

KINDS = ("gold", "empty", "wrong")
WRONG_LINE = "# lumobench local-eval check: a patch that fixes nothing\n"


def wrong_patch(task: Task, mirror: Path, scratch: Path) -> str:
    """The gold patch's first file with one comment line added at the top, as a diff from the base."""
    first = re.search(r"^diff --git a/(\S+) b/", task.record["patch"], re.M)
    if first is None:
        raise LumobenchError(f"the gold patch of {task.instance_id} changes no file")
    work = prepare_workspace(mirror, task.base_commit, scratch / task.instance_id)
    target = work / first.group(1)
    target.write_text(WRONG_LINE + target.read_text())
    return collect_patch(work, task.base_commit)


def _write_predictions(path: Path, patches: dict[str, str]) -> Path:
    rows = [{"instance_id": i, "model_name_or_path": path.stem, "model_patch": p} for i, p in patches.items()]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default="astropy", help="Task list or file (default: astropy).")
    parser.add_argument("--repos", type=Path, required=True, help="Folder of repository mirrors.")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write.")
    parser.add_argument("--work", type=Path, help="Where predictions and logs go (default: a temp folder).")
    parser.add_argument("--rebuild", action="store_true", help="Build the environments again first.")
    args = parser.parse_args(argv)
    try:
        tasks = resolve_tasks([args.tasks])
        mirror = ensure_mirror(tasks[0].repo, args.repos, allow_clone=False)
    except LumobenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="local-eval-check-"))
    work.mkdir(parents=True, exist_ok=True)
    present = [t for t in tasks if t.base_commit not in missing_commits(mirror, [t.base_commit])]
    patches = {
        "gold": {t.instance_id: t.record["patch"] for t in tasks},
        "empty": {t.instance_id: "" for t in tasks},
        "wrong": {t.instance_id: wrong_patch(t, mirror, work / "scratch") for t in present},
    }
    outcomes = {}
    for kind in KINDS:
        predictions = _write_predictions(work / f"{kind}.jsonl", patches[kind])
        command = [sys.executable, "-m", "lumobench.cli", "evaluate", str(predictions), "--local"]
        command += ["--repos", str(args.repos), "--tasks", args.tasks]
        if args.rebuild and kind == "gold":
            command.append("--rebuild")
        print(f"$ lumobench evaluate {predictions} --local --repos {args.repos}", file=sys.stderr, flush=True)
        subprocess.run(command, check=True)
        outcomes[kind] = read_evaluations(work / f"{kind}.evaluation.jsonl")
    environments = {}
    for task_version in sorted({str(t.record["version"]) for t in tasks}):
        state = local_env.env_root(tasks[0].repo, task_version) / "env.json"
        built = json.loads(state.read_text()) if state.is_file() else {"status": "not built"}
        environments[task_version] = {k: built.get(k) for k in ("status", "build_s", "reason", "python")}
    entries = []
    for task in tasks:
        entry: dict[str, object] = {
            "instance_id": task.instance_id,
            "version": task.record["version"],
            "base_in_mirror": task in present,
            "environment": environments[str(task.record["version"])]["status"],
        }
        for kind in KINDS:
            found = outcomes[kind].get(task.instance_id)
            entry[kind] = (
                None if found is None else {k: v for k, v in asdict(found).items() if k != "instance_id"}
            )
        entries.append(entry)
    result = {
        "created": now_iso(),
        "command": " ".join(["python -m lumobench.agent.local_eval_check", *(argv or sys.argv[1:])]),
        "host": host_info(),
        "swebench": version("swebench"),
        "specs": local_env.SPECS_SOURCE,
        "wrong_patch": f"one comment line ({WRONG_LINE.strip()!r}) at the top of the gold patch's first file",
        "adaptations": [{"what": a.what, "why": a.why} for a in local_env.ADAPTATIONS],
        "environments": environments,
        "tasks": entries,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
