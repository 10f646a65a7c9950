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
            if isinstance(obj, dict) and "error" in obj:
                err = obj["error"]
                self.error = str(err.get("message", err) if isinstance(err, dict) else err)
                continue
            self.on_event(obj, t_ns)
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
        usage = obj.get("usage")
        new_tokens = False
        if usage:
            self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
            count = usage.get("completion_tokens")
            if count is not None:
                new_tokens = count > (self.completion_tokens or 0)
                self.completion_tokens = count
        visible = False
        for choice in obj.get("choices") or ():
            delta = choice.get("delta") or {}
            if content := delta.get("content"):
                self._text.append(content)
                visible = True
            if reasoning := delta.get("reasoning_content") or delta.get("reasoning"):
                self._reasoning.append(reasoning)
                visible = True
            if calls := delta.get("tool_calls"):
                self._merge_tool_calls(calls)
                visible = True
            if ids := choice.get("token_ids"):
                self.token_ids.extend(ids)
                new_tokens = True
            if reason := choice.get("finish_reason"):
                self.finish_reason = reason
        if visible and self.t_first_ns is None:
            self.t_first_ns = t_ns
        if visible or (new_tokens and obj.get("choices")):
            self.output_chunks += 1
            self.chunk_ns.append(t_ns)
            if usage and usage.get("completion_tokens") is not None:
                self.chunk_tokens.append(usage["completion_tokens"])

    def _merge_tool_calls(self, calls: list[dict[str, Any]]) -> None:
        # streamed tool calls arrive as fragments keyed by index; arguments are concatenated
        for frag in calls:
            slot = self._tool_calls.setdefault(
                frag.get("index", len(self._tool_calls)),
                {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
            )
            slot["id"] = frag.get("id") or slot["id"]
            fn = frag.get("function") or {}
            slot["function"]["name"] += fn.get("name") or ""
            slot["function"]["arguments"] += fn.get("arguments") or ""

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
        meta = obj.get("meta_info") or {}
        self.prompt_tokens = meta.get("prompt_tokens", self.prompt_tokens)
        count = meta.get("completion_tokens")
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
        text, ids = obj.get("text") or "", obj.get("output_ids")
        if ids is None:
            cumulative = text.startswith(self._text)
        else:
            cumulative = count is not None and len(ids) == count
            self.token_ids = list(ids) if cumulative else self.token_ids + list(ids)
        self._text = text if cumulative else self._text + text
        reason = meta.get("finish_reason")
        if reason:
            self.finish_reason = reason.get("type") if isinstance(reason, dict) else str(reason)

    def text_fields(self) -> dict[str, Any]:
        return {"text": self._text, "reasoning": "", "tool_calls": None}
