"""The replay report on real run directories: the executed notebook (every figure, no failed cell, its
tables equal to `lumobench report --format json`), the HTML page in a real headless Chromium, the
PNGs, the paper's tables as markdown and LaTeX, and the vllm-json export computed from the rows."""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

import nbformat
import pytest

from lumobench.reports.frames import load_replay
from lumobench.reports.notebook import figures, tables
from lumobench.reports.summary import report_command
from lumobench.results import RequestRow

from .chromium import Chromium
from .conftest import ARMS, REPLAY_FIGURES, Replay, Report, report_cli

pytestmark = pytest.mark.integration


def _json_report(runs: list[Path]) -> list[dict]:
    result = report_cli("report", *runs, "--format", "json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["arms"]


def _rows(run: Path) -> list[RequestRow]:
    return [
        RequestRow.model_validate_json(line) for line in (run / "requests.jsonl").read_text().splitlines()
    ]


def test_replay_ends_by_naming_the_report_command(replay: Replay) -> None:
    assert report_command(replay.runs) in replay.stderr


def test_notebook_runs_every_cell_and_shows_every_figure(replay_report: Report) -> None:
    nb = nbformat.read(replay_report.notebook, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code)
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    names = [name for name, _ in figures(nb)]
    assert sorted(names) == sorted(REPLAY_FIGURES)  # each once
    pngs = {p.stem: p.read_bytes() for p in replay_report.plots.glob("*.png")}
    assert set(pngs) == REPLAY_FIGURES and all(b.startswith(b"\x89PNG\r\n\x1a\n") for b in pngs.values())
    assert "executed: 8 figures" in replay_report.stderr  # a progress line per stage


def test_notebook_tables_equal_the_json_report(replay: Replay, replay_report: Report) -> None:
    expected = _json_report(replay.runs)
    shown = tables(nbformat.read(replay_report.notebook, as_version=4))
    assert [a["arm"] for a in expected] == list(ARMS)
    for arm, row in zip(expected, shown["rates"], strict=True):
        known = [r for r in arm["run_rates"] if r is not None]
        assert row["arm"] == arm["arm"]
        for key in ("runs", "completed", "failed", "matched", "pooled_tokens_per_s", "ratio_vs_first"):
            assert row[key] == arm[key], key
        assert [row["ci95_low"], row["ci95_high"]] == arm["pooled_ci95"]
        assert [row["ratio_ci95_low"], row["ratio_ci95_high"]] == (arm["ratio_ci95"] or [None, None])
        assert (row["run_rate_min"], row["run_rate_max"]) == (min(known), max(known))
        assert (row["same_output"], row["same_output_compared"]) == (
            arm["same_output"],
            arm["same_output_compared"],
        )
        assert [row[f"{p}_ms"] for p in ("target", "drafter", "dispatch")] == [
            arm["phase_ms"][p] for p in ("target", "drafter", "dispatch")
        ]
    for arm, row in zip(expected, shown["acceptance"], strict=True):
        for key in ("accepted_per_event", "per_position_acceptance", "tokens_per_chunk", "phase_ms"):
            assert row[key] == arm[key], key
    assert [r["differing"] for r in shown["same_output"]] == [a["differing_outputs"] for a in expected]
    # the comparison itself: two repetitions, every request matched, speculation ran, outputs agree
    ar, tree = expected
    assert ar["runs"] == tree["runs"] == 2 and ar["matched"] == tree["matched"] == 3
    assert ar["accepted_per_event"] is None and tree["accepted_per_event"] > 0.5
    assert tree["ratio_ci95"][0] <= tree["ratio_vs_first"] <= tree["ratio_ci95"][1]
    assert (tree["same_output"], tree["same_output_compared"]) == (3, 3)


def test_html_page_loads_in_headless_chromium(
    replay: Replay, replay_report: Report, chromium: Chromium
) -> None:
    screenshot = replay_report.html.with_suffix(".png")
    page = chromium.open(replay_report.html, screenshot)
    print(f"screenshot: {screenshot} ({page.height} px tall)")
    assert page.console_errors == [] and page.failed_loads == []
    assert sorted(i["alt"] for i in page.images) == sorted(REPLAY_FIGURES)
    assert all(i["complete"] and i["naturalWidth"] > 0 and i["naturalHeight"] > 0 for i in page.images)
    assert screenshot.read_bytes().startswith(b"\x89PNG") and page.height > 2000
    text = replay_report.html.read_text()
    for arm in _json_report(replay.runs):
        assert f'<td class="num">{arm["pooled_tokens_per_s"]:.2f}</td>' in text  # the table, formatted
    assert "<script" not in text and "http://" not in text and "https://" not in text  # self-contained


def test_chromium_check_catches_console_errors_and_broken_images(chromium: Chromium, tmp_path: Path) -> None:
    page = tmp_path / "broken.html"
    page.write_text(
        '<html><body><img alt="gone" src="missing.png"><script>console.error("boom")</script></body></html>'
    )
    found = chromium.open(page, tmp_path / "broken.png")
    assert any("boom" in e for e in found.console_errors)
    assert [i["naturalWidth"] for i in found.images] == [0] and found.failed_loads


def test_markdown_and_latex_give_the_papers_tables_with_the_report_numbers(replay: Replay) -> None:
    expected = _json_report(replay.runs)
    markdown = report_cli("report", *replay.runs, "--format", "markdown").stdout
    latex = report_cli("report", *replay.runs, "--format", "latex").stdout
    for arm in expected:
        rate, (lo, hi) = f"{arm['pooled_tokens_per_s']:.2f}", arm["pooled_ci95"]
        assert f"| {arm['arm']} | 2 | " in markdown and f"| {rate} | {lo:.2f}–{hi:.2f} |" in markdown
        assert f"{rate} & {lo:.2f}--{hi:.2f} &" in latex
    tree = expected[1]
    assert f"| {tree['ratio_vs_first']:.2f}x |" in markdown
    assert f"| {tree['accepted_per_event']:.2f} | {tree['per_position_acceptance'][0]:.2f} |" in markdown
    assert latex.count(r"\begin{tabular}") == 2 and latex.count(r"\bottomrule") == 2


VLLM_FIELDS = {
    "date",
    "endpoint_type",
    "backend",
    "label",
    "model_id",
    "tokenizer_id",
    "num_prompts",
    "request_rate",
    "burstiness",
    "max_concurrency",
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    *[f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "std", "p99")],
}


