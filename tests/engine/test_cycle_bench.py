"""The cycle benchmarks drive the engine's own runner (`lumobench.bench.cycle.run_arm`): on the
CPU under TRITON_INTERPRET=1 with a tiny model, each arm's loop runs the device cycle back to back
with its forced acceptance, and reports what it measured (the GPU runs time it).

The default run uses smaller arms of the same kinds (a chain of 3 MTP drafts; a tree of 4 MTP
depths with siblings, tail and a rescue branch, padded to 16 rows): the interpreter's cost grows
with rows and MTP passes. The benchmark's own arms (MTP-5, the paper tree padded to 32 rows) are
slow-marked."""

from __future__ import annotations

import pytest
import torch

from lumobench.bench.cycle import ARMS, MAX_DEPTH, Arm, build_runner, fill_state_, run_arm
from lumobench.bench.cycle_profile import SAMPLINGS
from lumotree.drafting.geometry import GeometryConfig
from tests.model.conftest import perturbed_model, tiny_config

SMALL_ARMS = {
    "mtp3": GeometryConfig(3, 0, 0, (), rows=4, max_depth=MAX_DEPTH),
    "tree16": GeometryConfig(4, 1, 2, (2,), rows=16, max_depth=MAX_DEPTH),
}


@pytest.mark.parametrize(
    ("name", "accepted", "sampling"),
    [
        ("mtp3", 2.0, "greedy"),  # chained, host-fed; greedy and sampled
        ("tree16", 4.0, "paper"),
        pytest.param("mtp5", 3.0, "greedy", marks=pytest.mark.slow),
        pytest.param("tree", 4.0, "paper", marks=pytest.mark.slow),
    ],
)
def test_each_arm_runs_the_engine_cycle_with_its_forced_acceptance(
    name: str, accepted: float, sampling: str
) -> None:
    model = perturbed_model(tiny_config(vocab_size=256), seed=0)
    arm = Arm(name, SMALL_ARMS.get(name) or ARMS[name], accepted)
    runner = build_runner(model, 64, arm, graphs=False, cycles=2)
    fill_state_(runner, 64)
    result = run_arm(runner, arm, 64, cycles=2, warmup=0, params=SAMPLINGS[sampling])
    assert result["accepted"] == pytest.approx(accepted)  # a whole mean: every cycle accepts it
    assert result["cycle_ms"] > 0 and result["loop_ms"] >= result["cycle_ms"]
    assert result["verify_ms"] > 0 and result["accept_publish_ms"] > 0
    assert runner.length == 0 and runner._ahead is None  # type: ignore[attr-defined]
    assert torch.isfinite(torch.tensor(list(result.values()))).all()
