"""Skinny GEMM vs cuBLAS (F.linear) at the Qwen3.5-27B projection shapes on a CUDA GPU.

Each figure is what one GEMM adds to a CUDA graph of them: the graph of three passes over several
weight copies (at least two, together > 3x the L2) less the graph of one pass, over the GEMMs added,
so weights stream from HBM as in a decode step and a graph launch's own constant drops out; medians
of CUDA-event timings (lumobench.bench.timing.Timer), GB/s of weights streamed and the fraction of
the device copy bandwidth measured in the same process (bytes read plus written per second: the bandwidth the
weight-read floor of lumobench.bench.cycle uses; a pure read stream can exceed it).
Usage: lumobench bench skinny-gemm --out DIR         (or python -m lumobench.bench.skinny_gemm)
       lumobench bench skinny-gemm --out DIR --sweep (a grid of configs at 1 row on the shapes below
       90 % of the copy bandwidth, the fastest first, into skinny_sweep.json)
       lumobench bench skinny-gemm --out DIR --narrow (the 5120-wide outputs' grid of narrow_grid at
       1, 6 and 32 rows, into skinny_narrow.{json,md}: a config must serve every row count)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import torch
import torch.nn.functional as F
import typer

from lumobench.bench.output import command_line, current_commit
from lumobench.bench.timing import Timer, copy_bandwidth, require_cuda
from lumotree.model.fused.skinny_gemm import SkinnyConfig, skinny_linear
from lumotree.verify.graphs import CapturedStage

SHAPES = [(16480, 5120), (14336, 5120), (34816, 5120), (248320, 5120), (5120, 6144), (5120, 17408)]
L2_BYTES = 50 * 2**20
MIN_STREAMED = 3 * L2_BYTES
LONG_PASSES = 3  # passes over the weight copies of the long graph (ms_per_gemm)


def candidate_configs(n: int, k: int, device: torch.device) -> list[tuple[str, SkinnyConfig]]:
    """The for_shape choice, 4 stages, and its neighbours: half / double the splits of a split
    shape, the other BLOCK_N (128 <-> 64, same tile bytes) of a wide one."""
    chosen = SkinnyConfig.for_shape(n, k, device)
    configs = [("for_shape", chosen), ("4 stages", replace(chosen, num_stages=4))]
    if chosen.splits > 1:
        configs.append(("half splits", replace(chosen, splits=max(1, chosen.splits // 2))))
        configs.append(("double splits", replace(chosen, splits=chosen.splits * 2)))
    else:
        other = 64 if chosen.block_n == 128 else 128
        configs.append(
            (
                f"BLOCK_N {other}",
                replace(chosen, block_n=other, block_k=chosen.block_k * chosen.block_n // other),
            )
        )
    return configs


SWEEP_SHAPES = [(5120, 17408), (5120, 6144), (16480, 5120), (14336, 5120)]


def sweep_configs(n: int, k: int) -> list[SkinnyConfig]:
    """A grid around the for_shape rules. Narrow outputs (the 5120-wide output projections): 16-64
    wide blocks, 128-256 deep tiles, 2-8 K splits, 4 warps (2 for 16-wide blocks too); wide ones:
    64-128 wide blocks, 64-256 deep tiles (at most 32 KB), 4 or 8 warps, no split. 3 or 4 stages."""
    if n <= 8192:
        grid = [
            SkinnyConfig(block_n, block_k, warps, stages, split)
            for block_n in (16, 32, 64)
            for block_k in (128, 256)
            for warps in ((2, 4) if block_n == 16 else (4,))
            for stages in (3, 4)
            for split in (2, 4, 8)
        ]
    else:
        grid = [
            SkinnyConfig(block_n, block_k, warps, stages)
            for block_n in (64, 128)
            for block_k in (64, 128, 256)
            for warps in (4, 8)
            for stages in (3, 4)
        ]
    return [c for c in grid if c.block_n * c.block_k * 2 <= 32 * 1024 and k // (c.block_k * c.splits) >= 4]


NARROW_SHAPES = [(5120, 17408), (5120, 6144)]
NARROW_ROWS = (1, 6, 32)


def narrow_grid(k: int) -> list[SkinnyConfig]:
    """The narrow outputs' split configs: 32- or 64-wide blocks, 64- or 128-deep tiles, 2 to 4
    stages, 2, 3, 4 or 6 K ranges, at least 8 tiles a range. At 32 rows the x tiles of two row
    tiles take pipeline stages' shared memory too (the earlier rule's 640 programs, 32-wide blocks
    in 4 ranges, no longer fit on the SMs at once): the grid looks for a config that runs 1, 6 and
    32 rows alike."""
    grid = [
        SkinnyConfig(block_n, block_k, 4, stages, splits)
        for block_n in (32, 64)
        for block_k in (64, 128)
        for stages in (2, 3, 4)
        for splits in (2, 3, 4, 6)
    ]
    return [c for c in grid if k // (c.block_k * c.splits) >= 8]


def sweep_narrow(iters: int = 30, warmup: int = 5) -> list[dict]:
    """Every narrow_grid config at NARROW_ROWS rows on NARROW_SHAPES, cuBLAS first: median ms and
    the fraction of the copy bandwidth; each shape's best configs by their slowest row count."""
    device = torch.device("cuda")
    timer = Timer(device, iters, warmup)
    bandwidth = copy_bandwidth(device)
    results = []
    for n, k in NARROW_SHAPES:
        weights = weight_copies(n, k, device)
        for m in NARROW_ROWS:
            results += _time_configs(n, k, m, narrow_grid(k), weights, timer, bandwidth)
        print(render_narrow_table([r for r in results if (r["n"], r["k"]) == (n, k)], best=6), flush=True)
        del weights
        torch.cuda.empty_cache()
    return results


