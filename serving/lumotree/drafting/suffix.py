"""The suffix drafter (SuffixDecoding-style, paper §III-C): continuations of the current context found
in the request's own prompt + output and in a bounded global cache of earlier outputs.

A `SuffixIndex` keeps, for every `key_len`-gram of its sequences, the latest positions that follow
it. A lookup takes the context's last key_len tokens, extends each occurrence backwards to its full
match length (up to `max_match`) and ranks occurrences by match length, then this request before the
cache, then recency. The tree drafter uses the best continuation after root + MTP spine as the
principal tail and the next distinct continuations after the root as rescue branches.

A key's occurrences are its latest `per_key` ones among the live sequences (removing a sequence
drops its occurrences at once), so a lookup is a function of the live token sequences alone: the
device tree drafter (`device_tree_drafter.py`) finds the same occurrences by scanning the request's
tokens and `OutputCache.concatenated()`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: what separates (and precedes) the outputs in `OutputCache.concatenated()`; no token id is negative
SEPARATOR = -1


@dataclass(frozen=True)
class SuffixMatch:
    """One occurrence: how many context tokens it matches and the tokens that followed it."""

    match_len: int
    continuation: tuple[int, ...]


class SuffixIndex:
    """Latest occurrences of every key_len-gram over a set of growing token sequences."""

    def __init__(self, key_len: int = 2, per_key: int = 32) -> None:
        if key_len < 1 or per_key < 1:
            raise ValueError(f"key_len and per_key must be >= 1, got {key_len}, {per_key}")
        self.key_len, self.per_key = key_len, per_key
        self.seqs: dict[int, list[int]] = {}
        # key -> (sequence id, position after the key), oldest first
        self._where: dict[tuple[int, ...], deque[tuple[int, int]]] = {}
        self._next_id = 0

    @property
    def tokens(self) -> int:
        return sum(len(s) for s in self.seqs.values())

    def add(self, tokens: Sequence[int] = ()) -> int:
        """A new sequence (returns its id), indexed."""
        sid = self._next_id
        self._next_id += 1
        self.seqs[sid] = []
        self.extend(sid, tokens)
        return sid

    def extend(self, sid: int, tokens: Sequence[int]) -> None:
        """Append tokens to sequence `sid` and index the keys they complete."""
        seq = self.seqs[sid]
        start = len(seq)
        seq.extend(int(t) for t in tokens)
        k = self.key_len
        for end in range(max(start, k - 1), len(seq)):
            key = tuple(seq[end - k + 1 : end + 1])
            slot = self._where.get(key)
            if slot is None:
                slot = self._where[key] = deque(maxlen=self.per_key)
            slot.append((sid, end + 1))

    def remove(self, sid: int) -> None:
        """Forget a sequence and its occurrences. Removed oldest first (as `OutputCache` evicts),
        every key keeps its latest `per_key` live occurrences: a removed sequence's entries are
        older than any live one's, so none of these was pushed out of a key's slots by them."""
        seq, k = self.seqs.pop(sid), self.key_len
        for key in {tuple(seq[end - k + 1 : end + 1]) for end in range(k - 1, len(seq))}:
            slot = self._where[key]
            while slot and slot[0][0] == sid:
                slot.popleft()
            if any(entry[0] == sid for entry in slot):  # not the oldest sequence: filter
                slot = self._where[key] = deque((e for e in slot if e[0] != sid), maxlen=self.per_key)
            if not slot:
                del self._where[key]

    def matches(self, context: Sequence[int], max_match: int) -> list[tuple[int, int, int]]:
        """Occurrences of the context's last key_len tokens that have a continuation, latest first:
        (match length up to max_match, sequence id, continuation start)."""
        k = self.key_len
        if len(context) < k:
            return []
        slot = self._where.get(tuple(context[-k:]))
        if not slot:
            return []
        out = []
        reach = min(max_match, len(context))
        for sid, start in reversed(slot):
            seq = self.seqs.get(sid)
            if seq is None or start >= len(seq):
                continue
            n, limit = k, min(reach, start)
            while n < limit and seq[start - 1 - n] == context[-1 - n]:
                n += 1
            out.append((n, sid, start))
        return out


class OutputCache:
    """The global cache of earlier requests' outputs, bounded to `budget` tokens (oldest evicted
    first). One cache may serve several drafters (an engine serving concurrent requests)."""

    def __init__(self, min_match: int = 2, budget: int = 65_536, per_key: int = 32) -> None:
        self.index = SuffixIndex(min_match, per_key)
        self.budget = budget
        self._cached: deque[tuple[int, int]] = deque()  # (sequence id, tokens), oldest first
        self._tokens = 0
        self.version = 0  # counts the changes (a device copy is refreshed when it differs)
        self._flat: tuple[int, np.ndarray] | None = None

    def add(self, output: Sequence[int]) -> None:
        """Keep a finished request's output, evicting the oldest outputs beyond the budget."""
        if not output or self.budget <= 0:
            return
        self._cached.append((self.index.add(output), len(output)))
        self._tokens += len(output)
        while self._tokens > self.budget:
            sid, n = self._cached.popleft()
            self.index.remove(sid)
            self._tokens -= n
        self.version += 1

    @property
    def tokens(self) -> int:
        """Tokens of the outputs held (<= budget)."""
        return self._tokens

    def concatenated(self) -> np.ndarray:
        """The outputs held, oldest first, each preceded by `SEPARATOR` (int64; one separator when
        empty): what a scan must search to find the occurrences `index` holds."""
        if self._flat is None or self._flat[0] != self.version:
            tokens = [t for sid, _ in self._cached for t in (SEPARATOR, *self.index.seqs[sid])]
            self._flat = (self.version, np.array(tokens or [SEPARATOR], dtype=np.int64))
        return self._flat[1]


