"""Request and response models of the HTTP API: OpenAI chat/completions (+ vLLM's extensions) and
SGLang's `/generate`.

Wrong types (strictly: `"stream": "yes"` is not a boolean, `"max_tokens": true` not an integer),
out-of-range values, NaN/infinity and text that is not valid Unicode (a lone UTF-16 surrogate, which
JSON can escape but no tokenizer can read) are rejected here (400 with the field's path). Sampling
values the request leaves unset fall back to the model's `generation_config.json`, as vLLM does.
Unknown request fields are ignored, as OpenAI-compatible servers do.
"""

from __future__ import annotations

import re
from contextvars import ContextVar
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator
from pydantic_core import PydanticCustomError

SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # the engine's coins take a 64-bit key
MAX_LOGPROBS = 20

Probability = Annotated[float, Field(ge=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
# vLLM allows (0, 2]; below 0.01 dividing the logits by it overflows float32 into NaN probabilities
RepetitionPenalty = Annotated[float, Field(ge=0.01, le=2.0)]
#: stop strings per request (each is matched against every output token)
MAX_STOP_STRINGS = 256
StopStrings = Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)]


#: the error type (and `ctx["field"]`, its path) of text that is not valid Unicode
INVALID_UNICODE = "invalid_unicode"
_SURROGATE = re.compile("[\ud800-\udfff]")


def escaped(text: str) -> str:
    """`text` with each lone surrogate written as its `\\udXXX` escape: an error that names a key
    holding one must still be valid UTF-8 itself."""
    return text.encode("utf-8", "backslashreplace").decode()


#: the error type of a body with more JSON values than the server's limit (`ctx["field"]`: the
#: top-level field holding the most of them)
TOO_MANY_VALUES = "too_many_values"
#: the most JSON values (objects, arrays, strings, numbers, ...) a request body may hold; set per request
#: by the server (`guards.RequestGuards`) from its context length; None: no limit
BODY_VALUES: ContextVar[int | None] = ContextVar("body_values", default=None)


def _scan(value: Any, limit: int | None) -> tuple[str | None, dict[str, int] | None]:
    """(dotted path of the first string or key holding a lone surrogate, keys on the path escaped;
    values per top-level field once more than `limit` values were seen, else None). Stops at the first
    of the two, so an oversized body costs no more than `limit` steps."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(value, ())]
    seen = 0
    per_field: dict[str, int] = {}
    while stack:
        item, path = stack.pop()
        seen += 1
        if path:
            per_field[path[0]] = per_field.get(path[0], 0) + 1
        if limit is not None and seen > limit:
            return None, per_field
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return (".".join(path) if path else "body"), None
        elif isinstance(item, dict | list):
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in pairs:
                if isinstance(key, str) and _SURROGATE.search(key):
                    return ".".join((*path, escaped(key))), None
                stack.append((child, (*path, str(key))))
    return None, None


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)


class _Request(_Body):
    """A whole request body: its text must be valid Unicode everywhere (the tokenizer reads it all), and
    it may hold at most `BODY_VALUES` JSON values (checked before any field is validated)."""

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        limit = BODY_VALUES.get()
        where, too_many = _scan(data, limit)
        if where is not None:
            raise PydanticCustomError(
                INVALID_UNICODE,
                "{field}: a lone surrogate (an unpaired \\uD800-\\uDFFF escape) is not valid Unicode text",
                {"field": where},
            )
        if too_many is not None:
            field = max(too_many, key=lambda k: too_many[k])
            raise PydanticCustomError(
                TOO_MANY_VALUES,
                "{field}: the request holds more than {limit} JSON values, this server's limit (4 per token "
                "of its context, and its vocabulary for logit_bias)",
                {"field": escaped(field), "limit": limit},
            )
        return data


class _Out(BaseModel):
    pass


# ----------------------------------------------------------------------------------------- requests


class StreamOptions(_Body):
    include_usage: bool = False
    #: vLLM's extension: cumulative usage on every chunk (replay records tokens per chunk from it)
    continuous_usage_stats: bool = False


class SamplingFields(_Request):
    """Sampling and stopping fields shared by chat and completions (OpenAI + vLLM extensions)."""

    temperature: float | None = Field(default=None, ge=0.0, description="0 = greedy")
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1, description="-1 or 0 = off")
    min_p: Probability | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    stop: str | StopStrings | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    n: int = Field(default=1, ge=1, description="only 1 is supported")
    stream: bool = False
    stream_options: StreamOptions | None = None
    #: vLLM's extension: token ids of the prompt and of each choice (streamed per chunk)
    return_token_ids: bool = False
    #: token id (a string, as in OpenAI's API) -> offset added to its logit, clamped to [-100, 100]
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    @property
    def include_usage(self) -> bool:
        """A final usage chunk (with the request's spec stats) ends the stream."""
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """Every chunk carries the cumulative usage."""
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)


