"""The import contract of pyproject.toml ([tool.importlinter]): the layers hold in this tree, and a
planted upward import breaks them (the check can fail)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports over the lumobench and lumotree packages found under `root`, with its pyproject."""
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{root / 'serving'}"}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_tree_keeps_the_import_contract() -> None:
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 2 kept, 0 broken." in result.stdout


@pytest.mark.parametrize(
    ("module", "planted", "summary"),
    [
        # verify sits below engine: the layers contract alone breaks
        ("serving/lumotree/verify/paired.py", "import lumotree.engine.llm_engine", "1 kept, 1 broken"),
        # lumobench is the top layer, and the forbidden contract names it: both break
        ("serving/lumotree/engine/config.py", "import lumobench.corpus", "0 kept, 2 broken"),
    ],
)
def test_a_planted_upward_import_breaks_the_contract(
    tmp_path: Path, module: str, planted: str, summary: str
) -> None:
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    shutil.copytree(REPO / "lumobench", tmp_path / "lumobench", ignore=ignore)
    shutil.copytree(REPO / "serving" / "lumotree", tmp_path / "serving" / "lumotree", ignore=ignore)
    target = tmp_path / module
    target.write_text(f"{target.read_text()}\n{planted}  # planted\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert f"Contracts: {summary}." in result.stdout, result.stdout
    importer = module.removeprefix("serving/").removesuffix(".py").replace("/", ".")
    assert f"{importer} -> {planted.split()[-1]}" in result.stdout, result.stdout
