"""Notebook outputs with names: figures as PNGs and tables with their raw values beside the cells.

A figure output carries `{"lumobench": {"figure": NAME}}` in its metadata (that is how `--plots` names
the files and the tests find each figure); a table output carries its HTML, its markdown and, as JSON,
the unformatted values it was made from (the tests compare those with `lumobench report --format json`).
"""

from __future__ import annotations

import base64
import io
import json
import math
from typing import Any

from IPython.display import display
from matplotlib.figure import Figure

from lumobench.reports.tables import Table, to_html, to_markdown

DPI = 96  # small PNGs: a report of a dozen figures stays a few hundred KB
META_KEY = "lumobench"


def png_bytes(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()


def show_figure(fig: Figure, name: str) -> None:
    """Display `fig` as a PNG output named `name` (no pyplot: the figure is not kept)."""
    data = base64.b64encode(png_bytes(fig)).decode()
    display(
        {"image/png": data, "text/plain": f"<figure {name}>"}, raw=True, metadata={META_KEY: {"figure": name}}
    )


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if hasattr(value, "item"):  # numpy scalars
        return _json_safe(value.item())
    return value


def show_table(table: Table, name: str, values: Any = None) -> None:
    """Display `table` (HTML and markdown); `values` (JSON-able) are the raw numbers behind it."""
    bundle = {
        "text/html": to_html(table),
        "text/markdown": to_markdown(table),
        "text/plain": to_markdown(table),
    }
    if values is not None:
        bundle["application/json"] = json.loads(json.dumps(_json_safe(values)))
    display(bundle, raw=True, metadata={META_KEY: {"table": name}})


def show_markdown(text: str) -> None:
    display({"text/markdown": text, "text/plain": text}, raw=True)
