"""The report figures (matplotlib, object API: no pyplot state, no display backend needed).

Each function takes the DataFrames of `frames`, `agent` or `kernels` and returns a `Figure`; arms keep
one colour across all figures of a report (their order in the comparison).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from lumobench.reports.frames import PHASES

WIDE, TALL = (7.5, 3.4), (7.5, 4.6)
PHASE_COLOURS = {"target": "#4c72b0", "drafter": "#dd8452", "dispatch": "#55a868"}


def arm_colours(arms: Sequence[str]) -> dict[str, str]:
    palette = [f"C{i}" for i in range(10)]
    return {arm: palette[i % len(palette)] for i, arm in enumerate(arms)}


def _figure(size: tuple[float, float] = WIDE) -> tuple[Figure, Axes]:
    fig = Figure(figsize=size, layout="constrained")
    return fig, fig.add_subplot()


def _tidy(ax: Axes) -> None:
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(axis="y", alpha=0.3)


def rates_figure(arms: pd.DataFrame) -> Figure:
    """Pooled Eq. 5 rate per arm: bars, 95% bootstrap interval, per-run min–max as a grey bracket."""
    fig, ax = _figure()
    colours = arm_colours(list(arms.arm))
    x = np.arange(len(arms))
    rate = arms.pooled_tokens_per_s.astype(float)
    err = np.vstack([rate - arms.ci95_low.astype(float), arms.ci95_high.astype(float) - rate])
    ax.bar(x, rate, color=[colours[a] for a in arms.arm], alpha=0.85, label="pooled rate")
    ax.errorbar(x, rate, yerr=np.nan_to_num(err), fmt="none", ecolor="black", capsize=6, label="95% CI")
    ax.vlines(x + 0.3, arms.run_rate_min, arms.run_rate_max, colors="grey", lw=3, label="per-run range")
    for xi, value in zip(x, rate, strict=True):
        if not np.isnan(value):  # inside the bar's foot, clear of the interval
            ax.annotate(
                f"{value:.1f}",
                (xi, 0),
                xytext=(0, 6),
                textcoords="offset points",
                ha="center",
                color="white",
                fontweight="bold",
                fontsize=9,
            )
    ax.set_xticks(x, arms.arm)
    ax.set_ylabel("tokens/s (Eq. 5, matched set)")
    ax.set_title("Pooled decode rate per arm")
    # below the axes: inside them it covered the first bar's interval whisker
    fig.legend(
        *ax.get_legend_handles_labels(), loc="outside lower center", ncols=3, fontsize=8, frameon=False
    )
    _tidy(ax)
    return fig


def ratios_figure(arms: pd.DataFrame) -> Figure:
    """Each arm's pooled rate over the first arm's, with the paired bootstrap 95% interval."""
    others = arms.iloc[1:]
    fig, ax = _figure((7.5, 1.2 + 0.55 * max(len(others), 1)))
    colours = arm_colours(list(arms.arm))
    y = np.arange(len(others))
    ratio = others.ratio_vs_first.astype(float)
    err = np.vstack(
        [ratio - others.ratio_ci95_low.astype(float), others.ratio_ci95_high.astype(float) - ratio]
    )
    ax.barh(y, ratio, color=[colours[a] for a in others.arm], alpha=0.85)
    ax.errorbar(ratio, y, xerr=np.nan_to_num(err), fmt="none", ecolor="black", capsize=5)
    ax.axvline(1.0, color="black", lw=1, ls="--")
    for yi, value in zip(y, ratio, strict=True):
        if not np.isnan(value):
            ax.annotate(f"{value:.2f}x", (value, yi), xytext=(6, -12), textcoords="offset points", fontsize=8)
    ax.set_yticks(y, others.arm)
    ax.invert_yaxis()  # the table's order, top to bottom
    ax.set_xlabel(f"pooled rate / {arms.arm.iloc[0]} (paired bootstrap 95% CI)")
    ax.set_title(f"Speed-up over {arms.arm.iloc[0]}")
    ax.spines[["top", "right"]].set_visible(False)
    return fig


def acceptance_figure(acceptance: pd.DataFrame, arms: Sequence[str]) -> Figure:
    """Share of speculative events that accepted a draft at each depth (the acceptance curve)."""
    fig, ax = _figure()
    colours = arm_colours(arms)
    for arm, rows in acceptance.groupby("arm", sort=False):
        ax.plot(rows.depth, rows.share_of_events, marker="o", color=colours[str(arm)], label=str(arm))
    ax.set_xlabel("draft depth")
    ax.set_ylabel("share of speculative events")
    ax.set_ylim(0, 1.05)
    ax.set_title("Per-position acceptance")
    ax.legend(fontsize=8)
    _tidy(ax)
    return fig


def accepted_length_figure(lengths: pd.DataFrame, arms: Sequence[str]) -> Figure:
    """Distribution of accepted drafts per speculative event, one bar group per length."""
    fig, ax = _figure()
    colours = arm_colours(arms)
    groups = list(lengths.groupby("arm", sort=False))
    width = 0.8 / max(len(groups), 1)
    for i, (arm, rows) in enumerate(groups):
        mean = float((rows.accepted * rows.share_of_events).sum())
        ax.bar(
            rows.accepted + (i - (len(groups) - 1) / 2) * width,
            rows.share_of_events,
            width=width,
            color=colours[str(arm)],
            label=f"{arm} (mean {mean:.2f})",
        )
    ax.set_xlabel("accepted drafts in one speculative event")
    ax.set_ylabel("share of events")
    ax.set_title("Accepted length per event")
    ax.legend(fontsize=8)
    _tidy(ax)
    return fig


def phase_spans_figure(arms: pd.DataFrame) -> Figure:
    """Mean milliseconds per span of target forward, drafter and dispatch, stacked per arm."""
    fig, ax = _figure()
    bottom = np.zeros(len(arms))
    for phase in PHASES:
        values = arms[f"{phase}_ms"].astype(float).fillna(0.0).to_numpy()
        ax.bar(arms.arm, values, bottom=bottom, color=PHASE_COLOURS[phase], label=phase)
        bottom += values
    for xi, total in enumerate(bottom):
        ax.annotate(f"{total:.1f} ms", (xi, total), xytext=(-16, 3), textcoords="offset points", fontsize=8)
    ax.set_ylabel("ms per span")
    ax.set_title("Phase spans per engine cycle")
    ax.legend(fontsize=8)
    _tidy(ax)
    return fig


def request_rates_figure(requests: pd.DataFrame, arms: Sequence[str]) -> Figure:
    """Each matched request's own decode rate per arm (box and points); repetitions are separate points."""
    fig, ax = _figure()
    colours = arm_colours(arms)
    rows = requests[requests.matched & requests.eligible]
    data = [rows[rows.arm == arm].tokens_per_s.astype(float).to_numpy() for arm in arms]
    ax.boxplot(data, positions=range(len(arms)), widths=0.5, showfliers=False)
    rng = np.random.default_rng(0)
    for i, (arm, values) in enumerate(zip(arms, data, strict=True)):
        ax.scatter(i + rng.uniform(-0.15, 0.15, len(values)), values, s=12, color=colours[arm], alpha=0.7)
    ax.set_xticks(range(len(arms)), arms)
    ax.set_ylabel("tokens/s of one request")
    ax.set_title("Per-request decode rate (matched set)")
    _tidy(ax)
    return fig


