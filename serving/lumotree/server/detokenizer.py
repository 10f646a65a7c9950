"""Streaming detokenization that never splits a multi-byte character, and stop strings.

Byte-level BPE emits one UTF-8 character as several tokens; decoding a prefix of them yields U+FFFD.
`IncrementalDetokenizer` keeps a short window of ids (vLLM's prefix/read offsets) and releases text only
when the window decodes to complete characters, so every piece it returns is final and
`"".join(pieces) + flush()` equals decoding all ids at once.
"""

from __future__ import annotations

from collections.abc import Sequence

from lumotree.server.tokenizer import ModelTokenizer

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Token ids in, final text pieces out (one request's output)."""

    def __init__(self, tokenizer: ModelTokenizer, skip_special_tokens: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # start of the decode window: text before it has been released
        self._read = 0  # end of the released part of the window

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes ('' while a character is still partial)."""
        self._ids.append(token_id)
        done = self._tok.decode(self._ids[self._prefix : self._read], self._skip)
        text = self._tok.decode(self._ids[self._prefix :], self._skip)
        if len(text) <= len(done) or text.endswith(REPLACEMENT):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(done) :]

    def flush(self) -> str:
        """At the end of the output: whatever is held back (an unfinished character becomes U+FFFD)."""
        done = self._tok.decode(self._ids[self._prefix : self._read], self._skip)
        text = self._tok.decode(self._ids[self._prefix :], self._skip)
        self._prefix = self._read = len(self._ids)
        return text[len(done) :]


class StopStringMatcher:
    """Cuts the output at the first stop string; holds back text that may be the start of one."""

    def __init__(self, stops: Sequence[str], include_stop: bool = False) -> None:
        self._stops = [s for s in stops if s]
        self._include = include_stop
        self._held = ""
        self.matched: str | None = None

    def push(self, text: str) -> str:
        """Text safe to emit; after a match (`matched` set) the text is cut and nothing more comes."""
        if self.matched is not None:
            return ""
        buf = self._held + text
        hits = [(buf.find(s), s) for s in self._stops if s in buf]
        if hits:
            at, stop = min(hits)
            self.matched, self._held = stop, ""
            return buf[: at + len(stop)] if self._include else buf[:at]
        keep = max((suffix_prefix_overlap(buf, s) for s in self._stops), default=0)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """At the end of the output: the held-back text (no stop string completed)."""
        held, self._held = self._held, ""
        return held


def suffix_prefix_overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `stop`."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0
