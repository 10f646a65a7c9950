"""Stream recorders: turn the SSE events of one response into the timing and token fields of a row.

Timing follows DESIGN §6 on `time.monotonic_ns()` taken when a network read returns:
- chat completions: t_first = the first event whose delta carries non-empty content, reasoning
  (`reasoning_content` or `reasoning`) or tool calls (role-only and empty chunks do not count);
- SGLang `/generate`: t_first = the first event whose `meta_info.completion_tokens` increases;
- t_end = the read that completes the stream (`[DONE]`).
The completion-token count n comes from the server (chat: `usage`; generate: `meta_info`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from lumobench.sse import SSEParser

DONE = "[DONE]"
# a JSON escape of a UTF-16 surrogate: paired ones decode to one character, a lone one to a str that
# has no UTF-8 form (it could not be written to requests.jsonl)
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _valid_unicode(value: Any) -> Any:
    """`value` with every lone surrogate in its strings replaced by U+FFFD."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_valid_unicode(k): _valid_unicode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_valid_unicode(v) for v in value]
    return value


#: the largest token count a server may report (no context holds a billion tokens): larger, negative
#: or non-integer counts fail the row instead of entering the rates
MAX_TOKEN_COUNT = 10**9


class BadEvent(ValueError):
    """An event whose JSON does not have its API's shape (a wrong type, an impossible count)."""


def _kind(value: Any) -> str:
    return (
        "null"
        if value is None
        else {bool: "a boolean", str: "a string", list: "an array", dict: "an object"}.get(
            type(value), "a number"
        )
    )


def _field(obj: dict[str, Any], key: str, kind: type, where: str) -> Any:
    """obj[key] when it is `kind` (None when absent or null); BadEvent otherwise."""
    value = obj.get(key)
    if value is None or (isinstance(value, kind) and not isinstance(value, bool)):
        return value
    raise BadEvent(f"{where}{key} is {_kind(value)}, not {_kind(kind())}")


def _count(obj: dict[str, Any], key: str, where: str) -> int | None:
    """A token count: an integer in [0, MAX_TOKEN_COUNT] (None when absent)."""
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKEN_COUNT:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
        raise BadEvent(f"{where}{key} is not a token count (0 to {MAX_TOKEN_COUNT}): {shown}")
    return value


def _token_ids(obj: dict[str, Any], key: str, where: str) -> list[int] | None:
    ids = _field(obj, key, list, where)
    if ids is not None and not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
        raise BadEvent(f"{where}{key} holds something other than token ids")
    return ids


class StreamRecorder:
    """Base: feeds raw reads through the SSE parser and keeps the per-request observations."""

    def __init__(self) -> None:
        self.parser = SSEParser()
        self.t_first_ns: int | None = None
        self.t_end_ns: int | None = None
        self.chunks = 0
        self.output_chunks = 0
        self.chunk_tokens: list[int] = []
        self.chunk_ns: list[int] = []  # arrival of each output chunk (the ITL gaps of vLLM's bench)
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.finish_reason: str | None = None
        self.token_ids: list[int] = []
        self.error: str | None = None
        self.done = False

    def feed(self, read: bytes, t_ns: int) -> bool:
        """Consume one network read that arrived at `t_ns`; return True once the stream is complete."""
        for event in self.parser.feed(read):
            if event.data == DONE:
                self.done = True
                self.t_end_ns = t_ns
                return True
            self.chunks += 1
            try:
                obj = json.loads(event.data)
            except (json.JSONDecodeError, RecursionError, ValueError):
                self.error = f"event {self.chunks} is not JSON: {event.data[:120]!r}"
                continue
            if _ESCAPED_SURROGATE.search(event.data):
                obj = _valid_unicode(obj)
            if not isinstance(obj, dict):
                self.error = f"event {self.chunks} is {_kind(obj)}, not a JSON object: {event.data[:120]!r}"
                continue
            if "error" in obj:
                err = obj["error"]
                self.error = str(err.get("message", err) if isinstance(err, dict) else err)
                continue
            try:
                self.on_event(obj, t_ns)
            except BadEvent as exc:  # the row fails naming the field; the stream is still read to its end
                self.error = self.error or f"event {self.chunks}: {exc}"
        return False

    def on_event(self, obj: dict[str, Any], t_ns: int) -> None:
        raise NotImplementedError

    def failure(self) -> str | None:
        """Why the stream does not count as completed, or None."""
        if self.error:
            return self.error
        if not self.done:
            return "stream ended before [DONE]"
        if self.completion_tokens is None:
            return "the server reported no completion-token usage"
        return None

    def text_fields(self) -> dict[str, Any]:
        raise NotImplementedError


