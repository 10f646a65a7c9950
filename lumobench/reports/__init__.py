"""Reports: `lumobench report` and everything it shows. The Eq. 5 summary per arm (the tables replay
prints), run directories as pandas DataFrames, the paper's tables, matplotlib figures, and the
execution of the jupytext sources in `notebooks/` into notebooks, HTML pages and PNGs.

    command.py   the `lumobench report` command
    summary.py   Eq. 5 per arm on the matched set: the table, JSON and CSV (no pandas)
    notebooks/   the report notebooks' jupytext sources, one per kind of input
    sources.py   which kind of result each input is (replay run, agent run, kernel result file)
    frames.py    replay runs -> DataFrames (per request row, per arm, per metrics segment, per chunk)
    agent.py     agent runs -> the task table and per-request timelines
    kernels.py   `lumobench bench kernels` results (results/h200/*.json) -> DataFrames
    kernel_tables.py  the markdown tables of one such result (kernels.md, no pandas)
    tables.py    the paper's tables as markdown / LaTeX / notebook tables
    plots.py     the figures
    display.py   notebook output helpers (named figures, tables with their raw values)
    notebook.py  jupytext source -> executed notebook (nbclient, the venv's own kernel)
    html.py      executed notebook -> one self-contained HTML page
    vllm_json.py results with `vllm bench serve --save-result` field names
"""
