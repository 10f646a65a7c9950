"""Report tables right for interleaved runs (issue 29, item 4): an arm's throughput counts only the time
its own requests were in flight (an interleaved repetition also holds the other arms' requests), the
acceptance table reaches the deepest accepted depth, and the rate chart's legend covers no bar's
interval whisker."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from matplotlib.backends.backend_agg import FigureCanvasAgg

from lumobench.reports.plots import rates_figure
from lumobench.reports.summary import ArmReport
from lumobench.reports.tables import acceptance_table
from lumobench.reports.vllm_json import vllm_results
from lumobench.results import ArmInfo, RequestRow, RunDir, RunMeta

MS = 1_000_000


def _write_run(root: Path, arm: str, ids: list[str], spans: list[tuple[int, int]], group: list[str]) -> Path:
    meta = RunMeta(
        run_id=f"run-{arm}", created="2026-12-01T00:00:00+00:00", arm=ArmInfo(name=arm), endpoint="http://x",
        corpus="c", corpus_sha256="h", request_ids=ids, runs=1, interleaved_with=group,
    )  # fmt: skip
    run = RunDir.create(root / meta.run_id, meta)
    for seq, (rid, (send, end)) in enumerate(zip(ids, spans, strict=True)):
        run.append_row(
            RequestRow(
                run_index=0,
                seq=seq,
                request_id=rid,
                status="completed",
                completion_tokens=10,
                prompt_tokens=5,
                t_send_ns=send,
                t_first_ns=send + (end - send) // 4,
                t_end_ns=end,
                started_at="t",
            )
        )
    return run.path


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    arms=st.integers(min_value=2, max_value=4),
    durations_ms=st.lists(st.integers(min_value=1, max_value=500), min_size=2, max_size=6),
    gap_ms=st.integers(min_value=0, max_value=50),
)
def test_an_interleaved_arms_throughput_counts_only_its_own_requests_time(
    tmp_path_factory: pytest.TempPathFactory, arms: int, durations_ms: list[int], gap_ms: int
) -> None:
    # request j goes to every arm in turn (as the rotation sends it), one at a time
    root = tmp_path_factory.mktemp("interleaved")
    names = [f"arm{k}" for k in range(arms)]
    ids = [f"r{j}" for j in range(len(durations_ms))]
    spans: dict[str, list[tuple[int, int]]] = {n: [] for n in names}
    clock = 0
    for j, duration in enumerate(durations_ms):
        for k in range(arms):
            name = names[(j + k) % arms]
            own = duration * (1 + names.index(name))  # the arms differ in speed
            spans[name].append((clock, clock + own * MS))
            clock += own * MS + gap_ms * MS
    group = [f"run-{n}" for n in names]
    paths = [_write_run(root, n, ids, spans[n], group) for n in names]
    for name, result in zip(names, vllm_results(paths), strict=True):
        own_s = sum(end - send for send, end in spans[name]) / 1e9
        assert result["duration"] == pytest.approx(own_s)
        assert result["output_throughput"] == pytest.approx(10 * len(ids) / own_s)
    # the same rows measured on their own: vLLM's duration, first send to last end
    (alone,) = vllm_results([_write_run(root, "alone", ids, spans[names[0]], [])])
    first, last = spans[names[0]][0][0], spans[names[0]][-1][1]
    assert alone["duration"] == pytest.approx((last - first) / 1e9)


def _report(arm: str, per_depth: list[float]) -> ArmReport:
    return ArmReport(
        arm=arm, run_dir="d", runs=1, completed=1, failed=0, matched=1, pooled_tokens_per_s=1.0,
        pooled_ci95=None, run_rates=[1.0], tokens=1, decode_s=1.0, accepted_per_event=1.0,
        per_position_acceptance=per_depth, tokens_per_chunk=1.0, phase_ms={},
    )  # fmt: skip


@given(depths=st.lists(st.lists(st.floats(min_value=0, max_value=1), max_size=12), min_size=1, max_size=3))
def test_the_acceptance_table_reaches_the_deepest_accepted_depth(depths: list[list[float]]) -> None:
    table = acceptance_table([_report(f"a{i}", d) for i, d in enumerate(depths)])
    deepest = max((k + 1 for d in depths for k, share in enumerate(d) if share > 0), default=0)
    shown = [h for h in table.headers if h.startswith("depth ")]
    assert shown == [f"depth {k + 1}" for k in range(deepest)]
    for row, d in zip(table.rows, depths, strict=True):  # every accepted share is in the table
        assert all(f"{share:.2f}" == row[2 + k] for k, share in enumerate(d) if share > 0)


def test_a_tree_accepting_at_depths_7_and_8_shows_them() -> None:
    tree = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.2, 0.1, 0.0, 0.0, 0.0]
    assert "depth 8" in acceptance_table([_report("lumotree", tree)]).headers


def _boxes_overlap(a: object, b: object) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1  # type: ignore[attr-defined]


@settings(max_examples=15, deadline=None)
@given(
    rates=st.lists(
        st.tuples(st.floats(1, 1000), st.floats(0, 0.5), st.floats(0, 0.5), st.floats(0, 0.3)),
        min_size=1,
        max_size=6,
    )
)
def test_the_rate_charts_legend_covers_no_interval_whisker(
    rates: list[tuple[float, float, float, float]],
) -> None:
    arms = pd.DataFrame(
        {
            "arm": [f"arm-{i}" for i in range(len(rates))],
            "pooled_tokens_per_s": [r for r, *_ in rates],
            "ci95_low": [r * (1 - lo) for r, lo, _, _ in rates],
            "ci95_high": [r * (1 + hi) for r, _, hi, _ in rates],
            "run_rate_min": [r * (1 - s) for r, _, _, s in rates],
            "run_rate_max": [r * (1 + s) for r, _, _, s in rates],
        }
    )
    fig = rates_figure(arms)
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    (ax,) = fig.axes
    legends = [*fig.legends, *([ax.get_legend()] if ax.get_legend() else [])]
    assert legends
    marks = [c for c in ax.collections if len(np.atleast_1d(c.get_paths()))]  # whiskers, caps' lines, ranges
    marks += [line for line in ax.lines]
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for mark in marks:
            assert not _boxes_overlap(box, mark.get_window_extent(renderer)), "the legend covers a whisker"
