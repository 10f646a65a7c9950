"""How fast one kernel can read a projection's bytes, and the skinny GEMM by its number of programs.

The narrow projections of Qwen3.5-27B (5120 x 6144: 63 MB, 5120 x 17408: 178 MB) stream at 68-76 %
of the device copy bandwidth in the skinny GEMM and in cuBLAS alike, while the 2.5 GB vocabulary
projection streams at 103 %. Two questions decide what a faster GEMV needs:

1. the read floor: what a kernel that only reads (and sums) the same bytes reaches in one launch
   inside a CUDA graph, by program count (`stream_read_kernel`, one contiguous chunk a program),
   as the GEMM is timed (what one launch adds to a graph of them over weight copies past the L2:
   `skinny_gemm.ms_per_gemm`);
2. the GEMM by program count: the skinny GEMM's split count swept (64-wide blocks, 128-deep tiles,
   3 stages) at 1, 6 and 32 rows, from one wave of programs to several.

Usage: python -m lumobench.bench.read_floor --out DIR   (CUDA only; read_floor.{json,md})
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import torch
import triton
import triton.language as tl
import typer

from lumobench.bench.output import command_line, current_commit, write_tables
from lumobench.bench.skinny_gemm import SHAPES, ms_per_gemm, weight_copies
from lumobench.bench.timing import Timer, copy_bandwidth, require_cuda
from lumotree.model.fused.skinny_gemm import SkinnyConfig, skinny_linear

READ_BLOCK = 8192  # bf16 elements a program loads per step (16 KB)
PROGRAMS_PER_SM = (1, 2, 3, 4, 8, 16, 32)
READ_WARPS = (4, 8)
GEMM_SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24)
GEMM_ROWS = (1, 6, 32)


@triton.jit
def stream_read_kernel(src_ptr, out_ptr, chunk, BLOCK: tl.constexpr):
    """out[pid, :] = src[pid * chunk : (pid + 1) * chunk] summed in fp32 over BLOCK lanes (chunk a
    multiple of BLOCK)."""
    pid = tl.program_id(0)
    base = src_ptr + pid.to(tl.int64) * chunk
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, chunk, BLOCK):
        acc += tl.load(base + i + offs).to(tl.float32)
    tl.store(out_ptr + pid * BLOCK + offs, acc)


def stream_read_reference(src: torch.Tensor, programs: int, block: int = READ_BLOCK) -> torch.Tensor:
    """The [programs, block] lane sums stream_read_kernel writes for the first programs * chunk
    elements of src (flat), in fp32."""
    chunk = read_chunk(src.numel(), programs, block)
    return src.reshape(-1)[: programs * chunk].float().reshape(programs, chunk // block, block).sum(1)


def read_chunk(numel: int, programs: int, block: int = READ_BLOCK) -> int:
    """Elements a program reads: numel split over programs, rounded down to whole blocks (>= one)."""
    return max(block, numel // programs // block * block)


def stream_read(
    src: torch.Tensor,
    programs: int,
    out: torch.Tensor | None = None,
    num_warps: int = 8,
    block: int = READ_BLOCK,
) -> torch.Tensor:
    """Launch stream_read_kernel over src (flat, contiguous) with `programs` programs into out
    [programs, block] fp32."""
    if not src.is_contiguous():
        raise ValueError("src must be contiguous")
    chunk = read_chunk(src.numel(), programs, block)
    if programs * chunk > src.numel():
        raise ValueError(f"{programs} programs of {chunk} elements pass the end of {src.numel()}")
    out = torch.empty(programs, block, dtype=torch.float32, device=src.device) if out is None else out
    stream_read_kernel[(programs,)](src, out, chunk, BLOCK=block, num_warps=num_warps)
    return out


def _reader(programs: int, out: torch.Tensor, warps: int):
    """A (x, w) callable for ms_per_gemm that reads w with stream_read (x unused)."""
    return lambda _x, w: stream_read(w, programs, out, warps)


def bench_read_floor(timer: Timer, bandwidth: float) -> list[dict]:
    """Per shape's bytes, program count (a multiple of the SMs) and warp count: median us of one
    read kernel in a graph over weight copies, and the fraction of the copy bandwidth."""
    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    results = []
    for n, k in SHAPES:
        weights = weight_copies(n, k, device)
        for per_sm in PROGRAMS_PER_SM:
            programs = per_sm * sms
            if programs * READ_BLOCK > n * k:
                continue  # fewer than one block a program
            out = torch.empty(programs, READ_BLOCK, dtype=torch.float32, device=device)
            read = programs * read_chunk(n * k, programs) * 2
            for warps in READ_WARPS:
                ms, _ = ms_per_gemm(timer, _reader(programs, out, warps), None, weights)
                fraction = read / (ms * 1e-3) / bandwidth
                results.append(dict(kind="read", n=n, k=k, programs=programs, warps=warps, bytes=read,
                                    us=ms * 1e3, fraction_of_copy_bw=fraction))  # fmt: skip
        del weights
        torch.cuda.empty_cache()
    return results


def bench_gemm_programs(timer: Timer, bandwidth: float) -> list[dict]:
    """Per shape, split count and row count: the skinny GEMM (64-wide blocks, 128-deep tiles, 3
    stages) median us, its program count and the fraction of the copy bandwidth."""
    device = torch.device("cuda")
    results = []
    for n, k in SHAPES:
        weights = weight_copies(n, k, device)
        for m in GEMM_ROWS:
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            out = torch.empty(m, n, device=device, dtype=torch.bfloat16)
            for splits in GEMM_SPLITS:
                if k // (128 * splits) < 2:
                    continue
                cfg = SkinnyConfig(64, 128, 4, 3, splits)
                ms, _ = ms_per_gemm(timer, lambda x, w, c=cfg, o=out: skinny_linear(x, w, o, c), x, weights)
                results.append(dict(kind="gemm", n=n, k=k, rows=m, splits=splits,
                                    programs=triton.cdiv(n, 64) * splits, us=ms * 1e3,
                                    fraction_of_copy_bw=n * k * 2 / (ms * 1e-3) / bandwidth))  # fmt: skip
        del weights
        torch.cuda.empty_cache()
    return results


def render(results: list[dict], head: str = "") -> str:
    """`head`, then two markdown tables: the read floor (fraction of copy bandwidth by programs per
    SM, best warp count) and the GEMM by split count (us and fraction at each row count)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
    reads = [r for r in results if r["kind"] == "read"]
    lines = [head, ""] if head else []
    lines += ["Read floor: one read-and-sum kernel over each shape's bytes (best of 4 / 8 warps):", "",
             "| N x K | MB | " + " | ".join(f"{p}/SM" for p in PROGRAMS_PER_SM) + " |",
             "|---|---:|" + "---:|" * len(PROGRAMS_PER_SM)]  # fmt: skip
    for n, k in SHAPES:
        cells = []
        for per_sm in PROGRAMS_PER_SM:
            got = [r for r in reads if (r["n"], r["k"], r["programs"]) == (n, k, per_sm * sms)]
            cells.append(f"{max(r['fraction_of_copy_bw'] for r in got):.0%}" if got else "")
        lines.append(f"| {n} x {k} | {n * k * 2 / 1e6:.0f} | " + " | ".join(cells) + " |")
    lines += ["", "Skinny GEMM by K splits (64-wide blocks, 128-deep tiles, 3 stages): us (fraction):", "",
              "| N x K | splits | programs | " + " | ".join(f"{m} rows" for m in GEMM_ROWS) + " |",
              "|---|---:|---:|" + "---:|" * len(GEMM_ROWS)]  # fmt: skip
    gemms = [r for r in results if r["kind"] == "gemm"]
    for n, k in SHAPES:
        for splits in GEMM_SPLITS:
            row = {r["rows"]: r for r in gemms if (r["n"], r["k"], r["splits"]) == (n, k, splits)}
            if not row:
                continue
            cells = " | ".join(
                f"{row[m]['us']:.1f} ({row[m]['fraction_of_copy_bw']:.0%})" if m in row else ""
                for m in GEMM_ROWS
            )
            programs = next(iter(row.values()))["programs"]
            lines.append(f"| {n} x {k} | {splits} | {programs} | {cells} |")
    return "\n".join(lines) + "\n"


