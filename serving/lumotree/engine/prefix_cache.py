"""Hybrid prefix cache (DESIGN §5): KV blocks keyed by a hash chain over token blocks, plus the
recurrent + conv snapshot at block boundaries (a hybrid model cannot resume from KV alone).

A block is `block` tokens; block i's key hashes block i's tokens and block i-1's key, so a key
names a whole prefix. An entry holds the target's KV rows of its tokens for every attention layer,
the MTP drafter's KV rows [i*block - 1, (i+1)*block - 1) (MTP row t needs token t+1, so its rows lag
by one), and optionally a snapshot taken when a prefill chunk ended at its boundary: every GDN
layer's recurrent and conv state and the target's hidden row of the boundary's last token (the
MTP drafter's next input). A hit is the longest block-aligned prefix, shorter than the prompt, whose
blocks are all present and whose last block has a snapshot. Least recently used entries are evicted
beyond `capacity_tokens`.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from torch import Tensor

from lumotree.model.state import GDNState, KVCache, ModelState


@dataclass(eq=False)
class Snapshot:
    """States at a block boundary B: GDN layers in order, and the hidden row [H] of token B-1."""

    gdn: list[GDNState]
    hidden: Tensor


@dataclass(eq=False)
class BlockEntry:
    kv: list[tuple[Tensor, Tensor]]  # per attention layer: key, value [block, Hkv, D]
    mtp: tuple[Tensor, Tensor] | None  # the MTP KV rows this block completes
    snapshot: Snapshot | None = None


class PrefixCache:
    """See the module docstring; mtp: entries are usable once their MTP rows are stored."""

    def __init__(self, block: int, capacity_tokens: int, mtp: bool = False) -> None:
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        self.block, self.capacity_blocks, self.mtp = block, capacity_tokens // block, mtp
        self._entries: OrderedDict[bytes, BlockEntry] = OrderedDict()

    def block_keys(self, tokens: Sequence[int]) -> list[bytes]:
        """Hash-chain keys of every full block of `tokens`."""
        keys, prev = [], b""
        arr = np.asarray(tokens, dtype=np.int64)
        for start in range(0, len(arr) - self.block + 1, self.block):
            prev = hashlib.blake2b(prev + arr[start : start + self.block].tobytes(), digest_size=16).digest()
            keys.append(prev)
        return keys

    def lookup(self, keys: Sequence[bytes], prompt_len: int) -> int:
        """Number of cached blocks usable for a prompt of prompt_len tokens with these block keys."""
        usable = 0
        for i, key in enumerate(keys):
            entry = self._entries.get(key)
            if entry is None or (i + 1) * self.block > prompt_len - 1 or (self.mtp and entry.mtp is None):
                break
            if entry.snapshot is not None:
                usable = i + 1
        for key in keys[:usable]:
            self._entries.move_to_end(key)
        return usable

    def restore(self, keys: Sequence[bytes], state: ModelState, mtp: KVCache | None) -> Tensor:
        """Copy the first len(keys) blocks into `state` (and the MTP cache) and load the snapshot at
        their end; state.length = the restored tokens. Returns the boundary's hidden row [H]."""
        b = self.block
        attn = [s for s in state.layers if isinstance(s, KVCache)]
        for i, key in enumerate(keys):
            entry = self._entries[key]
            for cache, (k, v) in zip(attn, entry.kv, strict=True):
                cache.key[i * b : (i + 1) * b] = k
                cache.value[i * b : (i + 1) * b] = v
            if mtp is not None:
                if entry.mtp is None:
                    raise ValueError("cached block has no MTP rows")
                rows = self._mtp_rows(i)
                mtp.key[rows], mtp.value[rows] = entry.mtp
        snapshot = self._entries[keys[-1]].snapshot
        assert snapshot is not None
        gdn = [s for s in state.layers if isinstance(s, GDNState)]
        for dst, src in zip(gdn, snapshot.gdn, strict=True):
            dst.recurrent.copy_(src.recurrent)
            dst.conv.copy_(src.conv)
        state.length = len(keys) * b
        return snapshot.hidden

    def store(self, keys: Sequence[bytes], state: ModelState, hidden: Tensor | None) -> None:
        """After a prefill chunk that ended at block boundary len(keys) * block: store the blocks
        not yet cached and a snapshot at the boundary (hidden: row [H] of its last token). The
        MTP rows the blocks complete come with `store_mtp` once they are written."""
        b = self.block
        attn = [s for s in state.layers if isinstance(s, KVCache)]
        for i, key in enumerate(keys):
            if key in self._entries:
                self._entries.move_to_end(key)
                continue
            self._entries[key] = BlockEntry(
                kv=[(c.key[i * b : (i + 1) * b].clone(), c.value[i * b : (i + 1) * b].clone()) for c in attn],
                mtp=None,
            )
        if keys and hidden is not None:
            entry = self._entries[keys[-1]]
            if entry.snapshot is None:
                gdn = [s.clone() for s in state.layers if isinstance(s, GDNState)]
                entry.snapshot = Snapshot(gdn, hidden.clone())
        while len(self._entries) > self.capacity_blocks:
            self._entries.popitem(last=False)

    def store_mtp(self, keys: Sequence[bytes], mtp: KVCache) -> None:
        """The MTP drafter's KV rows of the stored blocks `keys` that lack them (the rows up to the
        boundary's second-last token: row t needs token t+1); evicted blocks are skipped."""
        for i, key in enumerate(keys):
            entry = self._entries.get(key)
            if entry is not None and entry.mtp is None:
                rows = self._mtp_rows(i)
                entry.mtp = (mtp.key[rows].clone(), mtp.value[rows].clone())

    def _mtp_rows(self, i: int) -> slice:
        """The MTP KV rows block i completes: [i*block - 1, (i+1)*block - 1) (row t needs token t+1)."""
        return slice(max(i * self.block - 1, 0), (i + 1) * self.block - 1)
