"""The kernel / cycle-stage report executed over the committed H200 results (results/h200/*.json)."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from lumobench.reports.notebook import figures, tables

from .conftest import report_cli

H200 = Path(__file__).resolve().parents[2] / "results" / "h200"
FILES = [H200 / "kernels-v1.json", H200 / "kernels-v3.json"]  # v1 measured every suite, v3 GDN + attention


def test_kernels_notebook_shows_each_suite_and_the_fastest_method_per_file(tmp_path: Path) -> None:
    out = tmp_path / "kernels.ipynb"
    result = report_cli("report", *FILES, "--notebook", out)
    assert result.exit_code == 0, result.output[-3000:]
    nb = nbformat.read(out, as_version=4)
    assert not [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert sorted(name for name, _ in figures(nb)) == ["attention", "gdn_history", "gdn_methods"]
    shown = tables(nb)
    for path, best in zip(FILES, shown["gdn_best"], strict=True):
        result_json = json.loads(path.read_text())
        methods = [m for m in result_json["gdn"]["methods"] if m.get("total")]
        fastest = min(methods, key=lambda m: m["total"]["median_ms"])
        floor = result_json["gdn"]["floor_bytes"]
        assert (best["method"], best["total_ms"]) == (fastest["method"], fastest["total"]["median_ms"])
        assert best["floor_ms"] == pytest.approx(
            (floor["verify"] + floor["publish"]) / result_json["copy_bandwidth_Bps"] * 1e3
        )
    stages = {(s["suite"], s["method"]) for s in shown["stages"]}
    v1 = json.loads(FILES[0].read_text())
    assert stages == {(suite, m["method"]) for suite in ("selection", "walk", "commit") for m in v1[suite]}