def read_floor_command(
    out: Annotated[Path, typer.Option(help="directory for read_floor.json and read_floor.md")],
    iters: int = 30,
    warmup: int = 5,
    gemm: Annotated[bool, typer.Option(help="Also sweep the skinny GEMM's split count.")] = True,
) -> None:
    """Time a plain read of each projection's bytes by program count, and the skinny GEMM by splits."""
    device = require_cuda("the read-floor benchmark")
    timer = Timer(device, iters, warmup)
    bandwidth = copy_bandwidth(device)
    results = bench_read_floor(timer, bandwidth)
    if gemm:
        results += bench_gemm_programs(timer, bandwidth)
    doc = dict(
        device=torch.cuda.get_device_name(),
        command=command_line("read-floor"),
        commit=current_commit(),
        copy_bandwidth=bandwidth,
        results=results,
    )
    write_tables(out / "read_floor", doc, _markdown)


def _markdown(doc: dict) -> str:
    """read_floor.md: the command and commit, then `render`'s tables."""
    head = (f"Command: `{doc['command']}` at commit {doc['commit']} ({doc['device']}); each figure what "
            "one launch adds to a CUDA graph of them over weight copies past the L2.")  # fmt: skip
    return render(doc["results"], head)


if __name__ == "__main__":
    typer.run(read_floor_command)
