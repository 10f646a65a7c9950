"""Markdown tables of a `lumobench bench kernels` result (the dict written to kernels.json)."""

from __future__ import annotations

MIB = 2**20


def _ms(cell: dict | None, key: str = "median_ms") -> str:
    return "—" if not cell else f"{cell[key]:.4f}"


def _median(row: dict, key: str) -> float | None:
    cell = row.get(key)
    return cell["median_ms"] if cell else None


def _gdn(g: dict, bandwidth: float) -> list[str]:
    floor = g["floor_bytes"]
    total_floor_ms = (floor["verify"] + floor["publish"]) / bandwidth * 1e3
    out = [
        f"### GDN verify + publish: {g['shape']['layers']} layers, {g['shape']['heads']} QK / "
        f"{g['shape']['v_heads']} V heads, dk = dv = {g['shape']['dk']}; paper tree "
        f"({g['active_rows']} active of {g['rows']} rows, {g['paths']} paths, {g['cuts']} cut states); bf16 "
        "operands, fp32 state",
        "",
        f"Byte floor: verify {floor['verify'] / MIB:.1f} MiB, publish {floor['publish'] / MIB:.1f} MiB; "
        f"total {total_floor_ms:.4f} ms at the measured copy bandwidth.",
        "",
        "| method | verify (graph) | publish (graph) | total (graph) | p10–p90 total | total (eager) "
        "| floor / total | output err | state err |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in g["methods"]:
        if "error" in row:
            out.append(f"| {row['method']} | failed: {row['error']} | | | | | | | |")
            continue
        total = row.get("total")
        errs = row.get("errors", {})
        spread = f"{total['p10_ms']:.4f}–{total['p90_ms']:.4f}" if total else "—"
        ratio = f"{total_floor_ms / total['median_ms']:.0%}" if total else "—"
        cells = [row["method"], _ms(row.get("verify")), _ms(row.get("publish")), _ms(total), spread]
        cells += [_ms(row.get("eager_total")), ratio]
        cells += [f"{errs.get(k, float('nan')):.2e}" for k in ("output_max_abs", "state_max_abs")]
        out.append("| " + " | ".join(cells) + " |")
    out += [
        "",
        "Named persistent buffers (Table XV's sense: outputs, graph pools and temporaries excluded):",
        "",
        "| method | buffer | MiB |",
        "| --- | --- | --- |",
    ]
    for row in g["methods"]:
        for name, nbytes in row.get("buffers", {}).items():
            out.append(f"| {row['method']} | {name} | {nbytes / MIB:.2f} |")
    return out


def _simple(title: str, rows: list[dict], keys: list[str]) -> list[str]:
    header = [*keys, "method", "eager", "graph", "floor", "graph / floor"]
    out = [
        f"### {title}",
        "",
        "| " + " | ".join(header) + " |",
        "| " + " | ".join(["---"] * len(header)) + " |",
    ]
    for row in rows:
        lead = [str(row.get(k, "")) for k in keys]
        if "error" in row:
            cells = [*lead, row["method"], f"failed: {row['error']}", "", "", ""]
        else:
            graph = _median(row, "graph")
            ratio = f"{graph / row['floor_ms']:.2f}×" if graph else "—"
            cells = [
                *lead,
                row["method"],
                _ms(row.get("eager")),
                _ms(row.get("graph")),
                f"{row['floor_ms']:.4f}",
                ratio,
            ]
        out.append("| " + " | ".join(cells) + " |")
    return out


def render_markdown(result: dict) -> str:
    """All suites of one run, times in milliseconds (medians)."""
    bw = result["copy_bandwidth_Bps"]
    lines = [
        "## LumoTree kernels",
        "",
        f"{result['device']}; torch {result['torch']}, triton {result['triton']}; measured copy bandwidth "
        f"{bw / 1e12:.2f} TB/s (read + write); {result['iters']} timed iterations after {result['warmup']} "
        "warm-up, CUDA events, L2 flushed (256 MiB written) before each; medians in ms.",
        "",
        f"Command: `{result['command']}` ({result['time']})",
        "",
    ]
    for suite, render in (
        ("gdn", lambda v: _gdn(v, bw)),
        (
            "attention",
            lambda v: _simple(
                "Tree attention (24 Q / 4 KV heads, dim 256, bf16); floor = KV read", v, ["context"]
            ),
        ),
        (
            "selection",
            lambda v: _simple("Draft selection: spine + ordered top-3 per MTP depth", v, ["dtype", "rows"]),
        ),
        ("walk", lambda v: _simple("Device acceptance walk (32 rows, full vocabulary)", v, [])),
        ("commit", lambda v: _simple("Captured commit (publication)", v, [])),
    ):
        value = result.get(suite)
        if value is None:
            continue
        if isinstance(value, dict) and "error" in value:
            lines += [f"### {suite}", "", f"failed: {value['error']}"]
        else:
            lines += render(value)
        lines.append("")
    return "\n".join(lines)
