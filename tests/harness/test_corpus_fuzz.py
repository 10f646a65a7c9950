"""Fuzzing the corpus reader: any file either loads or yields one `line N[ (id X)]: field: why` issue per
bad line, never an exception; and every record it loads is one replay can send (strict UTF-8 JSON body,
hashable for the manifest, an id that fits the X-Request-Id header unchanged)."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

from aiohttp.http_writer import _serialize_headers  # the client's own header check
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from lumobench.client import Target, build_request, request_headers
from lumobench.corpus import SAMPLING_FIELDS, CorpusRecord, canonical_json, check_corpus, record_sha256

ISSUE = re.compile(r"line (\d+)( \(id [^\n]*\))?: [^\n]+")
# every code point, lone surrogates included (hypothesis leaves those out by default)
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=12)
LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | ANY_TEXT
)
VALUES = st.recursive(
    LEAVES,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(ANY_TEXT, kids, max_size=3),
    max_leaves=12,
)
MESSAGE_FIELDS = ["role", "content", "name", "tool_call_id", "tool_calls"]
FIELDS = ["id", "messages", "tools", "tool_choice", "input_ids", "source", "extra_body", *SAMPLING_FIELDS]


def _record(rid: str) -> dict[str, Any]:
    return {
        "id": rid,
        "messages": [
            {"role": "user", "content": "fix the bug"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "function": {"name": "ls", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
        ],
        "temperature": 0.0,
        "max_tokens": 8,
        "input_ids": [1, 2, 3],
    }


@st.composite
def mutated_record(draw: st.DrawFn, index: int) -> bytes:
    rec = _record(f"r{index}")
    messages = rec["messages"]
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            rec[draw(st.sampled_from(FIELDS))] = draw(VALUES)
        else:  # inside a message
            messages[draw(st.integers(0, 2))][draw(st.sampled_from(MESSAGE_FIELDS))] = draw(VALUES)
    return json.dumps(rec).encode()  # ensure_ascii: lone surrogates stay \udXXX escapes, NaN stays NaN


def line(index: int) -> st.SearchStrategy[bytes]:
    return st.one_of(
        mutated_record(index),
        VALUES.map(lambda v: json.dumps(v).encode()),
        st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")),
        st.integers(1, 3000).map(lambda d: b"[" * d + b"]" * d),
        st.integers(4000, 6000).map(lambda n: b'{"id": "n", "seed": ' + b"7" * n + b"}"),
    )


corpus_files = st.integers(1, 5).flatmap(lambda n: st.tuples(*(line(i) for i in range(n))))


def assert_replay_can_send(record: CorpusRecord) -> None:
    record_sha256(record)
    canonical_json(record).encode("utf-8")
    apis = ["chat"] + (["generate"] if record.input_ids is not None else [])
    for api in apis:
        _, body = build_request(record, Target(base_url="http://127.0.0.1:1", api=api))  # type: ignore[arg-type]
        json.dumps(body, allow_nan=False, ensure_ascii=False).encode("utf-8")
    headers = request_headers(record, 0)
    _serialize_headers("POST /v1/chat/completions HTTP/1.1", CIMultiDict(headers))
    assert all(v == v.strip() for v in headers.values())  # clients strip what the server would not see


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpus_files)
def test_any_input_loads_or_gives_one_line_per_problem(lines: tuple[bytes, ...]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.jsonl"
        path.write_bytes(b"\n".join(lines) + b"\n")
        records, issues = check_corpus(path)
    for issue in issues:
        match = ISSUE.fullmatch(str(issue))
        assert match, str(issue)
        assert 1 <= int(match.group(1)) <= len(lines)
    content_lines = sum(bool(raw.strip()) for raw in lines)
    assert len(records) + len({i.line for i in issues}) == max(content_lines, 1 if issues else 0)
    for record in records:
        assert_replay_can_send(record)
