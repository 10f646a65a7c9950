"""Property-based requests from the server's own OpenAPI schema (schemathesis) against the real server
process with the real engine: whatever the body, valid or not, the answer is never a 5xx and conforms
to the schema (status code, content type, JSON body)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
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


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[schemathesis.BaseSchema]:
    # a short context keeps every generated request cheap: at most 160 tokens in all
    log = tmp_path_factory.mktemp("schemathesis") / "server.log"
    with lumotree_server(log, "--max-model-len", "160", "--seed", "0") as base:
        yield schemathesis.openapi.from_url(base + "/openapi.json")


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
