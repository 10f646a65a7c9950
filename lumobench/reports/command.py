"""`lumobench report INPUT...`: tables, an executed report notebook, its HTML page or its figures.

Inputs are replay run directories (a comparison), agent run directories or `lumobench bench kernels`
result files (results/h200/*.json); each kind has its notebook source in
`lumobench/reports/notebooks/`.
"""

from __future__ import annotations

import json
import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from lumobench.agent.rundir import AgentRunDir
from lumobench.agent.table import table_rows, table_title, to_csv, to_markdown
from lumobench.errors import LumobenchError, user_errors
from lumobench.reports.kernel_tables import render_markdown
from lumobench.reports.sources import Kind, report_kind
from lumobench.reports.summary import build_report, print_table, render_csv, render_json, table_console
from lumobench.reports.vllm_json import render_vllm_json

EXIT_NOTEBOOK_FAILED = 1


class Format(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"
    markdown = "markdown"
    latex = "latex"
    vllm_json = "vllm-json"


def _stage(message: str) -> None:
    typer.echo(f"report: {message}", err=True)


def _print_replay(inputs: list[Path], format: Format, reference: str | None = None) -> None:
    if format is Format.json:
        typer.echo(render_json(build_report(inputs, reference)))
    elif format is Format.csv:
        typer.echo(render_csv(build_report(inputs, reference)), nl=False)
    elif format in (Format.markdown, Format.latex):
        from lumobench.reports.tables import paper_tables, to_latex, to_markdown  # pandas: only when asked

        render = to_markdown if format is Format.markdown else to_latex
        typer.echo("\n".join(render(t) for t in paper_tables(build_report(inputs, reference))), nl=False)
    elif format is Format.vllm_json:
        typer.echo(render_vllm_json(inputs), nl=False)
    else:
        print_table(build_report(inputs, reference), table_console())


def _print_agent(inputs: list[Path], format: Format) -> None:
    if format not in (Format.table, Format.markdown, Format.csv):
        raise LumobenchError(
            f"--format {format.value} is for replay runs; agent runs have table, markdown, csv"
        )
    several = len(inputs) > 1  # one table per run, each named (the tasks repeat from arm to arm)
    for i, path in enumerate(inputs):
        run = AgentRunDir.open(path)
        meta = run.read_meta()
        rows = table_rows(meta, run)
        if format is Format.csv:
            lead = {"agent_run": meta.run_id, "arm": meta.arm.name} if several else None
            typer.echo(to_csv(rows, lead, header=i == 0), nl=False)
        else:
            typer.echo(("\n" if i else "") + table_title(meta) + "\n\n" + to_markdown(rows), nl=False)


def _print_kernels(inputs: list[Path], format: Format) -> None:
    if format not in (Format.table, Format.markdown):
        raise LumobenchError(f"--format {format.value} is for replay runs; kernel results have markdown")
    typer.echo("\n".join(render_markdown(json.loads(p.read_text())) for p in inputs))


PRINTERS = {"replay": _print_replay, "agent": _print_agent, "kernels": _print_kernels}


def _write_outputs(
    kind: Kind, inputs: list[Path], notebook: Path | None, html: Path | None, plots: Path | None
) -> None:
    """Execute the kind's notebook source once and write what was asked for."""
    # pandas, matplotlib and nbclient load only when a report needs them, not with every command
    import nbformat

    from lumobench.reports.html import notebook_title, render_html
    from lumobench.reports.notebook import NotebookFailed, execute, figures, load_source, source_path

    source = source_path(kind)
    if not source.is_file():
        raise LumobenchError(f"report source {source} is missing (is this a lumobench checkout?)")
    nb = load_source(source, {"RUNS": [str(p.resolve()) for p in inputs]})
    _stage(
        f"executing {source.relative_to(source.parents[1])} on {len(inputs)} input(s) ({len(nb.cells)} cells)"
    )
    try:
        nb = execute(nb, source)
    except NotebookFailed as failed:
        kept = notebook or Path("report-failed.ipynb")
        nbformat.write(failed.notebook, kept)
        typer.secho(
            f"error: {failed} (the notebook with the traceback: {kept})", err=True, fg=typer.colors.RED
        )
        raise typer.Exit(EXIT_NOTEBOOK_FAILED) from None
    found = figures(nb)
    _stage(f"executed: {len(found)} figures")
    try:
        if notebook:
            nbformat.write(nb, notebook)
            _stage(f"wrote {notebook}")
        if html:
            html.write_text(render_html(nb, notebook_title(nb), [str(p) for p in inputs]))
            _stage(f"wrote {html} ({html.stat().st_size / 1024:.0f} KB, figures embedded)")
        if plots:
            for name, png in found:
                (plots / f"{name}.png").write_bytes(png)
            _stage(f"wrote {len(found)} PNGs to {plots}")
    except OSError as exc:  # e.g. the disk filled while writing
        raise LumobenchError(f"cannot write {exc.filename}: {exc.strerror or exc}") from None


def _check_outputs(notebook: Path | None, html: Path | None, plots: Path | None) -> None:
    """Refuse, before the notebook runs (tens of seconds), outputs that cannot be written."""
    try:
        for flag, out in (("--notebook", notebook), ("--html", html)):
            if out is None:
                continue
            if out.is_dir():
                raise LumobenchError(f"{flag} {out} is a directory: give a file name")
            if not out.parent.is_dir():
                raise LumobenchError(f"cannot write {out}: {out.parent} is not a directory")
            if not os.access(out.parent, os.W_OK):
                raise LumobenchError(f"cannot write {out}: {out.parent} is not writable")
        if plots is not None:
            if plots.exists() and not plots.is_dir():
                raise LumobenchError(f"--plots {plots} is a file: give a folder for the PNGs")
            plots.mkdir(parents=True, exist_ok=True)
            if not os.access(plots, os.W_OK):
                raise LumobenchError(f"cannot write to {plots}: it is not writable")
    except OSError as exc:  # a name longer than the file system allows, a missing permission
        raise LumobenchError(f"cannot write {exc.filename}: {exc.strerror or exc}") from None


def report(
    inputs: Annotated[
        list[Path],
        typer.Argument(
            help="Replay run directories (results/<run-id>; several = comparison, the first is the "
            "reference), agent run directories, or kernel result files (results/h200/*.json).",
        ),
    ],
    format: Annotated[
        Format,
        typer.Option(
            "--format",
            help="table (terminal), json, csv, markdown or latex (the paper's tables), vllm-json "
            "(vllm bench serve --save-result field names, one object per run directory and line).",
        ),
    ] = Format.table,
    notebook: Annotated[
        Path | None, typer.Option("--notebook", help="Write the executed report notebook (.ipynb).")
    ] = None,
    html: Annotated[
        Path | None, typer.Option("--html", help="Write the report as one self-contained HTML page.")
    ] = None,
    plots: Annotated[
        Path | None, typer.Option("--plots", help="Write the report's figures as PNGs here.")
    ] = None,
    reference: Annotated[
        str | None,
        typer.Option(
            help="Replay runs: the arm ratios and output agreement are taken against (default: the first "
            "arm that completed anything)."
        ),
    ] = None,
) -> None:
    """Eq. 5 tables over run directories; with --notebook/--html/--plots, the full report."""
    outputs = bool(notebook or html or plots)
    with user_errors():
        kind = report_kind(inputs)
        _check_outputs(notebook, html, plots)
        if outputs:
            _stage(f"{len(inputs)} {kind} input(s)")
            _write_outputs(kind, inputs, notebook, html, plots)
        if reference is not None and kind != "replay":
            raise LumobenchError("--reference names an arm of replay runs")
        if format is not Format.table or not outputs:
            if kind == "replay":
                _print_replay(inputs, format, reference)
            else:
                PRINTERS[kind](inputs, format)
