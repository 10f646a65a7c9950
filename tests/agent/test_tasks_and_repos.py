"""Task loading (shipped list, files, ids) and task repositories (clean clone at base, patch collection)."""

from __future__ import annotations

import json
import subprocess

import pytest

from lumobench.agent.repos import (
    collect_patch,
    ensure_mirror,
    missing_commits,
    prepare_workspace,
    uncommitted_changes,
)
from lumobench.agent.tasks import TASK_LISTS_DIR, load_task_file, resolve_tasks
from lumobench.errors import LumobenchError

from .conftest import ASTROPY_ABSENT, ASTROPY_PRESENT, BUGGY, CalcRepo, git, tree_state, write_tasks

PAPER_TASKS = {"12907", "13033", "13977", "14096", "14182", "14309", "14365", "14369", "14508", "14995"}


def test_shipped_astropy_list_holds_the_ten_paper_tasks_with_evaluation_fields():
    tasks = resolve_tasks(["astropy"])
    assert {t.instance_id.rsplit("-", 1)[1] for t in tasks} == PAPER_TASKS
    for task in tasks:
        assert task.repo == "astropy/astropy" and len(task.base_commit) == 40 and task.problem_statement
        assert {"FAIL_TO_PASS", "PASS_TO_PASS", "eval_script", "log_parser", "image"} <= set(task.record)


def test_ids_select_from_given_files_else_from_shipped_lists(calc_repo: CalcRepo, tmp_path):
    one = calc_repo.task("a__b-1")
    two = calc_repo.task("a__b-2")
    tasks_file = write_tasks(tmp_path / "mine.jsonl", [one, two])
    assert [t.instance_id for t in resolve_tasks([str(tasks_file), "a__b-2"])] == ["a__b-2"]
    assert [t.instance_id for t in resolve_tasks([str(tasks_file)])] == ["a__b-1", "a__b-2"]
    assert resolve_tasks(["astropy__astropy-14995"])[0].repo == "astropy/astropy"
    with pytest.raises(LumobenchError, match=r"unknown task id a__b-3 \(looked in .*mine.jsonl\)"):
        resolve_tasks([str(tasks_file), "a__b-3"])