def test_vllm_json_uses_vllm_field_names_with_values_from_the_rows(replay: Replay) -> None:
    result = report_cli("report", *replay.runs, "--format", "vllm-json")
    assert result.exit_code == 0, result.output
    exported = [json.loads(line) for line in result.stdout.splitlines()]
    expected = _json_report(replay.runs)
    assert [e["label"] for e in exported] == list(ARMS)
    for run, out, arm in zip(replay.runs, exported, expected, strict=True):
        assert set(out) >= VLLM_FIELDS
        rows = [r for r in _rows(run) if r.status == "completed"]
        ttft = [(r.t_first_ns - r.t_send_ns) / 1e6 for r in rows]  # type: ignore[operator]
        e2el = [(r.chunk_ns[-1] - r.t_send_ns) / 1e6 for r in rows]  # type: ignore[index]
        gaps = [(b - a) / 1e6 for r in rows for a, b in itertools.pairwise(r.chunk_ns) if a >= r.t_first_ns]  # type: ignore[arg-type,index,operator]
        assert out["completed"] == len(rows) == 6 and out["failed"] == 0 and out["num_prompts"] == 6
        assert out["total_output_tokens"] == sum(r.completion_tokens for r in rows)  # type: ignore[misc]
        assert out["mean_ttft_ms"] == pytest.approx(statistics.mean(ttft))
        assert out["median_e2el_ms"] == pytest.approx(statistics.median(e2el))
        assert out["median_itl_ms"] == pytest.approx(statistics.median(gaps))
        assert out["output_throughput"] == pytest.approx(out["total_output_tokens"] / out["duration"])
        assert out["lumobench"]["pooled_tokens_per_s"] == arm["pooled_tokens_per_s"]
    ar, tree = exported
    assert "spec_decode_acceptance_length" not in ar
    assert tree["spec_decode_acceptance_length"] == pytest.approx(1 + expected[1]["accepted_per_event"])
    assert tree["spec_decode_per_position_acceptance_rates"] == expected[1]["per_position_acceptance"]


def test_accepted_length_distribution_matches_accepted_per_event(replay: Replay) -> None:
    data = load_replay(replay.runs)
    tree = data.accepted_lengths[data.accepted_lengths.arm == "lumotree"]
    assert tree.share_of_events.sum() == pytest.approx(1.0) and (tree.share_of_events >= -1e-12).all()
    mean = (tree.accepted * tree.share_of_events).sum()
    assert mean == pytest.approx(data.reports[1].accepted_per_event)
    # one DataFrame row per request row, per output chunk as the report counts tokens per chunk
    assert len(data.requests) == 12 and data.requests.matched.all()
    chunks = data.chunks[data.chunks.arm == "lumotree"]
    assert chunks.tokens.sum() / len(chunks) == pytest.approx(data.reports[1].tokens_per_chunk)


def test_report_refuses_missing_foreign_and_mixed_inputs_in_one_line(replay: Replay, tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    not_kernels = tmp_path / "x.json"
    not_kernels.write_text("{}")
    kernels = Path(__file__).resolve().parents[2] / "results" / "h200" / "kernels-v3.json"
    cases = [
        ([tmp_path / "nope"], "does not exist"),
        ([foreign], "is not a lumobench run directory (no run.json)"),
        ([not_kernels], "neither a run directory nor a `lumobench bench kernels` result"),
        ([replay.runs[0], kernels], "give inputs of one kind"),
        ([replay.runs[0], replay.runs[0]], "is given twice"),
        ([kernels, "--format", "vllm-json"], "--format vllm-json is for replay runs"),
        ([replay.runs[0], "--html", tmp_path / "no" / "r.html"], "is not a directory"),
    ]
    for args, message in cases:
        result = report_cli("report", *args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert result.stderr.startswith("error: ")