class ContentPart(_Body):
    """One part of a list-valued message content. Only text parts can be served; others (image_url,
    input_audio, file, ...) are rejected with a 400 naming the part."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class FunctionCall(_Body):
    name: str
    arguments: str | dict[str, Any]


class ToolCall(_Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class FunctionDef(_Body):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class ResponseFormat(_Body):
    type: str


class ChatCompletionRequest(SamplingFields):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    response_format: ResponseFormat | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(SamplingFields):
    model: str | None = None
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    suffix: str | None = None


class GenerateSamplingParams(_Body):
    """SGLang's sampling parameters (`max_new_tokens`, `sampling_seed`, `top_k` -1 = off)."""

    max_new_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: Probability | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    sampling_seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    stop: str | StopStrings | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    n: int = Field(default=1, ge=1, description="only 1 is supported")


class GenerateRequest(_Request):
    """SGLang `/generate`: exactly one of `text` and `input_ids`."""

    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: GenerateSamplingParams = Field(default_factory=GenerateSamplingParams)
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = Field(default=0, ge=0, le=MAX_LOGPROBS)


class TokenizeRequest(_Request):
    """vLLM's `/tokenize`: a prompt, or chat messages rendered with the chat template."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    tools: list[Tool] | None = None
    add_generation_prompt: bool = True


# ---------------------------------------------------------------------------------------- responses


class SpecDecodeStats(_Out):
    """Per-request speculative-decoding counters (vLLM's metric meanings)."""

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_pos: list[int]


class PromptTokensDetails(_Out):
    cached_tokens: int


class Usage(_Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    spec_decode: SpecDecodeStats | None = None


class TopLogprob(_Out):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprobOut(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Out):
    content: list[TokenLogprobOut]


class FunctionCallOut(_Out):
    name: str
    arguments: str


class ToolCallOut(_Out):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class AssistantMessage(_Out):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning: str | None = None  # vLLM's current name; reasoning_content is the older one
    reasoning_content: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class ChatChoice(_Out):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None
    #: vLLM's: the stop string or stop_token_ids entry that ended the output (null for EOS and length)
    stop_reason: str | int | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(_Out):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None
    prompt_token_ids: list[int] | None = None


class FunctionDeltaOut(_Out):
    name: str | None = None
    arguments: str | None = None


class ToolCallDeltaOut(_Out):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDeltaOut


class ChatDeltaOut(_Out):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDeltaOut] | None = None


class _StreamedChoice(_Out):
    """A streamed choice as OpenAI and vLLM send it: `logprobs` and `finish_reason` always present
    (null until set; events are written without null fields otherwise), `stop_reason` on the last."""

    @model_serializer(mode="wrap")
    def _explicit_nulls(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        data.setdefault("logprobs", None)
        data.setdefault("finish_reason", None)
        if data["finish_reason"] is not None:
            data.setdefault("stop_reason", None)
        return data


class ChatChunkChoice(_StreamedChoice):
    index: int
    delta: ChatDeltaOut
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    token_ids: list[int] | None = None


class ChatCompletionChunk(_Out):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None  # on the last event, as vLLM sends it
    prompt_token_ids: list[int] | None = None


class CompletionLogprobs(_Out):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(_Out):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None
    stop_reason: str | int | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None


class CompletionChunkChoice(_StreamedChoice, CompletionChoice):
    pass


class CompletionResponse(_Out):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    system_fingerprint: str | None = None


class CompletionChunk(_Out):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class GenerateMetaInfo(_Out):
    id: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: dict[str, Any] | None
    spec_decode: SpecDecodeStats | None = None
    output_token_logprobs: list[list[Any]] | None = None
    output_top_logprobs: list[list[list[Any]]] | None = None


class GenerateResponse(_Out):
    text: str
    output_ids: list[int]
    meta_info: GenerateMetaInfo


class ModelCard(_Out):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "lumotree"
    root: str
    max_model_len: int


class ModelList(_Out):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(_Out):
    count: int
    max_model_len: int
    tokens: list[int]


class ErrorInfo(_Out):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(_Out):
    error: ErrorInfo
