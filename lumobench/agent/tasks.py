"""SWE-bench task loading: shipped task lists (`agents/tasks/<name>.jsonl`), local JSONL/JSON/parquet
files in SWE-bench format, and instance ids looked up in them. Everything is read offline."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lumobench.agent.paths import AGENTS_DIR
from lumobench.errors import LumobenchError

#: Shipped task lists: `--tasks astropy` reads `agents/tasks/astropy.jsonl`.
TASK_LISTS_DIR = AGENTS_DIR / "tasks"

_REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement")


@dataclass(frozen=True)
class Task:
    """One SWE-bench task instance; `record` keeps the full row (the evaluator needs its test fields)."""

    instance_id: str
    repo: str  # "owner/name", as in SWE-bench
    base_commit: str
    problem_statement: str
    record: dict[str, Any]


def _task_from_row(row: dict[str, Any], where: str) -> Task:
    missing = [key for key in _REQUIRED if not row.get(key)]
    if missing:
        raise LumobenchError(f"{where}: not a SWE-bench task record (missing {', '.join(missing)})")
    return Task(row["instance_id"], row["repo"], row["base_commit"], row["problem_statement"], row)


def _read_rows(path: Path) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise LumobenchError(
                f"reading {path} needs pyarrow (pip install 'lumobench[swebench]')"
            ) from None
        return pq.read_table(path).to_pylist()
    try:
        text = path.read_text()
    except OSError as exc:
        raise LumobenchError(f"cannot read task file {path}: {exc.strerror or exc}") from None
    try:
        if suffix == ".json":
            rows = json.loads(text)
            return rows if isinstance(rows, list) else [rows]
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise LumobenchError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None


def load_task_file(path: Path) -> list[Task]:
    """All tasks of a SWE-bench-format file (.jsonl, .json or .parquet), in file order."""
    tasks = [_task_from_row(row, f"{path} row {i + 1}") for i, row in enumerate(_read_rows(path))]
    if not tasks:
        raise LumobenchError(f"{path} holds no tasks")
    return tasks


def resolve_tasks(specs: Sequence[str], lists_dir: Path = TASK_LISTS_DIR) -> list[Task]:
    """Resolve `--tasks` values: each is a shipped list name, a task file, or an instance id.

    Without ids, the result is every task of the named lists and files. With ids, the lists and
    files given (or, if none, every shipped list) are only where the ids are looked up, and the
    result is those ids in the order given. Raises `LumobenchError` naming any unknown id.
    """
    sources: list[tuple[str, list[Task]]] = []
    ids: list[str] = []
    for spec in specs:
        shipped = lists_dir / f"{spec}.jsonl"
        if "/" not in spec and shipped.is_file():
            sources.append((spec, load_task_file(shipped)))
        elif Path(spec).is_file():
            sources.append((spec, load_task_file(Path(spec))))
        elif Path(spec).suffix.lower() in {".jsonl", ".json", ".parquet"}:
            raise LumobenchError(f"task file {spec} does not exist")
        else:
            ids.append(spec)
    if not ids:
        if not sources:
            raise LumobenchError("no tasks given")
        return _unique([task for _, tasks in sources for task in tasks])
    if not sources:
        sources = [(p.stem, load_task_file(p)) for p in sorted(lists_dir.glob("*.jsonl"))]
    by_id = {task.instance_id: task for _, tasks in sources for task in tasks}
    unknown = [i for i in ids if i not in by_id]
    if unknown:
        where = ", ".join(name for name, _ in sources) or "no task lists"
        raise LumobenchError(f"unknown task id {', '.join(unknown)} (looked in {where})")
    return _unique([by_id[i] for i in ids])


def _unique(tasks: list[Task]) -> list[Task]:
    seen: set[str] = set()
    out = []
    for task in tasks:
        if task.instance_id not in seen:
            seen.add(task.instance_id)
            out.append(task)
    return out
