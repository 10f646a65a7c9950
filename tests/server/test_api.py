"""The HTTP layer over a scripted fake engine: response shapes, streaming parsers, stop strings, usage
and spec stats, errors and auth. Streams are read back with lumobench's own SSE recorders, so what
replay parses is what these tests check. Real generation is tested in test_live_server.py."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from lumobench.metrics import parse_prometheus, spec_counters
from lumobench.sse import SSEParser
from lumobench.stream import ChatRecorder, GenerateRecorder, StreamRecorder
from lumotree.model import default_model_path
from lumotree.server.app import create_app
from lumotree.server.context import ServingContext
from lumotree.server.guards import default_allowed_hosts
from lumotree.server.metrics import render_metrics
from lumotree.server.tokenizer import ModelTokenizer

from .scripted_engine import ScriptedEngine

MAX_LEN = 512
ANSWER = (
    "<think>\nFind the WAL reader first.\n</think>\n\nSearching.\n"
    '<tool_call>\n{"name": "grep", "arguments": {"pattern": "def replay", "path": "kvstash"}}\n</tool_call>'
)
USER = [{"role": "user", "content": "Where is the WAL replayed?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "grep",
            "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}}},
        },
    }
]


def chunked(ids: list[int], sizes: tuple[int, ...] = (1, 3, 2, 5, 1, 4)) -> list[list[int]]:
    """Split ids into events of varying sizes (speculative cycles emit several tokens at once)."""
    out, pos, i = [], 0, 0
    while pos < len(ids):
        out.append(ids[pos : pos + sizes[i % len(sizes)]])
        pos += sizes[i % len(sizes)]
        i += 1
    return out


@pytest.fixture
def engine(tokenizer: ModelTokenizer) -> ScriptedEngine:
    return ScriptedEngine(chunks=chunked([*tokenizer.encode(ANSWER), 2]))  # 2 = <|im_end|>


def make_client(engine: ScriptedEngine, api_key: str | None = None) -> TestClient:
    ctx = ServingContext.for_model(engine, default_model_path(), MAX_LEN, api_key=api_key)
    return TestClient(create_app(ctx, lambda: render_metrics(engine.metrics(), ctx.model_name)))


@pytest.fixture
def client(engine: ScriptedEngine) -> Iterator[TestClient]:
    with make_client(engine) as c:
        yield c


def record(
    client: TestClient, path: str, body: dict, recorder: StreamRecorder
) -> tuple[StreamRecorder, list]:
    """Stream a request into a lumobench recorder; also return the decoded events."""
    with client.stream("POST", path, json=body) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(resp.iter_bytes())
    recorder.feed(raw, 1)
    events = [json.loads(e.data) for e in SSEParser().feed(raw) if e.data != "[DONE]"]
    return recorder, events


def test_streamed_chat_splits_reasoning_content_and_tool_calls(
    client: TestClient, engine: ScriptedEngine
) -> None:
    body = {"messages": USER, "tools": TOOLS, "stream": True, "stream_options": {"include_usage": True}}
    rec, events = record(client, "/v1/chat/completions", body, ChatRecorder())
    assert rec.failure() is None
    fields = rec.text_fields()
    assert fields["reasoning"] == "Find the WAL reader first."
    assert fields["text"] == "Searching.\n"
    (call,) = fields["tool_calls"]
    assert call["function"]["name"] == "grep" and call["id"].startswith("call_")
    assert json.loads(call["function"]["arguments"]) == {"pattern": "def replay", "path": "kvstash"}
    assert rec.finish_reason == "tool_calls"
    n = sum(len(c) for c in engine.chunks)
    assert rec.completion_tokens == n and rec.prompt_tokens == len(engine.requests[0].prompt_token_ids)
    # the arguments streamed in several fragments, not in one piece at the end
    fragments = [tc for e in events for ch in e["choices"] for tc in (ch["delta"].get("tool_calls") or [])]
    assert len(fragments) >= 3
    usage = events[-1]["usage"]
    assert events[-1]["choices"] == []
    assert usage["spec_decode"]["num_drafts"] == len(engine.chunks)
    assert usage["spec_decode"]["num_accepted_tokens"] == n - len(engine.chunks)


def test_whole_chat_answer_equals_the_streamed_one(client: TestClient) -> None:
    body = {"messages": USER, "tools": TOOLS}
    resp = client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200
    out = resp.json()
    msg = out["choices"][0]["message"]
    streamed = record(client, "/v1/chat/completions", body | {"stream": True}, ChatRecorder())[
        0
    ].text_fields()
    assert msg["content"] == streamed["text"] and msg["reasoning_content"] == streamed["reasoning"]
    assert [c["function"] for c in msg["tool_calls"]] == [c["function"] for c in streamed["tool_calls"]]
    assert out["choices"][0]["finish_reason"] == "tool_calls" and out["object"] == "chat.completion"
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"]


def test_tool_markup_stays_content_without_tools(client: TestClient) -> None:
    out = client.post("/v1/chat/completions", json={"messages": USER}).json()
    assert "<tool_call>" in out["choices"][0]["message"]["content"]
    assert out["choices"][0]["message"]["tool_calls"] is None and out["choices"][0]["finish_reason"] == "stop"


def test_prompt_is_rendered_with_the_model_chat_template(client: TestClient, engine: ScriptedEngine) -> None:
    client.post("/v1/chat/completions", json={"messages": USER, "tools": TOOLS})
    tok = ModelTokenizer(default_model_path())
    expected = tok.render_chat(USER, TOOLS, add_generation_prompt=True)
    assert tok.decode(engine.requests[-1].prompt_token_ids, skip_special_tokens=False) == expected
    tokenized = client.post("/tokenize", json={"messages": USER, "tools": TOOLS}).json()
    assert tokenized["tokens"] == engine.requests[-1].prompt_token_ids


def test_stop_string_across_events_is_trimmed_and_stops_the_engine_there(
    client: TestClient, engine: ScriptedEngine, tokenizer: ModelTokenizer
) -> None:
    text = "alpha beta STOP gamma delta epsilon"
    ids = tokenizer.encode(text)
    engine.chunks = chunked(ids, (2, 2, 2, 2))
    stop_at = next(i for i in range(len(ids)) if "STOP" in tokenizer.decode(ids[: i + 1]))
    body = {"messages": USER, "stop": ["STOP"], "stream": True, "stream_options": {"include_usage": True}}
    rec, _ = record(client, "/v1/chat/completions", body, ChatRecorder())
    assert rec.text_fields()["text"] == "alpha beta " and rec.finish_reason == "stop"
    assert rec.completion_tokens == stop_at + 1  # counted up to the token that completed the stop string
    # the engine is told where the client's output ended (it counts that, as "stop"), not aborted
    assert engine.stopped == {engine.requests[-1].request_id: stop_at + 1} and engine.aborted == []


def test_max_tokens_ends_with_length(client: TestClient, engine: ScriptedEngine) -> None:
    out = client.post("/v1/completions", json={"prompt": "def f(", "max_tokens": 4}).json()
    assert out["choices"][0]["finish_reason"] == "length" and out["usage"]["completion_tokens"] == 4
    assert engine.requests[-1].max_tokens == 4


def test_multibyte_characters_split_across_events_arrive_whole(
    client: TestClient, engine: ScriptedEngine, tokenizer: ModelTokenizer
) -> None:
    text = "naïve 世界 🙂🙂 ok"
    engine.chunks = [[i] for i in tokenizer.encode(text)]
    _, events = record(client, "/v1/completions", {"prompt": "x", "stream": True}, ChatRecorder())
    pieces = [e["choices"][0]["text"] for e in events if e["choices"]]
    assert "".join(pieces) == text and all("\ufffd" not in p for p in pieces)


def test_continuous_usage_and_token_ids_let_replay_count_tokens_per_chunk(
    client: TestClient, engine: ScriptedEngine
) -> None:
    body = {
        "messages": USER,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "return_token_ids": True,
    }
    rec, events = record(client, "/v1/chat/completions", body, ChatRecorder())
    ids = [t for c in engine.chunks for t in c]
    assert rec.token_ids == ids and rec.chunk_tokens[-1] == len(ids)
    assert rec.chunk_tokens == sorted(rec.chunk_tokens)
    assert events[0]["prompt_token_ids"] == engine.requests[-1].prompt_token_ids


def test_generate_streams_cumulative_completion_tokens(client: TestClient, engine: ScriptedEngine) -> None:
    body = {
        "input_ids": [1, 20, 30, 40],
        "sampling_params": {"max_new_tokens": 200, "temperature": 0},
        "stream": True,
    }
    rec, events = record(client, "/generate", body, GenerateRecorder())
    counts = [e["meta_info"]["completion_tokens"] for e in events]
    assert counts == sorted(counts) and len(set(counts)) == len(engine.chunks)
    ids = [t for c in engine.chunks for t in c]
    assert rec.failure() is None and rec.token_ids == ids and rec.completion_tokens == len(ids)
    assert events[-1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": 2}
    whole = client.post("/generate", json=body | {"stream": False}).json()
    assert whole["output_ids"] == ids and whole["text"] == rec.text_fields()["text"]
    assert engine.requests[-1].sampling.temperature == 0.0


def test_logprobs_have_the_requested_alternatives(client: TestClient, engine: ScriptedEngine) -> None:
    out = client.post(
        "/v1/chat/completions", json={"messages": USER, "logprobs": True, "top_logprobs": 3}
    ).json()
    content = out["choices"][0]["logprobs"]["content"]
    assert len(content) == out["usage"]["completion_tokens"]
    assert all(len(c["top_logprobs"]) == 3 and c["logprob"] == -0.25 for c in content)
    assert engine.requests[-1].logprobs == 3
    legacy = client.post("/v1/completions", json={"prompt": "x", "logprobs": 2}).json()["choices"][0][
        "logprobs"
    ]
    assert len(legacy["tokens"]) == len(legacy["token_logprobs"]) == len(legacy["top_logprobs"])


def test_unset_sampling_values_come_from_generation_config(
    client: TestClient, engine: ScriptedEngine
) -> None:
    client.post("/v1/chat/completions", json={"messages": USER, "top_k": -1, "seed": -1})
    s = engine.requests[-1].sampling
    assert (s.temperature, s.top_p, s.top_k) == (0.6, 0.95, 0)  # model defaults; top_k -1 = off
    assert engine.requests[-1].seed == 2**64 - 1  # negative seeds wrap to the 64-bit key


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"messages": USER, "model": "gpt-9"}, 404, "does not exist"),
        ({"messages": USER, "temperature": -1}, 400, "temperature"),
        ({"messages": USER, "top_p": 0}, 400, "top_p"),
        ({"messages": USER, "top_p": 1.5}, 400, "top_p"),
        ({"messages": USER, "presence_penalty": 3}, 400, "presence_penalty"),
        ({"messages": USER, "max_tokens": 0}, 400, "max_tokens"),
        ({"messages": USER, "max_tokens": MAX_LEN}, 400, "maximum context length"),
        ({"messages": [{"role": "user", "content": "word " * MAX_LEN}]}, 400, "maximum context length"),
        ({"messages": "hello"}, 400, "messages"),
        ({"messages": []}, 400, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
        ({"messages": USER, "n": 2}, 400, "n > 1"),
        ({"messages": USER, "tools": TOOLS, "tool_choice": "required"}, 400, "tool_choice"),
        ({"messages": USER, "stop_token_ids": [99999]}, 400, "vocabulary"),
        ({"messages": USER, "seed": 2**70}, 400, "seed"),
        ({"messages": USER, "repetition_penalty": 1e-300}, 400, "repetition_penalty"),
    ],
)
def test_bad_chat_requests_get_a_clear_4xx(client: TestClient, body: dict, status: int, needle: str) -> None:
    resp = client.post("/v1/chat/completions", json=body)
    assert resp.status_code == status
    assert needle in resp.json()["error"]["message"]


def test_malformed_json_and_non_finite_numbers_get_400(client: TestClient) -> None:
    for raw in (
        b'{"messages": [',
        b"[1, 2]",
        b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
    ):
        resp = client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
        assert resp.status_code == 400, raw
        assert resp.json()["error"]["type"] == "invalid_request_error"


def test_bad_generate_and_completion_requests_get_400(client: TestClient) -> None:
    assert client.post("/generate", json={"input_ids": [1, 10**6]}).status_code == 400
    assert client.post("/generate", json={"text": "a", "input_ids": [1]}).status_code == 400
    assert client.post("/generate", json={"input_ids": []}).status_code == 400
    assert client.post("/v1/completions", json={"prompt": ["a", "b"]}).status_code == 400
    assert client.post("/v1/completions", json={"prompt": "a", "echo": True}).status_code == 400


def test_api_key_guards_generation_but_not_health(engine: ScriptedEngine) -> None:
    with make_client(engine, api_key="sekret") as c:
        assert c.get("/health").status_code == 200 and c.get("/metrics").status_code == 200
        assert c.get("/v1/models").status_code == 401
        wrong = c.post("/v1/chat/completions", json={"messages": USER}, headers={"Authorization": "Bearer x"})
        assert wrong.status_code == 401 and "API key" in wrong.json()["error"]["message"]
        ok = c.post(
            "/v1/chat/completions", json={"messages": USER}, headers={"Authorization": "Bearer sekret"}
        )
        assert ok.status_code == 200
    assert engine.requests and len(engine.requests) == 1


def test_models_lists_the_served_model(client: TestClient) -> None:
    (card,) = client.get("/v1/models").json()["data"]
    assert card["id"] == "lumo-tiny-coder" and card["max_model_len"] == MAX_LEN


def test_metrics_use_vllm_names_that_lumobench_reads(client: TestClient, engine: ScriptedEngine) -> None:
    # before any request every finish reason is already a zero series, so deltas from a fresh server work
    fresh = parse_prometheus(client.get("/metrics").text)["vllm:request_success_total"]
    assert {lab["finished_reason"]: v for lab, v in fresh} == {"stop": 0, "length": 0, "abort": 0, "error": 0}
    client.post("/v1/chat/completions", json={"messages": USER})
    text = client.get("/metrics").text
    spec = spec_counters(text)
    assert spec is not None and spec.drafts == len(engine.chunks)
    assert spec.accepted == sum(len(c) - 1 for c in engine.chunks)
    assert spec.per_position_rates()[0] == sum(len(c) > 1 for c in engine.chunks) / len(engine.chunks)
    samples = parse_prometheus(text)
    assert samples["vllm:generation_tokens_total"][0][1] == sum(len(c) for c in engine.chunks)
    assert {lab["phase"] for lab, _ in samples["lumotree:phase_seconds_count"]} >= {
        "target",
        "drafter",
        "dispatch",
    }
    assert ({"model_name": "lumo-tiny-coder", "finished_reason": "stop"}, 1.0) in samples[
        "vllm:request_success_total"
    ]


def _post_raw(client: TestClient, path: str, body: dict) -> httpx.Response:
    # json.dumps escapes a lone surrogate as \udXXX: valid JSON that no tokenizer can read
    return client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "a\ud800"}]},
            "messages.0.content",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]},
            "messages.0.content.0.text",
        ),
        ("/v1/chat/completions", {"messages": USER, "stop": ["x", "\ud83d"]}, "stop.1"),
        ("/v1/completions", {"prompt": "def f(\udc00"}, "prompt"),
        ("/generate", {"text": "\ud800 x"}, "text"),
        ("/tokenize", {"prompt": "\ud800"}, "prompt"),
        ("/tokenize", {"messages": [{"role": "user", "content": "ok", "name": "\udead"}]}, "messages.0.name"),
    ],
)
def test_lone_surrogates_get_400_naming_the_field(
    client: TestClient, path: str, body: dict, field: str
) -> None:
    resp = _post_raw(client, path, body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == field and "lone surrogate" in error["message"]


def test_context_length_errors_name_the_field_that_holds_the_prompt(client: TestClient) -> None:
    long_text = "word " * MAX_LEN
    for path, body, field in [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": long_text}]}, "messages"),
        ("/v1/completions", {"prompt": long_text}, "prompt"),
        ("/generate", {"text": long_text}, "text"),
        ("/generate", {"input_ids": [5] * MAX_LEN}, "input_ids"),
    ]:
        error = client.post(path, json=body).json()["error"]
        assert (error["param"], error["code"]) == (field, "context_length_exceeded"), path


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": USER, "stream": "yes"}, "stream"),
        ({"messages": USER, "max_tokens": True}, "max_tokens"),
        ({"messages": USER, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
        ({"messages": USER, "temperature": "0.5"}, "temperature"),
    ],
)
def test_values_of_the_wrong_json_type_are_not_converted(client: TestClient, body: dict, field: str) -> None:
    resp = client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == field


def test_head_health_answers_like_get(client: TestClient) -> None:
    assert client.head("/health").status_code == 200 and client.get("/health").status_code == 200


def _guarded_client(engine: ScriptedEngine, base_url: str, **guards: object) -> TestClient:
    ctx = ServingContext.for_model(engine, default_model_path(), MAX_LEN)
    app = create_app(ctx, lambda: render_metrics(engine.metrics(), ctx.model_name), **guards)  # type: ignore[arg-type]
    return TestClient(app, base_url=base_url)


@pytest.mark.parametrize(
    ("base_url", "status"),
    [
        ("http://127.0.0.1:8000", 200),
        ("http://localhost:8000", 200),
        ("http://[::1]:8000", 200),
        ("http://agent.localhost", 200),
        ("http://rebind.attacker.example:8000", 403),  # DNS rebinding: the page's name, our address
        ("http://127.0.0.1.attacker.example", 403),
    ],
)
def test_a_loopback_server_answers_only_loopback_host_names(
    engine: ScriptedEngine, base_url: str, status: int
) -> None:
    with _guarded_client(engine, base_url, allowed_hosts=default_allowed_hosts("127.0.0.1")) as c:
        for resp in (c.get("/health"), c.post("/v1/chat/completions", json={"messages": USER})):
            assert resp.status_code == status
        if status == 403:
            assert resp.json()["error"]["code"] == "host_not_allowed"
    assert default_allowed_hosts("0.0.0.0") is None  # bound to be reached: any Host


def test_no_cors_headers_are_sent(client: TestClient) -> None:
    origin = {"Origin": "https://attacker.example"}
    preflight = client.options(
        "/v1/chat/completions", headers=origin | {"Access-Control-Request-Method": "POST"}
    )
    answer = client.post("/v1/chat/completions", json={"messages": USER}, headers=origin)
    for resp in (preflight, answer):
        assert not any(h.lower().startswith("access-control-") for h in resp.headers)


def test_bodies_over_the_limit_get_413_before_they_are_parsed(engine: ScriptedEngine) -> None:
    body = json.dumps({"messages": [{"role": "user", "content": "x" * 5000}]}).encode()
    with _guarded_client(engine, "http://127.0.0.1", max_body_bytes=4096) as c:
        declared = c.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        chunked = c.post(
            "/v1/chat/completions",
            content=(body[i : i + 1000] for i in range(0, len(body), 1000)),  # no Content-Length
            headers={"content-type": "application/json"},
        )
        small = c.post("/v1/chat/completions", json={"messages": USER})
    for resp in (declared, chunked):
        assert resp.status_code == 413 and "larger than this server's limit of 4096 bytes" in resp.text
    assert small.status_code == 200 and len(engine.requests) == 1


def test_a_huge_prompt_is_tokenized_off_the_event_loop(engine: ScriptedEngine) -> None:
    """Tokenizing 1.2 MB takes seconds; /health keeps answering meanwhile (it waited 8-19 s for 10 MB)."""
    prompt = "def f(x):\n    return x + 1  # a comment\n" * 30_000
    took: dict[str, float] = {}
    # a context this text could fit (at 512 tokens it is refused before it is tokenized)
    ctx = ServingContext.for_model(engine, default_model_path(), 65_536)
    client = TestClient(create_app(ctx, lambda: render_metrics(engine.metrics(), ctx.model_name)))

    def tokenize() -> None:
        start = time.monotonic()
        assert client.post("/tokenize", json={"prompt": prompt}).status_code == 200
        took["tokenize"] = time.monotonic() - start

    worker = threading.Thread(target=tokenize)
    worker.start()
    waits = []
    while worker.is_alive():
        start = time.monotonic()
        assert client.get("/health").status_code == 200
        waits.append(time.monotonic() - start)
        time.sleep(0.05)
    worker.join()
    assert took["tokenize"] > 0.5 and max(waits) < took["tokenize"] / 4, (took, max(waits))