def tokens_per_chunk_figure(chunks: pd.DataFrame, arms: Sequence[str]) -> Figure:
    """How many completion tokens each streamed chunk carried (speculation sends several at once)."""
    fig, ax = _figure()
    colours = arm_colours(arms)
    top = int(chunks.tokens.max()) if len(chunks) else 1
    bins = np.arange(0.5, top + 1.5)
    for arm in arms:
        values = chunks[chunks.arm == arm].tokens
        if len(values):
            ax.hist(values, bins=bins, histtype="step", lw=2, color=colours[arm], density=True, label=arm)
    ax.set_xlabel("completion tokens in one streamed chunk")
    ax.set_ylabel("share of chunks")
    ax.set_title("Tokens per chunk")
    ax.legend(fontsize=8)
    _tidy(ax)
    return fig


def rate_vs_prompt_figure(requests: pd.DataFrame, arms: Sequence[str]) -> Figure:
    """Per-request decode rate against prompt length: long prompts make attention and drafting dearer."""
    fig, ax = _figure()
    colours = arm_colours(arms)
    rows = requests[requests.matched & requests.eligible]
    for arm in arms:
        mine = rows[rows.arm == arm]
        ax.scatter(mine.prompt_tokens, mine.tokens_per_s, s=16, color=colours[arm], alpha=0.8, label=arm)
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("tokens/s of one request")
    ax.set_title("Decode rate against prompt length")
    ax.legend(fontsize=8)
    _tidy(ax)
    return fig


