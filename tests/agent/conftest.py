"""Fixtures of the agent tests: the real Qwen Code install, a local task repository with a failing
test, a read-only copy of the project's real Astropy mirror, scripted arms (the scripted model server,
a test double, launched from an arm TOML)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from harness.helpers import free_port
from harness.helpers import lumobench as run_cli

from lumobench.agent.qwen_code import ensure_qwen_code

HERE = Path(__file__).resolve().parent
SCRIPTED_SERVER = HERE / "scripted_server.py"
#: The project's shared data (../shared/data/README.md): the ten Astropy task records and a bare, shallow
#: mirror of astropy/astropy holding the base trees of seven of them.
SHARED_DATA = Path(os.environ.get("LUMO_SHARED_DATA", HERE.parents[2] / "shared" / "data"))
ASTROPY_PRESENT = tuple(
    f"astropy__astropy-{n}" for n in ("12907", "13033", "13977", "14096", "14182", "14309", "14369")
)
ASTROPY_ABSENT = ("astropy__astropy-14365", "astropy__astropy-14508", "astropy__astropy-14995")

BUGGY = "def add(a, b):\n    return a - b\n"
TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
FIXED = "def add(a, b):\n    return a + b\n"
PROBLEM = "add() in calc.py returns the wrong result and test_calc.py fails. Fix it."

#: The model of the test double: run the failing test, read and edit the file, re-run, finish.
FIX_TURNS: list[dict[str, Any]] = [
    {
        "tool_calls": [
            {
                "name": "run_shell_command",
                "arguments": {
                    "command": f"{sys.executable} -m pytest -q -p no:cacheprovider test_calc.py",
                    "description": "run the failing test",
                },
            }
        ]
    },
    {"tool_calls": [{"name": "read_file", "arguments": {"file_path": "{cwd}/calc.py"}}]},
    {
        "tool_calls": [
            {
                "name": "edit",
                "arguments": {
                    "file_path": "{cwd}/calc.py",
                    "old_string": "return a - b",
                    "new_string": "return a + b",
                },
            }
        ]
    },
    {
        "tool_calls": [
            {
                "name": "run_shell_command",
                "arguments": {
                    "command": f"{sys.executable} -m pytest -q -p no:cacheprovider test_calc.py",
                    "description": "re-run the test",
                },
            }
        ]
    },
    {"content": "Fixed add(): it subtracted instead of adding; the test passes now."},
]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="session")
def qwen_cli() -> Path:
    """The pinned Qwen Code, installed into the repo's cache on first use (npm, a few seconds)."""
    return ensure_qwen_code()


@dataclass(frozen=True)
class CalcRepo:
    """A mirror folder holding `local/calc`: base commit with a bug, then a later upstream fix."""

    mirrors: Path
    mirror: Path
    base: str
    upstream_fix: str

    def task(self, instance_id: str = "local__calc-1", repo: str = "local/calc") -> dict[str, Any]:
        return {
            "instance_id": instance_id,
            "repo": repo,
            "base_commit": self.base,
            "problem_statement": PROBLEM,
            "FAIL_TO_PASS": '["test_calc.py::test_add"]',
            "PASS_TO_PASS": "[]",
        }


def make_calc_repo(root: Path) -> CalcRepo:
    mirrors = root / "mirrors"
    mirror = mirrors / "local__calc"
    mirror.mkdir(parents=True)
    git(mirror, "init", "-q", "-b", "main")
    git(mirror, "config", "user.email", "t@example.invalid")
    git(mirror, "config", "user.name", "test")
    (mirror / "calc.py").write_text(BUGGY)
    (mirror / "test_calc.py").write_text(TEST)
    (mirror / ".gitignore").write_text("__pycache__/\n")
    git(mirror, "add", ".")
    git(mirror, "commit", "-qm", "calc with a bug")
    base = git(mirror, "rev-parse", "HEAD")
    (mirror / "calc.py").write_text(FIXED)
    git(mirror, "commit", "-qam", "upstream fix")
    return CalcRepo(mirrors, mirror, base, git(mirror, "rev-parse", "HEAD"))


def tree_state(root: Path) -> dict[str, tuple[int, int, int, str]]:
    """Every path under `root` with its mode, size, mtime (ns) and, for files, sha256: what "nothing
    was written" is checked against (root may write into a chmod a-w folder)."""
    state = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
        state[str(path.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return state


@pytest.fixture(scope="session")
def readonly_mirrors(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of ../shared/data/repos made read-only (chmod -R a-w), as the folder is in CI."""
    source = SHARED_DATA / "repos"
    if not (source / "astropy__astropy.git").is_dir():
        pytest.skip(f"the shared Astropy mirror is not at {source} (set LUMO_SHARED_DATA)")
    copy = tmp_path_factory.mktemp("readonly") / "repos"
    shutil.copytree(source, copy)
    subprocess.run(["chmod", "-R", "a-w", str(copy)], check=True)
    return copy


@pytest.fixture
def calc_repo(tmp_path: Path) -> CalcRepo:
    return make_calc_repo(tmp_path)


def write_tasks(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def make_scripted_arm(
    root: Path, turns: list[dict[str, Any]], stall_at_turn: int | None = None, name: str = "scripted"
) -> Path:
    """An arm TOML that launches the scripted server (a test double) with the given turns."""
    script = root / f"{name}-script.json"
    script.write_text(json.dumps({"turns": turns}))
    command = ["{python}", str(SCRIPTED_SERVER), "--port", "{port}", "--script", str(script)]
    if stall_at_turn is not None:
        command += ["--stall-at-turn", str(stall_at_turn)]
    arm = root / f"{name}.toml"
    arm.write_text(
        f'name = "{name}"\nengine = "scripted"\nport = {free_port()}\n'
        f"command = {json.dumps(command)}\n[readiness]\ntimeout_s = 60\n"
    )
    return arm


@pytest.fixture
def scripted_arm(tmp_path: Path) -> Callable[..., Path]:
    def make(turns: list[dict[str, Any]], stall_at_turn: int | None = None) -> Path:
        return make_scripted_arm(tmp_path, turns, stall_at_turn)

    return make


def lumobench(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The real `lumobench` CLI in a subprocess, with room for agent runs (minutes on a loaded machine);
    `cwd` is where it runs (default: the repository)."""
    return run_cli(*args, timeout=600, **({"cwd": cwd} if cwd else {}))


def only_run_dir(out: Path) -> Path:
    runs = [p for p in out.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
