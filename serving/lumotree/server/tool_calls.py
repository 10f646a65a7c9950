"""Streaming parser of Qwen-style tool calls into OpenAI `tool_calls` deltas.

The chat template renders a call as `<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>`. As
soon as the name is known the parser emits the call's header delta (index, id, name); the arguments
then stream as they are generated, minus what may still turn out to be the closing `}` and tag, so
the concatenated argument fragments are exactly ARGS as the model wrote it. A call whose JSON does not
have this shape is parsed when its closing tag arrives; one that is not valid JSON at all is passed
through as content, tags included. Whitespace between and after calls is dropped.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from enum import Enum

from lumotree.server.detokenizer import suffix_prefix_overlap

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
# the call's JSON up to the first character of its arguments value, in the template's key order
_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*(?=\S)')


@dataclass
class ToolCallDelta:
    """One OpenAI tool-call fragment: the first of a call carries id and name, later ones arguments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _strip_outer(text: str) -> str:
    """Arguments text without the call object's closing brace and the whitespace around it."""
    text = text.rstrip()
    return text[:-1].rstrip() if text.endswith("}") else text


class _State(Enum):
    TEXT = "text"
    HEADER = "header"  # inside <tool_call>, name not parsed yet
    ARGUMENTS = "arguments"  # streaming the arguments of the current call
    BETWEEN = "between"  # after </tool_call>: drop whitespace


class ToolCallParser:
    """Content text in, (content, tool-call deltas) out."""

    def __init__(self) -> None:
        self._state = _State.TEXT
        self._buf = ""
        self._calls = 0
        self._sent_args = ""  # argument text already emitted for the current call

    @property
    def num_calls(self) -> int:
        return self._calls

    def push(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        """Feed the next content text; return the content and tool-call fragments that are now final."""
        self._buf += text
        content: list[str] = []
        deltas: list[ToolCallDelta] = []
        while self._buf:
            if self._state is _State.BETWEEN:
                self._buf = self._buf.lstrip()
                if self._buf:
                    self._state = _State.TEXT
            elif self._state is _State.TEXT:
                at = self._buf.find(TOOL_OPEN)
                if at >= 0:
                    content.append(self._buf[:at])
                    self._buf, self._state = self._buf[at + len(TOOL_OPEN) :], _State.HEADER
                    continue
                keep = suffix_prefix_overlap(self._buf, TOOL_OPEN)
                content.append(self._buf[: len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep :]
                break
            elif self._state is _State.HEADER:
                m = _HEADER.match(self._buf)
                if m and (name := _json_string(m.group(1))) is not None:
                    deltas.append(self._open_call(name))
                    self._buf, self._state = self._buf[m.end() :], _State.ARGUMENTS
                    continue
                at = self._buf.find(TOOL_CLOSE)
                if at < 0:
                    break
                body, self._buf = self._buf[:at], self._buf[at + len(TOOL_CLOSE) :]
                parsed = _parse_call(body)
                if parsed is None:
                    content.append(TOOL_OPEN + body + TOOL_CLOSE)
                    self._state = _State.TEXT
                else:
                    deltas.append(self._open_call(parsed[0]))
                    deltas.append(ToolCallDelta(self._calls - 1, arguments=parsed[1]))
                    self._state = _State.BETWEEN
            else:
                at = self._buf.find(TOOL_CLOSE)
                if at >= 0:
                    deltas += self._arguments(_strip_outer(self._buf[:at]))
                    self._buf, self._state = self._buf[at + len(TOOL_CLOSE) :], _State.BETWEEN
                    continue
                ready = self._buf[: len(self._buf) - suffix_prefix_overlap(self._buf, TOOL_CLOSE)]
                deltas += self._arguments(_strip_outer(ready))
                break
        return "".join(content), deltas

    def flush(self) -> tuple[str, list[ToolCallDelta]]:
        """At the end of the output: an unclosed call ends with what it has; held text is content."""
        held, self._buf = self._buf, ""
        if self._state is _State.TEXT:
            return held, []
        if self._state is _State.HEADER:
            return TOOL_OPEN + held, []
        if self._state is _State.ARGUMENTS:
            return "", self._arguments(_strip_outer(held))
        return "", []

    def _open_call(self, name: str) -> ToolCallDelta:
        self._calls += 1
        self._sent_args = ""
        return ToolCallDelta(self._calls - 1, id=new_call_id(), name=name)

    def _arguments(self, text: str) -> list[ToolCallDelta]:
        # `text` is the whole argument text known so far; it always extends what was sent
        new = text[len(self._sent_args) :]
        if not new:
            return []
        self._sent_args = text
        return [ToolCallDelta(self._calls - 1, arguments=new)]


def _json_string(literal: str) -> str | None:
    try:
        return json.loads(literal)
    except json.JSONDecodeError:
        return None


def _parse_call(body: str) -> tuple[str, str] | None:
    """(name, arguments JSON text) of a call body in any key order, or None if it is not a call."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", {})
    return obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
