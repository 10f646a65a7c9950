"""`POST /v1/chat/completions`: prompt rendering with the chat template, and the streamed or whole answer
with `<think>` reasoning as `reasoning` (vLLM's current name) and `reasoning_content` (its older one),
and `<tool_call>` blocks as OpenAI `tool_calls`.

Streams follow vLLM 0.32: the role chunk goes out with the first output (after prefill, so a
client's time to first token includes it), every choice carries `logprobs` and `finish_reason`
(null until set), the last one `stop_reason`, each chunk holds one `tool_calls` entry per call index,
and `system_fingerprint` rides on the last event."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from lumotree.engine.sequence import GenerationRequest
from lumotree.server.context import ServingContext, new_id
from lumotree.server.errors import bad_request
from lumotree.server.generation import EngineFailure, OutputDelta, TextOptions
from lumotree.server.outputs import chat_logprobs, stop_reason, usage
from lumotree.server.params import SamplingInput, build_request
from lumotree.server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDeltaOut,
    ChatLogprobs,
    ChatMessage,
    FunctionCallOut,
    FunctionDeltaOut,
    TokenLogprobOut,
    ToolCallDeltaOut,
    ToolCallOut,
)
from lumotree.server.reasoning import ReasoningParser
from lumotree.server.sse import DONE, sse_event, stream_error
from lumotree.server.tokenizer import ChatTemplateError
from lumotree.server.tool_calls import ToolCallDelta, ToolCallParser


@dataclass
class ChatDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)

    def __add__(self, other: ChatDelta) -> ChatDelta:
        return ChatDelta(
            self.reasoning + other.reasoning, self.content + other.content, self.tool_calls + other.tool_calls
        )


class ChatTextParser:
    """Output text -> reasoning, content and tool-call fragments (tool calls only when tools are on)."""

    def __init__(self, tools: bool) -> None:
        self._reasoning = ReasoningParser()
        self._tools = ToolCallParser() if tools else None

    @property
    def num_tool_calls(self) -> int:
        return self._tools.num_calls if self._tools else 0

    def push(self, text: str) -> ChatDelta:
        reasoning, content = self._reasoning.push(text)
        return self._split(reasoning, content, final=False)

    def feed(self, text: str, last: bool) -> ChatDelta:
        """`push(text)`, and on the output's last text also what the parsers held back."""
        return self.push(text) + self.flush() if last else self.push(text)

    def flush(self) -> ChatDelta:
        reasoning, content = self._reasoning.flush()
        return self._split(reasoning, content, final=True)

    def _split(self, reasoning: str, content: str, final: bool) -> ChatDelta:
        if self._tools is None:
            return ChatDelta(reasoning, content)
        content, calls = self._tools.push(content)
        if final:
            tail, more = self._tools.flush()
            content, calls = content + tail, calls + more
        return ChatDelta(reasoning, content, calls)


def _check_text_parts(messages: list[ChatMessage], model: str) -> None:
    """400 for a content part this text-only server cannot read (image_url, input_audio, file, ...)."""
    for i, m in enumerate(messages):
        for j, part in enumerate(m.content if isinstance(m.content, list) else ()):
            where = f"messages[{i}].content[{j}]"
            if part.type != "text":
                raise bad_request(
                    f"{where}: content part type {part.type!r} is not supported: {model} reads text only",
                    f"messages.{i}.content.{j}.type",
                )
            if part.text is None:
                raise bad_request(f"{where}: a text part needs 'text'", f"messages.{i}.content.{j}.text")


def _template_message(m: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role}
    if isinstance(m.content, list):
        out["content"] = [{"type": "text", "text": p.text} for p in m.content]
    else:
        out["content"] = m.content
    if m.tool_calls:
        out["tool_calls"] = [c.model_dump(exclude_none=True) for c in m.tool_calls]
    if reasoning := m.reasoning_content or m.reasoning:
        out["reasoning_content"] = reasoning
    for key in ("name", "tool_call_id"):
        if getattr(m, key) is not None:
            out[key] = getattr(m, key)
    return out


def chat_prompt_ids(ctx: ServingContext, req: ChatCompletionRequest) -> list[int]:
    """The prompt token ids of a chat request (400 for what this server cannot honour)."""
    if req.tool_choice == "required" or (
        req.tool_choice is not None and not isinstance(req.tool_choice, str)
    ):
        raise bad_request(
            "tool_choice 'required' or a named function needs constrained decoding, which this server "
            "does not do; use 'auto' or 'none'",
            "tool_choice",
        )
    if req.response_format is not None and req.response_format.type != "text":
        raise bad_request("only response_format {'type': 'text'} is supported", "response_format")
    _check_text_parts(req.messages, ctx.model_name)
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    try:
        text = ctx.tokenizer.render_chat(
            [_template_message(m) for m in req.messages],
            tools,
            req.add_generation_prompt,
            req.chat_template_kwargs,
        )
    except ChatTemplateError as exc:
        raise bad_request(str(exc), "messages") from None
    return ctx.prompt_ids(text, "messages")


def prepare_chat(ctx: ServingContext, req: ChatCompletionRequest) -> tuple[GenerationRequest, TextOptions]:
    ctx.check_model(req.model)
    k = (req.top_logprobs or 0) if req.logprobs else None
    return build_request(
        new_id("chatcmpl"),
        chat_prompt_ids(ctx, req),
        SamplingInput.from_openai(req),
        ctx.limits,
        logprobs=k,
        prompt_field="messages",
    )


def _tools_on(req: ChatCompletionRequest) -> bool:
    return bool(req.tools) and req.tool_choice != "none"


