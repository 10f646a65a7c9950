"""The cycle benchmarks drive the engine's own runner (`lumobench.bench.cycle.run_arm`): on the
CPU under TRITON_INTERPRET=1 with a tiny model, each arm's loop runs the device cycle back to back
with its forced acceptance, and reports what it measured (the GPU runs time it)."""

from __future__ import annotations

import pytest
import torch

from lumobench.bench.cycle import ARMS, Arm, build_runner, fill_state_, run_arm
from lumobench.bench.cycle_profile import SAMPLINGS
from tests.model.conftest import perturbed_model, tiny_config


@pytest.mark.parametrize(
    ("name", "accepted", "sampling"),
    [("mtp5", 3.0, "greedy"), ("tree", 4.0, "paper")],  # chained, host-fed; greedy and sampled
)
def test_each_arm_runs_the_engine_cycle_with_its_forced_acceptance(
    name: str, accepted: float, sampling: str
) -> None:
    model = perturbed_model(tiny_config(vocab_size=256), seed=0)
    arm = Arm(name, ARMS[name], accepted)
    runner = build_runner(model, 64, arm, graphs=False, cycles=2)
    fill_state_(runner, 64)
    result = run_arm(runner, arm, 64, cycles=2, warmup=0, params=SAMPLINGS[sampling])
    assert result["accepted"] == pytest.approx(accepted)  # a whole mean: every cycle accepts it
    assert result["cycle_ms"] > 0 and result["loop_ms"] >= result["cycle_ms"]
    assert result["verify_ms"] > 0 and result["accept_publish_ms"] > 0
    assert runner.length == 0 and runner._ahead is None  # type: ignore[attr-defined]
    assert torch.isfinite(torch.tensor(list(result.values()))).all()
