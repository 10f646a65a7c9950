"""Bad task files and hostile task ids: every kind is refused in one line (a `LumobenchError`, never a
traceback), and no instance id can put an attempt's folders outside the run directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lumobench.agent.rundir import AgentRunDir
from lumobench.agent.tasks import load_task_file, resolve_tasks
from lumobench.errors import LumobenchError

GOOD = {"instance_id": "a__b-1", "repo": "a/b", "base_commit": "0" * 40, "problem_statement": "fix it"}
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)


def _line(row: object) -> bytes:
    return json.dumps(row).encode() + b"\n"


# the kinds, each as the bytes of a .jsonl file (garbage parquet has its own suffix below)
BAD_FILES = {
    "array line": _line([GOOD]),
    "number line": b"5\n",
    "invalid UTF-8": b'{"instance_id": "\xff\xfe"}\n',
    "UTF-16": json.dumps(GOOD).encode("utf-16"),
    "5000-digit integer": b'{"instance_id": ' + b"9" * 5000 + b"}\n",
    "deep nesting": b"[" * 100_000 + b"]" * 100_000 + b"\n",
    "instance_id a list": _line(GOOD | {"instance_id": ["a__b-1"]}),
    "repo an int": _line(GOOD | {"repo": 5}),
    "instance_id ../../../../../x": _line(GOOD | {"instance_id": "../../../../../x"}),
    "instance_id absolute": _line(GOOD | {"instance_id": "/tmp/x"}),
}


@pytest.mark.parametrize("kind", list(BAD_FILES))
def test_each_kind_of_bad_task_file_is_one_clear_error(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(BAD_FILES[kind])
    with pytest.raises(LumobenchError) as err:
        load_task_file(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_garbage_parquet_is_one_clear_error(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow.parquet", reason="parquet support is the optional swebench extra")
    path = tmp_path / "tasks.parquet"
    path.write_bytes(b"PAR1 this is not a parquet file PAR1")
    with pytest.raises(LumobenchError, match="is not a readable parquet table"):
        load_task_file(path)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(
        JSON_VALUES | st.fixed_dictionaries({}, optional=dict.fromkeys(GOOD, JSON_VALUES)), max_size=3
    )
)
def test_any_json_lines_load_as_tasks_or_fail_as_one_error(rows: list[object], tmp_path: Path) -> None:
    path = tmp_path / "any.jsonl"
    path.write_bytes(b"".join(_line(r) for r in rows))
    try:
        tasks = load_task_file(path)
    except LumobenchError as exc:
        assert "\n" not in str(exc)
        return
    run = AgentRunDir(tmp_path / "run")
    for task in tasks:  # whatever loads names a folder inside the run directory
        assert run.log_dir(0, task.instance_id).resolve().parent == (run.path / "tasks").resolve()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    instance_id=st.text(min_size=1, max_size=40)
    | st.sampled_from(["..", ".", "../x", "/x", "a/../..", "a\\b"])
)
def test_no_instance_id_names_a_folder_outside_the_run(instance_id: str, tmp_path: Path) -> None:
    path = tmp_path / "one.jsonl"
    path.write_bytes(_line(GOOD | {"instance_id": instance_id}))
    run = AgentRunDir(tmp_path / "run")
    try:
        (task,) = load_task_file(path)
    except LumobenchError:
        return
    folder = run.log_dir(0, task.instance_id)
    assert folder.resolve().parent == (run.path / "tasks").resolve()
    with pytest.raises(LumobenchError, match="cannot name a folder inside the run directory"):
        run.log_dir(0, "../" + task.instance_id)  # the run directory's own guard


def test_a_task_id_too_long_for_a_file_name_is_an_unknown_id(tmp_path: Path) -> None:
    with pytest.raises(LumobenchError, match="unknown task id"):
        resolve_tasks(["x" * 5000])