def _no_output(d: OutputDelta) -> OutputDelta:
    """`d`'s counts before its tokens: the usage of the role chunk (0 completion tokens, as vLLM)."""
    return dataclasses.replace(d, token_ids=[], text="", num_output_tokens=0)


def _finish(reason: str | None, parser: ChatTextParser) -> str | None:
    return "tool_calls" if reason == "stop" and parser.num_tool_calls else reason


def _tool_deltas_out(calls: list[ToolCallDelta]) -> list[ToolCallDeltaOut] | None:
    """The chunk's tool-call fragments, one entry per call index (a call's header and the argument
    text that came with it merge): clients that read `tool_calls[0]` see the whole chunk's part."""
    merged: dict[int, ToolCallDeltaOut] = {}
    for d in calls:
        if (out := merged.get(d.index)) is not None:
            out.function.arguments = (out.function.arguments or "") + d.arguments
            continue
        header = d.id is not None
        merged[d.index] = ToolCallDeltaOut(
            index=d.index,
            id=d.id,
            type="function" if header else None,
            function=FunctionDeltaOut(name=d.name if header else None, arguments=d.arguments),
        )
    return list(merged.values()) or None


async def chat_stream(
    ctx: ServingContext, req: ChatCompletionRequest, gen: GenerationRequest, opts: TextOptions
) -> AsyncIterator[bytes]:
    """SSE events of a streamed chat completion; engine failures end the stream with an error event."""
    created = int(time.time())
    continuous = req.continuous_usage
    parser = ChatTextParser(_tools_on(req))

    def chunk(
        choice: ChatChunkChoice | None,
        d: OutputDelta | None = None,
        final: bool = False,
        first: bool = False,
        last_event: bool = False,
    ) -> bytes:
        return sse_event(
            ChatCompletionChunk(
                id=gen.request_id,
                created=created,
                model=ctx.model_name,
                choices=[choice] if choice else [],
                usage=usage(d, final) if d is not None else None,
                system_fingerprint=ctx.system_fingerprint if last_event else None,
                prompt_token_ids=gen.prompt_token_ids if first and req.return_token_ids else None,
            )
        )

    head = b""  # the role chunk, sent with the first output as vLLM does
    last: OutputDelta | None = None
    try:
        async with contextlib.aclosing(ctx.output(gen, opts)) as deltas:
            async for d in deltas:
                if last is None:
                    role = ChatChunkChoice(index=0, delta=ChatDeltaOut(role="assistant", content=""))
                    head = chunk(role, _no_output(d) if continuous else None, first=True)
                last = d
                parsed = parser.feed(d.text, d.finished)
                lps = (
                    chat_logprobs(ctx.tokenizer, d.logprobs)
                    if d.logprobs is not None and d.token_ids
                    else None
                )
                extras = lps is not None or (req.return_token_ids and d.token_ids) or continuous
                if not (parsed or d.finished or extras):
                    continue
                reason = _finish(d.finish_reason, parser)
                choice = ChatChunkChoice(
                    index=0,
                    delta=ChatDeltaOut(
                        content=parsed.content or None,
                        reasoning=parsed.reasoning or None,
                        reasoning_content=parsed.reasoning or None,
                        tool_calls=_tool_deltas_out(parsed.tool_calls),
                    ),
                    logprobs=ChatLogprobs(content=lps) if lps is not None else None,
                    finish_reason=reason,
                    stop_reason=stop_reason(d, gen),
                    token_ids=d.token_ids if req.return_token_ids else None,
                )
                closing = reason is not None and not req.include_usage
                yield head + chunk(choice, d if continuous else None, last_event=closing)
                head = b""
    except EngineFailure as exc:
        yield head + stream_error(exc)
        yield DONE
        return
    if req.include_usage and last is not None:
        yield head + chunk(None, last, final=True, last_event=True)
    yield DONE


async def chat_full(
    ctx: ServingContext, req: ChatCompletionRequest, gen: GenerationRequest, opts: TextOptions
) -> ChatCompletionResponse:
    """The whole chat completion (raises EngineFailure)."""
    parser = ChatTextParser(_tools_on(req))
    reasoning, content, ids = [], [], []
    calls: dict[int, ToolCallOut] = {}
    lps: list[TokenLogprobOut] = []
    last: OutputDelta | None = None
    async for d in ctx.output(gen, opts):
        last = d
        ids += d.token_ids
        if d.logprobs is not None:
            lps += chat_logprobs(ctx.tokenizer, d.logprobs)
        part = parser.feed(d.text, d.finished)
        reasoning.append(part.reasoning)
        content.append(part.content)
        for c in part.tool_calls:
            if c.id is not None:
                calls[c.index] = ToolCallOut(
                    id=c.id, function=FunctionCallOut(name=c.name or "", arguments="")
                )
            calls[c.index].function.arguments += c.arguments
    assert last is not None  # stream_output raises unless it yielded a finished delta
    text = "".join(content)
    message = AssistantMessage(
        content=text if text or not calls else None,
        reasoning="".join(reasoning) or None,
        reasoning_content="".join(reasoning) or None,
        tool_calls=[calls[i] for i in sorted(calls)] or None,
    )
    return ChatCompletionResponse(
        id=gen.request_id,
        created=int(time.time()),
        model=ctx.model_name,
        choices=[
            ChatChoice(
                index=0,
                message=message,
                logprobs=ChatLogprobs(content=lps) if gen.logprobs is not None else None,
                finish_reason=_finish(last.finish_reason, parser),
                stop_reason=stop_reason(last, gen),
                token_ids=ids if req.return_token_ids else None,
            )
        ],
        usage=usage(last, final=True),
        system_fingerprint=ctx.system_fingerprint,
        prompt_token_ids=gen.prompt_token_ids if req.return_token_ids else None,
    )
