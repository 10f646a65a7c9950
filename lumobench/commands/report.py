"""`lumobench report RUN_DIR...`: Eq. 5 tables over one or more run directories."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from lumobench.errors import user_errors
from lumobench.report import build_report, print_table, render_csv, render_json, table_console


class Format(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


def report(
    run_dirs: Annotated[
        list[Path], typer.Argument(help="Run directories (results/<run-id>); several = comparison.")
    ],
    format: Annotated[Format, typer.Option("--format", help="table (terminal), json or csv.")] = Format.table,
) -> None:
    """Pooled Eq. 5 rate, per-run range, completed/failed, accepted drafts per event, tokens per chunk."""
    with user_errors():
        reports = build_report(run_dirs)
    if format is Format.json:
        typer.echo(render_json(reports))
    elif format is Format.csv:
        typer.echo(render_csv(reports), nl=False)
    else:
        print_table(reports, table_console())
