"""Bad input the server must answer with a 4xx, and work it must bound by tokens (issue 29, item 6):
a lone surrogate in any JSON object key, ports that are no TCP port, bodies of more JSON values than
the context can hold, prompt texts longer than the context can hold (refused before they are
tokenized, and never a prompt that would fit). Over the HTTP app with the scripted engine (a fake of
the engine's streaming contract) and the real tokenizer; `test_live_server.py` measures the real
server's event loop and memory under the same bodies."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from lumotree.model import default_model_path
from lumotree.server.__main__ import app as server_cli
from lumotree.server.app import create_app
from lumotree.server.context import ServingContext
from lumotree.server.metrics import render_metrics
from lumotree.server.protocol import escaped
from lumotree.server.tokenizer import ModelTokenizer

from .scripted_engine import ScriptedEngine

MAX_LEN = 512
USER = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "grep", "parameters": {"type": "object", "properties": {}}}}
CHAT = {
    "messages": USER,
    "tools": [TOOL],
    "logit_bias": {"5": 1.0},
    "stream_options": {"include_usage": True},
    "chat_template_kwargs": {"enable_thinking": False},
    "max_tokens": 2,
}
CHAT_OBJECTS = [
    *[(), ("logit_bias",), ("stream_options",), ("chat_template_kwargs",), ("messages", 0)],
    *[("tools", 0, "function", "parameters"), ("tools", 0, "function", "parameters", "properties")],
]
#: a valid body per route, and the objects in it where a client can put keys of its own
BODIES: dict[str, tuple[dict[str, Any], list[tuple[str | int, ...]]]] = {
    "/v1/chat/completions": (CHAT, CHAT_OBJECTS),
    "/v1/completions": (
        {"prompt": "def f(", "logit_bias": {"5": 1.0}, "max_tokens": 2},
        [(), ("logit_bias",)],
    ),
    "/generate": ({"text": "def f(", "sampling_params": {"max_new_tokens": 2}}, [(), ("sampling_params",)]),
    "/tokenize": ({"messages": USER, "tools": [TOOL]}, [(), ("messages", 0), ("tools", 0, "function")]),
}
SURROGATES = st.integers(0xD800, 0xDFFF).map(chr)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    engine = ScriptedEngine(chunks=[[5], [2]])
    ctx = ServingContext.for_model(engine, default_model_path(), MAX_LEN)
    with TestClient(create_app(ctx, lambda: render_metrics(engine.metrics(), ctx.model_name))) as c:
        yield c


def _post(client: TestClient, path: str, body: object) -> Any:
    # json.dumps writes a lone surrogate as a \udXXX escape: valid JSON, not valid Unicode text
    return client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_lone_surrogate_in_any_key_gets_400_naming_it(client: TestClient, data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(sorted(BODIES)), label="route")
    body, places = json.loads(json.dumps(BODIES[path][0])), BODIES[path][1]
    where = data.draw(st.sampled_from(places), label="object")
    key = (
        data.draw(st.text(max_size=4), label="before")
        + data.draw(SURROGATES)
        + data.draw(st.text(max_size=4))
    )
    holder = body
    for step in where:
        holder = holder[step]
    holder[key] = data.draw(st.sampled_from([1, "x", True, None, {}]), label="value")
    resp = _post(client, path, body)
    assert resp.status_code == 400, resp.text  # it was 500: the error body could not be encoded
    error = resp.json()["error"]
    assert error["param"] == ".".join([*map(str, where), escaped(key)])
    assert "lone surrogate" in error["message"]


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_a_port_that_is_no_tcp_port_is_one_usage_line(port: str) -> None:
    # `python -m lumotree.server`'s own command, in this process (a fresh one imports torch: seconds)
    result = CliRunner().invoke(server_cli, ["--port", port])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)  # a usage error, no crash
    assert "Invalid value for '--port'" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("field", "body"),
    [
        ("messages", {"messages": USER * 30_000}),
        ("tools", {"messages": USER, "tools": [TOOL] * 10_000}),
        ("logit_bias", {"messages": USER, "logit_bias": {str(i): 1.0 for i in range(40_000)}}),
        ("stuff", {"messages": USER, "stuff": list(range(40_000))}),  # an ignored field is no way around it
    ],
)
def test_a_body_of_more_json_values_than_the_context_holds_gets_413_before_validation(
    client: TestClient, field: str, body: dict[str, Any]
) -> None:
    resp = _post(client, "/v1/chat/completions", body)
    assert resp.status_code == 413, resp.text
    error = resp.json()["error"]
    assert error["param"] == field and "JSON values, this server's limit" in error["message"]


@pytest.fixture(scope="module")
def tokenizer() -> ModelTokenizer:
    return ModelTokenizer(default_model_path())


def test_a_prompt_text_longer_than_the_context_holds_is_refused_before_it_is_tokenized(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = ModelTokenizer.encode
    monkeypatch.setattr(
        ModelTokenizer, "encode", lambda self, text: calls.append(len(text)) or real(self, text)
    )
    long_text = "x" * (MAX_LEN * 80)
    for path, body, field in [
        ("/v1/completions", {"prompt": long_text}, "prompt"),
        ("/generate", {"text": long_text}, "text"),
        ("/tokenize", {"prompt": long_text}, "prompt"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": long_text}]}, "messages"),
    ]:
        resp = _post(client, path, body)
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert (error["param"], error["code"]) == (field, "context_length_exceeded")
        assert "but the prompt has at least" in error["message"]
    assert calls == []  # none of them reached the tokenizer


TOKEN_PIECES = st.sampled_from([" ", "\n", "    ", "def", "x", "é", "😀", "<|im_end|>", "# " + "-" * 60])


@settings(max_examples=150, deadline=None)
@given(pieces=st.lists(TOKEN_PIECES | st.text(max_size=30), max_size=200))
def test_the_length_bound_never_refuses_a_prompt_that_fits(
    tokenizer: ModelTokenizer, pieces: list[str]
) -> None:
    # the bound says "at least ceil(chars / max_token_bytes) tokens": it must never exceed the real count
    text = "".join(pieces)
    assert -(-len(text) // tokenizer.max_token_bytes) <= len(tokenizer.encode(text))


def test_the_longest_token_sets_the_bound(tokenizer: ModelTokenizer) -> None:
    longest = max(range(tokenizer.vocab_size), key=lambda i: len(tokenizer.token_bytes(i)))
    assert tokenizer.max_token_bytes == len(tokenizer.token_bytes(longest)) > 1
