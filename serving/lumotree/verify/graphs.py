"""CUDA-graph capture of fixed-shape LumoTree stages (verify, draft selection, commit).

Every kernel here reads its per-cycle metadata (scan tables, prefix length, accepted path, path
length) from device buffers, so a stage captured once replays for every later cycle: the caller
rewrites the static inputs in place (`ScanTables.fill_`, `Tensor.copy_`) and calls `replay()`.
Only the hot stages are captured; everything else stays eager and debuggable.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class CapturedStage:
    """A zero-argument callable over static buffers, warmed up on a side stream, then captured.

    Warm-up runs compile the Triton kernels and let allocators settle outside the graph; the
    stage's outputs are whatever buffers `fn` writes (they stay valid between replays).
    """

    def __init__(self, fn: Callable[[], object], warmup: int = 2) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA graphs need a CUDA device")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            fn()

    def replay(self) -> None:
        """Launch the captured stage on the current stream (asynchronous)."""
        self.graph.replay()

    __call__ = replay
