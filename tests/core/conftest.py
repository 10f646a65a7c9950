"""Run the core tests single-threaded: they are thousands of tiny tensor ops, where OpenMP worker
threads only add synchronisation (and stall badly when the CPU is shared)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def _single_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
