"""GDN verify / publish ablations on the H200: where the value-major kernel's time goes.

Times one step alone (48 instances, one launch; CUDA graph replay; L2 flushed before every
iteration; median of --iters). --set run6: the one-launch substitution solve with its 11 rounds and
with 1 round (wrong outputs: the difference is the rounds' cost), the split solve whole and each of
its two launches alone, apply-launch tile configurations. --set run7: prepare-launch warps,
apply-launch registers / pipelining / key chunks, and replay-publication tiles. --set run8: the
new defaults (4-stage apply) and the replay on one warp against two, repeated. Prints a markdown
table and writes it to --out. Usage (repository root, on a CUDA machine):
python3 results/h200/ablate_gdn.py --set run8 --out OUT_DIR
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from lumobench.bench.gdn_bench import GdnShape, GdnWorkload
from lumobench.bench.timing import Timer
from lumotree.verify.gdn.replay import replay_layers_
from lumotree.verify.gdn.tree_scan import AncestryTables, ancestry_tables
from lumotree.verify.gdn.tree_value_major import gdn_value_major_layers_
from lumotree.verify.graphs import CapturedStage

SUB = dict(solve="substitution", block_v=128, num_warps=8, max_registers=128)
SPLIT6 = dict(solve="split", block_v=128, num_warps=8, prepare_warps=4)
SPLIT7 = dict(solve="split", block_v=128, num_warps=4, prepare_warps=2)
Variant = tuple[str, dict, int | None]  # label, value-major config, solve depth override
RUN6: list[Variant] = [
    ("substitution bv128 w8 r128, 11 rounds", SUB, None),
    ("substitution bv128 w8 r128, 1 round (round cost)", SUB, 1),
    ("split bv128 w8, both launches", SPLIT6, None),
    ("split, prepare launch alone (w4)", dict(SPLIT6, only="prepare"), None),
    ("split, prepare launch alone (w8)", dict(SPLIT6, only="prepare", prepare_warps=8), None),
    ("split, prepare launch alone (w2)", dict(SPLIT6, only="prepare", prepare_warps=2), None),
    ("split, apply launch alone, bv128 w8", dict(SPLIT6, only="apply"), None),
    ("split, apply launch alone, bv128 w8 r128", dict(SPLIT6, only="apply", max_registers=128), None),
    ("split, apply launch alone, bv128 w4", dict(SPLIT6, only="apply", num_warps=4), None),
    ("split, apply launch alone, bv64 w4", dict(SPLIT6, only="apply", block_v=64, num_warps=4), None),
    (
        "split, apply launch alone, bv64 w4 r128",
        dict(SPLIT6, only="apply", block_v=64, num_warps=4, max_registers=128),
        None,
    ),
]
RUN7: list[Variant] = [
    ("split bv128 w4 p2, both launches", SPLIT7, None),
    ("split, prepare launch alone (w2)", dict(SPLIT7, only="prepare"), None),
    ("split, prepare launch alone (w1)", dict(SPLIT7, only="prepare", prepare_warps=1), None),
    ("split, apply launch alone, bv128 w4", dict(SPLIT7, only="apply"), None),
    ("split, apply launch alone, bv128 w4 r128", dict(SPLIT7, only="apply", max_registers=128), None),
    ("split, apply launch alone, bv128 w4 2 stages", dict(SPLIT7, only="apply", num_stages=2), None),
    ("split, apply launch alone, bv128 w4 4 stages", dict(SPLIT7, only="apply", num_stages=4), None),
    ("split, apply launch alone, bv128 w4 bk64", dict(SPLIT7, only="apply", block_k=64), None),
    (
        "split, apply launch alone, bv64 w4 r96",
        dict(SPLIT7, only="apply", block_v=64, max_registers=96),
        None,
    ),
]
PUBLISH7 = [(8, 2), (4, 1), (8, 1), (16, 2), (16, 4), (32, 4)]  # replay (block_v, num_warps)
SPLIT8 = dict(SPLIT7, num_stages=4)
RUN8: list[Variant] = [
    ("split bv128 w4 p2 s4, both launches", SPLIT8, None),
    ("split, apply launch alone, bv128 w4 s4", dict(SPLIT8, only="apply"), None),
    ("split, apply launch alone, bv128 w4 s5", dict(SPLIT8, only="apply", num_stages=5), None),
    (
        "split, apply launch alone, bv128 w8 r128 s4",
        dict(SPLIT8, only="apply", num_warps=8, max_registers=128),
        None,
    ),
]
PUBLISH8 = [(8, 1), (8, 2), (4, 1), (16, 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--set", choices=("run6", "run7", "run8"), default="run8")
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()
    device = torch.device("cuda")
    w = GdnWorkload(GdnShape(), torch.bfloat16, device)
    timer = Timer(device, args.iters, warmup=10)
    inputs = (w.q, w.k, w.v, w.a, w.b, w.A_log, w.dt_bias, w.states)
    full = ancestry_tables(w.tree, device)
    steps: list[tuple[str, Callable[[], object]]] = []
    for label, config, depth in {"run6": RUN6, "run7": RUN7, "run8": RUN8}[args.set]:
        tables = full if depth is None else AncestryTables(full.ancestry, full.n_active, max_depth=depth)
        steps.append(
            (
                f"verify: {label}",
                lambda t=tables, c=config: gdn_value_major_layers_(*inputs, t, w.o, w.records, **c),
            )
        )
    if args.set != "run6":
        gdn_value_major_layers_(*inputs, full, w.o, w.records)  # records for the replay
        for bv, nw in PUBLISH7 if args.set == "run7" else PUBLISH8:
            steps.append(
                (
                    f"publish: replay bv{bv} w{nw}, one launch",
                    lambda bv=bv, nw=nw: replay_layers_(
                        w.states, w.records, w.accepted, w.path_len, block_v=bv, num_warps=nw
                    ),
                )
            )
    rows = [f"Command: `python3 {' '.join(sys.argv)}`", "", "| step | graph, ms |", "| --- | --- |"]
    for label, fn in steps:
        try:
            ms = f"{timer(CapturedStage(fn).replay, w.set_frontier).median_ms:.4f}"
        except Exception as exc:  # a configuration that does not compile is a row, not the end
            ms = f"error: {repr(exc)[:120]}"
        rows.append(f"| {label} | {ms} |")
        print(rows[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ablate_gdn.md").write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
