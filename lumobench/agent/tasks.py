"""SWE-bench task loading: shipped task lists (`agents/tasks/<name>.jsonl`), local JSONL/JSON/parquet
files in SWE-bench format, and instance ids looked up in them. Everything is read offline."""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lumobench.agent.paths import AGENTS_DIR
from lumobench.errors import LumobenchError

#: Shipped task lists: `--tasks astropy` reads `agents/tasks/astropy.jsonl`.
TASK_LISTS_DIR = AGENTS_DIR / "tasks"

_REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement")
#: an instance id names the attempt's folders (`tasks/<id>.run<k>`, `work/<id>.run<k>`): one plain file
#: name, so no id can reach outside the run directory (SWE-bench ids: `astropy__astropy-12907`)
INSTANCE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")
REPO = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")
#: byte-order marks of encodings a task file is sometimes saved in (UTF-32's first: it starts with UTF-16's)
_BOMS = {
    codecs.BOM_UTF32_LE: "UTF-32",
    codecs.BOM_UTF32_BE: "UTF-32",
    codecs.BOM_UTF16_LE: "UTF-16",
    codecs.BOM_UTF16_BE: "UTF-16",
}


@dataclass(frozen=True)
class Task:
    """One SWE-bench task instance; `record` keeps the full row (the evaluator needs its test fields)."""

    instance_id: str
    repo: str  # "owner/name", as in SWE-bench
    base_commit: str
    problem_statement: str
    record: dict[str, Any]


def _task_from_row(row: Any, where: str) -> Task:
    if not isinstance(row, dict):
        raise LumobenchError(
            f"{where}: not a SWE-bench task record (a JSON {type(row).__name__}, not an object)"
        )
    missing = [key for key in _REQUIRED if not row.get(key)]
    if missing:
        raise LumobenchError(f"{where}: not a SWE-bench task record (missing {', '.join(missing)})")
    wrong = [key for key in _REQUIRED if not isinstance(row[key], str)]
    if wrong:
        raise LumobenchError(f"{where}: {', '.join(wrong)} must be text (got {type(row[wrong[0]]).__name__})")
    if not INSTANCE_ID.fullmatch(row["instance_id"]):
        raise LumobenchError(
            f"{where}: instance_id {row['instance_id'][:80]!a} is not a plain name (letters, digits and "
            "._+- only, at most 200 characters): it names the attempt's folders"
        )
    if not REPO.fullmatch(row["repo"]):
        raise LumobenchError(f"{where}: repo {row['repo'][:80]!a} is not owner/name")
    return Task(row["instance_id"], row["repo"], row["base_commit"], row["problem_statement"], row)


def _decode(path: Path, raw: bytes) -> str:
    for bom, name in _BOMS.items():
        if raw.startswith(bom):
            raise LumobenchError(f"task file {path} is {name} (byte-order mark): save it as UTF-8")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise LumobenchError(
            f"task file {path} is not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start})"
        ) from None


def _json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise LumobenchError(f"{where}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except RecursionError:
        raise LumobenchError(f"{where}: not valid JSON (nested too deeply)") from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise LumobenchError(f"{where}: not valid JSON ({str(exc).split(':')[0]})") from None


def _read_parquet(path: Path) -> list[Any]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise LumobenchError(f"reading {path} needs pyarrow (pip install 'lumobench[swebench]')") from None
    try:
        return pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError, ValueError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise LumobenchError(f"task file {path} is not a readable parquet table: {why}") from None


def _read_rows(path: Path) -> list[Any]:
    """The file's rows as parsed (any JSON value: `_task_from_row` checks each)."""
    if path.suffix.lower() == ".parquet":
        return _read_parquet(path)
    try:
        text = _decode(path, path.read_bytes())
    except OSError as exc:
        raise LumobenchError(f"cannot read task file {path}: {exc.strerror or exc}") from None
    if path.suffix.lower() == ".json":
        rows = _json(text, str(path))
        return rows if isinstance(rows, list) else [rows]
    return [_json(line, f"{path} line {i + 1}") for i, line in enumerate(text.splitlines()) if line.strip()]


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
        if "/" not in spec and _is_file(shipped):
            sources.append((spec, load_task_file(shipped)))
        elif _is_file(Path(spec)):
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


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a name too long for the file system is no file (it may still be an id)
        return False


def _unique(tasks: list[Task]) -> list[Task]:
    seen: set[str] = set()
    out = []
    for task in tasks:
        if task.instance_id not in seen:
            seen.add(task.instance_id)
            out.append(task)
    return out
