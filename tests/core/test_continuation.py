"""Publication of the accepted path equals step-by-step decoding; every planted fault is caught."""

from __future__ import annotations

import pytest
import torch

from lumobench.checks.continuation import FAULTS, MUTATION_CYCLE, check_continuation, run_continuation
from lumobench.checks.toy import ToyDims, make_toy


@pytest.fixture(scope="module")
def model() -> object:
    return make_toy(ToyDims(), torch.Generator().manual_seed(21))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_publication_matches_stepwise_decode(model: object, dtype: torch.dtype) -> None:
    cycles = run_continuation(model, dtype, cycles=4, seed=5)
    assert all(r.ok for r in cycles), cycles
    assert min(r.cells for r in cycles) > 100


@pytest.mark.parametrize("fault", FAULTS)
def test_each_publication_fault_is_detected(model: object, fault: str) -> None:
    cycles = run_continuation(model, torch.float32, cycles=MUTATION_CYCLE + 2, seed=5, fault=fault)
    assert all(r.ok for r in cycles[:MUTATION_CYCLE])  # nothing is wrong before the mutation
    assert any(not r.ok for r in cycles[MUTATION_CYCLE:])


def test_continuation_check_counts_cases_and_faults() -> None:
    result = check_continuation(runs=1, cycles=4, seed=8)
    assert result.ok and result.cases == 8 and result.faults_planted == 2 * len(FAULTS)


@pytest.mark.slow
def test_continuation_over_many_runs() -> None:
    result = check_continuation(runs=6, cycles=8, seed=100)
    assert result.ok, result
