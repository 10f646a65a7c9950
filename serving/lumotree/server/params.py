"""From API fields to an engine `GenerationRequest`: defaults, context-length and id checks.

Every check here is a client mistake and becomes a 400 with a message that names the field; the engine
only ever sees requests it can run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lumotree.engine.sequence import GenerationRequest
from lumotree.sampling import SamplingParams
from lumotree.server.errors import APIError, bad_request
from lumotree.server.generation import TextOptions
from lumotree.server.guards import DEFAULT_MAX_BODY_BYTES
from lumotree.server.protocol import SamplingFields

_DEFAULTED = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
GREEDY_EPS = 1e-5
LOGIT_BIAS_LIMIT = 100.0  # OpenAI's and vLLM's clamp
TOP_P_FLOOR = float(np.finfo(np.float32).tiny)


@dataclass(frozen=True)
class SamplingInput:
    """Sampling and stopping settings in one vocabulary (OpenAI's and SGLang's names map onto it)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop: bool = False
    skip_special_tokens: bool = True
    n: int = 1
    logit_bias: dict[str, float] | None = None

    @classmethod
    def from_openai(cls, f: SamplingFields) -> SamplingInput:
        return cls(
            temperature=f.temperature,
            top_p=f.top_p,
            top_k=f.top_k,
            min_p=f.min_p,
            presence_penalty=f.presence_penalty,
            frequency_penalty=f.frequency_penalty,
            repetition_penalty=f.repetition_penalty,
            max_tokens=f.max_completion_tokens if f.max_completion_tokens is not None else f.max_tokens,
            seed=f.seed,
            stop=f.stop,
            stop_token_ids=f.stop_token_ids,
            ignore_eos=f.ignore_eos,
            include_stop=f.include_stop_str_in_output,
            skip_special_tokens=f.skip_special_tokens,
            n=f.n,
            logit_bias=f.logit_bias,
        )


def load_sampling_defaults(model_dir: Path) -> dict[str, float | int]:
    """The model's generation_config.json sampling values (temperature, top_p, top_k, min_p,
    repetition_penalty), used where a request leaves them unset; {} without the file."""
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return {}
    config = json.loads(path.read_text())
    if config.get("do_sample") is False:
        return {"temperature": 0.0}
    return {k: config[k] for k in _DEFAULTED if config.get(k) is not None}


@dataclass(frozen=True)
class RequestLimits:
    """What the served model accepts, and the work one request may cause, bounded by its context.

    max_token_bytes: the most bytes (so characters) one token stands for: a prompt text longer than
    max_model_len × max_token_bytes characters cannot fit and is refused before it is tokenized."""

    max_model_len: int
    vocab_size: int
    defaults: dict[str, float | int]
    max_token_bytes: int = 1

    @property
    def body_values(self) -> int:
        """JSON values a request body may hold: a rendered message, tool or content part costs at least
        one prompt token per value, with room for logit_bias over the whole vocabulary."""
        return 4 * self.max_model_len + 2 * self.vocab_size + 1024

    @property
    def body_bytes(self) -> int:
        """The body size a request at the full context can need (its text JSON-escaped to twice its
        size, plus 1 MiB for tools, logit_bias and fields), at most `DEFAULT_MAX_BODY_BYTES`."""
        return min(DEFAULT_MAX_BODY_BYTES, 2 * self.max_model_len * self.max_token_bytes + 2**20)


def context_error(limits: RequestLimits, prompt_tokens: int, field: str, at_least: bool = False) -> APIError:
    """The 400 of a prompt with no room for a completion (OpenAI's context_length_exceeded)."""
    return bad_request(
        f"this model's maximum context length is {limits.max_model_len} tokens, but the prompt has "
        f"{'at least ' if at_least else ''}{prompt_tokens} tokens (no room for a completion)",
        field,
        "context_length_exceeded",
    )


def _check_ids(ids: list[int], vocab: int, field: str) -> None:
    bad = next((i for i in ids if not 0 <= i < vocab), None)
    if bad is not None:
        raise bad_request(f"{field}: token id {bad} is outside the vocabulary [0, {vocab})", field)


