"""Response pieces shared by the endpoints: usage with per-request spec stats, and log-probabilities."""

from __future__ import annotations

import math

from lumotree.engine.sequence import GenerationRequest, SpecStats, TokenLogprob
from lumotree.server.generation import OutputDelta
from lumotree.server.protocol import (
    CompletionLogprobs,
    PromptTokensDetails,
    SpecDecodeStats,
    TokenLogprobOut,
    TopLogprob,
    Usage,
)
from lumotree.server.tokenizer import ModelTokenizer

# JSON has no -inf; vLLM reports impossible tokens with this value too
LOGPROB_FLOOR = -9999.0


def spec_stats(spec: SpecStats) -> SpecDecodeStats:
    return SpecDecodeStats(
        num_drafts=spec.num_drafts,
        num_draft_tokens=spec.num_draft_tokens,
        num_accepted_tokens=spec.num_accepted_tokens,
        accepted_per_pos=list(spec.accepted_per_pos),
    )


def usage(d: OutputDelta, final: bool) -> Usage:
    """Token usage after delta `d`; the final usage carries the prefix-cache hit and the spec stats."""
    return Usage(
        prompt_tokens=d.num_prompt_tokens,
        completion_tokens=d.num_output_tokens,
        total_tokens=d.num_prompt_tokens + d.num_output_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=d.cached_prompt_tokens) if final else None,
        spec_decode=spec_stats(d.spec) if final else None,
    )


def stop_reason(d: OutputDelta, gen: GenerationRequest) -> str | int | None:
    """vLLM's `stop_reason` of a finished output: the stop string, or the request's `stop_token_ids`
    entry that ended it; None for EOS, length and unfinished outputs."""
    reason = d.stop_reason
    return reason if isinstance(reason, str) or reason in gen.stop_token_ids else None


def finite_logprob(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else LOGPROB_FLOOR


def _top(tok: ModelTokenizer, token_id: int, logprob: float) -> TopLogprob:
    return TopLogprob(
        token=tok.token_text(token_id), logprob=finite_logprob(logprob), bytes=list(tok.token_bytes(token_id))
    )


def chat_logprobs(tok: ModelTokenizer, lps: list[TokenLogprob]) -> list[TokenLogprobOut]:
    """OpenAI chat `logprobs.content` entries (token text, logprob, UTF-8 bytes, top alternatives)."""
    out = []
    for lp in lps:
        head = _top(tok, lp.token_id, lp.logprob)
        out.append(
            TokenLogprobOut(
                token=head.token,
                logprob=head.logprob,
                bytes=head.bytes,
                top_logprobs=[_top(tok, i, v) for i, v in lp.top],
            )
        )
    return out


def completion_logprobs(tok: ModelTokenizer, lps: list[TokenLogprob], offset: int) -> CompletionLogprobs:
    """Legacy completions logprobs; `offset` is the text offset of the first token's text."""
    tokens, offsets = [], []
    for lp in lps:
        text = tok.token_text(lp.token_id)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
    return CompletionLogprobs(
        tokens=tokens,
        token_logprobs=[finite_logprob(lp.logprob) for lp in lps],
        top_logprobs=[{tok.token_text(i): finite_logprob(v) for i, v in lp.top} for lp in lps],
        text_offset=offsets,
    )
