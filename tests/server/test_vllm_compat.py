"""What outside clients built for vLLM 0.32 rely on, over the scripted fake engine: when the role chunk
goes out, one tool-call entry per index per chunk, logit_bias, vLLM's response fields and explicit
nulls, a clear 400 for image parts, and the latency histograms on /metrics."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from lumobench.stream import ChatRecorder
from lumotree.engine.metrics import EngineMetrics
from lumotree.engine.sequence import GenerationRequest, TokenEvent
from lumotree.model import default_model_path
from lumotree.server.chat import chat_stream, prepare_chat
from lumotree.server.context import ServingContext
from lumotree.server.metrics import render_metrics
from lumotree.server.protocol import ChatCompletionRequest
from lumotree.server.tokenizer import ModelTokenizer

from .scripted_engine import ScriptedEngine
from .test_api import ANSWER, MAX_LEN, TOOLS, USER, chunked, make_client, record

STREAM = {"stream": True, "stream_options": {"include_usage": True}}


@pytest.fixture
def engine(tokenizer: ModelTokenizer) -> ScriptedEngine:
    return ScriptedEngine(chunks=chunked([*tokenizer.encode(ANSWER), 2]))  # 2 = <|im_end|>


@pytest.fixture
def client(engine: ScriptedEngine) -> Iterator[TestClient]:
    with make_client(engine) as c:
        yield c


class GatedEngine(ScriptedEngine):
    """The scripted engine, holding its first event until `release` is set (a long prefill)."""

    def __init__(self, chunks: list[list[int]]) -> None:
        super().__init__(chunks=chunks)
        self.release = asyncio.Event()

    async def generate(self, req: GenerationRequest) -> AsyncIterator[TokenEvent]:
        await self.release.wait()
        async for event in super().generate(req):
            yield event


def test_role_chunk_goes_out_with_the_first_output_not_before_prefill(tokenizer: ModelTokenizer) -> None:
    async def scenario() -> tuple[bool, bytes]:
        engine = GatedEngine([tokenizer.encode("Hello there"), [2]])
        ctx = ServingContext.for_model(engine, default_model_path(), MAX_LEN)
        req = ChatCompletionRequest.model_validate({"messages": USER, **STREAM})
        stream = chat_stream(ctx, req, *prepare_chat(ctx, req))
        async with contextlib.aclosing(stream):
            first = asyncio.ensure_future(anext(stream))
            await asyncio.sleep(0.2)
            sent_before_prefill = first.done()
            engine.release.set()
            return sent_before_prefill, await first

    sent_before_prefill, first = asyncio.run(scenario())
    assert not sent_before_prefill  # vLLM bench counts the first chunk as the first token
    events = [e for e in first.split(b"\n\n") if e]
    assert len(events) == 2 and b'"role":"assistant"' in events[0] and b'"content":"Hello' in events[1]


def test_each_chunk_carries_one_tool_call_entry_per_index(
    client: TestClient, engine: ScriptedEngine, tokenizer: ModelTokenizer
) -> None:
    # speculative events of up to 9 tokens: a call's header and its first arguments often share one
    two_calls = ANSWER + '\n<tool_call>\n{"name": "grep", "arguments": {"pattern": "x"}}\n</tool_call>'
    ids = [*tokenizer.encode(two_calls), 2]
    for sizes in ((9,), (5, 9, 2), (1, 3, 2, 5, 1, 4)):
        engine.chunks = chunked(ids, sizes)
        rec, events = record(
            client, "/v1/chat/completions", {"messages": USER, "tools": TOOLS, **STREAM}, ChatRecorder()
        )
        entries = [ch["delta"].get("tool_calls") or [] for e in events for ch in e["choices"]]
        assert all(len({c["index"] for c in calls}) == len(calls) for calls in entries), entries
        calls = rec.text_fields()["tool_calls"]
        assert [c["function"]["arguments"] for c in calls] == [
            '{"pattern": "def replay", "path": "kvstash"}',
            '{"pattern": "x"}',
        ]


def test_logit_bias_reaches_the_engine_clamped_and_bad_keys_get_400(
    client: TestClient, engine: ScriptedEngine
) -> None:
    resp = client.post(
        "/v1/chat/completions", json={"messages": USER, "logit_bias": {"17": 250, "3": -1.5, "0": 0}}
    )
    assert resp.status_code == 200
    assert engine.requests[-1].sampling.logit_bias == ((0, 0.0), (3, -1.5), (17, 100.0))
    client.post("/v1/completions", json={"prompt": "x", "logit_bias": {"5": -100}})
    assert engine.requests[-1].sampling.logit_bias == ((5, -100.0),)
    for bias, needle in (({"abc": 1}, "not a token id"), ({"99999": 1}, "outside the vocabulary")):
        bad = client.post("/v1/chat/completions", json={"messages": USER, "logit_bias": bias})
        assert bad.status_code == 400 and needle in bad.json()["error"]["message"]
        assert bad.json()["error"]["param"] == "logit_bias"


def test_streamed_and_whole_answers_carry_vllm_fields(client: TestClient, engine: ScriptedEngine) -> None:
    body = {"messages": USER, "tools": TOOLS, **STREAM}
    _, events = record(client, "/v1/chat/completions", body, ChatRecorder())
    choices = [ch for e in events for ch in e["choices"]]
    assert all("finish_reason" in ch and "logprobs" in ch for ch in choices)  # explicit nulls
    assert [ch["finish_reason"] for ch in choices][-1] == "tool_calls" and choices[-1]["stop_reason"] is None
    assert all(ch["finish_reason"] is None for ch in choices[:-1])
    deltas = [ch["delta"] for ch in choices]
    assert all(d.get("reasoning") == d.get("reasoning_content") for d in deltas)
    assert "".join(d.get("reasoning") or "" for d in deltas) == "Find the WAL reader first."
    fingerprints = [e.get("system_fingerprint") for e in events]
    assert fingerprints[:-1] == [None] * (len(events) - 1)
    assert fingerprints[-1].startswith("lumotree-0.1.0-") and events[-1]["usage"]
    # without the usage chunk, the fingerprint rides on the finishing chunk
    _, events = record(client, "/v1/chat/completions", {"messages": USER, "stream": True}, ChatRecorder())
    assert events[-1]["choices"][0]["finish_reason"] and events[-1]["system_fingerprint"] == fingerprints[-1]

    whole = client.post("/v1/chat/completions", json={"messages": USER, "tools": TOOLS}).json()
    assert whole["system_fingerprint"] == fingerprints[-1]
    message = whole["choices"][0]["message"]
    assert message["reasoning"] == message["reasoning_content"] == "Find the WAL reader first."
    assert "stop_reason" in whole["choices"][0]
    # a stop string and a stop token id are vLLM's stop_reason; EOS is null
    stopped = client.post("/v1/chat/completions", json={"messages": USER, "stop": ["WAL"]}).json()
    assert stopped["choices"][0]["stop_reason"] == "WAL"
    engine.chunks = [[40], [41], [2]]
    by_id = client.post("/v1/completions", json={"prompt": "x", "stop_token_ids": [2]}).json()
    assert by_id["choices"][0]["stop_reason"] == 2 and by_id["system_fingerprint"] == fingerprints[-1]
    _, events = record(client, "/v1/completions", {"prompt": "x", "stream": True}, ChatRecorder())
    assert all("finish_reason" in ch and "logprobs" in ch for e in events for ch in e["choices"])


def test_image_content_part_gets_a_400_naming_it(client: TestClient, engine: ScriptedEngine) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]
    resp = client.post("/v1/chat/completions", json={"messages": messages})
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["message"] == (
        "messages[0].content[1]: content part type 'image_url' is not supported: "
        "lumo-tiny-coder reads text only"
    )
    assert error["param"] == "messages.0.content.1.type" and not engine.requests
    text_only = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}]}]
    assert client.post("/v1/chat/completions", json={"messages": text_only}).status_code == 200


@pytest.mark.parametrize(
    ("name", "field", "observations"),
    [
        ("vllm:time_to_first_token_seconds", "time_to_first_token", [0.0005, 0.03, 0.03, 3000.0]),
        ("vllm:inter_token_latency_seconds", "inter_token_latency", [0.01, 0.012, 0.2]),
        ("vllm:e2e_request_latency_seconds", "e2e_request_latency", [0.3, 61.0]),
        ("vllm:request_queue_time_seconds", "request_queue_time", [0.0, 0.0, 9.5]),
        ("vllm:request_prefill_time_seconds", "request_prefill_time", [0.2, 3.0]),
        ("vllm:request_decode_time_seconds", "request_decode_time", [0.0, 12.0, 500.0]),
        ("vllm:request_inference_time_seconds", "request_inference_time", [1.0]),
        ("vllm:request_time_per_output_token_seconds", "request_time_per_output_token", [0.0, 0.02]),
        ("vllm:request_prompt_tokens", "request_prompt_tokens", [1, 3, 4096, 5000]),
        ("vllm:request_generation_tokens", "request_generation_tokens", [2, 20]),
        ("vllm:request_max_num_generation_tokens", "request_max_num_generation_tokens", [7]),
        ("vllm:iteration_tokens_total", "iteration_tokens", [1, 3, 700, 20000]),
    ],
)
def test_metrics_export_vllm_latency_histograms(name: str, field: str, observations: list[float]) -> None:
    metrics = EngineMetrics(kv_cache_usage=0.25)
    for seconds in observations:
        getattr(metrics, field).observe(seconds)
    families = {f.name: f for f in text_string_to_metric_families(render_metrics(metrics, "m"))}
    family = families[name]
    assert family.type == "histogram"
    buckets = {s.labels["le"]: s.value for s in family.samples if s.name == name + "_bucket"}
    bounds = getattr(metrics, field).bounds
    assert list(buckets) == [*map(str, map(float, bounds)), "+Inf"]
    for le, count in buckets.items():
        assert count == sum(v <= float(le) for v in observations), le
    [total] = [s.value for s in family.samples if s.name == name + "_sum"]
    assert total == pytest.approx(sum(observations))
    [usage] = families["vllm:kv_cache_usage_perc"].samples
    assert (usage.value, usage.labels) == (0.25, {"model_name": "m"})
