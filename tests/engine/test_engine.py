"""The engine API (engine_api.md): queueing and concurrency, stop conditions, the context limit, request
validation, logprobs, the prefix cache, metrics, aborts and failure isolation."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from lumotree.engine import (
    AsyncEngine,
    EngineClient,
    EngineConfig,
    EngineDeadError,
    EngineProcess,
    GenerationRequest,
    LLMEngine,
    TokenEvent,
)
from lumotree.model import HybridLM
from lumotree.sampling import SamplingParams

from .helpers import output_tokens, run_requests

GREEDY = SamplingParams(0.0)


@pytest.fixture(scope="module")
def tree_engine() -> LLMEngine:
    return LLMEngine(EngineConfig(drafter="tree", max_model_len=4096))


def _short(demo_prompts: list[GenerationRequest]) -> list[GenerationRequest]:
    return sorted(demo_prompts, key=lambda p: len(p.prompt_token_ids))[:4]


def test_concurrent_requests_all_complete_with_their_solo_outputs(
    demo_prompts: list[GenerationRequest],
) -> None:
    prompts = _short(demo_prompts)
    solo = {}
    for p in prompts:
        engine = LLMEngine(EngineConfig(drafter="tree", max_model_len=4096, prefix_cache=False))
        solo[p.request_id] = output_tokens(
            run_requests(engine, [GenerationRequest(p.request_id, p.prompt_token_ids, GREEDY, 24)])[
                p.request_id
            ]
        )

    async def stream(engine: EngineClient, p: GenerationRequest) -> list[TokenEvent]:
        return [
            e async for e in engine.generate(GenerationRequest(p.request_id, p.prompt_token_ids, GREEDY, 24))
        ]

    config = EngineConfig(drafter="tree", max_model_len=4096, prefix_cache=False)

    async def all_at_once(engine: EngineClient) -> list[list[TokenEvent]]:
        try:
            return await asyncio.gather(*(stream(engine, p) for p in prompts))
        finally:
            engine.shutdown()

    # the engine in a thread of this process, and in its own process (what the server runs)
    for engine in (AsyncEngine(LLMEngine(config)), EngineProcess(config)):
        for p, events in zip(prompts, asyncio.run(all_at_once(engine)), strict=True):
            assert output_tokens(events) == solo[p.request_id]
            assert events[-1].finished and events[-1].finish_reason in ("stop", "length")
            assert [e.num_output_tokens for e in events] == list(
                torch.tensor([len(e.token_ids) for e in events]).cumsum(0).tolist()
            )


def test_an_engine_process_refuses_a_bad_config_and_a_dead_one_fails_its_requests(
    demo_prompts: list[GenerationRequest], tmp_path: Path
) -> None:
    """The server's engine process: a configuration the engine refuses is a ValueError with its
    message; an engine process that dies (killed here) fails the waiting stream and every later
    one with EngineDeadError, and says why (`dead`, which /health reports)."""
    with pytest.raises(ValueError, match="draft vocabulary"):
        EngineProcess(EngineConfig(drafter="tree", draft_vocab=tmp_path / "missing.json"))
    engine = EngineProcess(EngineConfig(drafter="tree", max_model_len=4096))
    p = _short(demo_prompts)[0]

    async def scenario() -> None:
        stream = engine.generate(GenerationRequest("long", p.prompt_token_ids, GREEDY, 4000, ignore_eos=True))
        await anext(stream)
        assert engine.pid is not None
        os.kill(engine.pid, signal.SIGKILL)
        with pytest.raises(EngineDeadError, match="exit code -9"):
            async for _ in stream:
                pass
        with pytest.raises(EngineDeadError):
            await anext(engine.generate(GenerationRequest("next", p.prompt_token_ids, GREEDY, 4)))

    try:
        asyncio.run(scenario())
        assert engine.dead is not None and "exit code -9" in engine.dead
    finally:
        engine.shutdown()


def test_closing_a_stream_aborts_its_request_and_the_engine_serves_the_next(
    demo_prompts: list[GenerationRequest],
) -> None:
    p = _short(demo_prompts)[0]

    async def scenario() -> tuple[list[TokenEvent], int]:
        engine = AsyncEngine(LLMEngine(EngineConfig(drafter="tree", max_model_len=4096)))
        try:
            stream = engine.generate(GenerationRequest("long", p.prompt_token_ids, SamplingParams(0.0), 2000))
            async for _ in stream:
                break
            await stream.aclose()
            after = [
                e async for e in engine.generate(GenerationRequest("next", p.prompt_token_ids, GREEDY, 8))
            ]
            return after, engine.metrics().requests_finished.get("abort", 0)
        finally:
            engine.shutdown()

    after, aborted = asyncio.run(scenario())
    assert len(output_tokens(after)) == 8 and after[-1].finish_reason == "length"
    assert aborted == 1


def test_a_stream_cancelled_while_its_request_is_being_submitted_is_aborted(
    demo_prompts: list[GenerationRequest],
) -> None:
    p = _short(demo_prompts)[0]

    async def scenario() -> tuple[dict[str, int], int]:
        llm = LLMEngine(EngineConfig(drafter="tree", max_model_len=4096))
        add_request = llm.add_request

        def slow_add_request(req: GenerationRequest) -> None:  # widen the submission window
            time.sleep(0.3)
            add_request(req)

        llm.add_request = slow_add_request  # type: ignore[method-assign]
        engine = AsyncEngine(llm)
        try:

            async def consume() -> None:
                request = GenerationRequest("gone", p.prompt_token_ids, GREEDY, 2000)
                async for _ in engine.generate(request):
                    pass

            task = asyncio.create_task(consume())
            await asyncio.sleep(0.05)  # inside the submission
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            for _ in range(200):  # the request must end as an abort, not run 2000 tokens unheard
                await asyncio.sleep(0.05)
                m = await asyncio.to_thread(engine.metrics)
                if m.requests_finished:
                    break
            return dict(m.requests_finished), m.generation_tokens
        finally:
            engine.shutdown()

    finished, generated = asyncio.run(scenario())
    assert finished == {"abort": 1} and generated < 2000


def test_stop_ids_end_the_output_and_max_tokens_cuts_a_speculative_cycle(
    tree_engine: LLMEngine, demo_prompts: list[GenerationRequest]
) -> None:
    p = _short(demo_prompts)[1]
    full = output_tokens(
        run_requests(tree_engine, [GenerationRequest("f", p.prompt_token_ids, GREEDY, 40)])["f"]
    )
    stop_at = next(i for i in range(3, len(full)) if full[i] not in full[:i])
    stopped = run_requests(
        tree_engine, [GenerationRequest("s", p.prompt_token_ids, GREEDY, 40, stop_token_ids=(full[stop_at],))]
    )["s"]
    assert output_tokens(stopped) == full[: stop_at + 1] and stopped[-1].finish_reason == "stop"
    for limit in (1, 2, 7):
        events = run_requests(
            tree_engine, [GenerationRequest(f"m{limit}", p.prompt_token_ids, GREEDY, limit)]
        )[f"m{limit}"]
        assert output_tokens(events) == full[:limit] and events[-1].finish_reason == "length"


def test_eos_stops_unless_ignored(tree_engine: LLMEngine, demo_prompts: list[GenerationRequest]) -> None:
    for p in sorted(demo_prompts, key=lambda p: len(p.prompt_token_ids)):  # a reply the model closes itself
        ended = run_requests(tree_engine, [GenerationRequest("e", p.prompt_token_ids, GREEDY, 96)])["e"]
        if ended[-1].finish_reason == "stop":
            break
    out = output_tokens(ended)
    assert ended[-1].finish_reason == "stop" and out[-1] in tree_engine.eos_token_ids
    ignored = run_requests(
        tree_engine, [GenerationRequest("i", p.prompt_token_ids, GREEDY, len(out) + 5, ignore_eos=True)]
    )["i"]
    assert output_tokens(ignored)[: len(out)] == out and ignored[-1].finish_reason == "length"


def test_context_limit_is_a_clear_error_and_a_length_finish() -> None:
    engine = LLMEngine(EngineConfig(drafter="tree", max_model_len=64))
    with pytest.raises(ValueError, match="context limit is 64 tokens"):
        engine.add_request(GenerationRequest("big", list(range(10, 74)), GREEDY, 5))
    events = run_requests(engine, [GenerationRequest("fit", list(range(10, 70)), GREEDY, 100)])["fit"]
    assert events[-1].finish_reason == "length" and events[-1].num_output_tokens == 4


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"prompt_token_ids": []}, "prompt is empty"),
        ({"prompt_token_ids": [5, 99999]}, "prompt token ids"),
        ({"prompt_token_ids": [5, -1]}, "prompt token ids"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"logprobs": 21}, "logprobs"),
        ({"stop_token_ids": (10**6,)}, "stop token ids"),
        ({"request_id": ""}, "request_id"),
    ],
)
def test_bad_requests_raise_value_errors_that_say_why(
    tree_engine: LLMEngine, change: dict, message: str
) -> None:
    fields = {"request_id": "bad", "prompt_token_ids": [5, 6], "sampling": GREEDY, "max_tokens": 4} | change
    with pytest.raises(ValueError, match=message):
        tree_engine.add_request(GenerationRequest(**fields))
    assert not tree_engine.has_unfinished()


def test_duplicate_request_ids_are_refused_while_running(tree_engine: LLMEngine) -> None:
    tree_engine.add_request(GenerationRequest("dup", [5, 6, 7], GREEDY, 3))
    with pytest.raises(ValueError, match="already in use"):
        tree_engine.add_request(GenerationRequest("dup", [5, 6, 7], GREEDY, 3))
    while tree_engine.has_unfinished():
        tree_engine.step()
    tree_engine.add_request(GenerationRequest("dup", [5, 6, 7], GREEDY, 3))  # free again once finished
    while tree_engine.has_unfinished():
        tree_engine.step()


@pytest.mark.parametrize("kind", ["ar", "tree"])
def test_logprobs_are_the_models_log_softmax(
    kind: str, model: HybridLM, demo_prompts: list[GenerationRequest]
) -> None:
    p = _short(demo_prompts)[0]
    engine = LLMEngine(EngineConfig(drafter=kind, max_model_len=4096))
    events = run_requests(engine, [GenerationRequest("lp", p.prompt_token_ids, GREEDY, 12, logprobs=3)])["lp"]
    out = output_tokens(events)
    entries = [lp for e in events for lp in e.logprobs or []]
    assert [lp.token_id for lp in entries] == out
    with torch.inference_mode():
        hidden = model.prefill(
            torch.tensor(p.prompt_token_ids + out[:-1]), model.new_state(len(p.prompt_token_ids) + len(out))
        )
        want = torch.log_softmax(model.compute_logits(hidden[len(p.prompt_token_ids) - 1 :]), dim=-1)
    for i, lp in enumerate(entries):
        assert lp.logprob == pytest.approx(float(want[i, lp.token_id]), abs=1e-4)
        assert [t for t, _ in lp.top] == torch.sort(want[i], descending=True, stable=True).indices[
            :3
        ].tolist()
        assert lp.top[0][0] == lp.token_id  # greedy
    none = run_requests(engine, [GenerationRequest("no", p.prompt_token_ids, GREEDY, 4)])["no"]
    assert all(e.logprobs is None for e in none)


def test_prefix_cache_hits_restore_the_state_of_a_full_prefill(demo_prompts: list[GenerationRequest]) -> None:
    wal = [p for p in demo_prompts if p.request_id.startswith("wal-")][:3]  # each turn extends the previous
    chunks = {"prefill_chunk": 128, "cache_block": 64}
    cold = LLMEngine(EngineConfig(drafter="tree", max_model_len=8192, prefix_cache=False, **chunks))
    warm = LLMEngine(EngineConfig(drafter="tree", max_model_len=8192, **chunks))
    requests = [GenerationRequest(p.request_id, p.prompt_token_ids, GREEDY, 16) for p in wal]
    cold_events = run_requests(cold, requests)
    got_events = run_requests(warm, requests)
    assert {k: output_tokens(v) for k, v in got_events.items()} == {
        k: output_tokens(v) for k, v in cold_events.items()
    }
    # the last prompt's MTP rows, mostly restored from entries completed after their background
    # commit, are the rows a full prefill writes
    rows = len(wal[-1].prompt_token_ids) - 1
    for name in ("key", "value"):
        restored, prefilled = (getattr(e.runner.mtp_cache, name)[:rows] for e in (warm, cold))
        torch.testing.assert_close(restored, prefilled, rtol=1e-5, atol=1e-5)
    cached = [got_events[p.request_id][-1].cached_prompt_tokens for p in wal]
    assert cached[0] == 0 and all(c > 0 and c % 64 == 0 for c in cached[1:])
    metrics = warm.metrics()
    assert metrics.prefix_cache_queries == sum(len(p.prompt_token_ids) for p in wal)
    assert metrics.prefix_cache_hits == sum(cached)
    assert cold.metrics().prefix_cache_hits == 0


def test_metrics_sum_the_requests_spec_stats_and_time_every_phase(
    demo_prompts: list[GenerationRequest],
) -> None:
    engine = LLMEngine(EngineConfig(drafter="tree", max_model_len=4096))
    prompts = _short(demo_prompts)
    events = run_requests(
        engine, [GenerationRequest(p.request_id, p.prompt_token_ids, GREEDY, 20) for p in prompts]
    )
    m = engine.metrics()
    finals = [ev[-1].spec for ev in events.values()]
    assert m.spec.num_drafts == sum(s.num_drafts for s in finals) > 0
    assert m.spec.num_accepted_tokens == sum(s.num_accepted_tokens for s in finals)
    assert m.spec.num_draft_tokens == sum(s.num_draft_tokens for s in finals)
    assert sum(m.spec.accepted_per_pos) == m.spec.num_accepted_tokens
    assert len(m.spec.accepted_per_pos) == engine.geometry.max_depth
    assert m.generation_tokens == sum(len(output_tokens(ev)) for ev in events.values())
    assert m.prompt_tokens == sum(len(p.prompt_token_ids) for p in prompts)
    assert sum(m.requests_finished.values()) == len(prompts)
    for phase in ("target", "drafter", "dispatch", "prefill"):
        assert m.spans[phase].count > 0 and m.spans[phase].seconds > 0
    assert m.spans["target"].count == m.spans["drafter"].count == m.spec.num_drafts


def test_a_failing_request_finishes_with_error_and_the_engine_goes_on(
    demo_prompts: list[GenerationRequest],
) -> None:
    engine = LLMEngine(EngineConfig(drafter="tree", max_model_len=4096))
    p = _short(demo_prompts)[0]
    real_topology = engine.drafter.topology

    def fail_once(root: int, proposal: object):  # a drafter bug on the first cycle
        engine.drafter.topology = real_topology
        raise RuntimeError("planted drafter failure")

    engine.drafter.topology = fail_once
    failed = run_requests(engine, [GenerationRequest("x", p.prompt_token_ids, GREEDY, 8)])["x"]
    assert failed[-1].finish_reason == "error" and "planted drafter failure" in (failed[-1].error or "")
    ok = run_requests(engine, [GenerationRequest("y", p.prompt_token_ids, GREEDY, 8)])["y"]
    assert ok[-1].finish_reason == "length" and len(output_tokens(ok)) == 8
