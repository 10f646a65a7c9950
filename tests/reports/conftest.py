"""One real replay comparison per session, shared by the report tests: `lumobench replay` of three demo
requests (an agent turn with tools, a greedy one, a short chat) on the embedded LumoTree engine, arms
`lumotree-ar` then `lumotree`, two repetitions each, and one `lumobench report --notebook --html
--plots` over it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import Result
from harness.helpers import DEMO, lumobench
from typer.testing import CliRunner

from lumobench.cli import app

from .chromium import Chromium, find_chromium

REQUEST_IDS = ("wal-t01", "ops-t01", "chat-short")
ARMS = ("lumotree-ar", "lumotree")
REPLAY_FIGURES = {
    "rates",
    "ratios",
    "acceptance",
    "accepted_length",
    "phase_spans",
    "request_rates",
    "rate_vs_prompt",
    "tokens_per_chunk",
}


@dataclass(frozen=True)
class Replay:
    runs: list[Path]  # in arm order
    stderr: str


@dataclass(frozen=True)
class Report:
    notebook: Path
    html: Path
    plots: Path
    stderr: str


def report_cli(*args: str | Path) -> Result:
    """`lumobench ...` in this process (the same Typer app as the console script)."""
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="session")
def chromium() -> Iterator[Chromium]:
    """A real headless Chromium for the page tests (skipped, saying so, where none is installed)."""
    browser = find_chromium()
    if browser is None:
        pytest.skip("no chromium on this machine (apt-get install chromium)")
    with Chromium(browser) as session:
        yield session


@pytest.fixture(scope="session")
def replay(tmp_path_factory: pytest.TempPathFactory) -> Replay:
    root = tmp_path_factory.mktemp("replay")
    records = [json.loads(line) for line in DEMO.read_text().splitlines()]
    corpus = root / "demo3.jsonl"
    corpus.write_text(
        "".join(json.dumps(r | {"max_tokens": 24}) + "\n" for r in records if r["id"] in REQUEST_IDS)
    )
    argv = ["replay", corpus, *[a for arm in ARMS for a in ("--arm", arm)], "--runs", "2", "--one-boot"]
    proc = lumobench(*argv, "--out", root / "results", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [next((root / "results").glob(f"*-{arm}")) for arm in ARMS]
    return Replay(runs, proc.stderr)


@pytest.fixture(scope="session")
def replay_report(replay: Replay, tmp_path_factory: pytest.TempPathFactory) -> Report:
    out = tmp_path_factory.mktemp("report")
    report = Report(out / "report.ipynb", out / "report.html", out / "plots", "")
    result = report_cli(
        "report", *replay.runs, "--notebook", report.notebook, "--html", report.html, "--plots", report.plots
    )
    assert result.exit_code == 0, result.output[-3000:]
    return Report(report.notebook, report.html, report.plots, result.stderr)