def agent_timeline_figure(timeline: pd.DataFrame) -> Figure:
    """One lane per attempt: each chat request from send to end (dark: waiting for the first byte)."""
    lanes = list(dict.fromkeys(zip(timeline.run_id, timeline.task, timeline.run, strict=True)))
    arms = dict(zip(timeline.run_id, timeline.arm, strict=True))  # several runs: name each lane's arm
    fig, ax = _figure((7.5, 1.3 + 0.45 * max(len(lanes), 1)))
    for y, (run_id, task, run) in enumerate(lanes):
        mine = timeline[(timeline.run_id == run_id) & (timeline.task == task) & (timeline.run == run)]
        first = mine.first_byte_s.fillna(mine.end_s)
        ax.broken_barh(
            list(zip(mine.start_s / 60, (first - mine.start_s) / 60, strict=True)),
            (y - 0.3, 0.6),
            color="#8c564b",
        )
        ax.broken_barh(
            list(zip(first / 60, (mine.end_s - first) / 60, strict=True)), (y - 0.3, 0.6), color="#4c72b0"
        )
        ax.annotate(
            f"{len(mine)} req",
            (float(mine.end_s.max()) / 60, y),
            xytext=(4, -3),
            textcoords="offset points",
            fontsize=8,
        )
    several = len(arms) > 1
    ax.set_yticks(
        range(len(lanes)),
        [f"{arms[run_id] + ': ' if several else ''}{task} (run {run})" for run_id, task, run in lanes],
    )
    ax.invert_yaxis()
    ax.set_xlim(left=0)
    ax.set_xlabel("minutes since the attempt started")
    ax.set_title("Agent requests per task (dark: until the first byte; blue: streaming)")
    ax.spines[["top", "right"]].set_visible(False)
    return fig


def kernel_totals_figure(gdn: pd.DataFrame) -> Figure:
    """GDN verify + publish per method (graph-captured medians, p10–p90 whiskers) against the floor."""
    rows = gdn.dropna(subset=["total_ms"]).sort_values("total_ms", ascending=False)
    fig, ax = _figure((7.5, 1.2 + 0.3 * max(len(rows), 1)))
    y = np.arange(len(rows))
    err = np.vstack([rows.total_ms - rows.total_p10_ms, rows.total_p90_ms - rows.total_ms])
    colours = ["#4c72b0" if m.startswith("lumotree") else "#999999" for m in rows.method]
    ax.barh(y, rows.total_ms, color=colours, xerr=err, capsize=2)
    if len(rows):
        ax.axvline(float(rows.floor_ms.iloc[0]), color="#c44e52", ls="--", label="byte floor")
        ax.legend(fontsize=8)
    ax.set_yticks(y, rows.method, fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("ms (verify + publish, CUDA graph, median)")
    ax.set_title("GDN verify + publish, all layers")
    ax.spines[["top", "right"]].set_visible(False)
    return fig


def kernel_history_figure(gdn: pd.DataFrame) -> Figure:
    """Best LumoTree method and best baseline per result file, in the files' time order."""
    fig, ax = _figure()
    rows = gdn.dropna(subset=["total_ms"]).copy()
    rows["family"] = np.where(rows.method.str.startswith("lumotree"), "LumoTree (best)", "baselines (best)")
    best = rows.groupby(["file", "time", "family"], as_index=False).total_ms.min().sort_values("time")
    for family, mine in best.groupby("family"):
        ax.plot(mine.file.map(_short), mine.total_ms, marker="o", label=str(family))
    floors = rows.groupby("file", sort=False).floor_ms.first()
    ax.plot(
        [_short(f) for f in floors.index], floors.to_numpy(), ls="--", color="#c44e52", label="byte floor"
    )
    ax.set_yscale("log")
    ax.set_ylabel("ms (verify + publish, graph)")
    ax.set_title("GDN verify + publish across result files")
    ax.legend(fontsize=8)
    _tidy(ax)
    return fig


def attention_figure(stages: pd.DataFrame) -> Figure:
    """Tree attention per context length: each method's graph median and the KV-read floor."""
    fig, ax = _figure()
    rows = stages[(stages.suite == "attention")].dropna(subset=["graph_ms"])
    for method, mine in rows.groupby("method"):
        ax.plot(mine.context, mine.graph_ms, marker="o", lw=1, label=str(method))
    floor = rows.groupby("context").floor_ms.first()
    ax.plot(floor.index, floor.to_numpy(), ls="--", color="black", label="KV-read floor")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("ms (CUDA graph, median)")
    ax.set_title("Tree attention against the KV-read floor")
    ax.legend(fontsize=6, ncol=2)
    _tidy(ax)
    return fig


def _short(path: str) -> str:
    return path.rsplit("/", 2)[-2] + "/" + path.rsplit("/", 1)[-1] if "/" in path else path
