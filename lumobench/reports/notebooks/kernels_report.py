# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Kernels and cycle stages
#
# `lumobench bench kernels` results (e.g. `results/h200/*.json`): GDN verify + publish of the paper
# tree over all layers, then the other stages of one LumoTree cycle that were measured (tree
# attention per context, draft selection, the device acceptance walk, the captured commit), each
# against its byte floor at the copy bandwidth measured in the same run. CUDA-graph medians.
#
# Made by `lumobench report results/h200/*.json --html OUT.html`; the source is
# `lumobench/reports/notebooks/kernels_report.py`.

# %%
from pathlib import Path

from lumobench.reports import plots
from lumobench.reports.display import show_figure, show_markdown, show_table
from lumobench.reports.kernels import load_kernels
from lumobench.reports.tables import frame_table

# %% tags=["parameters"]
RUNS: list[str] = sorted(str(p) for p in Path("results/h200").glob("*.json"))  # kernel result files

# %%
data = load_kernels([Path(r) for r in RUNS])
files = data.files.assign(file=data.files.file.map(lambda f: Path(f).name))
show_table(
    frame_table(
        files[["file", "device", "torch", "triton", "copy_bandwidth_TBps", "time", "suites"]], "Result files"
    ),
    "files",
    values=data.files.to_dict(orient="records"),
)

# %% [markdown]
# ## GDN verify + publish
#
# The newest file's methods (blue: LumoTree's kernels, grey: baselines measured in the same run), then
# the best of each family in every file, in time order.

# %%
latest = data.files.sort_values("time").file.iloc[-1]
gdn_latest = data.gdn[data.gdn.file == latest]
show_figure(plots.kernel_totals_figure(gdn_latest), "gdn_methods")
if data.files.file.nunique() > 1:
    show_figure(plots.kernel_history_figure(data.gdn), "gdn_history")
best = (
    data.gdn.dropna(subset=["total_ms"])
    .assign(over_floor=lambda d: d.total_ms / d.floor_ms)
    .sort_values("total_ms")
    .groupby("file", as_index=False)
    .first()[["file", "method", "total_ms", "floor_ms", "over_floor"]]
)
show_table(
    frame_table(
        best.assign(file=best.file.map(lambda f: Path(f).name)), "Fastest GDN method per file", digits=4
    ),
    "gdn_best",
    values=best.to_dict(orient="records"),
)

# %% [markdown]
# ## Other cycle stages

# %%
attention_files = data.stages[data.stages.suite == "attention"].file.unique()
if len(attention_files):
    newest = max(attention_files, key=lambda f: data.files.set_index("file").time[f])
    show_figure(plots.attention_figure(data.stages[data.stages.file == newest]), "attention")
others = data.stages[data.stages.suite != "attention"].dropna(subset=["graph_ms"])
if len(others):
    stage_table = others.assign(file=others.file.map(lambda f: Path(f).name))[
        ["file", "suite", "method", "eager_ms", "graph_ms", "floor_ms", "graph_over_floor"]
    ]
    show_table(
        frame_table(stage_table, "Selection, walk and commit", digits=4),
        "stages",
        values=others.to_dict(orient="records"),
    )
else:
    show_markdown("These files measured no selection, walk or commit stage.")

# %% [markdown]
# ## Tables of each file
#
# As `lumobench bench kernels` writes them beside the JSON (`kernels.md`).

# %%
for index in range(len(data.results)):
    show_markdown(f"### {Path(RUNS[index]).name}\n\n" + data.markdown(index))