def render_narrow_table(results: list[dict], best: int = 10) -> str:
    """Markdown of sweep_narrow's rows: per shape, cuBLAS, the `best` configs by their slowest row
    count, and the for_shape config, each as us (fraction of the copy bandwidth) per row count."""
    counts = sorted({r["rows"] for r in results})
    lines = [
        "| N | K | method | " + " | ".join(f"{m} rows" for m in counts) + " | slowest us |",
        "|---|---|---|" + "---:|" * (len(counts) + 1),
    ]
    for n, k in dict.fromkeys((r["n"], r["k"]) for r in results):
        timed: dict[str, dict[int, dict]] = {}
        for r in results:
            if (r["n"], r["k"]) == (n, k):
                timed.setdefault(r["method"], {})[r["rows"]] = r
        slowest = {name: max(r["median_ms"] for r in rows.values()) for name, rows in timed.items()}
        chosen = SkinnyConfig.for_shape(n, k, "cpu").label()
        ranked = [name for name in sorted(slowest, key=slowest.get) if name != "cuBLAS F.linear"][:best]
        for name in dict.fromkeys(["cuBLAS F.linear", *ranked, chosen]):
            if name not in timed:
                continue
            cells = " | ".join(
                f"{timed[name][m]['median_ms'] * 1e3:.1f} ({timed[name][m]['fraction_of_copy_bw']:.0%})"
                if m in timed[name] else ""
                for m in counts
            )  # fmt: skip
            label = f"{name} (for_shape)" if name == chosen else name
            lines.append(f"| {n} | {k} | {label} | {cells} | {slowest[name] * 1e3:.1f} |")
    return "\n".join(lines) + "\n"


def sweep_skinny_gemm(iters: int = 30, warmup: int = 5) -> list[dict]:
    """Every sweep config at 1 row on SWEEP_SHAPES: median ms and fraction of copy bandwidth, with
    cuBLAS first in each shape's rows."""
    device = torch.device("cuda")
    timer = Timer(device, iters, warmup)
    bandwidth = copy_bandwidth(device)
    results = []
    for n, k in SWEEP_SHAPES:
        weights = weight_copies(n, k, device)
        rows = _time_configs(n, k, 1, sweep_configs(n, k), weights, timer, bandwidth)
        ranked = rows[:1] + sorted(rows[1:], key=lambda r: r["median_ms"])
        best = "; ".join(
            f"{r['method']} {r['median_ms'] * 1e3:.1f}us {r['fraction_of_copy_bw']:.0%}" for r in ranked[:8]
        )
        print(f"{n}x{k}: {best}", flush=True)
        results += ranked
        del weights
        torch.cuda.empty_cache()
    return results


