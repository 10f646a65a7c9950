"""Request corpora: the typed record schema (DESIGN §6), the JSONL loader and per-record hashing.

A corpus is a JSONL file, one `CorpusRecord` per line: an OpenAI chat request (messages with tool calls
and tool results, tool definitions, sampling parameters) plus an `id`, optional prompt `input_ids`
(for SGLang-style `/generate` replay) and optional `source` (where it was captured).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from lumobench.errors import LumobenchError

#: Sampling fields copied verbatim into every replayed request (OpenAI names plus the vLLM/SGLang
#: extensions top_k, min_p, repetition_penalty).
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "max_tokens",
    "seed",
    "ignore_eos",
)


#: deepest nesting of arrays and objects in one record (a tool's JSON schema needs a few levels)
MAX_DEPTH = 64
#: the largest max_tokens a record may ask for: no model's context holds more than 10M tokens
MAX_TOKENS = 10_000_000
#: request fields replay sets itself (or a record's own fields set): an `extra_body` may not replace them
REPLAY_FIELDS = frozenset(
    {"model", "messages", "stream", "stream_options", "n", "tools", "tool_choice", "input_ids", "text"}
    | {"sampling_params", "max_completion_tokens", *SAMPLING_FIELDS}
)
#: the seeds servers take: a 64-bit key, signed or not (vLLM, SGLang, LumoTree)
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")


class _Strict(BaseModel):
    # strict: a value is sent as it is written, so `max_tokens: true` or `"temperature": "0.5"` are
    # errors rather than silently converted; NaN/Infinity are not JSON numbers
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class FunctionCall(_Strict):
    name: str = Field(min_length=1)
    arguments: str  # JSON text, exactly as the model emitted it


class ToolCall(_Strict):
    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCall


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    """One OpenAI chat message; assistant turns may carry tool calls, tool turns answer one of them."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    @model_validator(mode="after")
    def _role_rules(self) -> Message:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        if self.role != "assistant" and (self.tool_calls or self.reasoning_content):
            raise ValueError("only assistant messages carry tool_calls or reasoning_content")
        if self.role != "tool" and self.tool_call_id is not None:
            raise ValueError("only tool messages carry tool_call_id")
        if self.content is None and not self.tool_calls:
            raise ValueError("content is required unless the message carries tool_calls")
        return self


class FunctionDef(_Strict):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"] = "function"
    function: FunctionDef


class ToolName(_Strict):
    name: str = Field(min_length=1)


class NamedToolChoice(_Strict):
    """OpenAI's `{"type": "function", "function": {"name": ...}}`: call this tool."""

    type: Literal["function"]
    function: ToolName


class Source(BaseModel):
    """Where a record was captured; extra keys (capture time, arm, ...) are kept as given."""

    model_config = ConfigDict(extra="allow", strict=True)

    task: str | None = None
    conversation: str | None = None
    turn: int | None = Field(default=None, ge=0)


class CorpusRecord(_Strict):
    """One replayable request. Unknown top-level keys are rejected so typos surface as errors."""

    id: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0, le=2)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    #: generate max_tokens whatever the model says (vLLM's and SGLang's ignore_eos: speed work)
    ignore_eos: bool | None = None
    input_ids: list[Annotated[int, Field(ge=0)]] | None = None
    source: Source | None = None
    #: engine-specific request fields merged into the body as given (e.g. chat_template_kwargs)
    extra_body: dict[str, Any] | None = None

    @field_validator("id")
    @classmethod
    def _sendable_id(cls, rid: str) -> str:
        # replay sends the id in the X-Request-Id header: no control characters, no blank ids, and no
        # surrounding whitespace (HTTP clients strip it, so the server would see another id)
        if not rid.strip():
            raise ValueError("the id is blank")
        if rid != rid.strip():
            raise ValueError("the id starts or ends with whitespace")
        if not rid.isprintable():
            raise ValueError("the id contains control characters (it is sent in an HTTP header)")
        return rid

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _one_of_openais_forms(cls, choice: Any) -> Any:
        # checked whole, so a wrong value is one issue rather than one per member of the union
        if choice is None or (isinstance(choice, str) and choice in ("none", "auto", "required")):
            return choice
        function = choice.get("function") if isinstance(choice, dict) else None
        if (
            isinstance(choice, dict)
            and set(choice) == {"type", "function"}
            and choice["type"] == "function"
            and isinstance(function, dict)
            and set(function) == {"name"}
            and isinstance(function["name"], str)
            and function["name"]
        ):
            return choice
        raise ValueError(
            'must be \'none\', \'auto\', \'required\' or {"type": "function", "function": {"name": NAME}}'
        )

    @field_validator("extra_body")
    @classmethod
    def _adds_fields_only(cls, extra: dict[str, Any] | None) -> dict[str, Any] | None:
        if taken := sorted(REPLAY_FIELDS & set(extra or {})):
            raise ValueError(
                f"extra_body may not set {', '.join(taken)}: replay sends "
                + ("it" if len(taken) == 1 else "them")
                + " from the record's own fields"
            )
        return extra

    @model_validator(mode="after")
    def _tool_results_answer_calls(self) -> CorpusRecord:
        called: set[str] = set()
        for i, msg in enumerate(self.messages):
            for call in msg.tool_calls or ():
                called.add(call.id)
            if msg.role == "tool" and msg.tool_call_id not in called:
                raise ValueError(
                    f"messages.{i}: tool_call_id {msg.tool_call_id!r} answers no earlier tool call"
                )
        return self

    @property
    def is_deterministic(self) -> bool:
        """Greedy or seeded: a lossless server must give the same output under every drafter."""
        return self.temperature == 0 or self.seed is not None

    @property
    def is_greedy(self) -> bool:
        """temperature 0, set explicitly (unset, the server's default applies, which may sample)."""
        return self.temperature == 0

    def sampling(self) -> dict[str, Any]:
        """The sampling fields this record sets (unset ones are left to the server's defaults)."""
        return {k: getattr(self, k) for k in SAMPLING_FIELDS if getattr(self, k) is not None}


