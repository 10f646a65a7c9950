"""Fixtures of the kernel tests."""

from __future__ import annotations

import pytest
from torch import Tensor

from .helpers import poisoned


@pytest.fixture
def poisoned_outputs(monkeypatch: pytest.MonkeyPatch) -> list[Tensor]:
    """Every output the dense elementwise kernels allocate starts as NaN; the list collects them
    for assert_written."""
    from lumotree.model.fused import elementwise

    made: list[Tensor] = []

    def empty(shape: tuple[int, ...], like: Tensor) -> Tensor:
        made.append(poisoned(tuple(shape), like.dtype, like.device))
        return made[-1]

    monkeypatch.setattr(elementwise, "_empty", empty)
    return made
