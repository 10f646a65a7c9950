"""The LumoTree vLLM plugin in the vLLM CPU environment: this repository installed editable there
(`pip install --no-deps -e REPO`), so `lumotree` is importable and its `vllm.general_plugins` entry
point (pyproject.toml) is registered. The plugin stays inert unless a vLLM process asks for it.

Reinstalled when the environment's editable install points at another checkout (the environment
under .cache may be shared by several worktrees).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from lumobench.arms import REPO_ROOT
from lumobench.errors import LumobenchError
from lumobench.vllm_cpu.env import venv_python


def installed_from(venv: Path) -> Path | None:
    """The checkout the environment's editable `lumobench` install points at (None: not installed)."""
    for record in venv.glob("lib/python3*/site-packages/lumobench-*.dist-info/direct_url.json"):
        url = json.loads(record.read_text()).get("url", "")
        if url.startswith("file://"):
            return Path(url.removeprefix("file://"))
    return None


def install_plugin(venv: Path, repo: Path = REPO_ROOT) -> None:
    """Install `repo` editable into the vLLM environment unless it already is (~5 s)."""
    if installed_from(venv) == repo.resolve():
        return
    argv = [str(venv_python(venv)), "-m", "pip", "--disable-pip-version-check", "install", "-q"]
    argv += ["--no-deps", "--no-build-isolation", "-e", str(repo.resolve())]
    proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise LumobenchError(f"installing the LumoTree vLLM plugin into {venv} failed:\n{tail}")
