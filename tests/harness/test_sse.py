"""SSE parsing per the spec and the stream recorders' timing rules (DESIGN §6)."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lumobench.sse import SSEEvent, SSELineTooLong, SSEParser
from lumobench.stream import ChatRecorder, GenerateRecorder

STREAM = (
    "\ufeff: comment first\r\n"
    'data: {"a": 1,\r\n'
    'data:  "b": "é€"}\r\n'
    "\r\n"
    "event: ping\n"
    "id: 7\n"
    "data\n"
    "\n"
    ": keep-alive\n\n"
    "retry: 10\r"
    "data: [DONE]\r"
    "\r"
).encode()


def _parse_in_pieces(raw: bytes, cuts: list[int]) -> tuple[list[SSEEvent], int]:
    parser = SSEParser()
    events: list[SSEEvent] = []
    last = 0
    for cut in [*sorted(set(cuts)), len(raw)]:
        events += parser.feed(raw[last:cut])
        last = cut
    return events, parser.comments


def test_spec_features_in_one_read() -> None:
    events, comments = _parse_in_pieces(STREAM, [])
    assert events == [
        SSEEvent("message", '{"a": 1,\n "b": "é€"}', None),
        SSEEvent("ping", "", "7"),
        SSEEvent("message", "[DONE]", "7"),
    ]
    assert json.loads(events[0].data) == {"a": 1, "b": "é€"}
    assert comments == 2


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_reads_split_anywhere_give_the_same_events(cuts: list[int]) -> None:
    """Lines, fields, CRLF pairs and multi-byte characters may be cut by any read boundary."""
    assert _parse_in_pieces(STREAM, cuts) == _parse_in_pieces(STREAM, [])


def test_a_long_line_in_small_reads_costs_linear_time() -> None:
    # 16 MB in 4 KB reads: re-copying the unfinished line on every read copies ~32 GB (minutes);
    # appending in place copies it about twice
    parser = SSEParser(max_line_bytes=32 * 1024 * 1024)
    piece = b"x" * 4096
    start = time.process_time()
    assert parser.feed(b"data: ") == []
    for _ in range(4096):
        assert parser.feed(piece) == []
    (event,) = parser.feed(b"\n\n")
    assert len(event.data) == 4096 * 4096 and time.process_time() - start < 3


def test_a_line_or_event_over_the_limit_is_refused() -> None:
    parser = SSEParser(max_line_bytes=1000)
    assert parser.feed(b"data: " + b"y" * 900) == []
    with pytest.raises(SSELineTooLong, match="longer than 1000 bytes"):
        parser.feed(b"y" * 200)
    many = SSEParser(max_line_bytes=1000)  # short lines, but one event of 1,200 bytes
    with pytest.raises(SSELineTooLong, match="event is longer"):
        many.feed((b"data: " + b"z" * 400 + b"\n") * 3)
    split = SSEParser(max_line_bytes=1000)  # the limit holds when the line ends in a later read
    with pytest.raises(SSELineTooLong):
        split.feed(b"data: " + b"w" * 1200 + b"\n\n")


def test_unterminated_event_at_end_is_discarded() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: one\n\ndata: two") == [SSEEvent("message", "one", None)]


def _chunk(
    delta: dict, usage: int | None = None, finish: str | None = None, ids: list | None = None
) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    if ids:
        choice["token_ids"] = ids
    obj: dict = {"choices": [choice]}
    if usage is not None:
        obj["usage"] = {"prompt_tokens": 5, "completion_tokens": usage}
    return f"data: {json.dumps(obj)}\n\n".encode()


def test_t_first_skips_role_only_and_empty_chunks_and_counts_reasoning() -> None:
    rec = ChatRecorder()
    rec.feed(_chunk({"role": "assistant", "content": ""}, usage=0), 100)
    rec.feed(_chunk({"content": ""}), 200)
    rec.feed(_chunk({}, usage=1, ids=[9]), 250)  # a token held back by the detokenizer: output, not visible
    assert rec.t_first_ns is None
    rec.feed(_chunk({"reasoning": "hmm"}, usage=2, ids=[4]), 300)
    rec.feed(_chunk({"content": "hi"}, usage=4, ids=[5, 6]), 400)
    rec.feed(_chunk({}, finish="length"), 450)
    rec.feed(b'data: {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4}}\n\n', 460)
    assert rec.feed(b"data: [DONE]\n\n", 500)
    assert (rec.t_first_ns, rec.t_end_ns) == (300, 500)
    assert rec.completion_tokens == 4 and rec.prompt_tokens == 5 and rec.finish_reason == "length"
    assert rec.output_chunks == 3 and rec.chunk_tokens == [1, 2, 4] and rec.token_ids == [9, 4, 5, 6]
    assert rec.chunk_ns == [250, 300, 400]  # arrival of each output chunk
    assert rec.text_fields()["text"] == "hi" and rec.text_fields()["reasoning"] == "hmm"
    assert rec.failure() is None


def test_tool_call_fragments_merge_and_count_as_first_output() -> None:
    rec = ChatRecorder()
    rec.feed(
        _chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "ls", "arguments": '{"p'}}]}), 10
    )
    rec.feed(_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '": 1}'}}]}), 20)
    assert rec.t_first_ns == 10
    assert rec.text_fields()["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"p": 1}'}}
    ]


def test_stream_without_done_or_usage_is_a_failure() -> None:
    rec = ChatRecorder()
    rec.feed(_chunk({"content": "x"}), 1)
    assert rec.failure() == "stream ended before [DONE]"
    rec.feed(b"data: [DONE]\n\n", 2)
    assert "usage" in (rec.failure() or "")
    err = ChatRecorder()
    err.feed(b'data: {"error": {"message": "engine died"}}\n\ndata: [DONE]\n\n', 3)
    assert err.failure() == "engine died"


def test_generate_t_first_is_first_increase_of_completion_tokens() -> None:
    rec = GenerateRecorder()

    def ev(text: str, ids: list[int], n: int, fin: dict | None = None) -> bytes:
        meta = {"prompt_tokens": 3, "completion_tokens": n, "finish_reason": fin}
        return f"data: {json.dumps({'text': text, 'output_ids': ids, 'meta_info': meta})}\n\n".encode()

    rec.feed(ev("", [], 0), 10)
    rec.feed(ev("a", [1], 1), 20)
    rec.feed(ev("a", [1], 1), 25)  # no increase: not an output chunk
    rec.feed(ev("abc", [1, 2, 3], 3, {"type": "length"}), 30)
    rec.feed(b"data: [DONE]\n\n", 40)
    assert (rec.t_first_ns, rec.t_end_ns, rec.completion_tokens) == (20, 40, 3)
    assert rec.chunk_tokens == [1, 3] and rec.output_chunks == 2 and rec.chunk_ns == [20, 30]
    assert rec.token_ids == [1, 2, 3] and rec.text_fields()["text"] == "abc" and rec.finish_reason == "length"