def _time_configs(
    n: int,
    k: int,
    m: int,
    configs: list[SkinnyConfig],
    weights: list[torch.Tensor],
    timer: Timer,
    bandwidth: float,
) -> list[dict]:
    """cuBLAS, then the skinny GEMM in each config, at m rows over `weights`: one dict each (method
    cuBLAS's name or the config's label, median ms, fraction of the copy bandwidth); a config the
    compiler refuses is skipped, and named."""
    x = torch.randn(m, k, device=weights[0].device, dtype=torch.bfloat16)
    out = torch.empty(m, n, device=weights[0].device, dtype=torch.bfloat16)
    methods = [("cuBLAS F.linear", lambda x, w: F.linear(x, w))]
    methods += [(c.label(), lambda x, w, c=c, o=out: skinny_linear(x, w, o, c)) for c in configs]
    rows = []
    for name, gemm in methods:
        try:
            ms, _ = ms_per_gemm(timer, gemm, x, weights)
        except Exception as exc:  # a config the compiler refuses is skipped, and named
            print(f"{n}x{k} {name}: skipped ({type(exc).__name__})")
            continue
        rows.append(dict(n=n, k=k, rows=m, method=name, median_ms=ms,
                         fraction_of_copy_bw=n * k * 2 / (ms * 1e-3) / bandwidth))  # fmt: skip
    return rows


