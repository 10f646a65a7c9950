"""`LLMEngine.stop_request`: a stop string the server matched ends the request as "stop" inside the engine,
and the engine's counters then count what the client received, whatever the engine did in between (ran
more cycles, finished by length, was aborted first): issue 29, item 2. Against the real engine and the
shipped model; the HTTP end of it (a real server, /metrics deltas equal to a stop-string request's
usage) is in tests/server/test_live_server.py."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lumotree.engine import EngineConfig, GenerationRequest, LLMEngine
from lumotree.engine.metrics import EngineMetrics, Histogram
from lumotree.sampling import SamplingParams

PER_REQUEST = (
    "e2e_request_latency", "request_queue_time", "request_prefill_time", "request_decode_time",
    "request_inference_time", "request_time_per_output_token", "request_prompt_tokens",
    "request_generation_tokens", "request_max_num_generation_tokens",
)  # fmt: skip


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine(EngineConfig(drafter="tree", max_model_len=1024, prefix_cache=False))


def _delta(after: Histogram, before: Histogram) -> tuple[int, float, list[int]]:
    return (
        after.count - before.count,
        after.total - before.total,
        [a - b for a, b in zip(after.counts, before.counts, strict=True)],
    )


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    max_tokens=st.integers(4, 40),
    made=st.floats(0.05, 1.0),  # how far the request got before the stop string matched
    ahead=st.integers(0, 4),  # cycles the engine ran on before the server's stop arrived
    aborted_first=st.booleans(),  # the stream's close (an abort) landed before the stop
    prompt=st.sampled_from([[9, 120, 33, 7, 410, 55], [300, 301, 302], list(range(40, 90))]),
    counter=st.integers(0, 10**9),
)
def test_a_stopped_request_counts_only_what_the_client_received(
    engine: LLMEngine,
    max_tokens: int,
    made: float,
    ahead: int,
    aborted_first: bool,
    prompt: list[int],
    counter: int,
) -> None:
    rid = f"stop-{counter}"
    engine.add_request(
        GenerationRequest(
            rid, prompt, SamplingParams(temperature=0.0), max_tokens=max_tokens, ignore_eos=True
        )
    )
    emitted: list[int] = []  # cumulative output after each step that emitted tokens
    before: EngineMetrics | None = None
    want = max(1, round(made * max_tokens))
    while engine.has_unfinished() and (not emitted or emitted[-1] < want):
        if before is None:
            before = engine.metrics()
        for event in engine.step():
            if event.token_ids:
                emitted.append(event.num_output_tokens)
    assert before is not None
    returned = min(want, emitted[-1])
    stop_step = next(i for i, count in enumerate(emitted) if count >= returned)
    for _ in range(ahead):  # the engine works on (it may finish by length meanwhile)
        engine.step()
    if aborted_first:
        engine.abort(rid)
    engine.stop_request(rid, returned)
    engine.stop_request(rid, returned)  # a repeated stop changes nothing
    while engine.has_unfinished():
        engine.step()
    after = engine.metrics()

    assert after.generation_tokens - before.generation_tokens == returned
    reasons = {
        r: after.requests_finished.get(r, 0) - before.requests_finished.get(r, 0)
        for r in after.requests_finished
    }
    assert {r: n for r, n in reasons.items() if n} == {"stop": 1}
    for name in PER_REQUEST:
        count, _, buckets = _delta(getattr(after, name), getattr(before, name))
        assert count == 1 and min(buckets) >= 0, name
    assert _delta(after.request_generation_tokens, before.request_generation_tokens)[1] == returned
    assert _delta(after.request_prompt_tokens, before.request_prompt_tokens)[1] == len(prompt)
    # one time to first token; one inter-token latency per later step up to the stop's; step tokens
    # add up to the prompt computed and the tokens returned
    assert _delta(after.time_to_first_token, before.time_to_first_token)[0] == 1
    itl, _, itl_buckets = _delta(after.inter_token_latency, before.inter_token_latency)
    assert itl == stop_step and min(itl_buckets) >= 0
    steps, tokens, _ = _delta(after.iteration_tokens, before.iteration_tokens)
    assert (steps, tokens) == (stop_step + 1, len(prompt) + returned)
