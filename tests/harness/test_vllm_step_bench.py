"""`lumobench.bench.vllm_step`'s bookkeeping: timers summed per step kind, decode steps told apart."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lumobench.bench.vllm_step import STEP_END, StepTimes, is_decode


def test_a_steps_timers_go_to_its_kind_when_the_step_ends() -> None:
    times = StepTimes()
    times.kind = "prefill"
    times.add("execute_model", 0.3)
    times.add(STEP_END, 0.1)
    for _ in range(2):
        times.kind = "decode"
        times.add("execute_model", 0.010)
        times.add("execute_model", 0.002)  # two calls in one step add up
        times.add(STEP_END, 0.004)
    times.add("execute_model", 5.0)  # a step that has not ended counts nowhere yet
    assert times.steps == {"prefill": 1, "decode": 2}
    assert times.ms_per_step("decode") == pytest.approx({"execute_model": 12.0, STEP_END: 4.0})
    assert times.ms_per_step("prefill") == pytest.approx({"execute_model": 300.0, STEP_END: 100.0})
    times.clear()
    assert times.ms_per_step("decode") == {}


def _scheduled(counts: dict[str, int], drafts: dict[str, list[int]], new: list[str]) -> SimpleNamespace:
    return SimpleNamespace(
        num_scheduled_tokens=counts, scheduled_spec_decode_tokens=drafts, scheduled_new_reqs=new
    )


def test_only_steps_of_last_tokens_and_their_drafts_are_decode_steps() -> None:
    assert is_decode(_scheduled({"a": 28, "b": 1}, {"a": list(range(27))}, []))
    assert not is_decode(_scheduled({"a": 28, "b": 40}, {"a": list(range(27))}, []))  # b prefills
    assert not is_decode(_scheduled({"a": 300}, {}, ["a"]))  # a new request's prompt
