"""The ncu target of ncu_gdn.sh: one launch each of the staged GDN variants' row scan and paths scan
(`lumobench bench gdn-variants stage`) on one layer of the random-weight 27B's shapes, the paper tree.

    python3 lumobench/bench/device/ncu_gdn_target.py old lanes
"""

from __future__ import annotations

import random
import sys

import torch

from lumobench.bench.gdn_variants import load_variant
from lumobench.checks.random_trees import paper_tree
from lumotree.drafting.geometry import GeometryConfig
from lumotree.tree import MAX_DEPTH
from lumotree.verify.device_tree import DeviceTree
from lumotree.verify.gdn.common import empty_operands
from lumotree.verify.gdn.plan import count_paths
from lumotree.verify.gdn.reference import GdnInputs

HEADS, V_HEADS, DIM = 16, 48, 128  # Qwen3.5-27B's GDN layer


def main(names: list[str]) -> None:
    device = torch.device("cuda")
    tree = paper_tree(random.Random(0), 1000, 4096, GeometryConfig(rows=32))
    tables = DeviceTree(tree.rows, MAX_DEPTH, device, paths=count_paths(tree)).load_(tree).gdn
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, device=device, generator=gen)

    rows = tree.rows
    raw = (randn(rows, HEADS, DIM), randn(rows, HEADS, DIM), randn(rows, V_HEADS, DIM), randn(rows, V_HEADS),
           randn(rows, V_HEADS))  # fmt: skip
    x = GdnInputs(*(t.bfloat16() for t in raw), randn(V_HEADS).abs().log(), randn(V_HEADS))
    state = randn(V_HEADS, DIM, DIM) * 0.1
    for name in names:
        modules = load_variant(name)
        for scan in (modules["row_scan"].gdn_rows_, modules["paths_scan"].gdn_paths_):  # type: ignore[attr-defined]
            ops = empty_operands(rows, HEADS, V_HEADS, DIM, DIM, device)
            scan(x, state, tables, torch.empty_like(x.v), ops)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1:])
