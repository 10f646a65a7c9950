"""The paper's tables over replay runs, as plain cells rendered to markdown, LaTeX or a notebook table.

- `rate_table` (Tables IV/VII): pooled Eq. 5 rate with its bootstrap interval and per-run range, the
  ratio to the reference arm with its paired bootstrap interval, completed/failed/matched, same output;
- `acceptance_table` (Tables III/IX): accepted drafts per event, the per-depth acceptance, tokens per
  streamed chunk and the phase spans (ms per span) from `/metrics`.
Every cell is formatted from the report's own numbers (`ArmReport`), nothing is recomputed here.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from lumobench.reports.frames import PHASES
from lumobench.reports.summary import ArmReport, versus_title


@dataclass(frozen=True)
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]
    note: str = ""
    numeric_columns: frozenset[int] | None = None  # right-aligned; None: every column but the first

    def numeric(self, column: int) -> bool:
        return column > 0 if self.numeric_columns is None else column in self.numeric_columns


def _f(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _interval(value: tuple[float, float] | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value[0]:.{digits}f}–{value[1]:.{digits}f}"


def _run_range(rates: Sequence[float | None]) -> str:
    known = [r for r in rates if r is not None]
    return f"{min(known):.2f}–{max(known):.2f}" if known else "–"


def rate_table(reports: Sequence[ArmReport]) -> Table:
    failed = [rep.arm for rep in reports if rep.status == "failed"]
    rows = []
    for rep in reports:
        if rep.status == "failed":  # completed nothing: out of the matched set and of every ratio
            ratio = same = "failed"
        else:
            ratio = "ref" if rep.reference in (None, rep.arm) else _f(rep.ratio_vs_first) + "x"
            same = "ref" if rep.same_output is None else f"{rep.same_output}/{rep.same_output_compared}"
        rows.append(
            [
                rep.arm,
                str(rep.runs),
                f"{rep.completed}/{rep.failed}",
                str(rep.matched),
                _f(rep.pooled_tokens_per_s),
                _interval(rep.pooled_ci95),
                _run_range(rep.run_rates),
                ratio,
                _interval(rep.ratio_ci95),
                same,
            ]
        )
    return Table(
        "Eq. 5 pooled decode rate over the matched set",
        [
            "arm",
            "runs",
            "completed/failed",
            "matched",
            "tok/s",
            "95% CI",
            "per-run range",
            versus_title(reports),
            "paired 95% CI",
            "same output",
        ],
        rows,
        "tok/s = Σ(n−1)/Σ(t_end−t_first) over the matched set; CI: requests resampled (all repetitions "
        f"together); {versus_title(reports)}: the same draw of requests for both arms (paired bootstrap); "
        "same output: greedy or seeded requests whose tokens equal the reference arm's."
        + (
            f" Failed (completed nothing, left out of the matched set): {', '.join(failed)}."
            if failed
            else ""
        ),
    )


def accepted_depths(reports: Sequence[ArmReport]) -> int:
    """Depths to show: up to the deepest at which any arm accepted a draft."""
    return max(
        (k + 1 for r in reports for k, share in enumerate(r.per_position_acceptance) if share > 0), default=0
    )


def acceptance_table(reports: Sequence[ArmReport]) -> Table:
    depths = accepted_depths(reports)
    rows = []
    for rep in reports:
        per_depth = [
            _f(rep.per_position_acceptance[k]) if k < len(rep.per_position_acceptance) else "–"
            for k in range(depths)
        ]
        spans = [_f(rep.phase_ms.get(p)) for p in PHASES]
        rows.append([rep.arm, _f(rep.accepted_per_event), *per_depth, _f(rep.tokens_per_chunk), *spans])
    return Table(
        "Acceptance and phase spans (server /metrics)",
        [
            "arm",
            "accepted/event",
            *[f"depth {k + 1}" for k in range(depths)],
            "tok/chunk",
            *[f"{p} ms" for p in PHASES],
        ],
        rows,
        "accepted/event = Δaccepted drafts / Δspeculative events; depth k: share of events that accepted a "
        "draft at depth k; spans: mean milliseconds per span of each phase.",
    )


def paper_tables(reports: Sequence[ArmReport]) -> list[Table]:
    return [rate_table(reports), acceptance_table(reports)]


def to_markdown(table: Table) -> str:
    align = ["---:" if table.numeric(i) else "---" for i in range(len(table.headers))]
    lines = [
        f"**{table.title}**",
        "",
        "| " + " | ".join(table.headers) + " |",
        "| " + " | ".join(align) + " |",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in table.rows]
    if table.note:
        lines += ["", table.note]
    return "\n".join(lines) + "\n"


_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "–": "--",
    "−": "-",
    "Σ": r"$\Sigma$",
    "Δ": r"$\Delta$",
}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(c, c) for c in text)


def to_latex(table: Table) -> str:
    """A booktabs table (needs \\usepackage{booktabs})."""
    spec = "".join("r" if table.numeric(i) else "l" for i in range(len(table.headers)))
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        rf"\caption{{{latex_escape(table.title)}}}",
        rf"\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        " & ".join(latex_escape(h) for h in table.headers) + r" \\",
        r"\midrule",
        *[" & ".join(latex_escape(c) for c in row) + r" \\" for row in table.rows],
        r"\bottomrule",
        r"\end{tabular}",
    ]
    if table.note:
        lines.append(rf"\par\smallskip\footnotesize {latex_escape(table.note)}")
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


def to_html(table: Table) -> str:
    """A plain HTML table (numbers right-aligned) with its title and note."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in table.headers)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="{"num" if table.numeric(i) else "name"}">{html.escape(c)}</td>'
            for i, c in enumerate(row)
        )
        + "</tr>"
        for row in table.rows
    )
    note = f'<p class="note">{html.escape(table.note)}</p>' if table.note else ""
    return (
        f'<table class="report"><caption>{html.escape(table.title)}</caption>'
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{note}"
    )


def frame_table(frame: pd.DataFrame, title: str, note: str = "", digits: int = 2) -> Table:
    """A DataFrame as a Table: floats with `digits` decimals, missing values as '–'."""

    def cell(value: object) -> str:
        if value is None or (isinstance(value, float) and pd.isna(value)):
            return "–"
        return f"{value:,.{digits}f}" if isinstance(value, float) else str(value)

    rows = [[cell(v) for v in record] for record in frame.itertuples(index=False)]
    numeric = frozenset(
        i
        for i, dtype in enumerate(frame.dtypes)
        if pd.api.types.is_numeric_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype)
    )
    return Table(title, [str(c) for c in frame.columns], rows, note, numeric)
