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
# # Replay comparison
#
# Arms replayed on the same frozen corpus, compared over the **matched set** (request ids completed
# in every repetition of every arm). Every number below is computed by the functions behind
# `lumobench report --format json`: the notebook adds figures, not new arithmetic.
#
# Made by `lumobench report RUN_DIR... --notebook OUT.ipynb` (or `--html`); the source is
# `lumobench/reports/notebooks/replay_report.py`.

# %%
from pathlib import Path

import pandas as pd

from lumobench.reports import plots
from lumobench.reports.display import show_figure, show_markdown, show_table
from lumobench.reports.frames import load_replay
from lumobench.reports.tables import acceptance_table, frame_table, rate_table
from lumobench.reports.vllm_json import vllm_results

# %% tags=["parameters"]
RUNS: list[str] = []  # replay run directories, the first is the reference arm (lumobench report sets it)

# %%
if not RUNS:
    raise ValueError("set RUNS to the replay run directories to compare")
data = load_replay([Path(r) for r in RUNS])
arms = data.arm_names
runs = pd.DataFrame(
    {
        "arm": arms,
        "run id": [m.run_id for m in data.metas],
        "corpus": [Path(m.corpus).name for m in data.metas],
        "requests": [len(m.request_ids) for m in data.metas],
        "runs": [m.runs for m in data.metas],
        "engine": [m.engine_version or "–" for m in data.metas],
        "boot per run": [m.boot_per_run for m in data.metas],
        "host": [f"{m.host.get('hostname', '?')} ({m.host.get('cpus', '?')} CPUs)" for m in data.metas],
        "created": [m.created[:19].replace("T", " ") for m in data.metas],
    }
)
show_table(frame_table(runs, "Runs compared"), "runs")

# %% [markdown]
# ## Decode rate (Eq. 5)
#
# R = Σ(n − 1) / Σ(t_end − t_first) over completed requests with n ≥ 2, pooled over requests and
# repetitions. The 95 % interval resamples requests (all repetitions of a request together); the
# per-run range is the same formula within each repetition; the ratio to the first arm resamples the
# same requests for both arms (paired bootstrap), so the prompts' own spread cancels.

# %%
show_table(rate_table(data.reports), "rates", values=data.arms.to_dict(orient="records"))
show_figure(plots.rates_figure(data.arms), "rates")
if len(arms) > 1:
    show_figure(plots.ratios_figure(data.arms), "ratios")

# %% [markdown]
# ## Acceptance and phase spans (Tables III / IX)
#
# From the server's `/metrics` counters before and after each run segment (vLLM's names: drafts =
# speculative events, accepted = accepted draft tokens). The accepted-length distribution follows
# from the per-depth counts: an event that accepted depth k accepted every depth above it.

# %%
show_table(
    acceptance_table(data.reports),
    "acceptance",
    values=[
        {
            "arm": r.arm,
            "accepted_per_event": r.accepted_per_event,
            "per_position_acceptance": r.per_position_acceptance,
        }
        | {"tokens_per_chunk": r.tokens_per_chunk, "phase_ms": r.phase_ms}
        for r in data.reports
    ],
)
if len(data.acceptance):
    show_figure(plots.acceptance_figure(data.acceptance, arms), "acceptance")
    show_figure(plots.accepted_length_figure(data.accepted_lengths, arms), "accepted_length")
else:
    show_markdown("No arm exported speculative-decoding counters (plain decoding or no `/metrics`).")
if data.arms[[f"{p}_ms" for p in ("target", "drafter", "dispatch")]].notna().any().any():
    show_figure(plots.phase_spans_figure(data.arms), "phase_spans")
else:
    show_markdown("No arm exported phase spans (`lumotree:phase_seconds`): the engine is not LumoTree's.")

# %% [markdown]
# ## Requests
#
# Each request's own rate (n − 1) / (t_end − t_first) over the matched set, the same rates against
# prompt length, and how many completion tokens each streamed chunk carried (from per-chunk usage;
# a speculative engine sends several tokens per chunk, a server that holds output back shows as
# large chunks).

# %%
show_figure(plots.request_rates_figure(data.requests, arms), "request_rates")
show_figure(plots.rate_vs_prompt_figure(data.requests, arms), "rate_vs_prompt")
if len(data.chunks):
    show_figure(plots.tokens_per_chunk_figure(data.chunks, arms), "tokens_per_chunk")
else:
    show_markdown("No run carries per-chunk token counts (the server sent no usage on each chunk).")

# %% [markdown]
# ## Same output
#
# Greedy and seeded requests must give the same tokens under every arm of a lossless engine: each
# arm's outputs against the first arm's, request by request (token ids where both rows have them).

# %%
same = pd.DataFrame(
    [
        {
            "arm": r.arm,
            "same output": "ref" if r.same_output is None else f"{r.same_output}/{r.same_output_compared}",
            "differing requests": ", ".join(r.differing_outputs) or "–",
        }
        for r in data.reports
    ]
)
show_table(
    frame_table(same, "Greedy and seeded outputs against the first arm"),
    "same_output",
    values=[
        {
            "arm": r.arm,
            "same_output": r.same_output,
            "compared": r.same_output_compared,
            "differing": r.differing_outputs,
        }
        for r in data.reports
    ],
)

# %% [markdown]
# ## Latency in `vllm bench serve` terms
#
# TTFT, TPOT, ITL and end-to-end latency of each arm's completed requests, with the field names of
# `vllm bench serve --save-result` (`lumobench report RUNS --format vllm-json` writes them as JSON).

# %%
latency = pd.DataFrame(
    [
        {"arm": r["label"]}
        | {
            f"{stat} {metric} ms": r[f"{stat}_{metric}_ms"]
            for metric in ("ttft", "tpot", "itl", "e2el")
            for stat in ("median", "p99")
        }
        | {"output tok/s": r["output_throughput"]}
        for r in vllm_results([Path(p) for p in RUNS])
    ]
)
show_table(
    frame_table(latency, "Latency per arm (vLLM bench field names)"),
    "latency",
    values=latency.to_dict("records"),
)
