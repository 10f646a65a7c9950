"""Streaming `<think>` and `<tool_call>` parsing: correct splits, and the same result however the text
is cut into pieces (the stream is parsed piece by piece, the whole answer in one go)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from lumotree.server.chat import ChatTextParser
from lumotree.server.reasoning import ReasoningParser
from lumotree.server.tool_calls import ToolCallParser

CALL = (
    '<tool_call>\n{"name": "read_file", "arguments": {"path": "kvstash/wal.py", "n": {"a": "}"}}}'
    "\n</tool_call>"
)
ANSWER = (
    "<think>\nI should read the file first.\n</think>\n\nLet me look.\n"
    + CALL
    + "\n"
    + CALL.replace("read_file", "grep")
)


def feed(parser: ChatTextParser, pieces: list[str]) -> dict:
    """Run pieces through a parser; return the joined reasoning, content and assembled tool calls."""
    reasoning, content, calls = [], [], {}
    for part in [*(parser.push(p) for p in pieces), parser.flush()]:
        reasoning.append(part.reasoning)
        content.append(part.content)
        for c in part.tool_calls:
            if c.id is not None:
                assert c.index not in calls, "a call's header is sent once"
                calls[c.index] = {"name": c.name, "arguments": ""}
            calls[c.index]["arguments"] += c.arguments
    return {"reasoning": "".join(reasoning), "content": "".join(content), "calls": calls}


def cut(text: str, sizes: list[int]) -> list[str]:
    pieces, pos = [], 0
    for s in sizes:
        pieces.append(text[pos : pos + s])
        pos += s
    return [*pieces, text[pos:]]


def test_reasoning_content_and_tool_calls_are_separated() -> None:
    out = feed(ChatTextParser(tools=True), [ANSWER])
    assert out["reasoning"] == "I should read the file first."
    assert out["content"] == "Let me look.\n"
    assert [c["name"] for c in out["calls"].values()] == ["read_file", "grep"]
    for c in out["calls"].values():
        assert json.loads(c["arguments"]) == {"path": "kvstash/wal.py", "n": {"a": "}"}}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 9), max_size=60))
def test_any_split_of_the_stream_gives_the_same_answer(sizes: list[int]) -> None:
    whole = feed(ChatTextParser(tools=True), [ANSWER])
    ids = {i: c["name"] for i, c in whole["calls"].items()}
    split = feed(ChatTextParser(tools=True), cut(ANSWER, sizes))
    assert split == whole and {i: c["name"] for i, c in split["calls"].items()} == ids


def test_tool_call_header_streams_before_the_arguments_end() -> None:
    parser = ToolCallParser()
    content, deltas = parser.push('Sure.\n<tool_call>\n{"name": "grep", "arguments": {"pattern": "de')
    assert content == "Sure.\n"
    assert [(d.index, d.name) for d in deltas] == [(0, "grep"), (0, None)]
    assert deltas[0].id and deltas[1].arguments == '{"pattern": "de'
    _, deltas = parser.push('f"}}\n</tool')
    assert "".join(d.arguments for d in deltas) == 'f"}'  # the last brace may be the call object's
    _, deltas = parser.push("_call>")
    assert deltas == [] and parser.num_calls == 1


def test_invalid_tool_call_json_passes_through_as_content() -> None:
    text = "<tool_call>\nnot json at all\n</tool_call> after"
    out = feed(ChatTextParser(tools=True), cut(text, [3, 5, 7]))
    assert out["content"] == text and out["calls"] == {}


def test_tool_call_in_another_key_order_is_parsed_at_its_end() -> None:
    out = feed(ChatTextParser(tools=True), ['<tool_call>{"arguments": {"x": 1}, "name": "f"}</tool_call>'])
    assert out["calls"] == {0: {"name": "f", "arguments": '{"x": 1}'}} and out["content"] == ""


def test_unfinished_tool_call_ends_with_what_was_generated() -> None:
    out = feed(ChatTextParser(tools=True), ['<tool_call>\n{"name": "grep", "arguments": {"pattern": "x'])
    assert out["calls"] == {0: {"name": "grep", "arguments": '{"pattern": "x'}}


def test_tool_markup_is_content_when_tools_are_off() -> None:
    out = feed(ChatTextParser(tools=False), [CALL])
    assert out["content"] == CALL and out["calls"] == {}


def test_output_without_think_is_all_content() -> None:
    parser = ReasoningParser()
    assert parser.push("  plain <think> later") == ("", "  plain <think> later")
    assert parser.flush() == ("", "")


def test_truncated_reasoning_stays_reasoning() -> None:
    parser = ReasoningParser()
    assert parser.push("<think>\nhalf a thou") == ("half a thou", "")
    assert parser.push("ght </thi") == ("ght", "")
    assert parser.flush() == (" </thi", "")


def test_partial_think_tag_is_held_until_decided() -> None:
    parser = ReasoningParser()
    assert parser.push("\n<thi") == ("", "")
    assert parser.push("nk>r</think>c") == ("r", "c")
