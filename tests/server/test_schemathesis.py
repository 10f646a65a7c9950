"""Property-based requests from the server's own OpenAPI schema (schemathesis) against the real server
process with the real engine: whatever the body, valid or not, the answer is never a 5xx and conforms
to the schema (status code, content type, JSON body). Generated bodies are also mutated beyond what
a schema can say: a lone surrogate put into any text field (400 naming that field), and a text field
grown past the body limit (413) or to half of it (never a 5xx)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from .live import lumotree_server

pytestmark = pytest.mark.integration
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
OPERATIONS = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/generate"),
    ("POST", "/tokenize"),
    ("GET", "/v1/models"),
    ("GET", "/health"),
    ("GET", "/metrics"),
]


MAX_BODY = 256 * 1024  # the server's --max-request-bytes here


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # a short context keeps every generated request cheap: at most 160 tokens in all
    log = tmp_path_factory.mktemp("schemathesis") / "server.log"
    args = ("--max-model-len", "160", "--seed", "0", "--max-request-bytes", str(MAX_BODY))
    with lumotree_server(log, *args) as url:
        yield url


@pytest.fixture(scope="module")
def api(base: str) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(base + "/openapi.json")


def test_the_schema_lists_every_route(api: schemathesis.BaseSchema) -> None:
    listed = {(method.upper(), path) for path, methods in api.items() for method in methods}
    assert listed >= set(OPERATIONS)


@pytest.mark.parametrize(
    ("method", "path", "mode"),
    [(m, p, GenerationMode.POSITIVE) for m, p in OPERATIONS]
    # routes without parameters or body have no invalid variant
    + [(m, p, GenerationMode.NEGATIVE) for m, p in OPERATIONS if m == "POST"],
    ids=lambda v: v.value if isinstance(v, GenerationMode) else v,
)
def test_generated_requests_never_get_a_server_error(
    api: schemathesis.BaseSchema, method: str, path: str, mode: GenerationMode
) -> None:
    operation = api[path][method]

    @given(operation.as_strategy(generation_mode=mode))
    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def check(case: schemathesis.Case) -> None:
        case.call_and_validate(checks=CHECKS, timeout=60)

    check()


def _text_fields(value: Any, path: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """Paths of every string value in a JSON body."""
    if isinstance(value, str):
        return [path]
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return [p for key, child in items for p in _text_fields(child, (*path, key))]


def _replaced(body: Any, path: tuple[str | int, ...], text: str) -> Any:
    out = copy.deepcopy(body)
    holder = out
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = text
    return out


@pytest.mark.parametrize(("method", "path"), [op for op in OPERATIONS if op[0] == "POST"])
def test_invalid_unicode_and_huge_text_fields_never_get_a_server_error(
    api: schemathesis.BaseSchema, base: str, method: str, path: str
) -> None:
    operation = api[path][method]

    @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE), data=st.data())
    @settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def check(case: schemathesis.Case, data: st.DataObject) -> None:
        fields = _text_fields(case.body)
        assume(fields)
        where = data.draw(st.sampled_from(fields), label="field")
        old = case.body
        for key in where:
            old = old[key]
        kind = data.draw(st.sampled_from(["surrogate", "over the limit", "half the limit"]), label="kind")
        if kind == "surrogate":
            cut = data.draw(st.integers(0, len(old)))
            text = old[:cut] + chr(data.draw(st.integers(0xD800, 0xDFFF))) + old[cut:]
        else:
            text = "x" * (MAX_BODY + 1 if kind == "over the limit" else MAX_BODY // 2)
        # json.dumps writes a lone surrogate as a \udXXX escape: valid JSON, not valid Unicode text
        content = json.dumps(_replaced(case.body, where, text)).encode()
        headers = {"content-type": "application/json"}
        resp = httpx.post(base + path, content=content, headers=headers, timeout=120)
        if kind == "surrogate":
            assert resp.status_code == 400, resp.text
            assert resp.json()["error"]["param"] == ".".join(map(str, where))
        elif kind == "over the limit":
            assert resp.status_code == 413, resp.text
            chunked = httpx.post(base + path, content=iter([content]), headers=headers, timeout=120)
            assert chunked.status_code == 413, chunked.text
        else:
            assert resp.status_code < 500, resp.text

    check()
