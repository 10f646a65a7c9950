"""Device timing for the kernel benchmarks: CUDA events around each iteration, L2 flushed between
iterations, median and 10th/90th percentiles; a host clock on CPU (smoke runs only)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import typer

FLUSH_BYTES = 256 * 2**20  # written outside every timed iteration (the paper's 256-MiB buffer)


@dataclass(frozen=True)
class Timing:
    """Milliseconds over `iters` timed iterations."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    iters: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


class Timer:
    """Times callables on one device. `prepare` runs before the flush, outside the timed region."""

    def __init__(self, device: torch.device, iters: int, warmup: int) -> None:
        self.device, self.iters, self.warmup = device, iters, warmup
        self.cuda = device.type == "cuda"
        self._flush = torch.empty(FLUSH_BYTES if self.cuda else 1024, dtype=torch.uint8, device=device)

    def __call__(
        self,
        fn: Callable[[], object],
        prepare: Callable[[int], object] | None = None,
        iters: int | None = None,
    ) -> Timing:
        iters = self.iters if iters is None else iters
        for i in range(self.warmup):
            if prepare:
                prepare(i)
            fn()
        samples = []
        for i in range(iters):
            if prepare:
                prepare(i)
            self._flush.zero_()
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                samples.append((start, end))
            else:
                t0 = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - t0)
        if self.cuda:
            torch.cuda.synchronize()
            ms = [s.elapsed_time(e) for s, e in samples]
        else:
            ms = [s * 1e3 for s in samples]
        return summarize(ms)


def summarize(ms: list[float]) -> Timing:
    """Median and 10th/90th percentiles (nearest rank) of samples in milliseconds."""
    ordered = sorted(ms)
    n = len(ordered)
    return Timing(
        median_ms=statistics.median(ordered),
        p10_ms=ordered[int(0.1 * (n - 1))],
        p90_ms=ordered[round(0.9 * (n - 1))],
        iters=n,
    )


def copy_bandwidth(device: torch.device, nbytes: int = 2 * 2**30, iters: int = 20) -> float:
    """Measured device-to-device copy bandwidth in bytes/s, counting bytes read plus written."""
    if device.type != "cuda":
        return float("nan")
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    timing = Timer(device, iters, warmup=3)(lambda: dst.copy_(src))
    return 2 * nbytes / (timing.median_ms * 1e-3)


def require_cuda(what: str) -> torch.device:
    """The CUDA device; on a machine without one, a one-line error saying that `what` needs it, and
    exit 2 (the GPU benchmarks' first step)."""
    if not torch.cuda.is_available():
        typer.echo(f"error: {what} needs a CUDA GPU", err=True)
        raise typer.Exit(2)
    return torch.device("cuda")
