"""`lumobench verify components`: table, JSON, and a non-zero exit on failure."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import lumobench.checks as checks
from lumobench.checks.components import FULL, suite
from lumobench.checks.result import CheckResult
from lumobench.cli import app


def test_verify_components_json_reports_every_check_passing() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "lumobench.cli", "verify", "components", "--json"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads(out.stdout)
    assert len(rows) == 12 and all(r["ok"] for r in rows)
    assert sum(r["faults_planted"] for r in rows) == sum(r["faults_detected"] for r in rows) > 500
    assert all(r["passed"] == r["cases"] > 0 for r in rows)


def _fake_suite(failing: bool) -> object:
    # A stand-in suite with one passing row and, optionally, one row with an undetected fault.
    def make(size: object, seed: int) -> list:
        rows = [("good", lambda: CheckResult("good", 3, 3, 2, 2, "fine"))]
        if failing:
            rows.append(("bad", lambda: CheckResult("bad", 3, 3, 2, 1, "one fault slipped")))
        return rows

    return make


def test_table_lists_every_column_and_a_failure_exits_non_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    monkeypatch.setattr(checks, "suite", _fake_suite(False))
    ok = runner.invoke(app, ["verify", "components"], env={"COLUMNS": "120"})
    assert ok.exit_code == 0
    for col in ("check", "cases", "passed", "planted", "detected", "good"):
        assert col in ok.output
    monkeypatch.setattr(checks, "suite", _fake_suite(True))
    bad = runner.invoke(app, ["verify", "components"], env={"COLUMNS": "120"})
    assert bad.exit_code == 1 and "failed: bad" in bad.output and "Traceback" not in bad.output


@pytest.mark.slow
def test_full_suite_passes() -> None:
    for name, run in suite(FULL, seed=0):
        result = run()
        assert result.ok, (name, result)