def test_json_and_parquet_task_files_load_like_jsonl(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet", reason="parquet support is the optional swebench extra")
    import pyarrow as pa

    rows = [json.loads(line) for line in (TASK_LISTS_DIR / "astropy.jsonl").read_text().splitlines()[:3]]
    (tmp_path / "t.json").write_text(json.dumps(rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet")
    for path in (tmp_path / "t.json", tmp_path / "t.parquet"):
        assert [t.instance_id for t in load_task_file(path)] == [r["instance_id"] for r in rows]


def test_malformed_task_files_are_clear_errors(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"instance_id": "x"}\n')
    with pytest.raises(LumobenchError, match="missing repo, base_commit, problem_statement"):
        load_task_file(tmp_path / "bad.jsonl")
    with pytest.raises(LumobenchError, match="does not exist"):
        resolve_tasks([str(tmp_path / "nope.jsonl")])


def test_workspace_is_clean_at_base_and_hides_later_history(calc_repo: CalcRepo, tmp_path):
    work = prepare_workspace(calc_repo.mirror, calc_repo.base, tmp_path / "work")
    assert git(work, "rev-parse", "HEAD") == calc_repo.base
    assert (work / "calc.py").read_text() == BUGGY
    assert git(work, "status", "--porcelain") == ""
    assert calc_repo.upstream_fix not in git(work, "log", "--all", "--format=%H").split()
    assert git(work, "remote") == ""


def test_dirty_mirror_is_left_untouched_and_its_changes_stay_out(calc_repo: CalcRepo, tmp_path):
    (calc_repo.mirror / "calc.py").write_text("local edits\n")
    assert uncommitted_changes(calc_repo.mirror) == ["calc.py"]
    work = prepare_workspace(calc_repo.mirror, calc_repo.base, tmp_path / "work")
    assert (work / "calc.py").read_text() == BUGGY
    assert (calc_repo.mirror / "calc.py").read_text() == "local edits\n"


def test_patch_holds_edits_new_files_and_commits_but_not_ignored_files(calc_repo: CalcRepo, tmp_path):
    work = prepare_workspace(calc_repo.mirror, calc_repo.base, tmp_path / "work")
    (work / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (work / "notes.txt").write_text("new file\n")
    (work / "__pycache__").mkdir()
    (work / "__pycache__" / "calc.cpython-311.pyc").write_bytes(b"\0")
    git(work, "add", "notes.txt")
    git(work, "commit", "-qm", "agent commit")
    (work / "later.py").write_text("x = 1\n")
    patch = collect_patch(work, calc_repo.base)
    assert "+    return a + b" in patch and "+new file" in patch and "+x = 1" in patch
    assert "__pycache__" not in patch
    fresh = prepare_workspace(calc_repo.mirror, calc_repo.base, tmp_path / "fresh")
    subprocess.run(["git", "apply", "-"], cwd=fresh, input=patch, text=True, check=True)
    assert (fresh / "later.py").read_text() == "x = 1\n"


def test_unknown_base_commit_and_missing_mirror_are_clear_errors(calc_repo: CalcRepo, tmp_path, monkeypatch):
    with pytest.raises(LumobenchError, match=r"base commit 0{40} is not usable in mirror"):
        prepare_workspace(calc_repo.mirror, "0" * 40, tmp_path / "work")
    with pytest.raises(LumobenchError, match=r"no mirror of nobody/none under .* \(looked for nobody__none"):
        ensure_mirror("nobody/none", calc_repo.mirrors, allow_clone=False)
    # no network: git refuses https here, so the clone fails at once and says so
    monkeypatch.setenv("GIT_ALLOW_PROTOCOL", "file")
    with pytest.raises(LumobenchError, match=r"cloning https://github.com/nobody/none.git failed"):
        ensure_mirror("nobody/none", tmp_path / "cache", allow_clone=True)
    assert not list((tmp_path / "cache").iterdir())  # no half-cloned mirror left behind


def test_mirror_layouts_are_found(calc_repo: CalcRepo, tmp_path):
    for layout in ("local__calc.git", "local/calc", "calc"):
        root = tmp_path / layout.replace("/", "_") / "m"
        target = root / layout
        target.parent.mkdir(parents=True, exist_ok=True)
        git(
            tmp_path,
            "clone",
            "-q",
            *(["--bare"] if layout.endswith(".git") else []),
            str(calc_repo.mirror),
            str(target),
        )
        assert ensure_mirror("local/calc", root, allow_clone=False) == target


def test_readonly_astropy_mirror_gives_clean_base_trees_and_is_never_written(readonly_mirrors, tmp_path):
    """The real mirror as CI has it (bare, shallow, read-only, no refs/ folder, so `git clone` refuses
    it): each present task's base tree checks out clean, the absent ones are named, nothing is written."""
    mirror = readonly_mirrors / "astropy__astropy.git"
    before = tree_state(readonly_mirrors)
    tasks = {t.instance_id: t for t in resolve_tasks(["astropy"])}
    assert missing_commits(mirror, sorted(t.base_commit for t in tasks.values())) == sorted(
        tasks[i].base_commit for i in ASTROPY_ABSENT
    )
    for instance_id in ASTROPY_PRESENT[:2]:
        base = tasks[instance_id].base_commit
        work = prepare_workspace(mirror, base, tmp_path / instance_id)
        assert git(work, "log", "--all", "--format=%H") == base  # shallow: the base commit alone
        assert git(work, "status", "--porcelain") == "" and git(work, "remote") == ""
        assert len(git(work, "ls-files").splitlines()) > 1800 and (work / "astropy" / "__init__.py").is_file()
    with pytest.raises(LumobenchError, match=r"is not usable in mirror .*reference is not a tree"):
        prepare_workspace(mirror, tasks[ASTROPY_ABSENT[0]].base_commit, tmp_path / "absent")
    assert tree_state(readonly_mirrors) == before
