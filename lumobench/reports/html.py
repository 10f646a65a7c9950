"""An executed report notebook as one self-contained HTML page: figures embedded as data URIs, no
scripts, no external stylesheet or font, code folded under each section (a page to share, not a
notebook viewer)."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from datetime import UTC, datetime

import nbformat
from markdown_it import MarkdownIt

from lumobench import __version__
from lumobench.reports.display import META_KEY

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable("table")

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #222;
       max-width: 980px; margin: 2em auto; padding: 0 1.2em; line-height: 1.45; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { margin-top: 1.8em; border-bottom: 1px solid #ddd; }
.meta { color: #666; font-size: 0.85em; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.85em; }
th, td { padding: 0.25em 0.6em; border-bottom: 1px solid #e4e4e4; }
th { background: #f4f4f4; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
caption { text-align: left; font-weight: 600; padding-bottom: 0.3em; }
p.note { color: #555; font-size: 0.8em; margin-top: -0.4em; }
figure { margin: 1em 0; } figure img { max-width: 100%; height: auto; }
details.code { margin: 0.3em 0; } details.code summary { color: #888; font-size: 0.75em; cursor: pointer; }
pre { background: #f7f7f7; padding: 0.6em; overflow-x: auto; font-size: 0.8em; }
pre.error { background: #fdecea; color: #611a15; }
"""


def _output_html(output: nbformat.NotebookNode) -> str:
    kind = output.get("output_type")
    if kind == "stream":
        return f'<pre class="stream">{html.escape(output.get("text", ""))}</pre>'
    if kind == "error":
        trace = _ANSI.sub("", "\n".join(output.get("traceback", [])))
        return f'<pre class="error">{html.escape(trace)}</pre>'
    data = output.get("data", {})
    if "image/png" in data:
        name = output.get("metadata", {}).get(META_KEY, {}).get("figure", "figure")
        return (
            f'<figure id="fig-{html.escape(name)}"><img alt="{html.escape(name)}" '
            f'src="data:image/png;base64,{data["image/png"].strip()}"></figure>'
        )
    if "text/html" in data:
        return data["text/html"]  # made by lumobench.reports.tables.to_html: escaped there
    if "text/markdown" in data:
        return _MARKDOWN.render(data["text/markdown"])
    if "text/plain" in data:
        return f"<pre>{html.escape(data['text/plain'])}</pre>"
    return ""


def notebook_title(nb: nbformat.NotebookNode) -> str:
    """The first level-one heading of the notebook's markdown."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return "lumobench report"


def render_html(nb: nbformat.NotebookNode, title: str, inputs: Sequence[str]) -> str:
    """The page: a header naming the inputs, then each cell's markdown or outputs (code folded)."""
    parts = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            parts.append(_MARKDOWN.render(cell.source))
        elif cell.cell_type == "code":
            tags = cell.get("metadata", {}).get("tags", [])
            if cell.source.strip() and not {"parameters", "injected-parameters"} & set(tags):
                parts.append(
                    '<details class="code"><summary>code</summary>'
                    f"<pre><code>{html.escape(cell.source)}</code></pre></details>"
                )
            parts += [_output_html(o) for o in cell.get("outputs", [])]
    created = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    listed = ", ".join(f"<code>{html.escape(p)}</code>" for p in inputs)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>\n"
        f'<p class="meta">lumobench {__version__} · generated {created} · from {listed}</p>\n'
        + "\n".join(p for p in parts if p)
        + "\n</body></html>\n"
    )