@dataclass(frozen=True)
class RecordIssue:
    """One problem in a corpus file: 1-based line number, the field path (or '' for the line) and why."""

    line: int
    field: str
    message: str
    record_id: str | None = None

    def __str__(self) -> str:
        rid = self.record_id
        shown = rid if rid is None or rid.isprintable() else ascii(rid)  # one line, whatever the id holds
        where = f"line {self.line}" + (f" (id {shown})" if rid else "")
        field = self.field if self.field.isprintable() else ascii(self.field)  # a key may hold a newline
        return f"{where}: {field + ': ' if field else ''}{self.message}"


class CorpusError(LumobenchError):
    """The corpus has invalid records; `issues` lists every one of them."""

    def __init__(self, path: Path, issues: Sequence[RecordIssue]) -> None:
        self.path = path
        self.issues = list(issues)
        first = self.issues[0]
        more = (
            f" (and {len(self.issues) - 1} more; run `lumobench corpus check {path}`)"
            if len(issues) > 1
            else ""
        )
        super().__init__(f"{path}: {first}{more}")


def _field_path(loc: tuple[Any, ...]) -> str:
    # pydantic puts union-member and validator names into loc; keep only the data path
    parts = [str(p) for p in loc if isinstance(p, int) or not any(c in str(p) for c in "[]()'")]
    return ".".join(parts)


def _parse_line(raw: bytes, first: bool) -> Any:
    """One line's JSON value; raises ValueError with a one-line reason."""
    try:
        text = raw.decode("utf-8-sig" if first else "utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at position {exc.start})") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"not valid JSON (nested too deeply; at most {MAX_DEPTH} levels)") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc})") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise ValueError(f"not valid JSON ({str(exc).split(':')[0]})") from None


def _unsendable(value: Any) -> tuple[str, str] | None:
    """(field path, why) of the first part of a parsed line that replay cannot send or hash: nesting
    deeper than MAX_DEPTH, a lone surrogate (no UTF-8 form), NaN or Infinity (not JSON)."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if found := _SURROGATE.search(item):
                code = ord(found.group())
                return ".".join(path), f"lone surrogate U+{code:04X} (text must be valid Unicode)"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return ".".join(path), f"{item} is not a JSON number"
        elif isinstance(item, dict | list):
            if len(path) >= MAX_DEPTH:  # named by the top-level field: the full path is 64 parts long
                return path[0], f"nested deeper than {MAX_DEPTH} levels"
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in reversed(list(pairs)):
                if isinstance(key, str) and _SURROGATE.search(key):
                    return ".".join(path), "a key holds a lone surrogate (text must be valid Unicode)"
                stack.append((child, (*path, str(key))))
    return None


def check_corpus(path: Path) -> tuple[list[CorpusRecord], list[RecordIssue]]:
    """Parse and validate every line of a JSONL corpus; return the valid records and every issue found.

    A record is valid exactly when replay can send it: strict types, the servers' value ranges, an id
    that fits an HTTP header, valid Unicode, finite numbers, bounded nesting.
    """
    try:
        raw_lines = path.read_bytes().split(b"\n")
    except OSError as exc:
        raise LumobenchError(f"cannot read corpus {path}: {exc.strerror or exc}") from None
    records: list[CorpusRecord] = []
    issues: list[RecordIssue] = []
    seen: dict[str, int] = {}
    for lineno, raw in enumerate(raw_lines, start=1):
        if not raw.strip():
            continue
        try:
            obj = _parse_line(raw, lineno == 1)
        except ValueError as exc:
            issues.append(RecordIssue(lineno, "", str(exc)))
            continue
        rid = obj.get("id") if isinstance(obj, dict) and isinstance(obj.get("id"), str) else None
        if bad := _unsendable(obj):
            issues.append(RecordIssue(lineno, *bad, rid))
            continue
        try:
            record = CorpusRecord.model_validate(obj)
        except ValidationError as exc:
            for err in exc.errors():
                # our own validators' reasons without pydantic's "Value error, " prefix
                why = str(err["ctx"]["error"]) if err["type"] == "value_error" else err["msg"]
                issues.append(RecordIssue(lineno, _field_path(err["loc"]), why, rid))
            continue
        if record.id in seen:
            issues.append(RecordIssue(lineno, "id", f"duplicate id (first on line {seen[record.id]})", rid))
            continue
        seen[record.id] = lineno
        records.append(record)
    if not records and not issues:
        issues.append(RecordIssue(1, "", "the corpus has no records"))
    return records, issues


def load_corpus(path: Path) -> list[CorpusRecord]:
    """Load a corpus, raising `CorpusError` (listing every bad line) if any record is invalid."""
    records, issues = check_corpus(path)
    if issues:
        raise CorpusError(path, issues)
    return records


def canonical_json(record: CorpusRecord) -> str:
    """Canonical JSON of the fields the record's line actually set (sorted keys, no spaces, UTF-8)."""
    return json.dumps(
        record.model_dump(mode="json", exclude_unset=True),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )


def record_sha256(record: CorpusRecord) -> str:
    """Hex sha256 of `canonical_json(record)`: stable under key order and whitespace changes."""
    return hashlib.sha256(canonical_json(record).encode()).hexdigest()


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
