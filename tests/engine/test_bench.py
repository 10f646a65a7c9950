"""`lumobench bench engine`: the engine benchmark runs end to end from the harness's command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lumobench.cli import app

from .conftest import DEMO


def test_bench_engine_writes_every_arm_and_its_own_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = tmp_path / "two.jsonl"
    corpus.write_text("".join(DEMO.read_text().splitlines(keepends=True)[:2]))
    out = tmp_path / "engine.json"
    args = ["bench", "engine", str(corpus), "--runs", "1", "--max-tokens", "6", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", [".venv/bin/lumobench", *args])  # what the console script sees
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    written = json.loads(out.read_text())
    assert written["command"] == "lumobench bench engine " + " ".join(args[2:])
    assert [a["arm"] for a in written["arms"]] == ["lumotree-ar", "lumotree-mtp5", "lumotree"]
    assert written["requests"] == 2 and all(a["pooled_tokens_per_s"] > 0 for a in written["arms"])


def test_bench_engine_refuses_a_missing_corpus(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["bench", "engine", str(tmp_path / "none.jsonl")])
    assert result.exit_code == 2 and "no corpus" in result.output
