"""`lumobench bench kernels` results (kernels.json, results/h200/*.json) as DataFrames.

- `files`: one row per result file (device, versions, copy bandwidth, time, command);
- `gdn`: one row per GDN verify + publish method and file, graph and eager medians against the byte
  floor of the paper tree at the result's measured copy bandwidth;
- `stages`: one row per method of the other suites (tree attention per context, draft selection, the
  device acceptance walk, the captured commit: the rest of a LumoTree cycle), graph/eager medians and
  the floor.
Methods that failed in a run are kept with their error and no times.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lumobench.reports.kernel_tables import render_markdown

STAGE_SUITES = ("attention", "selection", "walk", "commit")
GDN_COLUMNS = [
    "file",
    "time",
    "method",
    "verify_ms",
    "publish_ms",
    "total_ms",
    "total_p10_ms",
    "total_p90_ms",
    "eager_total_ms",
    "floor_ms",
    "output_err",
    "state_err",
    "error",
]
STAGE_COLUMNS = [
    "file",
    "suite",
    "method",
    "context",
    "dtype",
    "rows",
    "eager_ms",
    "graph_ms",
    "floor_ms",
    "graph_over_floor",
    "error",
]


@dataclass(frozen=True)
class KernelData:
    results: list[dict]  # the parsed files, in input order
    files: pd.DataFrame
    gdn: pd.DataFrame
    stages: pd.DataFrame

    def markdown(self, index: int) -> str:
        """The tables `lumobench bench kernels` writes beside that result (kernels.md)."""
        return render_markdown(self.results[index])


def _median(cell: dict | None) -> float | None:
    return cell["median_ms"] if cell else None


def _gdn_rows(name: str, result: dict) -> list[dict]:
    gdn = result.get("gdn")
    if not isinstance(gdn, dict) or "methods" not in gdn:
        return []
    floor = gdn["floor_bytes"]
    floor_ms = (floor["verify"] + floor["publish"]) / result["copy_bandwidth_Bps"] * 1e3
    rows = []
    for method in gdn["methods"]:
        total = method.get("total")
        errors = method.get("errors", {})
        rows.append(
            {
                "file": name,
                "time": result["time"],
                "method": method["method"],
                "verify_ms": _median(method.get("verify")),
                "publish_ms": _median(method.get("publish")),
                "total_ms": _median(total),
                "total_p10_ms": total["p10_ms"] if total else None,
                "total_p90_ms": total["p90_ms"] if total else None,
                "eager_total_ms": _median(method.get("eager_total")),
                "floor_ms": floor_ms,
                "output_err": errors.get("output_max_abs"),
                "state_err": errors.get("state_max_abs"),
                "error": method.get("error"),
            }
        )
    return rows


def _stage_rows(name: str, result: dict) -> list[dict]:
    rows = []
    for suite in STAGE_SUITES:
        value = result.get(suite)
        if not isinstance(value, list):
            continue
        for method in value:
            graph = _median(method.get("graph"))
            rows.append(
                {
                    "file": name,
                    "suite": suite,
                    "method": method["method"],
                    "context": method.get("context"),
                    "dtype": method.get("dtype"),
                    "rows": method.get("rows"),
                    "eager_ms": _median(method.get("eager")),
                    "graph_ms": graph,
                    "floor_ms": method.get("floor_ms"),
                    "graph_over_floor": graph / method["floor_ms"]
                    if graph and method.get("floor_ms")
                    else None,
                    "error": method.get("error"),
                }
            )
    return rows


def load_kernels(paths: Sequence[Path]) -> KernelData:
    """Parse kernel result files; `file` names them by their path as given."""
    results, files, gdn, stages = [], [], [], []
    for path in paths:
        result = json.loads(Path(path).read_text())
        name = str(path)
        results.append(result)
        files.append(
            {
                "file": name,
                "device": result["device"],
                "torch": result.get("torch"),
                "triton": result.get("triton"),
                "copy_bandwidth_TBps": result["copy_bandwidth_Bps"] / 1e12,
                "time": result.get("time"),
                "command": result.get("command"),
                "suites": ", ".join(k for k in ("gdn", *STAGE_SUITES) if k in result),
            }
        )
        gdn += _gdn_rows(name, result)
        stages += _stage_rows(name, result)
    return KernelData(
        results,
        pd.DataFrame(files),
        pd.DataFrame(gdn, columns=GDN_COLUMNS),
        pd.DataFrame(stages, columns=STAGE_COLUMNS),
    )