class ChatRecorder(StreamRecorder):
    """OpenAI `chat.completion.chunk` events (vLLM, SGLang, LumoTree)."""

    def __init__(self) -> None:
        super().__init__()
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._tool_calls: dict[int, dict[str, Any]] = {}

    def on_event(self, obj: dict[str, Any], t_ns: int) -> None:
        usage = _field(obj, "usage", dict, "")
        new_tokens = False
        if usage:
            prompt = _count(usage, "prompt_tokens", "usage.")
            self.prompt_tokens = self.prompt_tokens if prompt is None else prompt
            count = _count(usage, "completion_tokens", "usage.")
            if count is not None:
                new_tokens = count > (self.completion_tokens or 0)
                self.completion_tokens = count
        visible = False
        choices = _field(obj, "choices", list, "") or []
        for i, choice in enumerate(choices):
            where = f"choices[{i}]."
            if not isinstance(choice, dict):
                raise BadEvent(f"choices[{i}] is {_kind(choice)}, not an object")
            delta = _field(choice, "delta", dict, where) or {}
            if content := _field(delta, "content", str, where + "delta."):
                self._text.append(content)
                visible = True
            reasoning = _field(delta, "reasoning_content", str, where + "delta.") or _field(
                delta, "reasoning", str, where + "delta."
            )
            if reasoning:
                self._reasoning.append(reasoning)
                visible = True
            if calls := _field(delta, "tool_calls", list, where + "delta."):
                self._merge_tool_calls(calls, where + "delta.tool_calls")
                visible = True
            if ids := _token_ids(choice, "token_ids", where):
                self.token_ids.extend(ids)
                new_tokens = True
            if reason := _field(choice, "finish_reason", str, where):
                self.finish_reason = reason
        if visible and self.t_first_ns is None:
            self.t_first_ns = t_ns
        if visible or (new_tokens and choices):
            self.output_chunks += 1
            self.chunk_ns.append(t_ns)
            if usage and usage.get("completion_tokens") is not None:
                self.chunk_tokens.append(usage["completion_tokens"])

    def _merge_tool_calls(self, calls: list[Any], where: str) -> None:
        # streamed tool calls arrive as fragments keyed by index; arguments are concatenated
        for i, frag in enumerate(calls):
            if not isinstance(frag, dict):
                raise BadEvent(f"{where}[{i}] is {_kind(frag)}, not an object")
            index = _field(frag, "index", int, f"{where}[{i}].")
            fn = _field(frag, "function", dict, f"{where}[{i}].") or {}
            call_id = _field(frag, "id", str, f"{where}[{i}].")
            name = _field(fn, "name", str, f"{where}[{i}].function.")
            arguments = _field(fn, "arguments", str, f"{where}[{i}].function.")
            slot = self._tool_calls.setdefault(
                len(self._tool_calls) if index is None else index,
                {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
            )
            slot["id"] = call_id or slot["id"]
            slot["function"]["name"] += name or ""
            slot["function"]["arguments"] += arguments or ""

    def text_fields(self) -> dict[str, Any]:
        return {
            "text": "".join(self._text),
            "reasoning": "".join(self._reasoning),
            "tool_calls": [self._tool_calls[i] for i in sorted(self._tool_calls)] or None,
        }


class GenerateRecorder(StreamRecorder):
    """SGLang `/generate` events: `text`, `output_ids` and cumulative `meta_info.completion_tokens`."""

    def __init__(self) -> None:
        super().__init__()
        self._text = ""

    def on_event(self, obj: dict[str, Any], t_ns: int) -> None:
        meta = _field(obj, "meta_info", dict, "") or {}
        prompt = _count(meta, "prompt_tokens", "meta_info.")
        self.prompt_tokens = self.prompt_tokens if prompt is None else prompt
        count = _count(meta, "completion_tokens", "meta_info.")
        if count is not None and count > (self.completion_tokens or 0):
            if self.t_first_ns is None:
                self.t_first_ns = t_ns
            self.output_chunks += 1
            self.chunk_ns.append(t_ns)
            self.chunk_tokens.append(count)
        if count is not None:
            self.completion_tokens = count
        # SGLang streams cumulative text/ids unless started with incremental output; ids whose length
        # equals the cumulative count are cumulative, otherwise they are the new tokens only
        text, ids = _field(obj, "text", str, "") or "", _token_ids(obj, "output_ids", "")
        if ids is None:
            cumulative = text.startswith(self._text)
        else:
            cumulative = count is not None and len(ids) == count
            self.token_ids = list(ids) if cumulative else self.token_ids + list(ids)
        self._text = text if cumulative else self._text + text
        reason = meta.get("finish_reason")
        if isinstance(reason, dict):
            reason = _field(reason, "type", str, "meta_info.finish_reason.")
        elif reason is not None and not isinstance(reason, str):
            raise BadEvent(f"meta_info.finish_reason is {_kind(reason)}, not an object or a string")
        if reason:
            self.finish_reason = reason

    def text_fields(self) -> dict[str, Any]:
        return {"text": self._text, "reasoning": "", "tool_calls": None}
