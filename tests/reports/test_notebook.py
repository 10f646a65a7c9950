"""Notebook execution itself: the kernel is this interpreter, and a failing cell is named."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

from lumobench.reports.notebook import NotebookFailed, execute


def test_kernel_is_this_interpreter_and_a_failing_cell_is_named(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import os, sys\nprint(sys.executable, os.environ['MPLBACKEND'])"),
        nbformat.v4.new_code_cell("raise ValueError('boom')"),
        nbformat.v4.new_code_cell("print('never')"),
    ]
    with pytest.raises(NotebookFailed) as failed:
        execute(nb, tmp_path / "broken_report.py", cwd=tmp_path)
    assert str(failed.value) == "broken_report.py cell 2 failed: ValueError: boom"
    first, second, third = failed.value.notebook.cells
    assert first.outputs[0]["text"].split() == [sys.executable, "Agg"]
    assert second.outputs[0]["output_type"] == "error" and not third.outputs
    assert not list(tmp_path.iterdir())  # no kernel files left in the working directory
