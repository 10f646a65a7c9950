"""GDN verify ablations on the H200 (run 6): where the value-major kernel's time goes.

Times the verify step alone (48 instances, one launch; CUDA graph replay; L2 flushed before every
iteration; median of --iters) for: the one-launch substitution solve with its 11 rounds and with 1
round (wrong outputs: the difference is the rounds' cost), the split solve whole and each of its two
launches alone, and apply-launch tile configurations. Prints a markdown table and writes it to --out.
Usage (repository root, on a CUDA machine): python3 results/h200/ablate_gdn.py --out OUT_DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from lumobench.bench.gdn_bench import GdnShape, GdnWorkload
from lumobench.bench.timing import Timer
from lumotree.verify.gdn.tree_scan import AncestryTables, ancestry_tables
from lumotree.verify.gdn.tree_value_major import gdn_value_major_layers_
from lumotree.verify.graphs import CapturedStage

SUB = dict(solve="substitution", block_v=128, num_warps=8, max_registers=128)
SPLIT = dict(solve="split", block_v=128, num_warps=8)
VARIANTS = [
    ("substitution bv128 w8 r128, 11 rounds", SUB, None),
    ("substitution bv128 w8 r128, 1 round (round cost)", SUB, 1),
    ("split bv128 w8, both launches", SPLIT, None),
    ("split, prepare launch alone (w4)", dict(SPLIT, only="prepare"), None),
    ("split, prepare launch alone (w8)", dict(SPLIT, only="prepare", prepare_warps=8), None),
    ("split, prepare launch alone (w2)", dict(SPLIT, only="prepare", prepare_warps=2), None),
    ("split, apply launch alone, bv128 w8", dict(SPLIT, only="apply"), None),
    ("split, apply launch alone, bv128 w8 r128", dict(SPLIT, only="apply", max_registers=128), None),
    ("split, apply launch alone, bv128 w4", dict(SPLIT, only="apply", num_warps=4), None),
    ("split, apply launch alone, bv64 w4", dict(SPLIT, only="apply", block_v=64, num_warps=4), None),
    (
        "split, apply launch alone, bv64 w4 r128",
        dict(SPLIT, only="apply", block_v=64, num_warps=4, max_registers=128),
        None,
    ),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()
    device = torch.device("cuda")
    w = GdnWorkload(GdnShape(), torch.bfloat16, device)
    timer = Timer(device, args.iters, warmup=10)
    inputs = (w.q, w.k, w.v, w.a, w.b, w.A_log, w.dt_bias, w.states)
    full = ancestry_tables(w.tree, device)
    rows = [
        f"Command: `python3 {' '.join(sys.argv)}`",
        "",
        "| variant | verify (graph, ms) |",
        "| --- | --- |",
    ]
    for label, config, rounds in VARIANTS:
        tables = full if rounds is None else AncestryTables(full.ancestry, full.n_active, max_depth=rounds)
        try:
            stage = CapturedStage(
                lambda t=tables, c=config: gdn_value_major_layers_(*inputs, t, w.o, w.records, **c)
            )
            ms = f"{timer(stage.replay).median_ms:.4f}"
        except Exception as exc:  # a configuration that does not compile is a row, not the end
            ms = f"error: {repr(exc)[:120]}"
        rows.append(f"| {label} | {ms} |")
        print(rows[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ablate_gdn.md").write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
