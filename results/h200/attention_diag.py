"""Diagnostic (session 19): the engine's tree attention for AR and the tree at 4K, one 27B layer,
eager launches for ncu, and the partial kernel's layouts / pipelining on this machine's Triton."""
import os

import torch

from lumobench.bench.attention import Setting, Workload, row_set
from lumobench.bench.kernels.decode import AttentionShape
from lumotree.verify.attention import decode
from lumotree.verify.attention.decode import AttentionConfig

dev = torch.device("cuda")
setting = Setting(AttentionConfig())
for kind in ("ar", "tree"):
    work = Workload(row_set(kind, 4096), AttentionShape(), dev, seed=1, layers=1)
    for _ in range(3):
        work.run(setting)
    torch.cuda.synchronize()
    print("ran", kind)
if os.environ.get("DIAG_TTGIR") == "1":
    for key, compiled in decode.tree_attention_partial_kernel.device_caches[0][0].items():
        ttgir = compiled.asm["ttgir"]
        print("=== partial", str(key)[-200:])
        print("\n".join(l for l in ttgir.splitlines() if l.startswith("#blocked") or l.startswith("#mma") or l.startswith("#shared")))
        for op in ("async_copy_global_to_local", "warp_group_dot", "ttng.warp_group_dot", "tt.dot ", "local_alloc", "async_wait", "tt.load"):
            print(op, ttgir.count(op))
        print("registers", compiled.n_regs, "spills", compiled.n_spills, "shared", compiled.metadata.shared)
