"""The import contract of pyproject.toml ([tool.importlinter]): the layers hold and no package's
siblings import each other in a circle in this tree, and a planted upward import or circle breaks
them (the check can fail)."""

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


def _planted_copy(root: Path, module: str, planted: str) -> Path:
    """The packages and pyproject copied under `root`, with `planted` appended to `module`."""
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copy(REPO / "pyproject.toml", root)
    shutil.copytree(REPO / "lumobench", root / "lumobench", ignore=ignore)
    shutil.copytree(REPO / "serving" / "lumotree", root / "serving" / "lumotree", ignore=ignore)
    target = root / module
    target.write_text(f"{target.read_text()}\n{planted}  # planted\n")
    return root


def test_the_tree_keeps_the_import_contract() -> None:
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 3 kept, 0 broken." in result.stdout


@pytest.mark.parametrize(
    ("module", "planted", "summary"),
    [
        # verify sits below engine, and engine imports verify: the layers and a circle in lumotree
        ("serving/lumotree/verify/kernel_sets.py", "import lumotree.engine.llm_engine", "1 kept, 2 broken"),
        # lumobench is the top layer, and the forbidden contract names it: both break (no circle
        # inside one package: lumobench and lumotree are two)
        ("serving/lumotree/engine/config.py", "import lumobench.corpus", "1 kept, 2 broken"),
    ],
)
def test_a_planted_upward_import_breaks_the_contract(
    tmp_path: Path, module: str, planted: str, summary: str
) -> None:
    result = lint_imports(_planted_copy(tmp_path, module, planted))
    assert result.returncode != 0
    assert f"Contracts: {summary}." in result.stdout, result.stdout
    importer = module.removeprefix("serving/").removesuffix(".py").replace("/", ".")
    assert f"{importer} -> {planted.split()[-1]}" in result.stdout, result.stdout


@pytest.mark.parametrize(
    ("module", "planted", "package"),
    [
        # the block modules import fused.weights (FusedProjection): weights must not import them back
        ("serving/lumotree/model/fused/weights.py", "import lumotree.model.mlp", "lumotree.model"),
        # the worker imports gpu.py (the Triton set) when it runs on CUDA: gpu.py must not import it
        ("serving/lumotree/vllm/gpu.py", "import lumotree.vllm.worker", "lumotree.vllm"),
    ],
)
def test_a_planted_circle_between_siblings_breaks_the_contract(
    tmp_path: Path, module: str, planted: str, package: str
) -> None:
    # one layer, so the layers contract stays kept: only the circle contract sees it
    result = lint_imports(_planted_copy(tmp_path, module, planted))
    assert result.returncode != 0
    assert "Contracts: 2 kept, 1 broken." in result.stdout, result.stdout
    assert f"No cycles are allowed in {package}." in result.stdout, result.stdout
