"""The engine's tree attention for AR and the paper tree at 4K, one 27B layer, launched eagerly (the
target of `ncu_attention.sh`, session 19); DIAG_TTGIR=1 also prints the split-K kernel's layouts,
its pipelining and MMA ops, registers, spills and shared memory on this machine's Triton.
On the device, from the repository root: python3 lumobench/bench/device/attention_diag.py"""

from __future__ import annotations

import os

import torch

from lumobench.bench.attention import Setting, Workload, row_set
from lumobench.bench.kernels.decode import AttentionShape
from lumotree.verify.attention import decode
from lumotree.verify.attention.decode import AttentionConfig

OPS = ("async_copy_global_to_local", "warp_group_dot", "tt.dot ", "local_alloc", "async_wait", "tt.load")
LAYOUTS = ("#blocked", "#mma", "#shared")


def main() -> None:
    device = torch.device("cuda")
    setting = Setting(AttentionConfig())
    for kind in ("ar", "tree"):
        work = Workload(row_set(kind, 4096), AttentionShape(), device, seed=1, layers=1)
        for _ in range(3):
            work.run(setting)
        torch.cuda.synchronize()
        print("ran", kind)
    if os.environ.get("DIAG_TTGIR") != "1":
        return
    for key, compiled in decode.tree_attention_partial_kernel.device_caches[0][0].items():
        ttgir = compiled.asm["ttgir"]
        print("=== partial", str(key)[-200:])
        print("\n".join(line for line in ttgir.splitlines() if line.startswith(LAYOUTS)))
        for op in OPS:
            print(op, ttgir.count(op))
        print("registers", compiled.n_regs, "spills", compiled.n_spills, "shared", compiled.metadata.shared)


main()  # a device script run by path, like the shell scripts beside it (not a `lumobench bench` verb)
