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

from lumobench.bench.cycle import ARMS, MAX_DEPTH, Arm, build_runner, fill_state_, markdown, run_arm, summary
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


def test_the_headline_carries_each_arms_drafting_and_the_gemv_fractions() -> None:
    arm = dict(cycle_ms=20.0, verify_ms=15.0, accept_publish_ms=0.3, draft_ms=4.3, loop_ms=20.0, accepted=3.0)
    row = {
        "ar": arm | dict(cycle_ms=14.0, draft_ms=0.01, accepted=0.0),
        "mtp5": arm,
        "tree": arm | dict(cycle_ms=22.0, draft_ms=4.4, accepted=4.0),
        "gdn_verify_model_order_ms": 2.0,
        "attention_over_floor": 4.0,
    }
    row["projected_tokens_per_s"] = {n: (row[n]["accepted"] + 1) * 1e3 / row[n]["cycle_ms"] for n in ARMS}
    fractions = {"5120x6144": {"1": 0.6856, "32": 0.6365}}
    result = dict(floor_ms=12.0, weight_gb=51.25, copy_bandwidth_tbps=4.25, contexts={"4096": row})
    result["gemv_fraction_of_copy_bw"] = fractions
    head = summary(result, "lumobench bench cycle")
    assert head["draft_ms"] == {"ar": 0.01, "mtp5": 4.3, "tree": 4.4}
    assert head["gemv_fraction_of_copy_bw"] == fractions
    assert "| 5120 x 6144 | 68.6% | 63.6% |" in markdown(result, head)
