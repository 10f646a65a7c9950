"""Streaming split of a leading `<think>...</think>` block into reasoning, the rest into content.

The chat template renders an assistant turn's reasoning as `<think>\\n{reasoning.strip()}\\n</think>\\n\\n`
before its content, so the parser strips the whitespace around both parts: what it returns renders back
to the same text. Only an output that begins with `<think>` has reasoning (Qwen3's rule); a truncated
output ends inside the reasoning.
"""

from __future__ import annotations

from enum import Enum

from lumotree.server.detokenizer import suffix_prefix_overlap

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


class _State(Enum):
    START = "start"  # undecided: whitespace or a partial <think> so far
    REASONING_LEAD = "reasoning_lead"  # after <think>: drop whitespace
    REASONING = "reasoning"
    CONTENT_LEAD = "content_lead"  # after </think>: drop whitespace
    CONTENT = "content"


class ReasoningParser:
    """Text pieces in, (reasoning, content) pieces out; text that may be a tag or trimmed is held back."""

    def __init__(self) -> None:
        self._state = _State.START
        self._buf = ""

    def push(self, text: str) -> tuple[str, str]:
        """Feed the next output text; return the (reasoning, content) that is now final."""
        self._buf += text
        reasoning, content = [], []
        while self._buf:
            if self._state is _State.START:
                lead = self._buf.lstrip()
                if lead.startswith(THINK_OPEN):
                    self._buf, self._state = lead[len(THINK_OPEN) :], _State.REASONING_LEAD
                elif THINK_OPEN.startswith(lead):
                    break
                else:
                    self._state = _State.CONTENT
            elif self._state in (_State.REASONING_LEAD, _State.CONTENT_LEAD):
                self._buf = self._buf.lstrip()
                if self._buf:
                    lead_of = _State.REASONING_LEAD
                    self._state = _State.REASONING if self._state is lead_of else _State.CONTENT
            elif self._state is _State.REASONING:
                at = self._buf.find(THINK_CLOSE)
                if at >= 0:
                    reasoning.append(self._buf[:at].rstrip())
                    self._buf, self._state = self._buf[at + len(THINK_CLOSE) :], _State.CONTENT_LEAD
                    continue
                # hold a partial </think> and the whitespace before it (trimmed if the tag follows)
                body = self._buf[: len(self._buf) - suffix_prefix_overlap(self._buf, THINK_CLOSE)]
                body = body.rstrip()
                reasoning.append(body)
                self._buf = self._buf[len(body) :]
                break
            else:
                content.append(self._buf)
                self._buf = ""
        return "".join(reasoning), "".join(content)

    def flush(self) -> tuple[str, str]:
        """At the end of the output: held text goes to the part it belongs to."""
        held, self._buf = self._buf, ""
        if self._state is _State.REASONING:
            return held, ""
        if self._state in (_State.START, _State.CONTENT):
            return "", held
        return "", ""