def logit_bias(bias: dict[str, float] | None, vocab: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's `logit_bias` (token id strings -> offsets) as sorted (id, offset) pairs, offsets
    clamped to [-100, 100] as vLLM does; 400 for a key that is no token id of this vocabulary."""
    pairs = []
    for key, offset in (bias or {}).items():
        try:
            token = int(key)
        except ValueError:
            raise bad_request(f"logit_bias: key {key!r} is not a token id", "logit_bias") from None
        if not 0 <= token < vocab:
            raise bad_request(
                f"logit_bias: token id {token} is outside the vocabulary [0, {vocab})", "logit_bias"
            )
        pairs.append((token, min(LOGIT_BIAS_LIMIT, max(-LOGIT_BIAS_LIMIT, float(offset)))))
    return tuple(sorted(pairs))


def sampling_params(
    s: SamplingInput, defaults: dict[str, float | int], bias: tuple[tuple[int, float], ...] = ()
) -> SamplingParams:
    """The engine's SamplingParams: request values, else the model's defaults, else neutral values."""

    def pick(name: str, neutral: float) -> float:
        value = getattr(s, name)
        return value if value is not None else defaults.get(name, neutral)

    top_k = int(pick("top_k", 0))
    temperature = float(pick("temperature", 1.0))
    try:
        return SamplingParams(
            # as vLLM: a temperature this close to 0 is greedy (dividing by it overflows the logits)
            temperature=0.0 if temperature < GREEDY_EPS else temperature,
            top_k=max(top_k, 0),  # -1 (vLLM/SGLang) and 0 both mean off
            # any top_p below the smallest normal float32 keeps only the most probable token, which this
            # floor also does; below it top_p would round to 0.0 in float32 and keep nothing
            top_p=max(float(pick("top_p", 1.0)), TOP_P_FLOOR),
            min_p=float(pick("min_p", 0.0)),
            presence_penalty=s.presence_penalty or 0.0,
            frequency_penalty=s.frequency_penalty or 0.0,
            repetition_penalty=float(pick("repetition_penalty", 1.0)),
            logit_bias=bias,
        )
    except ValueError as exc:
        raise bad_request(str(exc)) from None


def build_request(
    request_id: str,
    prompt_ids: list[int],
    s: SamplingInput,
    limits: RequestLimits,
    logprobs: int | None = None,
    prompt_field: str = "prompt",
) -> tuple[GenerationRequest, TextOptions]:
    """Validate one request against the model and build what the engine and the detokenizer need.

    prompt_field: the request field the prompt came from (messages, prompt, text or input_ids), named
    by the errors about it."""
    if s.n != 1:
        raise bad_request("n > 1 is not supported: this server returns one choice per request", "n")
    if not prompt_ids:
        raise bad_request("the prompt is empty", prompt_field)
    _check_ids(prompt_ids, limits.vocab_size, prompt_field)
    _check_ids(list(s.stop_token_ids or ()), limits.vocab_size, "stop_token_ids")
    room = limits.max_model_len - len(prompt_ids)
    if room < 1:
        raise context_error(limits, len(prompt_ids), prompt_field)
    if s.max_tokens is not None and s.max_tokens > room:
        raise bad_request(
            f"this model's maximum context length is {limits.max_model_len} tokens, but {len(prompt_ids)} "
            f"prompt tokens + max_tokens {s.max_tokens} = {len(prompt_ids) + s.max_tokens}",
            "max_tokens",
            "context_length_exceeded",
        )
    stops = (s.stop,) if isinstance(s.stop, str) else tuple(s.stop or ())
    req = GenerationRequest(
        request_id=request_id,
        prompt_token_ids=prompt_ids,
        sampling=sampling_params(s, limits.defaults, logit_bias(s.logit_bias, limits.vocab_size)),
        max_tokens=s.max_tokens if s.max_tokens is not None else room,
        seed=None if s.seed is None else s.seed % 2**64,
        stop_token_ids=tuple(s.stop_token_ids or ()),
        ignore_eos=s.ignore_eos,
        logprobs=logprobs,
    )
    return req, TextOptions(
        stop=stops, include_stop=s.include_stop, skip_special_tokens=s.skip_special_tokens
    )