class SuffixDrafter:
    """Suffix lookups over this request's prompt + output and a bounded cache of earlier outputs.

    min_match: tokens of context an occurrence must match (the index key length); max_match: how
    far back a match is extended when ranking; cache_tokens: budget of the global output cache
    (oldest outputs evicted first); cache: an output cache shared with other drafters (default:
    a cache of this drafter's own).
    """

    def __init__(
        self,
        min_match: int = 2,
        max_match: int = 24,
        cache_tokens: int = 65_536,
        per_key: int = 32,
        cache: OutputCache | None = None,
    ) -> None:
        self.min_match, self.max_match = min_match, max_match
        self.per_key = per_key
        self.outputs = cache if cache is not None else OutputCache(min_match, cache_tokens, per_key)
        self.local = SuffixIndex(min_match, per_key)
        self._sid = self.local.add()
        self._output: list[int] = []

    def begin(self, prompt: Sequence[int]) -> None:
        """Start a request: index its prompt."""
        self.local = SuffixIndex(self.min_match, self.per_key)
        self._sid = self.local.add(prompt)
        self._output = []

    def extend(self, tokens: Sequence[int]) -> None:
        """Tokens emitted by the request (they join its index at once)."""
        self.local.extend(self._sid, tokens)
        self._output.extend(int(t) for t in tokens)

    def finish(self) -> None:
        """Move the request's output into the global cache."""
        self.outputs.add(self._output)
        self._output = []

    def continuations(self, extra: Sequence[int], length: int, limit: int) -> list[SuffixMatch]:
        """Up to `limit` distinct continuations (each up to `length` tokens) of the context
        = prompt + output + `extra`, best first."""
        if length <= 0 or limit <= 0:
            return []
        seq = self.local.seqs[self._sid]
        context = [*seq[-self.max_match :], *extra][-self.max_match :]
        # rank: longer match, then this request before the cache, then the latest occurrence
        ranked = [
            (-n, 0, i, self.local.seqs[sid], start)
            for i, (n, sid, start) in enumerate(self.local.matches(context, self.max_match))
        ] + [
            (-n, 1, i, self.outputs.index.seqs[sid], start)
            for i, (n, sid, start) in enumerate(self.outputs.index.matches(context, self.max_match))
        ]
        ranked.sort(key=lambda r: r[:3])
        out: list[SuffixMatch] = []
        seen: set[tuple[int, ...]] = set()
        for neg_n, _, _, source, start in ranked:
            cont = tuple(source[start : start + length])
            if cont and cont not in seen:
                seen.add(cont)
                out.append(SuffixMatch(-neg_n, cont))
                if len(out) == limit:
                    break
        return out
