"""Fixtures of the kernel tests."""

from __future__ import annotations

import numpy as np
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


@pytest.fixture
def dot_in_k_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the interpreter, tl.dot(a, b, acc) sums a[m, k] * b[k, n] over k = 0, 1, ... (one
    rounded multiply and one rounded add per k, numpy elementwise: the same bits on every CPU), then
    adds acc, instead of numpy's matmul, whose summation order follows the CPU's BLAS kernel and the
    operands' shapes. For tests that compare two launches bit for bit (float operands only)."""
    from triton.runtime import interpreter

    def create_dot(
        self: object,
        a: interpreter.TensorHandle,
        b: interpreter.TensorHandle,
        d: interpreter.TensorHandle,
        input_precision: object,
        max_num_imprecise_acc: object,
    ) -> interpreter.TensorHandle:
        x, y, dtype = a.data, b.data, d.data.dtype
        if x.dtype.kind != "f" or y.dtype.kind != "f":
            raise NotImplementedError(f"dot_in_k_order takes float operands, not {x.dtype} and {y.dtype}")
        total = np.zeros(d.data.shape, dtype=dtype)
        for k in range(x.shape[-1]):
            total = total + x[..., :, k, None].astype(dtype) * y[..., k, None, :].astype(dtype)
        return interpreter.TensorHandle(total + d.data, d.dtype.scalar)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)
