"""GDN verify / publish ablations on the H200: where the value-major kernel's time goes.

Times one step alone (48 instances, one launch; CUDA graph replay; L2 flushed before every
iteration; median of --iters). --set run7: prepare-launch warps, apply-launch registers /
pipelining / key chunks, replay-publication tiles. --set run8: the new defaults (4-stage apply)
and the replay on one warp against two, repeated. Run 6's set (the removed one-launch
substitution solve with 11 and with 1 round, the split solve's launches apart) is this file at
commit 2eab259 (then results/h200/ablate_gdn.py). Prints a markdown table and writes it to --out.
Usage (repository root, on a CUDA machine):

    lumobench bench ablate-gdn --set run8 --out OUT_DIR   (or python3 -m lumobench.bench.kernels.ablate_gdn)
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import torch
import typer

from lumobench.bench.kernels.gdn import GdnShape, GdnWorkload
from lumobench.bench.output import command_line
from lumobench.bench.timing import Timer
from lumotree.verify.gdn.plan import ancestry_tables
from lumotree.verify.gdn.replay import replay_layers_
from lumotree.verify.gdn.tree_value_major import gdn_value_major_layers_
from lumotree.verify.graphs import CapturedStage

SPLIT7 = dict(block_v=128, num_warps=4, prepare_warps=2, num_stages=None)
Variant = tuple[str, dict]  # label, gdn_value_major_layers_ keyword arguments
RUN7: list[Variant] = [
    ("split bv128 w4 p2, both launches", SPLIT7),
    ("split, prepare launch alone (w2)", dict(SPLIT7, only="prepare")),
    ("split, prepare launch alone (w1)", dict(SPLIT7, only="prepare", prepare_warps=1)),
    ("split, apply launch alone, bv128 w4", dict(SPLIT7, only="apply")),
    ("split, apply launch alone, bv128 w4 r128", dict(SPLIT7, only="apply", max_registers=128)),
    ("split, apply launch alone, bv128 w4 2 stages", dict(SPLIT7, only="apply", num_stages=2)),
    ("split, apply launch alone, bv128 w4 4 stages", dict(SPLIT7, only="apply", num_stages=4)),
    ("split, apply launch alone, bv128 w4 bk64", dict(SPLIT7, only="apply", block_k=64)),
    (
        "split, apply launch alone, bv64 w4 r96",
        dict(SPLIT7, only="apply", block_v=64, max_registers=96),
    ),
]
PUBLISH7 = [(8, 2), (4, 1), (8, 1), (16, 2), (16, 4), (32, 4)]  # replay (block_v, num_warps)
SPLIT8 = dict(SPLIT7, num_stages=4)
RUN8: list[Variant] = [
    ("split bv128 w4 p2 s4, both launches", SPLIT8),
    ("split, apply launch alone, bv128 w4 s4", dict(SPLIT8, only="apply")),
    ("split, apply launch alone, bv128 w4 s5", dict(SPLIT8, only="apply", num_stages=5)),
    (
        "split, apply launch alone, bv128 w8 r128 s4",
        dict(SPLIT8, only="apply", num_warps=8, max_registers=128),
    ),
]
PUBLISH8 = [(8, 1), (8, 2), (4, 1), (16, 1)]


class AblationSet(StrEnum):
    run7 = "run7"
    run8 = "run8"


def ablate_gdn_command(
    out: Annotated[Path, typer.Option(help="Folder for ablate_gdn.md.")],
    which: Annotated[
        AblationSet, typer.Option("--set", help="run7: the kernels' knobs; run8: the new defaults.")
    ] = AblationSet.run8,
    iters: Annotated[int, typer.Option(min=1, help="Timed iterations per median.")] = 50,
) -> None:
    """Time each GDN verify / publish configuration of the set alone (48 instances, one launch)."""
    device = torch.device("cuda")
    w = GdnWorkload(GdnShape(), torch.bfloat16, device)
    timer = Timer(device, iters, warmup=10)
    full = ancestry_tables(w.tree, device)
    steps: list[tuple[str, Callable[[], object]]] = []
    for label, config in RUN7 if which is AblationSet.run7 else RUN8:
        steps.append(
            (
                f"verify: {label}",
                lambda c=config: gdn_value_major_layers_(w.inputs, w.states, full, w.o, w.records, **c),
            )
        )
    gdn_value_major_layers_(w.inputs, w.states, full, w.o, w.records)  # records for the replay
    for bv, nw in PUBLISH7 if which is AblationSet.run7 else PUBLISH8:
        steps.append(
            (
                f"publish: replay bv{bv} w{nw}, one launch",
                lambda bv=bv, nw=nw: replay_layers_(
                    w.states, w.records, w.accepted, w.path_len, block_v=bv, num_warps=nw
                ),
            )
        )
    rows = [f"Command: `{command_line('ablate-gdn')}`", "", "| step | graph, ms |", "| --- | --- |"]
    for label, fn in steps:
        try:
            ms = f"{timer(CapturedStage(fn).replay, w.set_frontier).median_ms:.4f}"
        except Exception as exc:  # a configuration that does not compile is a row, not the end
            ms = f"error: {repr(exc)[:120]}"
        rows.append(f"| {label} | {ms} |")
        print(rows[-1], flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ablate_gdn.md").write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    typer.run(ablate_gdn_command)
