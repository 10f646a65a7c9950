"""`lumobench bench kernels`: the LumoTree kernel benchmark (issue 5) on a CUDA GPU.

Runs every suite in one process so all comparisons come from the same run, writes
`kernels.json` (every number) and `kernels.md` (the tables) under --out, and prints the tables.
`--tiny` runs the same code on small shapes (on a CPU only under TRITON_INTERPRET=1): a smoke test,
its numbers mean nothing.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Annotated

import torch
import typer
from rich.console import Console
from rich.progress import Progress

from lumobench.bench.kernels import decode, gdn
from lumobench.bench.output import command_line
from lumobench.bench.timing import Timer, copy_bandwidth
from lumobench.reports.kernel_tables import render_markdown
from lumotree.verify.attention.decode import AttentionConfig

SUITES = ("gdn", "attention", "selection", "walk", "commit")
VOCAB = 248320


# Tree-parallel value-major configurations, fastest expected first. Runs 6-7 measured the split
# solve's launches apart (results/h200/run{6,7}/ablate_gdn.md): prepare fastest with 2 warps, apply
# with 128-row value tiles on 4 warps and a 4-stage state loop (or 8 warps with 128 registers).
VALUE_MAJOR_CONFIGS = [
    dict(block_v=bv, num_warps=nw, max_registers=regs, prepare_warps=2, num_stages=stages)
    for bv, nw, regs, stages in ((128, 4, None, 4), (128, 8, 128, 4), (64, 4, 128, 4), (128, 4, None, 3))
]


def _gdn_methods(w: gdn.GdnWorkload, tiny: bool, with_fla: bool) -> list:
    """Makers in the order they run: the new kernels first (so a time limit keeps them), then the
    previous scan (v2) and the baselines."""
    R, HV, V, K = w.tree.rows, w.shape.v_heads, w.shape.dv, w.shape.dk
    cut_bank = torch.empty(R, HV, V, K, device=w.device)
    bank = torch.empty(w.shape.layers, R, HV, V, K, device=w.device)
    staging = torch.empty(w.shape.layers, 1, HV, V, K, device=w.device)
    # (block_v, num_warps, precision, solve, both layouts?) for tree-parallel. Run 3 (product solve
    # only) measured bv64 w8 fastest.
    tree = (
        [(16, 4, "ieee", "substitution", True)]
        if tiny
        else [
            (64, 8, "tf32x3", "substitution", True),
            (64, 8, "tf32x3", "product", True),
            (64, 8, "ieee", "substitution", False),
            (32, 8, "ieee", "substitution", True),
        ]
    )
    makers = []
    value_major = [dict(VALUE_MAJOR_CONFIGS[0], block_v=16, num_warps=4)] if tiny else VALUE_MAJOR_CONFIGS
    for i, config in enumerate(value_major):
        # every configuration in one launch over the layers; the first also with per-layer launches
        for one in (True, False) if i == 0 else (True,):
            label = f"lumotree tree-parallel value-major {gdn.value_major_label(**config)}"
            makers.append((label, partial(gdn.value_major_method, w, one, **config)))
    for bv, nw, precision, solve, both in tree:
        for one in (False, True) if both else (False,):
            label = f"lumotree tree-parallel {precision} {solve} bv{bv} w{nw}"
            makers.append((label, partial(gdn.tree_method, w, one, bv, nw, precision, solve)))
    makers += [
        ("lumotree v2 cut bv8 w2", partial(gdn.lumotree_method, w, "cut", True, 8, 2, cut_bank)),
        (
            "lumotree v2 recompute bv4 w1",
            partial(gdn.lumotree_method, w, "recompute", True, 4, 1, cut_bank),
        ),
        ("native paths", partial(gdn.native_paths_method, w, bank, staging, 8, 2)),
    ]
    if with_fla:
        makers.append(("fla chain kernels", partial(gdn.fla_methods, w)))
    makers.append(("torch sequential", partial(gdn.torch_sequential_method, w, bank, staging)))
    return makers


def _chosen(label: str, only: Sequence[str]) -> bool:
    return not only or any(part in label for part in only)


def run_gdn(
    device: torch.device,
    timer: Timer,
    tiny: bool,
    eager_iters: int,
    with_fla: bool,
    progress: Progress,
    checkpoint: Callable[[dict], None],
    only: Sequence[str] = (),
) -> dict:
    """The GDN suite; `checkpoint(partial result)` after every method, so a time limit keeps rows.

    `only`: keep the methods whose label contains one of these substrings (all when empty).
    """
    shape = gdn.GdnShape(layers=2, heads=1, v_heads=2, dk=16, dv=16) if tiny else gdn.GdnShape()
    w = gdn.GdnWorkload(shape, torch.bfloat16, device)
    rows: list[dict] = []
    header = {
        "shape": vars(shape),
        "active_rows": w.tree.n_active,
        "rows": w.tree.rows,
        "paths": int(w.tree.paths.nodes.shape[0]),
        "cuts": len(w.tree.paths.cut_nodes),
        "floor_bytes": w.floor_bytes(),
        "methods": rows,
    }
    makers = [(label, make) for label, make in _gdn_methods(w, tiny, with_fla) if _chosen(label, only)]
    if not makers:
        raise ValueError(f"no GDN method label contains any of {list(only)}")
    task = progress.add_task("GDN methods", total=len(makers))
    for label, make in makers:
        try:
            made = make()
            methods = made if isinstance(made, list) else [made]
        except Exception as exc:  # e.g. fla missing: the table says so
            rows.append({"method": label, "error": repr(exc)[:300]})
            methods = []
        for method in methods:
            try:
                row = gdn.measure_method(w, method, timer, timer.cuda, eager_iters)
                if not method.name.startswith("fla"):
                    row["errors"] = gdn.method_errors(w, method)
            except Exception as exc:  # one failing variant must not kill the table
                row = {"method": method.name, "error": repr(exc)[:300]}
            rows.append(row)
            checkpoint(header)
        progress.advance(task)
    return header


def run_suites(
    suites: list[str],
    device: torch.device,
    iters: int,
    warmup: int,
    eager_iters: int,
    contexts: list[int],
    tiny: bool,
    with_fla: bool,
    checkpoint: Callable[[dict], None],
    gdn_only: Sequence[str] = (),
) -> dict:
    """Every chosen suite in order; `checkpoint(result)` after each, so a crash keeps the rest."""
    timer = Timer(device, iters, warmup)
    bandwidth = copy_bandwidth(device) if device.type == "cuda" else 1e12
    result: dict = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "copy_bandwidth_Bps": bandwidth,
        "iters": iters,
        "warmup": warmup,
        "eager_iters": eager_iters,
        "command": command_line("kernels"),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    attn = decode.AttentionShape(4, 2, 16) if tiny else decode.AttentionShape()
    vocab = 3000 if tiny else VOCAB
    gdn_shape = gdn.GdnShape(layers=2, heads=1, v_heads=2, dk=16, dv=16) if tiny else gdn.GdnShape()
    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("suites", total=len(suites))
        for suite in suites:
            try:
                if suite == "gdn":
                    result["gdn"] = run_gdn(
                        device,
                        timer,
                        tiny,
                        eager_iters,
                        with_fla,
                        progress,
                        lambda g: checkpoint({**result, "gdn": g}),
                        gdn_only,
                    )
                elif suite == "attention":
                    configs = (
                        [(AttentionConfig(block_m=16, block_n=16, num_warps=1, num_stages=1), 2)]
                        if tiny
                        else [
                            (AttentionConfig(block_m=64, block_n=64, num_warps=8, num_stages=2), 22),
                            (AttentionConfig(block_m=64, block_n=32, num_warps=8, num_stages=2), 11),
                            (AttentionConfig(block_m=64, block_n=64, num_warps=8, num_stages=2), 11),
                            (AttentionConfig(block_m=64, block_n=32, num_warps=8, num_stages=3), 22),
                        ]
                    )
                    result["attention"] = decode.attention_rows(
                        contexts, attn, torch.bfloat16, device, timer, bandwidth, configs
                    )
                elif suite == "selection":
                    result["selection"] = decode.selection_rows(vocab, 5, device, timer, bandwidth)
                elif suite == "walk":
                    result["walk"] = decode.walk_rows(vocab, device, timer, bandwidth)
                elif suite == "commit":
                    result["commit"] = decode.commit_rows(
                        gdn_shape,
                        attn,
                        64 if tiny else 10240,
                        2 if tiny else 16,
                        contexts[0],
                        device,
                        timer,
                        bandwidth,
                    )
            except Exception as exc:  # a broken suite is reported, the others still run
                result[suite] = {"error": repr(exc)[:500]}
            checkpoint(result)
            progress.advance(task)
    return result


def kernels_command(
    out: Annotated[Path, typer.Option(help="Directory for kernels.json and kernels.md.")] = Path(
        "results/h200"
    ),
    suites: Annotated[str, typer.Option(help=f"Comma-separated suites: {', '.join(SUITES)}.")] = ",".join(
        SUITES
    ),
    iters: Annotated[
        int, typer.Option(min=1, help="Timed iterations per measurement (median reported).")
    ] = 100,
    warmup: Annotated[int, typer.Option(min=0, help="Untimed warm-up iterations.")] = 20,
    eager_iters: Annotated[int, typer.Option(min=1, help="Timed iterations for eager GDN totals.")] = 20,
    contexts: Annotated[
        str, typer.Option(help="Attention context lengths, comma-separated.")
    ] = "4096,32768,131072",
    fla: Annotated[bool, typer.Option(help="Include flash-linear-attention's chain kernels.")] = True,
    tiny: Annotated[
        bool, typer.Option(help="Small shapes (smoke test; on CPU needs TRITON_INTERPRET=1).")
    ] = False,
    methods: Annotated[
        str,
        typer.Option(
            help="GDN suite: comma-separated substrings; run only the methods whose label contains one "
            "(e.g. 'tree-parallel tf32x3,native'). Default: all."
        ),
    ] = "",
) -> None:
    """Benchmark the LumoTree Triton kernels (needs a CUDA GPU unless --tiny)."""
    chosen = [s.strip() for s in suites.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(SUITES))
    if unknown:
        raise typer.BadParameter(f"unknown suite(s) {', '.join(unknown)}; choose from {', '.join(SUITES)}")
    try:
        context_list = [int(c) for c in contexts.split(",") if c.strip()]
    except ValueError:
        raise typer.BadParameter(f"contexts must be comma-separated integers, got {contexts!r}") from None
    if torch.cuda.is_available():
        device = torch.device("cuda")
    elif tiny:
        device = torch.device("cpu")
    else:
        typer.echo("error: no CUDA device here; run on a GPU, or use --tiny for a CPU smoke test", err=True)
        raise typer.Exit(2)
    out.mkdir(parents=True, exist_ok=True)

    def checkpoint(result: dict) -> None:
        (out / "kernels.json").write_text(json.dumps(result, indent=1))
        (out / "kernels.md").write_text(render_markdown(result))

    only = [m.strip() for m in methods.split(",") if m.strip()]
    result = run_suites(chosen, device, iters, warmup, eager_iters, context_list, tiny, fla, checkpoint, only)
    typer.echo(render_markdown(result))