def weight_copies(n: int, k: int, device: torch.device) -> list[torch.Tensor]:
    """bf16 [n, k] weights: at least two copies, enough to stream more than MIN_STREAMED bytes
    (past the L2) before a copy is read again."""
    copies = max(2, -(-MIN_STREAMED // (n * k * 2)))
    return [torch.randn(n, k, device=device, dtype=torch.bfloat16) for _ in range(copies)]


def ms_per_gemm(
    timer: Timer, gemm: Callable[[torch.Tensor, torch.Tensor], object], x, weights
) -> tuple[float, float]:
    """Median ms one GEMM adds to a stream of them, and the earlier figure beside it.

    The first: a CUDA graph of LONG_PASSES passes over the weight copies less one of a single pass,
    over the GEMMs it adds, so a graph launch's own constant (~7 us on the H200: 55.2 us a
    5120 x 17408 GEMM timed as a one-kernel graph, 46.5 us its kernel under ncu) drops out, as it
    does inside a decode step's graph of ~900 kernels. The second: the single pass's graph over
    its GEMMs (the constant shared among the copies; the figure of sessions up to 13)."""
    short = CapturedStage(lambda: [gemm(x, w) for w in weights])
    long = CapturedStage(lambda: [gemm(x, w) for _ in range(LONG_PASSES) for w in weights])
    short_ms, long_ms = timer(short).median_ms, timer(long).median_ms
    return (long_ms - short_ms) / ((LONG_PASSES - 1) * len(weights)), short_ms / len(weights)


def bench_skinny_gemm(
    rows: tuple[int, ...] = (1, 6, 32),
    iters: int = 50,
    warmup: int = 10,
    neighbours: bool = True,
    bandwidth: float | None = None,
) -> list[dict]:
    """One dict per (shape, rows, method): median ms per GEMM, weight GB/s, fraction of copy bandwidth
    (`bandwidth`, bytes/s, or measured here) and the ratio to cuBLAS (cuBLAS first, then the
    for_shape config and, with `neighbours`, the configs next to it)."""
    device = torch.device("cuda")
    timer = Timer(device, iters, warmup)
    bandwidth = bandwidth or copy_bandwidth(device)  # bytes read plus written per second: the floor's
    results = []
    for n, k in SHAPES:
        nbytes = n * k * 2
        weights = weight_copies(n, k, device)
        for m in rows:
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            out = torch.empty(m, n, device=device, dtype=torch.bfloat16)
            methods = [("cuBLAS F.linear", lambda x, w: F.linear(x, w))]
            for label, cfg in candidate_configs(n, k, device)[: None if neighbours else 1]:
                methods.append(
                    (f"skinny {label} {cfg.label()}", lambda x, w, c=cfg, o=out: skinny_linear(x, w, o, c))
                )
            base_ms = None
            for name, gemm in methods:
                ms, one_pass_ms = ms_per_gemm(timer, gemm, x, weights)
                base_ms = ms if base_ms is None else base_ms
                gbs = nbytes / (ms * 1e-3) / 1e9
                results.append(
                    dict(
                        n=n,
                        k=k,
                        rows=m,
                        method=name,
                        copies=len(weights),
                        median_ms=ms,
                        one_pass_graph_ms=one_pass_ms,
                        weight_gbs=gbs,
                        fraction_of_copy_bw=gbs * 1e9 / bandwidth,
                        speedup_vs_cublas=base_ms / ms,
                    )
                )
        del weights
        torch.cuda.empty_cache()
    return results


def for_shape_fractions(results: list[dict]) -> dict[str, dict[str, float]]:
    """{"NxK": {"rows": fraction of the copy bandwidth}} of the for_shape config in
    bench_skinny_gemm's rows: the cycle benchmark's gemv_fraction_of_copy_bw."""
    fractions: dict[str, dict[str, float]] = {}
    for r in results:
        if r["method"].startswith("skinny for_shape "):
            shape = fractions.setdefault(f"{r['n']}x{r['k']}", {})
            shape[str(r["rows"])] = round(r["fraction_of_copy_bw"], 4)
    return fractions


def render_table(results: list[dict]) -> str:
    """Markdown of bench_skinny_gemm's rows: ms a GEMM adds to a stream of them, its GB/s, fraction
    of the copy bandwidth and ratio to cuBLAS, and the one-pass graph's ms a GEMM beside them."""
    lines = [
        "| N | K | rows | method | ms | weight GB/s | of copy BW | vs cuBLAS | one-pass graph ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['n']} | {r['k']} | {r['rows']} | {r['method']} | {r['median_ms']:.4f} | "
            f"{r['weight_gbs']:.0f} | {r['fraction_of_copy_bw']:.1%} | {r['speedup_vs_cublas']:.2f}x | "
            f"{r['one_pass_graph_ms']:.4f} |"
        )
    return "\n".join(lines) + "\n"


def skinny_gemm_command(
    out: Annotated[Path, typer.Option(help="directory for skinny_gemm.json and skinny_gemm.md")],
    iters: int = 50,
    warmup: int = 10,
    sweep: Annotated[bool, typer.Option(help="Time a grid of configs at 1 row instead.")] = False,
    narrow: Annotated[
        bool, typer.Option(help="Time the narrow outputs' grid at 1, 6 and 32 rows instead.")
    ] = False,
) -> None:
    """Time the skinny GEMM against cuBLAS at the Qwen3.5-27B projection shapes."""
    require_cuda("the skinny GEMM benchmark")
    if narrow:
        found = sweep_narrow()
        _write_results(out, "skinny_narrow", found, render_narrow_table(found))
    elif sweep:
        _write_results(out, "skinny_sweep", sweep_skinny_gemm())
    else:
        results = bench_skinny_gemm(iters=iters, warmup=warmup)
        device = torch.cuda.get_device_name()
        head = f"Command: `{command_line('skinny-gemm')}` at commit {current_commit()} ({device})."
        table = head + "\n\n" + render_table(results)
        _write_results(out, "skinny_gemm", results, table)
        print(table)


def _write_results(out: Path, name: str, results: list[dict], table: str | None = None) -> None:
    """out/name.json (the device, the command and the rows) and, given a table, out/name.md."""
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(device=torch.cuda.get_device_name(), command=command_line("skinny-gemm"))
    (out / f"{name}.json").write_text(json.dumps(dict(meta, results=results), indent=2))
    if table is not None:
        (out / f"{name}.md").write_text(table)


if __name__ == "__main__":
    typer.run(skinny_gemm_command)
